"""PF-PPO's drawing weights (verl 0.9.1's `compute_pf_ppo_reweight_data`) and the update's rows drawn again."""

import jax
import numpy as np
import pytest

from rljax.algos import pf_ppo

SCORES = np.array([-2.0, 1.0, 0.0, 1.0, 3.0], np.float32)


@pytest.mark.parametrize("method,weight_pow,expected", [
    ("pow", 2.0, [4.0, 1.0, 0.0, 1.0, 9.0]),  # |score| ** weight_pow
    ("pow", 0.5, [2.0 ** 0.5, 1.0, 0.0, 1.0, 3.0 ** 0.5]),
    ("max_min", 2.0, [1.0, 0.0, 0.0, 0.0, 1.0]),  # the highest and the lowest score
    ("max_random", 2.0, [0.1, 0.1, 0.1, 0.1, 0.4]),  # the highest score 0.4, the others 0.1
])
def test_weights_are_verls_plus_one_in_a_hundred_million(method, weight_pow, expected):
  np.testing.assert_allclose(pf_ppo.weights(SCORES, method, weight_pow), np.float32(expected) + np.float32(1e-8),
                             rtol=1e-6)


def test_an_unknown_method_is_named():
  with pytest.raises(ValueError, match="reweight_method='maxmin'"):
    pf_ppo.weights(SCORES, "maxmin", 2.0)


def test_rows_are_drawn_with_replacement_in_proportion_to_their_weights():
  # 4,000 rows in update order 3999..0, scores by row number: row r scores r % 4 - 1 (-1, 0, 1, 2)
  rows = 4000
  order, scores = np.arange(rows)[::-1], (np.arange(rows) % 4 - 1).astype(np.float32)
  drawn = pf_ppo.resampled_order(jax.random.key(0), order, scores, "pow", 1.0)
  assert drawn.shape == (rows,) and len(set(drawn.tolist())) < rows
  counts = np.bincount(scores[drawn].astype(int) + 1, minlength=4) / rows
  np.testing.assert_allclose(counts, [1 / 4, 0, 1 / 4, 2 / 4], atol=0.03)  # weights 1, 0, 1, 2 of a total 4
  only_extremes = pf_ppo.resampled_order(jax.random.key(1), order, scores, "max_min", 2.0)
  assert set(scores[only_extremes].tolist()) == {-1.0, 2.0}
  assert np.array_equal(drawn, pf_ppo.resampled_order(jax.random.key(0), order, scores, "pow", 1.0))  # by its key


def test_the_update_order_is_drawn_again_only_under_use_pf_ppo():
  import types  # pylint: disable=import-outside-toplevel
  from rljax import config as config_lib  # pylint: disable=import-outside-toplevel
  from rljax.rl import experience, sources, stages  # pylint: disable=import-outside-toplevel
  config = config_lib.get_base_config()
  config_lib.apply_overrides(config, ["algorithm.adv_estimator=gae", "algorithm.pf_ppo.reweight_method=max_random"])
  token_scores = np.zeros((8, 3), np.float32)
  token_scores[[2, 5], -1] = 1.0  # rows 2 and 5 score 1 (weight 0.4), the others 0 (0.1)
  rows = experience.Experience(token_level_scores=token_scores)
  parts = stages.StepParts(config=config, run=None, mesh=None, keys=sources.Keys.of(7))
  order, state = np.arange(8)[::-1], types.SimpleNamespace(step=3)
  assert np.array_equal(stages.resampled(parts, state, rows, order), order)
  config.algorithm.use_pf_ppo = True
  drawn = stages.resampled(parts, state, rows, order)
  key = sources.Keys.of(7).at(3, sources.Draw.PF_PPO)
  assert np.array_equal(drawn, pf_ppo.resampled_order(key, order, token_scores.sum(-1), "max_random", 2.0))
  config.algorithm.adv_estimator = "grpo"  # verl reweights under gae alone: the keys change nothing
  assert np.array_equal(stages.resampled(parts, state, rows, order), order)
