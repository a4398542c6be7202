"""Which estimators read the whole batch: a host computing its own rows' advantages (whole groups) gets one
process's numbers exactly when the estimator is not listed as batch-wide (`advantage_stage.reads_every_row`)."""

import numpy as np
import pytest

from rljax import config as C
from rljax.algos import advantages as adv_lib
from rljax.rl import advantage_stage
from rljax.rl.experience import Experience


def inputs(rows, group, seed):
  """AdvantageInputs of `rows` rows in groups of `group`, 5 tokens, varied lengths, scores, values, components and
  old-policy statistics."""
  rng = np.random.default_rng(seed)
  mask = (np.arange(5)[None, :] < rng.integers(1, 6, rows)[:, None]).astype(np.int32)
  rewards = np.where(np.arange(5)[None, :] == mask.sum(1, keepdims=True) - 1, rng.integers(0, 3, (rows, 1)), 0.0)
  return adv_lib.AdvantageInputs(
      rewards.astype(np.float32), mask, group_ids=np.repeat(np.arange(rows // group), group).astype(np.int32),
      num_groups=rows // group, values=rng.normal(size=(rows, 5)).astype(np.float32),
      reward_baselines=rng.normal(size=rows).astype(np.float32),
      reward_components={"acc": rng.integers(0, 2, rows).astype(np.float32)},
      old_log_probs=-rng.random((rows, 5)).astype(np.float32), sum_pi_squared=rng.random((rows, 5)).astype(np.float32))


def half(x, which, rows):
  """Host `which` of 2's rows of x (group ids renumbered from 0, as each host numbers its own)."""
  if isinstance(x, dict):
    return {k: half(v, which, rows) for k, v in x.items()}
  if isinstance(x, np.ndarray) and x.shape[:1] == (rows,):
    part = x[which * rows // 2:(which + 1) * rows // 2]
    return part - part.min() if x.dtype == np.int32 and x.ndim == 1 else part
  return x


@pytest.mark.parametrize("name", adv_lib.adv_estimator_names())
def test_only_the_batch_wide_estimators_depend_on_other_hosts_rows(name):
  whole = inputs(16, 4, seed=1)
  one, _ = adv_lib.compute_advantage(name, whole)
  fields = {k: getattr(whole, k) for k in whole.__dataclass_fields__}
  halves = [adv_lib.compute_advantage(name, adv_lib.AdvantageInputs(**{
      k: (v // 2 if k == "num_groups" else half(v, h, 16)) for k, v in fields.items()}))[0] for h in (0, 1)]
  local = np.allclose(np.concatenate(halves), one, rtol=1e-6, atol=1e-6)
  assert local != adv_lib.estimator_inputs(name).batch_wide


def test_a_quantized_rollout_reports_its_log_prob_mismatch_over_the_whole_batch():
  """rollout.quantization without a correction: the step reads the rollout's and the trainer's log-probs over
  every host's rows and reports verl's rollout_corr/* diagnostics; with neither, it reads neither."""
  config = C.get_base_config()
  config.data.train_batch_size, config.algorithm.adv_estimator = 4, "grpo"
  assert "rollout_log_probs" not in advantage_stage.inputs(config) and not advantage_stage.reads_every_row(config)
  config.actor_rollout_ref.rollout.quantization = "int8"
  assert {"old_log_probs", "rollout_log_probs"} <= set(advantage_stage.inputs(config))
  assert advantage_stage.reads_every_row(config)
  rng = np.random.default_rng(0)
  old = -rng.random((16, 5)).astype(np.float32)
  rollout = old + rng.normal(0, 0.05, (16, 5)).astype(np.float32)
  mask = (np.arange(5)[None, :] < rng.integers(1, 6, 16)[:, None]).astype(np.int32)
  rows = Experience(token_level_scores=np.zeros((16, 5), np.float32), response_mask=mask,
                    group=np.repeat(np.arange(4), 4).astype(np.int32), old_log_probs=old, rollout_log_probs=rollout)
  _, (_, metrics) = advantage_stage.stage(config, rows, None)
  np.testing.assert_allclose(metrics["rollout_corr/kl"], ((rollout - old) * mask).sum() / mask.sum(), rtol=1e-5)
  assert {"rollout_corr/log_ppl_abs_diff", "rollout_corr/chi2_token"} <= set(metrics)
