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

A role whose strategy is megatron follows Megatron-Core's OptimizerParamScheduler instead, as verl 0.9.1's
get_megatron_optimizer_param_scheduler sets it up (`megatron_schedule`, `megatron_lr`): learning rates, not
multipliers, at training step s (verl steps it once per update_actor, from 0):

    D = lr_decay_steps, or total steps when null
    W = lr_warmup_steps if > 0 else int(lr_warmup_steps_ratio * D)
    s <= W (W > 0):     lr_warmup_init + (lr - lr_warmup_init) * s / W
    constant:           lr
    s > D:              min_lr
    inverse-square-root: max(min_lr, lr * sqrt(max(W, 1) / max(s, 1)))
    otherwise:          min_lr + (lr - min_lr) * c, r = (s - W) / (D - W), c by lr_decay_style:
      linear 1 - r; cosine (1 + cos(pi r)) / 2; WSD 1 until D - lr_wsd_decay_steps, then by
      lr_wsd_decay_style over q = (s - D + lr_wsd_decay_steps) / lr_wsd_decay_steps: linear 1 - q,
      cosine (1 + cos(pi q)) / 2, exponential 2 * 0.5^q - 1, minus_sqrt 1 - sqrt(q)

verl gives Megatron the same start and end weight decay, so weight_decay_incr_style changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rljax.config.errors import check


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


MEGATRON_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
MEGATRON_WSD_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
MEGATRON_WD_STYLES = ("constant", "linear", "cosine")


@dataclasses.dataclass(frozen=True)
class MegatronSchedule:
  """Megatron-Core's OptimizerParamScheduler settings as verl 0.9.1 passes them (the module docstring's names)."""
  init_lr: float
  max_lr: float
  min_lr: float
  warmup: int
  decay: int
  style: str
  wsd_steps: int | None
  wsd_style: str


def megatron_schedule(optim, total_steps: int, key: str) -> MegatronSchedule:
  """The scheduler verl 0.9.1 builds from a Megatron optim node (`key`, its path, for errors) over `total_steps`.

  Raises:
    ConfigError: for what Megatron's scheduler refuses (an unknown style, min_lr above lr, lr_warmup_init above lr,
      no decay steps, a warm-up as long as the decay, WSD without lr_wsd_decay_steps), naming the key.
  """
  decay = total_steps if optim.lr_decay_steps is None else optim.lr_decay_steps
  warmup = optim.lr_warmup_steps
  if optim.lr_warmup_steps_ratio is not None and (warmup is None or warmup <= 0):
    warmup = int(optim.lr_warmup_steps_ratio * decay)
  style, wsd_style = optim.lr_decay_style, optim.lr_wsd_decay_style
  checked = [("lr_decay_style", style, MEGATRON_DECAY_STYLES),
             ("weight_decay_incr_style", optim.weight_decay_incr_style, MEGATRON_WD_STYLES)]
  if style == "WSD":  # Megatron reads the annealing style under WSD only
    checked.append(("lr_wsd_decay_style", wsd_style, MEGATRON_WSD_STYLES))
  for name, value, allowed in checked:
    near = {"inverse_square_root": "inverse-square-root", "wsd": "WSD", "minus-sqrt": "minus_sqrt"}.get(value)
    check(value in allowed, f"{key}.{name}", value, f"Megatron's scheduler knows {', '.join(allowed)}",
          f"set {key}.{name}={near or allowed[0]}")
  lr, min_lr, init_lr = float(optim.lr), float(optim.min_lr), float(optim.lr_warmup_init)
  check(0.0 <= min_lr <= lr, f"{key}.min_lr", optim.min_lr, f"must lie in [0, {key}.lr={lr}]",
        f"set {key}.min_lr between 0 and the learning rate")
  check(init_lr <= lr, f"{key}.lr_warmup_init", optim.lr_warmup_init, f"must not exceed {key}.lr={lr}",
        f"set {key}.lr_warmup_init <= {key}.lr")
  check(decay > 0, f"{key}.lr_decay_steps", optim.lr_decay_steps,
        f"the schedule decays over {decay} steps (null: the run's {total_steps} training steps); Megatron needs > 0",
        f"set {key}.lr_decay_steps to a positive number of training steps")
  check(warmup < decay, f"{key}.lr_warmup_steps", optim.lr_warmup_steps,
        f"a warm-up of {warmup} steps is not shorter than the {decay} decay steps, which Megatron refuses",
        f"shorten the warm-up or set {key}.lr_decay_steps above it")
  wsd_steps = optim.lr_wsd_decay_steps
  check(style != "WSD" or (isinstance(wsd_steps, int) and wsd_steps > 0), f"{key}.lr_wsd_decay_steps", wsd_steps,
        "lr_decay_style=WSD anneals over its last lr_wsd_decay_steps steps (Megatron divides by them)",
        f"set {key}.lr_wsd_decay_steps to a positive number of steps")
  return MegatronSchedule(init_lr, lr, min_lr, int(warmup), int(decay), style, wsd_steps, wsd_style)


def megatron_lr(step, schedule: MegatronSchedule):
  """The learning rate Megatron's scheduler gives at training step `step` (0-based, any array shape)."""
  s = schedule
  step = jnp.asarray(step, jnp.float32)
  warm = s.init_lr + (s.max_lr - s.init_lr) * step / max(s.warmup, 1)
  if s.style == "constant":
    after = jnp.full_like(step, s.max_lr)
  elif s.style == "inverse-square-root":
    after = jnp.maximum(s.min_lr, s.max_lr * math.sqrt(max(s.warmup, 1)) / jnp.sqrt(jnp.maximum(step, 1.0)))
  else:
    after = s.min_lr + (s.max_lr - s.min_lr) * _megatron_coefficient(step, s)
  if s.style != "constant":
    after = jnp.where(step > s.decay, s.min_lr, after)
  return jnp.where(step <= s.warmup, warm, after) if s.warmup > 0 else after


