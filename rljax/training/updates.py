"""The cores every training step is built from: a gradient laid out as its parameters, accumulated over
micro-batches, and one optimizer update.

Both trainers (RL's actor and critic updates, `rljax.rl.steps`; SFT's
gradient and apply steps, `rljax.sft.step`) and the sharding benchmarks
build their jitted steps from these functions. Every step traces its body
inside `rljax.sharding.activation_sharding` (`traced_in`), so activations
keep the batch sharding and FSDP weights are gathered rather than
activations all-reduced; a gradient is constrained to its parameter's
sharding, which XLA lowers as a reduce-scatter (`constrained_grad`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from rljax.models import lora
from rljax.sharding import rules as rules_lib
from rljax.sharding.placement import gradient_compiler_options

Metrics = dict[str, jax.Array]


def constrained_grad(loss_fn: Callable, params: Any, shardings: Any, *args) -> tuple[Any, Any]:
  """(loss_fn's (loss, aux), its gradient in `params` laid out by `shardings`: reduce-scattered, not all-reduced)."""
  out, grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *args)
  return out, jax.lax.with_sharding_constraint(grads, shardings)


def accumulate_gradients(loss_fn: Callable, params: Any, micro_batches: dict[str, jax.Array], keys: jax.Array,
                         shardings: Any) -> tuple[Any, Metrics]:
  """Sum over micro-batches of grad `loss_fn(params, micro, key)` (in the parameters' dtypes), and the
  stacked metrics.

  Args:
    loss_fn: (params, micro-batch, key) -> (loss, metrics).
    micro_batches: [M, rows, ...] arrays.
    keys: [M] PRNG keys.
    shardings: the parameters' shardings (gradients and the sum are laid out by them).
  """
  as_params = lambda grads: jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)  # noqa: E731
  if keys.shape[0] == 1:  # one micro-batch: no accumulator to hold beside the gradient
    (_, metrics), grads = constrained_grad(loss_fn, params, shardings, *jax.tree.map(lambda x: x[0],
                                                                                     (micro_batches, keys)))
    return as_params(grads), jax.tree.map(lambda m: m[None], metrics)

  def body(total, xs):
    micro, key = xs
    (_, metrics), grads = constrained_grad(loss_fn, params, shardings, micro, key)
    return jax.tree.map(lambda t, g: t + g.astype(t.dtype), total, grads), metrics

  zeros = jax.lax.with_sharding_constraint(jax.tree.map(jnp.zeros_like, params), shardings)
  return jax.lax.scan(body, zeros, (micro_batches, keys))


def apply_gradients(tx: optax.GradientTransformation, params: Any, opt_state: Any, grads: Any):
  """(params, opt_state) after one optimizer update, and the global gradient norm before clipping."""
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, optax.tree.norm(grads)


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, mesh: Mesh, rules: Any, param_shardings: Any,
                    opt_shardings: Any, batch_shardings: Any) -> Callable:
  """jitted `(params, opt_state, batch) -> (params, opt_state, loss, aux)`: one gradient and one update.

  `loss_fn(params, batch) -> (loss, aux)`; params and optimizer state are donated. It is the plain
  one-batch step that the sharding tests and benchmarks measure; the RL and SFT steps accumulate
  micro-batches over the same cores (`accumulate_gradients`, `apply_gradients`).
  """
  def step(params, opt_state, batch):
    (loss, aux), grads = constrained_grad(loss_fn, params, param_shardings, batch)
    params, opt_state, _ = apply_gradients(tx, params, opt_state, grads)
    return params, opt_state, loss, aux

  return jax.jit(traced_in(mesh, rules, step), in_shardings=(param_shardings, opt_shardings, batch_shardings),
                 out_shardings=(param_shardings, opt_shardings, None, None), donate_argnums=(0, 1),
                 compiler_options=gradient_compiler_options(mesh))


def traced_in(mesh: Mesh, rules: Any, fn: Callable) -> Callable:
  """`fn` whose body is traced inside `activation_sharding(mesh, rules)`."""
  @functools.wraps(fn)
  def wrapped(*args):
    with rules_lib.activation_sharding(mesh, rules):
      return fn(*args)
  return wrapped


def training_model(graphdef: nnx.GraphDef, params: Any, frozen: Any, key: jax.Array) -> Any:
  """The model from its trained and frozen state, in training mode.

  Training mode turns LoRA dropout on, its masks drawn from `key`
  (rljax.models.lora.seed_dropout); a model without dropout is unchanged.
  """
  frozen = nnx.State({}) if frozen is None else lora.seed_dropout(frozen, jax.random.fold_in(key, 1))
  model = nnx.merge(graphdef, params, frozen)
  model.train()
  return model
