"""Optimizers from verl's `optim` config nodes (actor, critic, and SFT via `rljax.sft.config.optim_view`).

AdamW (betas `optim.betas` where the node has them, as verl's SFT trainer
does, else 0.9/0.999 as torch's; eps 1e-8) after clipping the global gradient
norm at `grad_clip`. The learning rate follows verl's schedulers,
stepped once per training step (verl steps its scheduler after each
`update_actor`, not after each mini-batch):

    warmup = lr_warmup_steps if > 0 else int(lr_warmup_steps_ratio * total)
    constant: lr * min(1, s / max(1, warmup))
    cosine:   lr * f(s'), f = s' / warmup                                        (s' < warmup)
                          f = max(min_lr_ratio, c * cos(2π * num_cycles * p) + i) (after)
              p = (s' - warmup) / max(1, total - warmup),
              c = (1 - min_lr_ratio) / 2, i = (1 + min_lr_ratio) / 2,
              s' = s, or s + 1 with optim.zero_indexed_step=false
              (verl 0.9.1's get_cosine_schedule_with_warmup: the warm-up starts at 0, its init_lr_ratio unset)
    wsd:      lr * g(s)  (warm-up, stable, decay; verl's SFT `lr_scheduler: wsd`)
              stable = int(0.9 * max(0, total - warmup)), decay = max(0, total - warmup) - stable
              g = s / max(1, warmup)                                          (s < warmup)
              g = 1                                                           (s < warmup + stable)
              g = m + (1 - m) * max(0, (1 + cos(2π * num_cycles * q)) / 2)    (s < total)
              g = m                                                           (after)
              q = (s - warmup - stable) / max(1, decay), m = min_lr_ratio
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax


def warmup_steps(optim, total_steps: int) -> int:
  """`lr_warmup_steps` when positive, else `lr_warmup_steps_ratio * total_steps`."""
  if optim.lr_warmup_steps is not None and optim.lr_warmup_steps > 0:
    return int(optim.lr_warmup_steps)
  return int(optim.lr_warmup_steps_ratio * total_steps)


WSD_STABLE_RATIO = 0.9


def wsd_factor(step, warmup: int, total_steps: int, min_lr_ratio: float, num_cycles: float,
               stable_ratio: float = WSD_STABLE_RATIO):
  """The wsd multiplier g(step) of the module docstring (step 0-based, any array shape)."""
  step = jnp.asarray(step, jnp.float32)
  remaining = max(0, total_steps - warmup)
  stable = int(remaining * stable_ratio)
  decay = remaining - stable
  ramp = step / max(1, warmup)
  progress = (step - warmup - stable) / max(1, decay)
  wave = jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(math.pi * float(num_cycles) * 2.0 * progress)))
  decayed = min_lr_ratio + (1.0 - min_lr_ratio) * wave
  return jnp.where(step < warmup, ramp,
                   jnp.where(step < warmup + stable, 1.0,
                             jnp.where(step < total_steps, decayed, min_lr_ratio)))


def lr_factor(step, optim, total_steps: int):
  """The scheduler's multiplier of `optim.lr` at training step `step` (0-based)."""
  warmup = warmup_steps(optim, total_steps)
  if optim.lr_scheduler_type == "wsd":
    return wsd_factor(step, warmup, total_steps, float(optim.min_lr_ratio or 0.0), float(optim.num_cycles))
  step = jnp.asarray(step, jnp.float32)
  if optim.lr_scheduler_type == "constant":
    return jnp.minimum(1.0, step / max(1, warmup)) if warmup > 0 else jnp.ones_like(step)
  floor = float(optim.min_lr_ratio or 0.0)
  if not optim.get("zero_indexed_step", True):  # verl 0.9: its cosine schedule counts steps from 1
    step = step + 1.0
  ramp = step / max(1, warmup)
  progress = (step - warmup) / max(1, total_steps - warmup)
  wave = (1.0 - floor) * 0.5 * jnp.cos(math.pi * float(optim.num_cycles) * 2.0 * progress) + (1.0 + floor) * 0.5
  return jnp.where(step < warmup, ramp, jnp.maximum(floor, wave))


def make_schedule(optim, total_steps: int, updates_per_step: int) -> Callable:
  """Learning rate as a function of optax's update count."""
  return lambda count: optim.lr * lr_factor(count // updates_per_step, optim, total_steps)


VISION_TOWER = "visual"  # the vision tower's subtree in a vision-language model's state
MTP_LAYERS = "mtp"  # a MiMo model's multi-token prediction layers' subtree


def in_tower(path: tuple, subtree: str = VISION_TOWER) -> bool:
  """Whether a leaf at pytree `path` (of a model's state) belongs to `subtree` (default the vision tower)."""
  return bool(path) and getattr(path[0], "key", None) == subtree


def tower_frozen(tx: optax.GradientTransformation, subtree: str = VISION_TOWER) -> optax.GradientTransformation:
  """`tx` over every parameter but `subtree`'s, whose updates are zero and which hold no optimizer state
  (verl's freeze_vision_tower: the tower has no gradients, so no moments, decay or share of the clipped norm;
  the MTP layers of a run that loads them and does not train them, model.mtp.enable_train=false)."""
  labels = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
      lambda path, _: "frozen" if in_tower(path, subtree) else "trained", params)
  return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


def without_tower_gradients(params: Any) -> Any:
  """`params` with the vision tower's leaves behind stop_gradient (its gradients zero, its backward pass never
  computed)."""
  return jax.tree_util.tree_map_with_path(lambda path, x: jax.lax.stop_gradient(x) if in_tower(path) else x, params)


def make_optimizer(optim, grad_clip: float, total_steps: int, updates_per_step: int) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> AdamW(verl's schedule, weight_decay)."""
  schedule = make_schedule(optim, total_steps, updates_per_step)
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip and grad_clip > 0 else []
  b1, b2 = optim.get("betas", None) or (0.9, 0.999)
  parts.append(optax.adamw(schedule, b1=float(b1), b2=float(b2), eps=1e-8, weight_decay=float(optim.weight_decay)))
  return optax.chain(*parts)
