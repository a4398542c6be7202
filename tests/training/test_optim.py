"""The learning-rate schedules against verl 0.9.1's formulas."""

import math

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
