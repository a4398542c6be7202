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

The gradient and optimizer cores are shared with RL training
(`rljax.training.updates.constrained_grad`, `apply_gradients`), traced inside
the job's activation sharding: gradients reduce-scatter to their
parameters' layout. Which parameters train is decided as in RL training, by
`rljax.models.lora.split_trainable`: the model is split into (graphdef,
trainable, frozen) states, gradients and optimizer state cover only
`trainable`, and `frozen` is passed through, read and never copied. Full
fine-tuning trains every `nnx.Param`; with LoRA (`model.lora_rank > 0`) the
adapters and modules_to_save train and the base weights are frozen.
Checkpoints hold the trainable state as "actor" (as `rljax.export` reads it);
the frozen state is the base model, loaded again from `model.partial_pretrain`.
A gradient step builds the model in training mode
(`rljax.training.updates.training_model`): LoRA dropout draws its masks from
the step's key.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from rljax.models import CausalLM, token_log_probs, vision
from rljax.sharding.placement import gradient_compiler_options, replicated
from rljax.training.updates import apply_gradients, constrained_grad, traced_in, training_model

Rows = dict[str, jax.Array]


def nll_sum(model: CausalLM, rows: Rows) -> jax.Array:
  """Sum of -log p(target) over trained tokens; rows [R, L] as in `rljax.sft.packing` (a vision-language model's
  with their images and M-RoPE positions [R, L, 3])."""
  positions, images = rows["positions"], None
  if "pixels" in rows:
    positions = jnp.moveaxis(positions, -1, 0)
    images = vision.Images(rows["pixels"], vision.ImageLayout(
        order=rows["patch_order"], rotary=rows["patch_rotary"], windows=rows["patch_windows"],
        frames=rows["patch_frames"], restore=rows["merge_restore"]))
  hidden = model.hidden_states(rows["input_ids"], rows["segment_ids"] > 0, positions, rows["segment_ids"],
                               images=images)
  weight = model.lm_head_weight().astype(hidden.dtype)
  log_probs, _ = token_log_probs(hidden, weight, rows["targets"], with_entropy=False,
                                 softcap=model.cfg.final_logit_softcapping)
  return -jnp.sum(log_probs * rows["loss_mask"])


def _zeros_like(params: nnx.State) -> nnx.State:
  return jax.tree.map(jnp.zeros_like, params)


def make_zeros(trainable_sh: Any) -> Callable[[nnx.State], nnx.State]:
  """A jitted `zeros_like(trainable)` laid out like the parameters (the gradient accumulator)."""
  return jax.jit(_zeros_like, out_shardings=trainable_sh)


def make_grad_step(graphdef: nnx.GraphDef, mesh: Mesh, rules: Any, trainable_sh: Any, frozen_sh: Any,
                   rows_sh: Any) -> Callable:
  """jitted `(trainable, frozen, rows, grads, n, key) -> (grads + d(nll_sum / n), nll_sum / n)`; grads donated.

  `key` seeds LoRA dropout (unused without it).
  """
  def step(trainable, frozen, rows, grads, normaliser, key):
    def loss_fn(params):
      return nll_sum(training_model(graphdef, params, frozen, key), rows) / normaliser, None

    (loss, _), new = constrained_grad(loss_fn, trainable, trainable_sh)
    return jax.tree.map(jnp.add, grads, new), loss

  scalar = replicated(mesh)
  return jax.jit(traced_in(mesh, rules, step),
                 in_shardings=(trainable_sh, frozen_sh, rows_sh, trainable_sh, scalar, scalar),
                 out_shardings=(trainable_sh, scalar), donate_argnums=(3,),
                 compiler_options=gradient_compiler_options(mesh))


def make_apply_step(tx: optax.GradientTransformation, mesh: Mesh, trainable_sh: Any, opt_sh: Any) -> Callable:
  """jitted `(trainable, opt_state, grads) -> (trainable, opt_state, global grad norm before clipping)`."""
  return jax.jit(functools.partial(apply_gradients, tx), in_shardings=(trainable_sh, opt_sh, trainable_sh),
                 out_shardings=(trainable_sh, opt_sh, replicated(mesh)), donate_argnums=(1, 2))


def make_eval_step(graphdef: nnx.GraphDef, mesh: Mesh, rules: Any, trainable_sh: Any, frozen_sh: Any,
                   rows_sh: Any) -> Callable:
  """jitted `(trainable, frozen, rows) -> nll_sum` (no gradient)."""
  def step(trainable, frozen, rows):
    return nll_sum(nnx.merge(graphdef, trainable, frozen), rows)

  return jax.jit(traced_in(mesh, rules, step), in_shardings=(trainable_sh, frozen_sh, rows_sh),
                 out_shardings=replicated(mesh))


__all__ = [
    "make_apply_step", "make_eval_step", "make_grad_step", "make_zeros", "nll_sum",
]
