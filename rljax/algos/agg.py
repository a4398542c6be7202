"""Loss aggregation: a `[B, T]` per-token loss matrix -> one scalar.

`agg_loss` is verl's `core_algos.agg_loss` (spec §2). With `L` the loss
matrix, `m` the loss mask, `D` = `dp_size`:

  token-mean               Σ_bt L·m / N_tok · D          N_tok = batch_num_tokens or Σ m
  token-sum                Σ_bt L·m · D
  seq-mean-token-sum       Σ_b (Σ_t L·m) / N_seq · D     N_seq = global_batch_size or #rows with Σ_t m > 0
  seq-mean-token-sum-norm  seq-mean-token-sum / S        S = loss_scale_factor or T
  seq-mean-token-mean      Σ_b (Σ_t L·m / (Σ_t m + 1e-8)) / N_seq · D

Global-batch normalisation: when a mini-batch is split into micro-batches
(gradient accumulation), pass the mini-batch's `batch_num_tokens` (Σ m over
the whole mini-batch) and `global_batch_size` (its number of rows) to every
micro-batch call; each call then returns its share and the micro-batch losses
sum to the whole mini-batch loss. `dp_size` multiplies the result so that
averaging gradients over data-parallel ranks gives the same sum (verl's FSDP
convention); on a JAX mesh the batch is one global array, so `dp_size` stays 1.

Deliberate difference from verl: verl's sequence modes multiply `L * m`
directly, so a NaN/inf at a padding position poisons its row; here padding
entries are dropped first (`where(m, L, 0)`), so padding never contributes.
On finite inputs the values are identical.
"""

from typing import Callable

import jax
import jax.numpy as jnp

from rljax.algos.masked import masked_sum

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "seq-mean-token-mean",
)

Scalar = float | int | jax.Array


def _masked_loss(loss_mat: jax.Array, loss_mask: jax.Array) -> jax.Array:
  """`where(m, L, 0) * m`: the loss with padding entries exactly 0."""
  mask = loss_mask.astype(loss_mat.dtype)
  return jnp.where(loss_mask.astype(bool), loss_mat, 0.0) * mask


def _require_global(value, dp_size: int, name: str) -> None:
  if value is None and dp_size > 1:
    raise ValueError(f"(global) {name} is required when dp_size > 1")


def _token_mean(loss_mat, loss_mask, dp_size, batch_num_tokens, **_):
  """Σ L·m / batch_num_tokens · dp_size (no epsilon: an empty mask gives NaN)."""
  _require_global(batch_num_tokens, dp_size, "batch_num_tokens")
  if batch_num_tokens is None:
    batch_num_tokens = jnp.sum(loss_mask.astype(loss_mat.dtype))
  return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size


def _token_sum(loss_mat, loss_mask, dp_size, **_):
  """Σ L·m · dp_size."""
  return masked_sum(loss_mat, loss_mask) * dp_size


def _seq_mean(seq_losses, loss_mask, dp_size, global_batch_size):
  """Σ_b seq_b·[row b non-empty] / global_batch_size · dp_size."""
  _require_global(global_batch_size, dp_size, "global_batch_size")
  dtype = seq_losses.dtype
  seq_mask = (jnp.sum(loss_mask.astype(dtype), axis=-1) > 0).astype(dtype)
  if global_batch_size is None:
    global_batch_size = jnp.sum(seq_mask)
  return masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size


def _seq_mean_token_sum(
    loss_mat, loss_mask, dp_size, global_batch_size, **_
):
  """Mean over rows of each row's token sum."""
  seq_losses = jnp.sum(_masked_loss(loss_mat, loss_mask), axis=-1)
  return _seq_mean(seq_losses, loss_mask, dp_size, global_batch_size)


def _seq_mean_token_sum_norm(
    loss_mat, loss_mask, dp_size, global_batch_size, loss_scale_factor, **_
):
  """`seq-mean-token-sum` divided by `loss_scale_factor` (default T)."""
  if loss_scale_factor is None:
    loss_scale_factor = loss_mask.shape[-1]
  loss = _seq_mean_token_sum(loss_mat, loss_mask, dp_size, global_batch_size)
  return loss / loss_scale_factor


def _seq_mean_token_mean(
    loss_mat, loss_mask, dp_size, global_batch_size, **_
):
  """Mean over rows of each row's token mean."""
  count = jnp.sum(loss_mask.astype(loss_mat.dtype), axis=-1)
  seq_losses = jnp.sum(_masked_loss(loss_mat, loss_mask), axis=-1) / (
      count + 1e-8
  )
  return _seq_mean(seq_losses, loss_mask, dp_size, global_batch_size)


_AGGREGATORS: dict[str, Callable[..., jax.Array]] = {
    "token-mean": _token_mean,
    "token-sum": _token_sum,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    "seq-mean-token-mean": _seq_mean_token_mean,
}


def agg_loss(
    loss_mat: jax.Array,
    loss_mask: jax.Array,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Scalar | None = None,
    global_batch_size: Scalar | None = None,
    loss_scale_factor: Scalar | None = None,
) -> jax.Array:
  """Aggregates a per-token loss matrix into a scalar (verl's `agg_loss`).

  See the module docstring for each mode's formula.

  Args:
    loss_mat: float `[B, T]` per-token losses.
    loss_mask: `[B, T]` mask (bool or 0/1 float); 1 = token counts.
    loss_agg_mode: one of `LOSS_AGG_MODES`.
    dp_size: data-parallel size the result is scaled by (static int).
    batch_num_tokens: valid tokens in the global (mini-)batch; default Σ m.
    global_batch_size: rows in the global (mini-)batch; default the number
      of rows of this call with at least one valid token.
    loss_scale_factor: divisor for `seq-mean-token-sum-norm`; default T.

  Returns:
    Scalar loss.

  Raises:
    ValueError: unknown `loss_agg_mode`, or `dp_size > 1` without the global
      count the mode needs.
  """
  try:
    aggregate = _AGGREGATORS[loss_agg_mode]
  except KeyError:
    raise ValueError(
        f"Invalid loss_agg_mode: {loss_agg_mode!r} "
        f"(config key actor_rollout_ref.actor.loss_agg_mode); valid modes: "
        f"{', '.join(LOSS_AGG_MODES)}"
    ) from None
  return aggregate(
      loss_mat,
      loss_mask,
      dp_size=dp_size,
      batch_num_tokens=batch_num_tokens,
      global_batch_size=global_batch_size,
      loss_scale_factor=loss_scale_factor,
  )


def global_batch_info(
    response_mask: jax.Array,
    dp_size: int = 1,
    loss_scale_factor: Scalar | None = None,
) -> dict:
  """verl's `global_batch_info` for a whole mini-batch, to pass to each part.

  `batch_num_tokens = Σ m` and `global_batch_size = B` (verl uses
  `ppo_mini_batch_size * rollout.n`, the row count of the mini-batch).

  Args:
    response_mask: `[B, T]` mask of the whole mini-batch.
    dp_size: data-parallel size (1 on a JAX mesh).
    loss_scale_factor: `actor.loss_scale_factor` (None -> T).

  Returns:
    dict with keys `dp_size, batch_num_tokens, global_batch_size,
    loss_scale_factor`, ready for `agg_loss(..., **info)`.
  """
  return {
      "dp_size": dp_size,
      "batch_num_tokens": jnp.sum(response_mask.astype(jnp.float32)),
      "global_batch_size": response_mask.shape[0],
      "loss_scale_factor": loss_scale_factor,
  }
