"""Jitted log-prob, value and update steps for the actor and the critic.

Every step is a pure function of arrays over the `(graphdef, params)` split.
An update takes one mini-batch shaped `[micro_batches, rows, ...]`, scans
the micro-batches accumulating gradients (each micro-batch's loss is its
share of the mini-batch loss: verl's global-batch normalisation with
`batch_num_tokens` and `global_batch_size` of the whole mini-batch), then
applies one optax update. Parameters and optimizer state are donated.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rljax.algos import agg, policy_loss, value_loss
from rljax.models import CausalLM, ModelConfig, lora
from rljax.trainer.sequences import response_hidden, response_log_probs, tree_zeros_like

Metrics = dict[str, jax.Array]


class ValueModel(nnx.Module):
  """The critic: the policy's architecture with a scalar value head on the last hidden state."""

  def __init__(self, backbone: CausalLM, rngs: nnx.Rngs):
    self.backbone = backbone
    d = backbone.cfg.hidden_size
    self.value_head = nnx.Param(jax.random.normal(rngs.params(), (d,), jnp.float32) * 0.02,
                                out_sharding=("embed",), eager_sharding=False)
    self.value_bias = nnx.Param(jnp.zeros((), jnp.float32))

  @property
  def cfg(self) -> ModelConfig:
    return self.backbone.cfg

  def response_values(self, batch: dict[str, jax.Array], group_size: int = 1) -> jax.Array:
    """[N, R] value of the state before each response token (group_size: see `response_hidden`)."""
    hidden = response_hidden(self.backbone, batch, group_size).astype(jnp.float32)
    return hidden @ self.value_head[...] + self.value_bias[...]


def _global_info(mask: jax.Array) -> dict[str, Any]:
  """verl's global_batch_info for a mini-batch mask [micro_batches, rows, R]."""
  return {"dp_size": 1, "batch_num_tokens": jnp.sum(mask), "global_batch_size": mask.shape[0] * mask.shape[1]}


def _reduce_metrics(metrics: Metrics) -> Metrics:
  """Loss terms are shares of the mini-batch loss (summed); other metrics are averaged."""
  return {k: (jnp.sum(v) if k.endswith("_loss") else jnp.mean(v)) for k, v in metrics.items()}


def _accumulate(loss_fn: Callable, params: Any, mini: dict[str, jax.Array], rng: jax.Array):
  """Sum of micro-batch gradients and stacked metrics of `loss_fn(params, micro, info, key)`."""
  info = _global_info(mini["response_mask"])
  keys = jax.random.split(rng, mini["response_mask"].shape[0])

  def body(grads, xs):
    micro, key = xs
    (_, metrics), g = jax.value_and_grad(loss_fn, has_aux=True)(params, micro, info, key)
    return jax.tree.map(jnp.add, grads, g), metrics

  return jax.lax.scan(body, tree_zeros_like(params), (mini, keys))


def _apply(tx: optax.GradientTransformation, params: Any, opt_state: Any, grads: Any):
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, optax.tree.norm(grads)


def make_log_prob_fn(graphdef: nnx.GraphDef, temperature: float, with_entropy: bool = True,
                     group_size: int = 1) -> Callable:
  """jit: (params, batch) -> (log_probs [N, R], entropy [N, R]).

  group_size n > 1: the batch's rows come in groups of n sharing a prompt,
  which runs once per group (`rljax.trainer.sequences.response_hidden`).
  """
  def fn(params, batch):
    return response_log_probs(nnx.merge(graphdef, params), batch, temperature, with_entropy,
                              group_size=group_size)
  return jax.jit(fn)


def make_value_fn(graphdef: nnx.GraphDef, group_size: int = 1) -> Callable:
  """jit: (critic params, batch) -> values [N, R]; group_size as in `make_log_prob_fn`."""
  return jax.jit(lambda params, batch: nnx.merge(graphdef, params).response_values(batch, group_size))


def training_model(graphdef: nnx.GraphDef, params: Any, frozen: Any, key: jax.Array) -> Any:
  """The model from its trained and frozen state, in training mode.

  Training mode turns LoRA dropout on, its masks drawn from `key`
  (rljax.models.lora.seed_dropout); a model without dropout is unchanged.
  """
  frozen = nnx.State({}) if frozen is None else lora.seed_dropout(frozen, jax.random.fold_in(key, 1))
  model = nnx.merge(graphdef, params, frozen)
  model.train()
  return model


