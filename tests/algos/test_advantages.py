"""Tests for rljax.algos.advantages and rljax.algos.masked.

Three kinds of check: hand-worked cases (the expected numbers are derived in
the test with plain arithmetic), an independent NumPy reference written from
the spec (`np_ref_advantages`) on a random batch with every awkward feature
at once, and sharded == unsharded on 8 CPU devices.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rljax.algos import advantages as adv
from rljax.algos import masked
from tests.algos import np_ref_advantages as ref

VERL_NAMES = {
    "gae", "grpo", "grpo_vectorized", "gdpo", "grpo_passk",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo",
    "rloo_vectorized", "opo", "gpg", "optimal_token_baseline",
    "tir_optimal_token_baseline",
}

TOL = dict(rtol=1e-5, atol=1e-5)


def assert_on_valid(actual, expected, mask):
  """`actual == expected` on valid tokens, and `actual == 0` on padding."""
  actual = np.asarray(actual)
  mask = np.asarray(mask) != 0
  np.testing.assert_allclose(actual[mask], np.asarray(expected)[mask], **TOL)
  assert np.all(actual[~mask] == 0.0), "padding must be exactly 0"


# ----------------------------------------------------------------------------
# A small hand-worked batch.
#
# rows:    0              1          2            3
# rewards  [0, .5, .5]    [2, 0, 0]  [0, 0, 3]    [0, 0, 5]
# mask     [1, 1, 0]      [1, 0, 0]  [1, 1, 1]    [1, 1, 1]
# score    1 (.5 sits on padding and still counts)  2   3   5
# group    3              0          3            3    -> {0, 2, 3} and {1}
# ----------------------------------------------------------------------------

R = np.array([[0, .5, .5], [2, 0, 0], [0, 0, 3], [0, 0, 5]], np.float32)
M = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], np.float32)
IDX = np.array([3, 0, 3, 3], np.int32)


def rows_to_tokens(row_values, mask=M):
  return np.asarray(row_values, np.float64)[:, None] * mask


def whiten_by_hand(row_values, mask=M):
  """Global token-weighted whitening, unbiased variance, + 1e-8."""
  tokens = [row_values[i] for i in range(len(row_values))
            for t in range(mask.shape[1]) if mask[i, t]]
  n = len(tokens)
  mean = sum(tokens) / n
  var = sum((x - mean) ** 2 for x in tokens) / (n - 1)
  return [(a - mean) / math.sqrt(var + 1e-8) for a in row_values]


def test_grpo_by_hand():
  # group {1, 3, 5}: mean 3, unbiased std sqrt((4 + 0 + 4) / 2) = 2.
  expected = [(1 - 3) / (2 + 1e-6), 2 / (1 + 1e-6), 0.0, (5 - 3) / (2 + 1e-6)]
  for name in ("grpo", "grpo_vectorized"):
    a, r = adv.get_adv_estimator(name)(R, M, IDX)
    assert_on_valid(a, rows_to_tokens(expected), M)
    assert_on_valid(r, rows_to_tokens(expected), M)
  a, _ = adv.compute_grpo_outcome_advantage(
      R, M, IDX, norm_adv_by_std_in_grpo=False)
  assert_on_valid(a, rows_to_tokens([-2, 2, 0, 2]), M)


def test_grpo_identical_scores_and_arbitrary_ids():
  # three equal scores of 0.1 (not exact in float32) give exactly 0.
  rewards = np.array([[.1, 0], [0, .1], [.1, 0], [.7, 0]], np.float32)
  mask = np.ones((4, 2), np.float32)
  a, _ = adv.compute_grpo_outcome_advantage(
      rewards, mask, np.array([40, 40, 40, 7]), num_groups=41)
  np.testing.assert_array_equal(np.asarray(a)[:3], 0.0)
  np.testing.assert_allclose(np.asarray(a)[3], 0.7 / (1 + 1e-6), rtol=1e-6)


def test_rloo_by_hand():
  # leave-one-out means: 1 - (3+5)/2 = -3, 3 - (1+5)/2 = 0, 5 - (1+3)/2 = 3.
  a, _ = adv.get_adv_estimator("rloo")(R, M, IDX)
  assert_on_valid(a, rows_to_tokens([-3, 2, 0, 3]), M)  # singleton keeps s
  a, _ = adv.get_adv_estimator("rloo_vectorized")(R, M, IDX)
  assert_on_valid(a, rows_to_tokens([-3, 0, 0, 3]), M)  # singleton -> 0


def test_opo_by_hand():
  # lengths 2, 3, 3 -> b = (2*1 + 3*3 + 3*5) / 8 = 3.25; singleton b = 0.
  a, r = adv.get_adv_estimator("opo")(R, M, IDX)
  assert_on_valid(a, rows_to_tokens([1 - 3.25, 2, 3 - 3.25, 5 - 3.25]), M)
  assert_on_valid(r, a, M)


def test_gpg_by_hand():
  rewards = R.copy()
  rewards[0] = 0.0  # scores 0, 2, 3, 5: three nonzero -> alpha = 4/3
  alpha = 4 / 3
  mean = (0 + 3 + 5) / 3
  expected = [alpha * (0 - mean), alpha * 2, alpha * (3 - mean),
              alpha * (5 - mean)]
  a, _ = adv.get_adv_estimator("gpg")(rewards, M, IDX, alpha=123.0)
  assert_on_valid(a, rows_to_tokens(expected), M)
  a, _ = adv.compute_gpg_outcome_advantage(rewards, M, IDX, f_norm=2.0)
  assert_on_valid(a, rows_to_tokens(expected) / 2, M)


def test_reinforce_plus_plus_baseline_by_hand():
  row = [1 - 3, 2, 3 - 3, 5 - 3]  # s - group mean; singleton mean 0
  a, _ = adv.get_adv_estimator("reinforce_plus_plus_baseline")(R, M, IDX)
  assert_on_valid(a, rows_to_tokens(whiten_by_hand(row)), M)


def test_gdpo_by_hand():
  row = [(1 - 3) / (2 + 1e-6), 2 / (1 + 1e-6), 0.0, (5 - 3) / (2 + 1e-6)]
  a, _ = adv.get_adv_estimator("gdpo")(R, M, IDX)
  assert_on_valid(a, rows_to_tokens(whiten_by_hand(row)), M)
  # Two components from non_tensor_batch, weights 1 and 2: row 0 wins on
  # "acc", row 3 on "fmt".
  config = {"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [1, 2]}
  ntb = {"acc": np.array([1.0, 0.0, 0.0, 0.0], dtype=object),
         "fmt": np.array([0.0, 1.0, 0.0, 1.0], dtype=object)}
  std_acc = math.sqrt(((1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
  acc = [(1 - 1 / 3) / (std_acc + 1e-6), 0.0, (-1 / 3) / (std_acc + 1e-6),
         (-1 / 3) / (std_acc + 1e-6)]
  fmt = [(-1 / 3) / (std_acc + 1e-6), 1 / (1 + 1e-6),
         (-1 / 3) / (std_acc + 1e-6), (2 / 3) / (std_acc + 1e-6)]
  row = [x + 2 * y for x, y in zip(acc, fmt)]
  a, _ = adv.compute_gdpo_outcome_advantage(
      R, M, IDX, config=config, non_tensor_batch=ntb, batch={})
  assert_on_valid(a, rows_to_tokens(whiten_by_hand(row)), M)
  with pytest.raises(ValueError, match="gdpo_reward_keys"):
    adv.compute_gdpo_outcome_advantage(
        R, M, IDX, config={}, non_tensor_batch=ntb, batch={})


def test_grpo_passk_by_hand():
  index = np.array([0, 0, 1, 1])  # {1, 2} and {3, 5}
  a, _ = adv.get_adv_estimator("grpo_passk")(R, M, index)
  expected = [0, 1 / (math.sqrt(0.5) + 1e-6), 0, 2 / (math.sqrt(2) + 1e-6)]
  assert_on_valid(a, rows_to_tokens(expected), M)
  off = ml_collections.ConfigDict({"norm_adv_by_std_in_grpo": False})
  a, _ = adv.compute_grpo_passk_outcome_advantage(R, M, index, config=off)
  assert_on_valid(a, rows_to_tokens([0, 1, 0, 2]), M)
  tie = np.array([[1, 0], [1, 0], [0.5, 0]], np.float32)
  a, _ = adv.compute_grpo_passk_outcome_advantage(
      tie, np.ones((3, 2)), np.array([0, 0, 0]))
  np.testing.assert_array_equal(a, 0.0)


def test_grpo_passk_needs_two_per_group():
  with pytest.raises(ValueError, match="at least 2 samples"):
    adv.compute_grpo_passk_outcome_advantage(R, M, IDX)
  jitted = jax.jit(adv.compute_grpo_passk_outcome_advantage)
  a, _ = jitted(R, M, IDX)  # traced: the singleton gets 0
  assert np.all(np.asarray(a)[1] == 0.0)


def test_gae_by_hand():
  # One row with a hole at t=1, gamma=.9, lam=.8, walked backwards:
  # t=2: delta = 1 - .2 = .8, acc = .8, next = .2
  # t=1: masked, acc and next carried
  # t=0: delta = .9*.2 - .5 = -.32, acc = -.32 + .72*.8 = .256
  rewards = np.array([[0, 0, 1]], np.float32)
  values = np.array([[.5, 9, .2]], np.float32)
  mask = np.array([[1, 0, 1]], np.float32)
  a, r = adv.compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8)
  raw = [0.256, 0.8]
  mean, var = sum(raw) / 2, (raw[0] - raw[1]) ** 2 / 2
  expected = [(raw[0] - mean) / math.sqrt(var + 1e-8), 0,
              (raw[1] - mean) / math.sqrt(var + 1e-8)]
  assert_on_valid(a, [expected], mask)
  assert_on_valid(r, [[0.256 + 0.5, 0, 0.8 + 0.2]], mask)
  config = ml_collections.ConfigDict({"gamma": 0.9, "lam": 0.8})
  a2, r2 = adv.compute_gae_advantage_return(
      rewards, values, mask, config=config)
  np.testing.assert_array_equal(a2, a)
  np.testing.assert_array_equal(r2, r)


def test_reinforce_plus_plus_by_hand():
  # t=2: G = 1; t=1 masked (its reward 7 is dropped); t=0: G = .5 + .9*1.
  rewards = np.array([[.5, 7, 1]], np.float32)
  mask = np.array([[1, 0, 1]], np.float32)
  a, r = adv.get_adv_estimator("reinforce_plus_plus")(
      rewards, mask, {"gamma": 0.9})
  assert_on_valid(r, [[1.4, 0, 1.0]], mask)
  scale = math.sqrt(0.08 + 1e-8)  # unbiased var of {1.4, 1.0}
  assert_on_valid(a, [[0.2 / scale, 0, -0.2 / scale]], mask)


def test_remax_by_hand():
  rewards = np.array([[0, 1, 2]], np.float32)
  mask = np.array([[1, 1, 0]], np.float32)
  a, r = adv.get_adv_estimator("remax")(rewards, np.array([0.5]), mask)
  assert_on_valid(r, [[1, 1, 0]], mask)
  assert_on_valid(a, [[0.5, 0.5, 0]], mask)


# Optimal token baseline: p = exp(log .5) = .5 and Σπ² = .5 make every
# per-token weight w = 1 - 2*.5 + .5 = .5.
def _otb_inputs(mask):
  old = np.full(mask.shape, math.log(0.5), np.float32)
  return old, np.full(mask.shape, 0.5, np.float32)


def test_optimal_token_baseline_by_hand():
  rewards = np.array([[0, 0, 1], [0, 2, 0], [3, 0, 0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], np.float32)
  index = np.array([0, 0, 1])
  # G_a = [1, 1, 1], W_a = [.5, 1, 1.5]; G_b = [2, 2, 0], W_b = [.5, 1, 1].
  # B_0 = (.5 + 1) / 1 = 1.5, B_1 = (1 + 2) / 2 = 1.5, B_2 = 1.5/1.5 = 1.
  # Row a is the unique longest (3 > 2): its baseline is 0 from t = 2.
  old, sps = _otb_inputs(mask)
  a, r = adv.get_adv_estimator("optimal_token_baseline")(
      rewards, mask, index, old, sps)
  assert_on_valid(a, [[-0.5, -0.5, 1], [0.5, 0.5, 0], [3, 0, 0]], mask)
  assert_on_valid(r, [[1, 1, 1], [2, 2, 0], [3, 0, 0]], mask)
  a, _ = adv.compute_optimal_token_baseline_advantage(
      rewards, mask, index, old, sps, handle_zero_tail=False)
  assert_on_valid(a, [[-0.5, -0.5, 0], [0.5, 0.5, 0], [3, 0, 0]], mask)
  # IS weights of 2 on every token scale W by 4; the baseline is unchanged.
  a, _ = adv.compute_optimal_token_baseline_advantage(
      rewards, mask, index, old, sps, rollout_is_weights=np.full((3, 3), 2.0))
  assert_on_valid(a, [[-0.5, -0.5, 1], [0.5, 0.5, 0], [3, 0, 0]], mask)


def test_tir_optimal_token_baseline_by_hand():
  # Row a has a tool span at t=1; ranks of its valid tokens: t=0,2,3 -> 0,1,2.
  # Compact: R_a = [1, 1, 1], W_a = [.5, 1, 1.5]; R_b = [2, 2], W_b = [.5, 1].
  # b_0 = 1.5, b_1 = 1.5, b_2 = 1 -> zeroed for a (unique longest, L2 = 2).
  # Row c is empty: left out, so the group still has two members. Row d's
  # only partner (e) is empty too, so d is a singleton: baseline 0.
  rewards = np.array([[0, 0, 0, 1], [0, 2, 0, 0], [5, 5, 5, 5],
                      [0, 4, 0, 0], [9, 0, 0, 0]], np.float32)
  mask = np.array([[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0],
                   [0, 0, 0, 0]], np.float32)
  index = np.array([2, 2, 2, 4, 4])
  old, sps = _otb_inputs(mask)
  a, r = adv.get_adv_estimator("tir_optimal_token_baseline")(
      rewards, mask, index, old, sps)
  expected = [[-0.5, 0, -0.5, 1], [0.5, 0.5, 0, 0], [0] * 4, [4, 4, 0, 0],
              [0] * 4]
  assert_on_valid(a, expected, mask)
  assert_on_valid(r, [[1, 1, 1, 1], [2, 2, 0, 0], [0] * 4, [4, 4, 0, 0],
                      [0] * 4], mask)
  # Without the zero-tail rule the last column of row a keeps b_2 = 1, and
  # row d stays a singleton (were empty row e counted, d's baseline would
  # be its own return and its advantage ~0).
  a, _ = adv.compute_multi_turn_optimal_token_baseline_advantage(
      rewards, mask, index, old, sps, handle_zero_tail=False)
  expected = [[-0.5, 0, -0.5, 0], [0.5, 0.5, 0, 0], [0] * 4, [4, 4, 0, 0],
              [0] * 4]
  assert_on_valid(a, expected, mask)


# ----------------------------------------------------------------------------
# Masked helpers.
# ----------------------------------------------------------------------------


def test_masked_helpers_by_hand():
  v = np.array([[1, 2, np.nan], [4, np.inf, 6]], np.float32)
  m = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
  assert float(masked.masked_sum(v, m)) == 13.0
  np.testing.assert_allclose(masked.masked_mean(v, m, axis=-1), [1.5, 5.0])
  # values 1, 2, 4, 6: mean 3.25, squared deviations sum 14.75.
  np.testing.assert_allclose(masked.masked_var(v, m), 14.75 / 3, rtol=1e-6)
  np.testing.assert_allclose(
      masked.masked_var(v, m, unbiased=False), 14.75 / 4, rtol=1e-6)
  white = np.asarray(masked.masked_whiten(v, m))
  np.testing.assert_allclose(
      white[0, :2], (np.array([1, 2]) - 3.25) / math.sqrt(14.75 / 3 + 1e-8),
      rtol=1e-6)
  assert float(masked.masked_mean(v, np.zeros_like(m))) == 0.0
  one_valid = np.array([[1, 0, 0], [0, 0, 0]], np.float32)
  assert np.isnan(float(masked.masked_var(v, one_valid)))


def test_group_mean_std_by_hand():
  scores = np.array([1, 5, 3, 7, 2], np.float32)
  mean, std = masked.group_mean_std(scores, np.array([2, 0, 2, 0, 4]), 5)
  # group 0: {5, 7}; group 2: {1, 3}; group 4: {2} (singleton); 1, 3 empty.
  np.testing.assert_allclose(mean, [6, 0, 2, 0, 0])
  np.testing.assert_allclose(std, [math.sqrt(2), 1, math.sqrt(2), 1, 1],
                             rtol=1e-6)
  _, std = masked.group_mean_std(np.ones(3), np.zeros(3, np.int32), 1, eps=0.25)
  np.testing.assert_allclose(std, [0.5])


def test_group_ids_from_labels_and_validation():
  ids, n = masked.group_ids_from_labels(["b", "a", "c", "a", "b"])
  np.testing.assert_array_equal(ids, [1, 0, 2, 0, 1])
  assert n == 3 and ids.dtype == np.int32
  with pytest.raises(ValueError, match="num_groups"):
    adv.compute_grpo_outcome_advantage(R, M, np.array([0, 4, 0, 0]))
  with pytest.raises(ValueError, match="integer group ids"):
    adv.compute_grpo_outcome_advantage(R, M, np.array(["a", "b", "a", "a"]))
  with pytest.raises(ValueError, match="needs `index`"):
    adv.compute_grpo_outcome_advantage(R, M, None)


# ----------------------------------------------------------------------------
# Registry and dispatch.
# ----------------------------------------------------------------------------


def test_registry_has_verls_names():
  assert set(adv.adv_estimator_names()) == VERL_NAMES
  for name in VERL_NAMES:
    assert callable(adv.get_adv_estimator(name))


def test_unknown_estimator_lists_valid_names():
  with pytest.raises(KeyError) as info:
    adv.get_adv_estimator("grpoo")
  message = str(info.value)
  assert "grpoo" in message and "algorithm.adv_estimator" in message
  for name in VERL_NAMES:
    assert name in message
  with pytest.raises(KeyError, match="valid names"):
    adv.compute_advantage("nope", adv.AdvantageInputs(R, M, IDX))


def test_compute_advantage_dispatch():
  config = ml_collections.ConfigDict(
      {"gamma": 0.9, "lam": 0.8, "norm_adv_by_std_in_grpo": False})
  values = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
  inputs = adv.AdvantageInputs(R, M, group_ids=IDX, values=values)
  got = adv.compute_advantage("gae", inputs, config)
  want = adv.compute_gae_advantage_return(R, values, M, 0.9, 0.8)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  with pytest.raises(ValueError, match="'gae' needs `values`: the critic's values"):
    adv.compute_advantage("gae", adv.AdvantageInputs(R, M), config)
  # The norm flag reaches grpo_vectorized (verl's trainer would drop it).
  a, _ = adv.compute_advantage("grpo_vectorized", inputs, config)
  assert_on_valid(a, rows_to_tokens([-2, 2, 0, 2]), M)
  a, _ = adv.compute_advantage("grpo", inputs, {"norm_adv_by_std_in_grpo": True})
  assert_on_valid(a, rows_to_tokens([-1 / (1 + 5e-7), 2 / (1 + 1e-6), 0,
                                     1 / (1 + 5e-7)]), M)
  with pytest.raises(ValueError, match="'grpo' needs `group_ids`"):
    adv.compute_advantage("grpo", adv.AdvantageInputs(R, M), config)
  a, _ = adv.compute_advantage("remax", adv.AdvantageInputs(R, M, reward_baselines=np.ones(4)))
  want = adv.compute_remax_outcome_advantage(R, np.ones(4), M)[0]
  assert_on_valid(a, want, M)
  a, _ = adv.compute_advantage("rloo", adv.AdvantageInputs(R, M, group_ids=np.array([6, 1, 6, 6]), num_groups=7))
  assert_on_valid(a, rows_to_tokens([-3, 2, 0, 3]), M)
  old, sps = _otb_inputs(M)
  a, _ = adv.compute_advantage("optimal_token_baseline",
                               adv.AdvantageInputs(R, M, IDX, old_log_probs=old, sum_pi_squared=sps))
  want = adv.compute_optimal_token_baseline_advantage(R, M, IDX, old, sps)[0]
  assert_on_valid(a, want, M)
  with pytest.raises(ValueError, match="sum_pi_squared"):
    adv.compute_advantage("optimal_token_baseline", adv.AdvantageInputs(R, M, IDX, old_log_probs=old))
  # gdpo reads the reward components (verl's non_tensor_batch) by algorithm.gdpo_reward_keys
  components = {"acc": np.array([1.0, 0.0, 0.0, 0.0]), "fmt": np.array([0.0, 1.0, 0.0, 1.0])}
  gdpo = {"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [1, 2]}
  a, _ = adv.compute_advantage("gdpo", adv.AdvantageInputs(R, M, IDX, reward_components=components), gdpo)
  want = adv.compute_gdpo_outcome_advantage(R, M, IDX, config=gdpo, non_tensor_batch=components, batch={})[0]
  assert_on_valid(a, want, M)
  with pytest.raises(ValueError, match=r"gdpo_reward_keys names \['len'\], but the reward components are \['acc', 'fmt'\]"):
    adv.compute_advantage("gdpo", adv.AdvantageInputs(R, M, IDX, reward_components=components),
                          {"gdpo_reward_keys": ["acc", "len"]})


def test_every_estimator_declares_what_it_reads():
  for name in adv.adv_estimator_names():
    declared = adv.estimator_inputs(name)
    fn = adv.get_adv_estimator(name)
    # each declared argument is one of the estimator's own parameters, and every field it needs is an input
    assert set(declared.reads) <= set(fn.__code__.co_varnames[:fn.__code__.co_argcount]), name
    assert set(declared.needs) <= {f.name for f in dataclasses.fields(adv.AdvantageInputs)}, name
  with pytest.raises(KeyError, match="valid names"):
    adv.estimator_inputs("nope")
  # a need the inputs record does not describe fails at registration, naming the ones it may name
  with pytest.raises(ValueError, match=r"estimator 'mine' needs \['critic_values'\].*values, reward_baselines"):
    adv.estimator("mine", reads=("token_level_rewards",), needs=("values", "critic_values"))


# ----------------------------------------------------------------------------
# Against the NumPy reference on a random batch.
#
# 12 rows, T = 8. Groups (ids not contiguous, uneven): 5 -> {0, 2, 5, 11},
# 2 -> {1, 4, 8}, 9 -> {3, 7}, 0 -> {6} (singleton), 7 -> {9, 10} (equal
# scores). Row 8 has no valid token; rows 2 and 7 have tool spans (holes);
# rewards are dense and also sit on padding.
# ----------------------------------------------------------------------------

B, T = 12, 8
INDEX = np.array([5, 2, 5, 9, 2, 5, 0, 9, 2, 7, 7, 5], np.int32)


def _random_batch(seed=0):
  rng = np.random.default_rng(seed)
  lengths = [8, 5, 8, 3, 7, 1, 4, 8, 0, 6, 6, 2]
  mask = np.zeros((B, T), np.float32)
  for i, n in enumerate(lengths):
    mask[i, :n] = 1
  mask[2, 2:5] = 0  # tool output in the middle of row 2
  mask[7, [1, 4, 5]] = 0  # two tool spans in row 7
  rewards = rng.normal(size=(B, T)).astype(np.float32)
  rewards[10] = rewards[9]  # identical scores in group 7
  probs = rng.uniform(0.05, 0.95, size=(B, T))
  sum_pi_sq = probs ** 2 + (1 - probs) ** 2 * rng.uniform(0, 1, size=(B, T))
  return dict(
      rewards=rewards,
      mask=mask,
      values=rng.normal(size=(B, T)).astype(np.float32),
      baselines=rng.normal(size=B).astype(np.float32),
      old_log_probs=np.log(probs).astype(np.float32),
      sum_pi_squared=sum_pi_sq.astype(np.float32),
      is_weights=rng.uniform(0.5, 1.5, size=(B, T)).astype(np.float32),
      acc=rng.integers(0, 2, size=B).astype(np.float32),
      fmt=rng.uniform(size=B).astype(np.float32),
  )


DATA = _random_batch()
PASSK_INDEX = np.where(INDEX == 0, 7, INDEX)  # every group >= 2


def _reference_cases():
  d = DATA
  r, m, i = d["rewards"], d["mask"], INDEX
  gdpo_config = {"gdpo_reward_keys": ["acc", "fmt"],
                 "gdpo_reward_weights": [1.0, 0.5]}
  ntb = {"acc": d["acc"].astype(object), "fmt": d["fmt"].astype(object)}
  batch = {"prompts": np.zeros((B, 3)),
           "attention_mask": np.concatenate([np.ones((B, 3)), m], axis=1)}
  otb = (d["old_log_probs"], d["sum_pi_squared"])
  return {
      "gae": (
          lambda: adv.compute_gae_advantage_return(
              r, d["values"], m, 0.95, 0.9),
          lambda: ref.gae(r, d["values"], m, 0.95, 0.9)),
      "grpo": (lambda: adv.compute_grpo_outcome_advantage(r, m, i),
               lambda: ref.grpo(r, m, i)),
      "grpo_no_std": (
          lambda: adv.compute_grpo_outcome_advantage(
              r, m, i, norm_adv_by_std_in_grpo=False),
          lambda: ref.grpo(r, m, i, norm=False)),
      "grpo_vectorized": (
          lambda: adv.get_adv_estimator("grpo_vectorized")(r, m, i),
          lambda: ref.grpo_vectorized(r, m, i)),
      "gdpo": (lambda: adv.compute_gdpo_outcome_advantage(r, m, i),
               lambda: ref.gdpo(r, m, i)),
      "gdpo_components": (
          lambda: adv.compute_gdpo_outcome_advantage(
              r, m, i, config=gdpo_config, non_tensor_batch=ntb, batch=batch),
          lambda: ref.gdpo(r, m, i, config=gdpo_config, non_tensor_batch=ntb,
                           batch=batch)),
      "grpo_passk": (
          lambda: adv.compute_grpo_passk_outcome_advantage(r, m, PASSK_INDEX),
          lambda: ref.grpo_passk(r, m, PASSK_INDEX)),
      "reinforce_plus_plus": (
          lambda: adv.compute_reinforce_plus_plus_outcome_advantage(
              r, m, {"gamma": 0.97}),
          lambda: ref.reinforce_plus_plus(r, m, 0.97)),
      "reinforce_plus_plus_baseline": (
          lambda: adv.compute_reinforce_plus_plus_baseline_outcome_advantage(
              r, m, i),
          lambda: ref.reinforce_plus_plus_baseline(r, m, i)),
      "remax": (
          lambda: adv.compute_remax_outcome_advantage(r, d["baselines"], m),
          lambda: ref.remax(r, d["baselines"], m)),
      "rloo": (lambda: adv.compute_rloo_outcome_advantage(r, m, i),
               lambda: ref.rloo(r, m, i)),
      "rloo_vectorized": (
          lambda: adv.compute_rloo_vectorized_outcome_advantage(r, m, i),
          lambda: ref.rloo_vectorized(r, m, i)),
      "opo": (lambda: adv.compute_opo_outcome_advantage(r, m, i),
              lambda: ref.opo(r, m, i)),
      "gpg": (lambda: adv.compute_gpg_outcome_advantage(r, m, i, f_norm=1.5),
              lambda: ref.gpg(r, m, i, f_norm=1.5)),
      "optimal_token_baseline": (
          lambda: adv.compute_optimal_token_baseline_advantage(r, m, i, *otb),
          lambda: ref.optimal_token_baseline(r, m, i, *otb)),
      "optimal_token_baseline_is": (
          lambda: adv.compute_optimal_token_baseline_advantage(
              r, m, i, *otb, rollout_is_weights=d["is_weights"]),
          lambda: ref.optimal_token_baseline(
              r, m, i, *otb, rollout_is_weights=d["is_weights"])),
      "optimal_token_baseline_no_tail": (
          lambda: adv.compute_optimal_token_baseline_advantage(
              r, m, i, *otb, handle_zero_tail=False),
          lambda: ref.optimal_token_baseline(r, m, i, *otb,
                                             handle_zero_tail=False)),
      "tir_optimal_token_baseline": (
          lambda: adv.compute_multi_turn_optimal_token_baseline_advantage(
              r, m, i, *otb, rollout_is_weights=d["is_weights"]),
          lambda: ref.tir_optimal_token_baseline(
              r, m, i, *otb, rollout_is_weights=d["is_weights"])),
  }


REFERENCE_CASES = _reference_cases()


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_matches_numpy_reference(case):
  ours, theirs = REFERENCE_CASES[case]
  (a, r), (a_ref, r_ref) = ours(), theirs()
  assert a.shape == (B, T) and a.dtype == jnp.float32
  assert_on_valid(a, a_ref, DATA["mask"])
  assert_on_valid(r, r_ref, DATA["mask"])


def test_reference_cases_cover_every_estimator():
  covered = {name for name in REFERENCE_CASES if name in VERL_NAMES}
  assert covered == VERL_NAMES


def test_identical_and_singleton_groups_in_random_batch():
  a, _ = adv.compute_grpo_outcome_advantage(
      DATA["rewards"], DATA["mask"], INDEX)
  a = np.asarray(a)
  assert np.all(a[9] == 0) and np.all(a[10] == 0)
  s6 = DATA["rewards"][6].astype(np.float64).sum()
  np.testing.assert_allclose(a[6, :4], s6 / (1 + 1e-6), rtol=1e-5)


# ----------------------------------------------------------------------------
# Sharded == unsharded on 8 CPU devices.
# ----------------------------------------------------------------------------

SB, ST = 16, 8
SHARD_INDEX = np.arange(SB, dtype=np.int32) * 3 % 5  # groups span devices


def _all_estimators(rewards, mask, index, values, baselines, old, sps, isw):
  config = {"gamma": 0.97, "lam": 0.9}
  outs = {}
  for name in sorted(VERL_NAMES):
    outs[name] = adv.compute_advantage(name, adv.AdvantageInputs(
        rewards, mask, index, num_groups=5, values=values,
        reward_baselines=baselines, old_log_probs=old, sum_pi_squared=sps,
        rollout_is_weights=isw), config)
  return outs


def _sharding_inputs():
  rng = np.random.default_rng(1)
  lengths = rng.integers(1, ST + 1, size=SB)
  mask = (np.arange(ST)[None, :] < lengths[:, None]).astype(np.float32)
  mask[3, 1] = 0
  probs = rng.uniform(0.05, 0.95, size=(SB, ST))
  return (
      rng.normal(size=(SB, ST)).astype(np.float32),
      mask,
      SHARD_INDEX,
      rng.normal(size=(SB, ST)).astype(np.float32),
      rng.normal(size=SB).astype(np.float32),
      np.log(probs).astype(np.float32),
      (probs ** 2 + (1 - probs) ** 2 * 0.5).astype(np.float32),
      rng.uniform(0.5, 1.5, size=(SB, ST)).astype(np.float32),
  )


@pytest.fixture(scope="module")
def unsharded_outputs():
  return jax.jit(_all_estimators)(*_sharding_inputs())


def _mesh(shape, names):
  return Mesh(np.array(jax.devices()[:8]).reshape(shape), names)


@pytest.mark.parametrize(
    "shape,names,token_spec",
    [
        ((8,), ("data",), P("data", None)),
        ((2, 4), ("data", "fsdp"), P(("data", "fsdp"), None)),
        ((2, 4), ("data", "fsdp"), P("data", "fsdp")),
    ],
    ids=["1x8-batch", "2x4-batch", "2x4-batch-and-time"],
)
def test_sharded_equals_unsharded(unsharded_outputs, shape, names, token_spec):
  assert len(jax.devices()) >= 8
  mesh = _mesh(shape, names)
  tok = NamedSharding(mesh, token_spec)
  row = NamedSharding(mesh, P(token_spec[0]))
  in_shardings = (tok, tok, row, tok, row, tok, tok, tok)
  fn = jax.jit(_all_estimators, in_shardings=in_shardings, out_shardings=tok)
  inputs = [jax.device_put(x, s)
            for x, s in zip(_sharding_inputs(), in_shardings)]
  sharded = fn(*inputs)
  for name, (a, r) in sharded.items():
    assert a.sharding.is_equivalent_to(tok, 2), name
    want_a, want_r = unsharded_outputs[name]
    np.testing.assert_allclose(a, want_a, err_msg=name, **TOL)
    np.testing.assert_allclose(r, want_r, err_msg=name, **TOL)