def _megatron_coefficient(step, s: MegatronSchedule):
  """The decay coefficient c of the module docstring (linear, cosine and WSD styles)."""
  ratio = jnp.clip((step - s.warmup) / (s.decay - s.warmup), 0.0, 1.0)
  if s.style == "linear":
    return 1.0 - ratio
  if s.style == "cosine":
    return 0.5 * (jnp.cos(math.pi * ratio) + 1.0)
  anneal_start = s.decay - s.wsd_steps
  q = jnp.clip((step - anneal_start) / s.wsd_steps, 0.0, 1.0)
  annealed = {"linear": lambda: 1.0 - q, "cosine": lambda: 0.5 * (jnp.cos(math.pi * q) + 1.0),
              "exponential": lambda: 2.0 * jnp.power(0.5, q) - 1.0, "minus_sqrt": lambda: 1.0 - jnp.sqrt(q)}
  return jnp.where(step <= anneal_start, 1.0, annealed[s.wsd_style]())


def make_schedule(optim, total_steps: int, updates_per_step: int, megatron_key: str | None = None) -> Callable:
  """Learning rate as a function of optax's update count: verl's FSDP schedule, or with `megatron_key` (the path
  of a Megatron role's optim node) Megatron's (`megatron_schedule`)."""
  if megatron_key is not None:
    schedule = megatron_schedule(optim, total_steps, megatron_key)
    return lambda count: megatron_lr(count // updates_per_step, schedule)
  return lambda count: optim.lr * lr_factor(count // updates_per_step, optim, total_steps)


VISION_TOWER = "visual"  # the vision tower's subtree in a vision-language model's state
MTP_LAYERS = "mtp"  # a MiMo model's multi-token prediction layers' subtree


def in_tower(path: tuple, subtree: str = VISION_TOWER) -> bool:
  """Whether a leaf at pytree `path` (of a model's state) belongs to `subtree` (default the vision tower)."""
  return bool(path) and getattr(path[0], "key", None) == subtree


def is_router(path: tuple) -> bool:
  """Whether a leaf at pytree `path` (of a model's state) is a mixture-of-experts layer's router (`mlp/router`)."""
  keys = [getattr(part, "key", None) for part in path]
  return any(a == "mlp" and b == "router" for a, b in zip(keys, keys[1:]))


def frozen_leaves(tower: bool, router: bool) -> Callable[[tuple], bool] | None:
  """Which leaves (by pytree path) take no gradient and no update: the vision tower's (`tower`, verl's
  freeze_vision_tower), the routers' (`router`, Megatron's freeze_moe_router); None where neither."""
  if not (tower or router):
    return None
  return lambda path: (tower and in_tower(path)) or (router and is_router(path))


def with_frozen(tx: optax.GradientTransformation, is_frozen: Callable[[tuple], bool]) -> optax.GradientTransformation:
  """`tx` over every parameter but those `is_frozen` picks (by pytree path), whose updates are zero and which hold
  no optimizer state (they have no gradient, so no moments, decay or share of the clipped norm)."""
  labels = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
      lambda path, _: "frozen" if is_frozen(path) else "trained", params)
  return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


def tower_frozen(tx: optax.GradientTransformation, subtree: str = VISION_TOWER) -> optax.GradientTransformation:
  """`tx` with `subtree` (default the vision tower) frozen (`with_frozen`): verl's freeze_vision_tower, or the MTP
  layers of a run that loads them and does not train them (model.mtp.enable_train=false)."""
  return with_frozen(tx, lambda path: in_tower(path, subtree))


def without_gradients(params: Any, is_frozen: Callable[[tuple], bool]) -> Any:
  """`params` with the leaves `is_frozen` picks behind stop_gradient (their gradients zero, their backward pass
  never computed)."""
  return jax.tree_util.tree_map_with_path(lambda path, x: jax.lax.stop_gradient(x) if is_frozen(path) else x, params)


def make_optimizer(optim, grad_clip: float, total_steps: int, updates_per_step: int,
                   megatron_key: str | None = None) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> AdamW(verl's schedule, weight_decay); with `megatron_key` (as make_schedule's)
  Megatron's schedule, and its weight decay on the leaves `megatron_decayed` picks."""
  schedule = make_schedule(optim, total_steps, updates_per_step, megatron_key)
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip and grad_clip > 0 else []
  b1, b2 = optim.get("betas", None) or (0.9, 0.999)
  parts.append(optax.adamw(schedule, b1=float(b1), b2=float(b2), eps=1e-8, weight_decay=float(optim.weight_decay),
                           mask=None if megatron_key is None else megatron_decayed))
  return optax.chain(*parts)


def megatron_decayed(params: Any) -> Any:
  """Which leaves Megatron's optimizer decays (a tree of bools like `params`): all but biases and norm scales, its
  1-D parameters and `*.bias` (wd_mult 0); verl's FSDP optimizer decays every parameter."""
  def decayed(path, _):
    names = [part.key for part in path if isinstance(getattr(part, "key", None), str)]
    last = names[-1] if names else ""
    return not (last == "scale" or last == "bias" or last.endswith("_bias"))
  return jax.tree_util.tree_map_with_path(decayed, params)