def make_actor_update(graphdef: nnx.GraphDef, actor_config: Any, tx: optax.GradientTransformation,
                      temperature: float, shardings: tuple[Any, Any] | None = None,
                      group_size: int = 1) -> Callable:
  """jit: (params, opt_state, mini, rng, frozen=None) -> (params, opt_state, metrics).

  `params` is what trains (every parameter, or with LoRA the adapters and
  modules_to_save: `rljax.models.lora.split_trainable`) and is donated with
  the optimizer state; `frozen` is the rest of the model's state (the base
  weights under LoRA), read and never copied. Gradients and optimizer state
  cover `params` only.

  The entropy is always reported (actor/entropy); it enters the loss, and
  the backward pass, only when entropy_coeff is non-zero.

  `mini` holds responses, input rows, response_mask, advantages, and
  optionally old_log_probs (absent: on-policy, the current log-probs with
  their gradient stopped, which is what a recomputation with the same
  parameters gives), ref_log_prob, rollout_is_weights and positive [rows].
  With group_size n > 1 each micro-batch's rows come in groups of n sharing
  a prompt, which runs forward and backward once per group.
  """
  entropy_in_loss = bool(actor_config.entropy_coeff)

  def loss_fn(params, micro, info, key, frozen=None):
    log_prob, entropy = response_log_probs(training_model(graphdef, params, frozen, key), micro, temperature,
                                           group_size=group_size)
    old = micro.get("old_log_probs", jax.lax.stop_gradient(log_prob))
    loss, metrics = policy_loss.ppo_loss(
        actor_config, log_prob, old, micro["advantages"], micro["response_mask"],
        entropy=entropy if entropy_in_loss else None, ref_log_prob=micro.get("ref_log_prob"),
        rollout_is_weights=micro.get("rollout_is_weights"), positive=micro.get("positive"),
        global_batch_info=info, rng=key)
    mask = micro["response_mask"].astype(jnp.float32)
    metrics["actor/entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, metrics

  def step(params, opt_state, mini, rng, frozen=None):
    grads, metrics = _accumulate(functools.partial(loss_fn, frozen=frozen), params, mini, rng)
    params, opt_state, grad_norm = _apply(tx, params, opt_state, grads)
    return params, opt_state, {**_reduce_metrics(metrics), "actor/grad_norm": grad_norm}

  kwargs = {} if shardings is None else {"out_shardings": (shardings[0], shardings[1], None)}
  return jax.jit(step, donate_argnums=(0, 1), **kwargs)


def make_critic_update(graphdef: nnx.GraphDef, critic_config: Any, tx: optax.GradientTransformation,
                       shardings: tuple[Any, Any] | None = None, group_size: int = 1) -> Callable:
  """jit: (params, opt_state, mini, rng) -> (params, opt_state, metrics); clipped value loss.

  `mini` holds the input rows, response_mask, values (old), returns;
  group_size as in `make_actor_update`.
  """
  def loss_fn(params, micro, info, key):
    del key
    vpreds = nnx.merge(graphdef, params).response_values(micro, group_size)
    loss, clipfrac = value_loss.compute_value_loss(
        vpreds, micro["returns"], micro["values"], micro["response_mask"], critic_config.cliprange_value,
        loss_agg_mode=critic_config.loss_agg_mode, **info)
    mask = micro["response_mask"].astype(jnp.float32)
    vpred_mean = agg.agg_loss(vpreds, mask, "token-mean")
    return loss, {"critic/vf_loss": loss, "critic/vf_clipfrac": clipfrac, "critic/vpred_mean": vpred_mean}

  def step(params, opt_state, mini, rng):
    grads, metrics = _accumulate(loss_fn, params, mini, rng)
    params, opt_state, grad_norm = _apply(tx, params, opt_state, grads)
    return params, opt_state, {**_reduce_metrics(metrics), "critic/grad_norm": grad_norm}

  kwargs = {} if shardings is None else {"out_shardings": (shardings[0], shardings[1], None)}
  return jax.jit(step, donate_argnums=(0, 1), **kwargs)
