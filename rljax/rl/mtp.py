"""The multi-token prediction loss of an actor update: verl's model.mtp.enable_train, as Megatron-LM computes it.

Depth k's hidden state at a position predicts the token k + 1 places on
(`rljax.models.mtp`); its loss is the cross-entropy of the response tokens
the loss mask counts (response_mask) that some position of the same sequence
predicts at that depth, through the LM head with no gradient reaching the
head. The update adds

    mtp_loss_scaling_factor / K * Σ_k (Σ cross-entropy_k) / tokens_k

with the sums over the whole mini-batch (every counted token weighs the
same, whatever the micro-batching: Megatron's per-token regime, which verl's
Megatron engine runs with context parallelism); the per-depth means are the
metrics mtp_losses/mtp_{k}_loss.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rljax.models import token_log_probs
from rljax.rl import packing
from rljax.rl.experience import Experience
from rljax.rl.sequences import model_positions


class MTPTraining(NamedTuple):
  """What an update trains of the MTP layers (verl's actor_rollout_ref.model.mtp)."""

  depths: int
  scale: float
  detach: bool


def training_of(config: Any, mtp_layers: int) -> MTPTraining | None:
  """The run's MTP training (enable and enable_train), or None; `mtp_layers`: the actor's layers."""
  mtp = config.actor_rollout_ref.model.mtp
  if not (mtp.enable and mtp.enable_train):
    return None
  return MTPTraining(mtp_layers, float(mtp.mtp_loss_scaling_factor), bool(mtp.detach_encoder))


def _padded_predictors(batch: Experience, depth: int) -> tuple[slice, jax.Array]:
  """(the positions [P - 1 - depth, P - 1 - depth + R) whose depth-`depth` states predict the response tokens,
  [N, R] which of them count: a counted response token whose predicting position holds a real token)."""
  width, length = batch.input_ids.shape[1], batch.responses.shape[1]
  start = width - length - 1 - depth
  if start < 0:
    raise ValueError(f"prompts of {width - length} tokens are too short for {depth} multi-token prediction depths")
  positions = slice(start, start + length)
  return positions, (batch.response_mask > 0) & (batch.attention_mask[:, positions] > 0)


def _packed_predictors(batch: Experience, depth: int) -> tuple[jax.Array, jax.Array]:
  """([D, rows / D * R] the buffer positions whose depth-`depth` states predict the rows' response tokens,
  [rows, R] which of them count: a counted token whose predicting position lies in its own segment)."""
  packed = batch.packed
  shards, per_shard, length = packed.out_index.shape
  width = packed.input_ids.shape[-1]
  target = packed.out_index.reshape(shards, -1)
  source = jnp.maximum(target - depth, 0)
  segments = packed.segment_ids.reshape(shards, -1)
  same = jnp.take_along_axis(segments, source, axis=1) == jnp.take_along_axis(segments, jnp.maximum(target, 0), axis=1)
  valid = (target >= 0) & (target % width >= depth) & same
  return source, valid.reshape(shards * per_shard, length) & (batch.response_mask > 0)


def counted_tokens(batch: Experience, depths: int) -> jax.Array:
  """[K] the response tokens each depth's loss counts in `batch` (one micro-batch)."""
  find = _packed_predictors if batch.packed is not None else _padded_predictors
  return jnp.stack([jnp.sum(find(batch, k)[1]) for k in range(1, depths + 1)])


def _depth_states(model: Any, batch: Experience, trunk: jax.Array, detach: bool) -> jax.Array:
  """[K, ...] the depths' hidden states of the pass whose final states are `trunk` (padded: [K, N, P + R, D];
  packed: [K, D, B * L, D])."""
  if batch.packed is None:
    return model.mtp_hidden(trunk, batch.input_ids, batch.attention_mask, model_positions(batch.positions),
                            detach=detach)
  packed = batch.packed
  shards, buffers, width = packed.input_ids.shape
  flat = lambda x: x.reshape(shards * buffers, width)  # noqa: E731
  segments = flat(packed.segment_ids)
  states = model.mtp_hidden(trunk.reshape(shards * buffers, width, -1), flat(packed.input_ids),
                            (segments > 0).astype(jnp.int32), flat(packed.positions), segment_ids=segments,
                            detach=detach)
  return states.reshape(states.shape[0], shards, buffers * width, -1)


def cross_entropy_sums(model: Any, batch: Experience, trunk: jax.Array, training: MTPTraining) -> jax.Array:
  """[K] each depth's summed cross-entropy over the tokens it counts in `batch` (one micro-batch), `trunk` the
  final hidden states of its pass (`rljax.rl.sequences.response_log_probs`'s with_trunk)."""
  states = _depth_states(model, batch, trunk, training.detach)
  head = jax.lax.stop_gradient(model.lm_head_weight())
  # every depth predicts the rows' response tokens [rows, R]
  targets = (batch.responses if batch.packed is None
             else packing.to_rows(packing.next_tokens(batch.packed), batch.packed.out_index))
  sums = []
  for k in range(1, training.depths + 1):
    if batch.packed is None:
      positions, valid = _padded_predictors(batch, k)
      hidden = states[k - 1][:, positions]
    else:
      source, valid = _packed_predictors(batch, k)
      hidden = jnp.take_along_axis(states[k - 1], source[..., None], axis=1).reshape(valid.shape + (-1,))
    log_probs, _ = token_log_probs(hidden, head, targets, with_entropy=False,
                                   softcap=model.cfg.final_logit_softcapping)
    sums.append(-jnp.sum(jnp.where(valid, log_probs, 0.0)))
  return jnp.stack(sums)


def loss_and_metrics(sums: jax.Array, tokens: jax.Array, training: MTPTraining) -> tuple[jax.Array, dict[str, Any]]:
  """One micro-batch's share of the MTP loss and its metrics, from its [K] cross-entropy sums and the
  mini-batch's [K] counted tokens."""
  means = sums / jnp.maximum(tokens, 1)
  metrics = {f"mtp_losses/mtp_{k}_loss": jax.lax.stop_gradient(means[k - 1]) for k in range(1, training.depths + 1)}
  return training.scale / training.depths * jnp.sum(means), metrics
