"""The SFT loss and its jitted steps over the pure (graphdef, trainable, frozen) split.

For a global batch laid out as rows (`rljax.sft.packing`), with N the
number of trained (response) tokens in the whole global batch:

  loss = -(1 / N) * sum_{r, t} loss_mask[r, t] * log p(targets[r, t] | its segment's tokens <= t)

A training step runs the micro-batches one after another, each adding the
gradient of its share of that sum to an accumulator, then clips and applies
the optimizer once. Because every micro-batch divides by the same N, the
loss and the gradient do not depend on how examples are grouped into rows
or micro-batches (packed or not, any micro_batch_size_per_gpu). verl divides
each micro-batch by its own token count and averages the micro-batches;
the two agree when micro-batches hold equal numbers of response tokens.

Which parameters train is decided as in the RL trainer, by
`rljax.models.lora.split_trainable`: the model is split into (graphdef,
trainable, frozen) states, gradients and optimizer state cover only
`trainable`, and `frozen` is passed through, read and never copied. Full
fine-tuning trains every `nnx.Param`; with LoRA (`model.lora_rank > 0`) the
adapters and modules_to_save train and the base weights are frozen.
Checkpoints hold the trainable state as "actor" (as `rljax.export` reads it);
the frozen state is the base model, loaded again from `model.partial_pretrain`.
A gradient step builds the model in training mode
(`rljax.trainer.updates.training_model`): LoRA dropout draws its masks from
the step's key.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.models import CausalLM, token_log_probs
from rljax.trainer.updates import training_model

Rows = dict[str, jax.Array]


def nll_sum(model: CausalLM, rows: Rows) -> jax.Array:
  """Sum of -log p(target) over trained tokens; rows [R, L] as in `rljax.sft.packing`."""
  hidden = model.hidden_states(rows["input_ids"], rows["segment_ids"] > 0, rows["positions"], rows["segment_ids"])
  weight = model.lm_head_weight().astype(hidden.dtype)
  log_probs, _ = token_log_probs(hidden, weight, rows["targets"], with_entropy=False)
  return -jnp.sum(log_probs * rows["loss_mask"])


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of a scalar: one copy on every device."""
  return NamedSharding(mesh, PartitionSpec())


def _zeros_like(params: nnx.State) -> nnx.State:
  return jax.tree.map(jnp.zeros_like, params)


def _grad_step(graphdef, trainable, frozen, rows, grads, normaliser, key):
  def loss_fn(params):
    return nll_sum(training_model(graphdef, params, frozen, key), rows) / normaliser

  loss, new = jax.value_and_grad(loss_fn)(trainable)
  return jax.tree.map(jnp.add, grads, new), loss


def _eval_step(graphdef, trainable, frozen, rows):
  return nll_sum(nnx.merge(graphdef, trainable, frozen), rows)


def _apply_step(tx, trainable, opt_state, grads):
  updates, opt_state = tx.update(grads, opt_state, trainable)
  return optax.apply_updates(trainable, updates), opt_state, optax.tree.norm(grads)


# The step functions are module-level and take the graphdef as a static
# argument, so trainers of the same model and mesh share their compilations.


def make_zeros(trainable_sh: Any) -> Callable[[nnx.State], nnx.State]:
  """A jitted `zeros_like(trainable)` laid out like the parameters (the gradient accumulator)."""
  return jax.jit(_zeros_like, out_shardings=trainable_sh)


def make_grad_step(graphdef: nnx.GraphDef, mesh: Mesh, trainable_sh: Any, frozen_sh: Any, rows_sh: Any) -> Callable:
  """jitted `(trainable, frozen, rows, grads, n, key) -> (grads + d(nll_sum / n), nll_sum / n)`; grads donated.

  `key` seeds LoRA dropout (unused without it).
  """
  scalar = replicated(mesh)
  step = jax.jit(_grad_step, static_argnums=(0,),
                 in_shardings=(trainable_sh, frozen_sh, rows_sh, trainable_sh, scalar, scalar),
                 out_shardings=(trainable_sh, scalar), donate_argnums=(4,))
  return functools.partial(step, graphdef)


def make_apply_step(tx: optax.GradientTransformation, mesh: Mesh, trainable_sh: Any, opt_sh: Any) -> Callable:
  """jitted `(trainable, opt_state, grads) -> (trainable, opt_state, global grad norm before clipping)`."""
  apply = jax.jit(_apply_step, static_argnums=(0,), in_shardings=(trainable_sh, opt_sh, trainable_sh),
                  out_shardings=(trainable_sh, opt_sh, replicated(mesh)), donate_argnums=(1, 2))
  return functools.partial(apply, tx)


def make_eval_step(graphdef: nnx.GraphDef, mesh: Mesh, trainable_sh: Any, frozen_sh: Any, rows_sh: Any) -> Callable:
  """jitted `(trainable, frozen, rows) -> nll_sum` (no gradient)."""
  step = jax.jit(_eval_step, static_argnums=(0,), in_shardings=(trainable_sh, frozen_sh, rows_sh),
                 out_shardings=replicated(mesh))
  return functools.partial(step, graphdef)


__all__ = [
    "make_apply_step", "make_eval_step", "make_grad_step", "make_zeros", "nll_sum",
]
