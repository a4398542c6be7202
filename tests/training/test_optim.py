"""The learning-rate schedules against verl 0.9.1's formulas."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rljax import config as config_lib
from rljax.training.optim import make_schedule


def verl_cosine(step: int, warmup: int, total: int, floor: float, zero_indexed: bool) -> float:
  """verl 0.9.1's get_cosine_schedule_with_warmup multiplier (init_lr_ratio unset: the warm-up starts at 0)."""
  step = step if zero_indexed else step + 1
  if step < warmup:
    return step / max(1, warmup)
  progress = (step - warmup) / max(1, total - warmup)
  return max(floor, (1 - floor) * 0.5 * math.cos(math.pi * 0.5 * 2.0 * progress) + (1 + floor) * 0.5)


@pytest.mark.parametrize("zero_indexed", [True, False])
def test_the_cosine_schedule_warms_up_from_zero_and_counts_steps_as_zero_indexed_step_says(zero_indexed):
  optim = config_lib.get_base_config().actor_rollout_ref.actor.optim
  optim.lr, optim.lr_scheduler_type, optim.lr_warmup_steps, optim.min_lr_ratio = 2.0, "cosine", 4, 0.1
  optim.zero_indexed_step = zero_indexed
  total = 20
  got = [float(make_schedule(optim, total, 3)(3 * s + 1)) for s in range(total + 2)]  # 3 updates a step
  np.testing.assert_allclose(got, [2.0 * verl_cosine(s, 4, total, 0.1, zero_indexed) for s in range(total + 2)],
                             rtol=1e-6, atol=1e-7)
  assert got[0] == (0.0 if zero_indexed else 0.5)


def megatron_get_lr(s: int, init: float, top: float, floor: float, warmup: int, decay: int, style: str,
                    wsd_steps: int | None = None, wsd_style: str = "exponential") -> float:
  """Megatron-Core's OptimizerParamScheduler.get_lr at num_steps=s, as written there (one param group)."""
  if warmup > 0 and s <= warmup:
    return init + (top - init) * float(s) / float(warmup)
  if style == "constant":
    return top
  if s > decay:
    return floor
  if style == "inverse-square-root":
    return max(floor, top * max(warmup, 1) ** 0.5 / (max(s, 1) ** 0.5))
  ratio = float(s - warmup) / float(decay - warmup)
  if style == "linear":
    coeff = 1.0 - ratio
  elif style == "cosine":
    coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
  else:
    start = decay - wsd_steps
    q = float(s - start) / float(wsd_steps)
    coeff = 1.0 if s <= start else {"linear": 1.0 - q, "cosine": 0.5 * (math.cos(math.pi * q) + 1.0),
                                    "exponential": 2.0 * math.pow(0.5, q) - 1.0, "minus_sqrt": 1.0 - math.sqrt(q)}[
                                        wsd_style]
  return floor + coeff * (top - floor)


MEGATRON_CASES = [  # (optim overrides, the (warm-up, decay) verl 0.9.1 derives over 20 training steps)
    (dict(lr_decay_style="cosine", min_lr=0.1, lr_warmup_steps=4, lr_warmup_init=0.5), (4, 20)),
    # the warm-up ratio is of the decay steps; an annealing style is read under WSD only (verl's YAML offers constant)
    (dict(lr_decay_style="linear", lr_decay_steps=12, lr_warmup_steps_ratio=0.25, lr_wsd_decay_style="constant"),
     (3, 12)),
    (dict(lr_decay_style="inverse-square-root", min_lr=0.3, lr_warmup_steps=2), (2, 20)),
    (dict(lr_decay_style="constant", lr_warmup_steps=5, lr_warmup_init=1.0), (5, 20)),
    *[(dict(lr_decay_style="WSD", lr_wsd_decay_steps=6, lr_wsd_decay_style=style, min_lr=0.2, lr_warmup_steps=2),
       (2, 20)) for style in ("linear", "cosine", "exponential", "minus_sqrt")],
]


@pytest.mark.parametrize("overrides,derived", MEGATRON_CASES, ids=[c[0]["lr_decay_style"] + "-" + str(i)
                                                                    for i, c in enumerate(MEGATRON_CASES)])
def test_a_megatron_role_s_learning_rate_is_megatron_s_scheduler_s(overrides, derived):
  optim = config_lib.get_base_config().actor_rollout_ref.actor.optim
  optim.lr = 2.0
  for key, value in overrides.items():
    optim[key] = value
  total = 20
  got = [float(make_schedule(optim, total, 3, "actor_rollout_ref.actor.optim")(3 * s + 2)) for s in range(total + 3)]
  warmup, decay = derived
  want = [megatron_get_lr(s, optim.lr_warmup_init, 2.0, optim.min_lr, warmup, decay, optim.lr_decay_style,
                          optim.lr_wsd_decay_steps, optim.lr_wsd_decay_style) for s in range(total + 3)]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_megatron_s_cosine_by_hand():
  optim = config_lib.get_base_config().actor_rollout_ref.actor.optim
  optim.lr, optim.lr_decay_style, optim.min_lr, optim.lr_warmup_steps, optim.lr_warmup_init = 1.0, "cosine", 0.2, 2, 0.1
  lr = make_schedule(optim, 6, 1, "critic.optim")
  # warm-up 0.1 -> 1.0 over steps 0..2, cosine from 1.0 at step 2 to 0.2 at step 6, then 0.2
  np.testing.assert_allclose([float(lr(s)) for s in range(8)],
                             [0.1, 0.55, 1.0, 0.2 + 0.8 * (1 + math.cos(math.pi / 4)) / 2, 0.6,
                              0.2 + 0.8 * (1 + math.cos(3 * math.pi / 4)) / 2, 0.2, 0.2], rtol=1e-6)


@pytest.mark.parametrize("overrides,message", [
    (dict(lr_decay_style="inverse_square_root"), "lr_decay_style='inverse_square_root': Megatron's scheduler knows "
     "constant, linear, cosine, inverse-square-root, WSD. Fix: set critic.optim.lr_decay_style=inverse-square-root"),
    (dict(lr_decay_style="WSD"), "critic.optim.lr_wsd_decay_steps=None: lr_decay_style=WSD anneals"),
    (dict(lr_decay_style="WSD", lr_wsd_decay_steps=4, lr_wsd_decay_style="constant"), "lr_wsd_decay_style='constant'"),
    (dict(lr_decay_style="WSD", lr_wsd_decay_steps=0), "critic.optim.lr_wsd_decay_steps=0: lr_decay_style=WSD"),
    (dict(min_lr=3.0), "critic.optim.min_lr=3.0: must lie in [0, critic.optim.lr=2.0]"),
    (dict(lr_warmup_init=2.5), "critic.optim.lr_warmup_init=2.5: must not exceed"),
    (dict(lr_warmup_steps=10), "critic.optim.lr_warmup_steps=10: a warm-up of 10 steps is not shorter than the 10"),
    (dict(lr_decay_steps=0), "critic.optim.lr_decay_steps=0: the schedule decays over 0 steps"),
    (dict(weight_decay_incr_style="exponential"), "weight_decay_incr_style='exponential'"),
])
def test_what_megatron_s_scheduler_refuses_is_a_config_error_naming_the_key(overrides, message):
  optim = config_lib.get_base_config().critic.optim
  optim.lr = 2.0
  for key, value in overrides.items():
    optim[key] = value
  with pytest.raises(config_lib.ConfigError) as info:
    make_schedule(optim, 10, 1, "critic.optim")
  assert message in str(info.value)


@pytest.mark.parametrize("megatron", [False, True])
def test_megatron_s_optimizer_leaves_biases_and_norm_scales_undecayed(megatron):
  # Megatron gives its 1-D parameters and *.bias wd_mult 0; verl's FSDP AdamW decays every parameter
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from rljax.models import CausalLM, ModelConfig  # pylint: disable=import-outside-toplevel
  from rljax.training.optim import make_optimizer  # pylint: disable=import-outside-toplevel
  cfg = ModelConfig(model_type="qwen2", vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
                    num_kv_heads=1, head_dim=4, qkv_bias=True)
  params = nnx.state(CausalLM(cfg, nnx.Rngs(0)), nnx.Param)
  params = jax.tree.map(lambda x: x + 1.0, params)  # biases start at zero: no decay to see there
  optim = config_lib.get_base_config().actor_rollout_ref.actor.optim
  optim.lr, optim.weight_decay = 0.5, 0.1
  tx = make_optimizer(optim, 0.0, 10, 1, "actor_rollout_ref.actor.optim" if megatron else None)
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  moved = {jax.tree_util.keystr(path): bool(np.any(np.asarray(u) != 0))
           for path, u in jax.tree_util.tree_leaves_with_path(updates)}
  held = [name for name in moved if name.endswith(("['scale'].value", "_bias'].value"))]
  assert len(held) == 6  # 3 norm scales, q/k/v biases
  assert all(moved[name] != megatron for name in held)
  assert all(moved[name] for name in moved if name not in held)
