"""Rollout correction (spec §5): IS weights, rejection masks, metrics."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.algos import rollout_corr as rc
from tests.algos import np_ref_losses as ref


weights = jax.jit(rc.compute_rollout_correction_weights, static_argnums=(2, 3, 4))
rejection = jax.jit(rc.compute_rollout_rejection_mask, static_argnums=(2, 3))
offpolicy = jax.jit(rc.compute_offpolicy_metrics)


def close(a, b, rtol=1e-5, atol=1e-5):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=rtol, atol=atol)


def close_metrics(got, want, rtol=1e-5, atol=1e-5):
  assert set(got) == set(want), sorted(set(got) ^ set(want))
  for k in want:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=rtol, atol=atol, err_msg=k)


def make_batch(seed, B=8, T=10, scale=0.4):
  """Training/rollout log-probs with variable lengths, gaps, one empty row."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):
    length = 0 if b == 5 else rng.integers(1, T + 1)
    mask[b, :length] = 1.0
    gaps = rng.random(T) < 0.2
    gaps[0] = False
    mask[b, gaps] = 0.0
  roll = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
  old = (roll + rng.normal(0, scale, (B, T))).astype(np.float32)
  pad = mask == 0
  old[pad], roll[pad] = -3.0, -60.0
  return old, roll, mask


# ------------------------------------------------------------ hand cases --


def test_token_tis_hand_case():
  lr = jnp.log(jnp.array([[3.0, 0.5, 1.0, 7.0]]))
  m = jnp.array([[1, 1, 1, 0]], jnp.float32)
  w, met = weights(lr, m, "token", 2.0, False)
  close(w, [[2.0, 0.5, 1.0, 0.0]])
  close(met["rollout_is_mean"], 3.5 / 3)
  close(met["rollout_is_ratio_fraction_high"], 1 / 3)   # raw 3 > 2
  close(met["rollout_is_ratio_fraction_low"], 0.0)      # 0.5 is not < 1/2
  close(met["rollout_is_max"], 2.0)
  close(met["rollout_is_min"], 0.5)
  wn, met = weights(lr, m, "token", 2.0, True)
  close(wn, [[2.0 / (3.5 / 3), 0.5 / (3.5 / 3), 1.0 / (3.5 / 3), 0.0]])
  close(met["rollout_is_batch_norm_factor"], 3.5 / 3)


def test_sequence_icepop_hand_case():
  lr = jnp.array([[0.5, 0.5, 9.0], [-2.0, 0.0, 0.0], [0.1, 0.0, 0.0]])
  m = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], jnp.float32)
  # row sums: 1.0, -2.0, 0.1 -> e^1 = 2.718 (> 2.5: zeroed), e^-2 = .135 (< .5: zeroed), e^.1
  w, met = weights(lr, m, "sequence", "0.5_2.5", False)
  e = math.exp(0.1)
  close(w, [[0, 0, 0], [0, 0, 0], [e, e, e]])
  close(met["rollout_is_oob_ratio"], 3 / 6)
  close(met["rollout_is_max"], math.e)
  close(met["rollout_is_min"], math.exp(-2))
  close(met["rollout_is_ratio_fraction_high"], 1 / 3)
  close(met["rollout_is_ratio_fraction_low"], 1 / 3)


def test_rejection_hand_cases():
  lr = jnp.array([[0.0, 1.0, -1.0, 5.0], [0.1, 0.1, 0.0, 0.0]])
  m = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
  # token_k1 with "2.0" means lower 0.5: keep -log 2 <= -lr <= log 2.
  mask, met = rejection(lr, m, "token_k1", 2.0)
  close(mask, [[1, 0, 0, 0], [1, 1, 0, 0]])
  close(met["rollout_rs_masked_fraction"], 2 / 5)
  close(met["rollout_rs_seq_masked_fraction"], 1 / 2)
  # seq_max_k2: row 0 max .5 > .4 -> whole row rejected; row 1 .005 kept.
  mask, met = rejection(lr, m, "seq_max_k2", 0.4)
  close(mask, [[0, 0, 0, 0], [1, 1, 0, 0]])
  close(met["rollout_rs_seq_max_k2_max"], 0.5)
  # seq_sum_k1 "0.5_4.0": row 0 Σ(-lr) = 0 kept, row 1 -0.2 kept.
  mask, _ = rejection(lr, m, "seq_sum_k1", "0.5_4.0")
  close(mask, m)
  # two options, one threshold each; seq_mean_k3 row 0 = (0 + e-2 + e^-1) / 3.
  k3 = (math.e - 2 + math.exp(-1)) / 3
  mask, met = rejection(lr, m, "token_k2,seq_mean_k3", f"0.6,{k3 - 1e-3}")
  close(mask, [[0, 0, 0, 0], [1, 1, 0, 0]])
  close(met["rollout_rs_seq_mean_k3_max"], k3)


def test_offpolicy_metrics_hand_case():
  old = jnp.log(jnp.array([[0.5, 0.25]]))
  roll = jnp.log(jnp.array([[0.25, 0.25]]))
  m = jnp.ones((1, 2))
  met = offpolicy(old, roll, m)
  close(met["kl"], -math.log(2) / 2)
  close(met["k3_kl"], (2 - math.log(2) - 1) / 2)
  close(met["training_ppl"], math.exp(-(math.log(0.5) + math.log(0.25)) / 2))
  close(met["rollout_ppl"], 4.0)
  close(met["chi2_token"], (4 + 1) / 2 - 1)
  close(met["chi2_seq"], 4 - 1)
  close(met["log_ppl_diff"], math.log(0.25) - (math.log(0.5) + math.log(0.25)) / 2)


# --------------------------------------------------- NumPy reference --


IS_CASES = [("token", 2.0, False), ("token", "0.8_1.5", True), ("sequence", 3.0, True),
            ("sequence", "0.3_4.0", False), ("token", "1.3", False)]


@pytest.mark.parametrize("level,threshold,normalize", IS_CASES)
def test_is_weights_match_reference(level, threshold, normalize):
  old, roll, m = make_batch(IS_CASES.index((level, threshold, normalize)))
  f = jax.jit(lambda lr, mm: rc.compute_rollout_correction_weights(
      lr, mm, level, threshold, normalize))
  w, met = f(old - roll, m)
  want_w, want_met = ref.is_weights(old - roll, m, level, threshold, normalize)
  close(w, want_w)
  assert np.all(np.asarray(w)[m == 0] == 0)
  close_metrics(met, want_met)


RS_OPTIONS = list(rc.ROLLOUT_RS_OPTIONS)
RS_THRESHOLDS = {  # chosen so that every option rejects some but not all tokens
    "token_k1": "0.7_1.6", "token_k2": "0.08", "token_k3": "0.06",
    "seq_sum_k1": "0.4_2.5", "seq_sum_k2": "0.3", "seq_sum_k3": "0.3",
    "seq_mean_k1": "0.9_1.1", "seq_mean_k2": "0.04", "seq_mean_k3": "0.06",
    "seq_max_k2": "0.08", "seq_max_k3": "0.06",
}


def test_each_rejection_option_matches_reference():
  """All eleven options (one compile), each on its own random batch."""
  batches = [make_batch(i, scale=0.3) for i in range(len(RS_OPTIONS))]

  def f(lrs, masks):
    return {opt: rc.compute_rollout_rejection_mask(lr, mm, opt, RS_THRESHOLDS[opt])
            for opt, lr, mm in zip(RS_OPTIONS, lrs, masks)}

  got = jax.jit(f)([o - r for o, r, _ in batches], [m for _, _, m in batches])
  for option, (old, roll, m) in zip(RS_OPTIONS, batches):
    mask, met = got[option]
    want_mask, want_met = ref.rs_mask(old - roll, m, option, RS_THRESHOLDS[option])
    close(mask, want_mask)
    assert 0 < float(met["rollout_rs_masked_fraction"]) < 1, option
    close_metrics(met, want_met)


def test_combined_options_and_single_threshold_for_all():
  old, roll, m = make_batch(20, scale=0.3)
  opts = "token_k3,seq_mean_k2,seq_max_k3,token_k3"
  mask, met = rejection(old - roll, m, opts, 0.1)
  want_mask, want_met = ref.rs_mask(old - roll, m, opts, 0.1)
  close(mask, want_mask)
  close_metrics(met, want_met)
  # k1 single number u means [1/u, u].
  a, _ = rejection(old - roll, m, "token_k1", "1.5")
  b, _ = rejection(old - roll, m, "token_k1", f"{1 / 1.5}_1.5")
  close(a, np.asarray(b))


def _verl07_rs_mask(log_ratio, mask, mode, upper, lower=None):
  """verl 0.6-0.7's rejection mask (rollout_rs token/sequence/geometric, rollout_rs_threshold_lower), in NumPy.

  Written from verl v0.7.0's compute_rollout_rejection_mask: the ratio pi_train/pi_rollout per token, or
  exp of the sequence's masked sum / masked mean of log-ratios, clamped to +-20, kept within
  [lower, upper] (lower = 1/upper when unset); the response mask times that.
  """
  lower = 1.0 / upper if lower is None else lower
  lr = log_ratio.astype(np.float64)
  if mode == "token":
    stat = lr
  else:
    total = (lr * mask).sum(-1, keepdims=True)
    stat = total if mode == "sequence" else total / (mask.sum(-1, keepdims=True) + 1e-8)
  w = np.exp(np.clip(stat, -20.0, 20.0))
  return mask * ((w >= lower) & (w <= upper))


@pytest.mark.parametrize("mode,option", [("token", "token_k1"), ("sequence", "seq_sum_k1"),
                                         ("geometric", "seq_mean_k1")])
def test_verl07_lower_threshold_is_a_k1_option_with_reciprocal_bounds(mode, option):
  """The fix rljax's error for rollout_rs_threshold_lower gives: verl 0.7's [L, U] on pi_train/pi_rollout is
  verl 0.9's k1 option with rollout_rs_threshold (1/U)_(1/L) (its bounds are on pi_rollout/pi_train)."""
  old, roll, m = make_batch(30, scale=0.3)
  lower, upper = {"token": (0.7, 1.25), "sequence": (0.5, 1.1), "geometric": (0.75, 1.05)}[mode]
  want = _verl07_rs_mask(old - roll, m, mode, upper, lower)
  assert 0 < want.sum() < m.sum(), "the bounds must reject some tokens and keep others"
  got, _ = rejection(old - roll, m, option, f"{1 / upper}_{1 / lower}")
  close(got, want)
  unflipped, _ = rejection(old - roll, m, option, f"{lower}_{upper}")
  assert not np.array_equal(np.asarray(unflipped), want)


def test_full_pipeline_matches_reference_and_prefixes_metrics():
  old, roll, m = make_batch(21, scale=0.3)
  f = jax.jit(lambda o, r, mm: rc.compute_rollout_correction_and_rejection_mask(
      o, r, mm, "sequence", 2.0, True, "token_k1,seq_sum_k3", "0.6_1.7,0.4"))
  w, mask, met = f(old, roll, m)
  want_w, want_mask, want_met = ref.rollout_correction(
      old, roll, m, "sequence", 2.0, True, "token_k1,seq_sum_k3", "0.6_1.7,0.4")
  close(w, want_w)
  close(mask, want_mask)
  close_metrics(met, want_met)
  assert all(k.startswith("rollout_corr/") for k in met)
  # nothing enabled: no weights, unchanged mask, only off-policy metrics.
  w, mask, met = jax.jit(rc.compute_rollout_correction_and_rejection_mask)(old, roll, m)
  assert w is None
  close(mask, m)
  close_metrics(met, {f"rollout_corr/{k}": v
                      for k, v in ref.offpolicy_metrics(old, roll, m).items()})


def test_offpolicy_metrics_match_reference():
  old, roll, m = make_batch(22)
  close_metrics(jax.jit(rc.compute_offpolicy_metrics)(old, roll, m),
                ref.offpolicy_metrics(old, roll, m))


def test_weights_carry_no_gradient():
  old, roll, m = make_batch(23)
  g = jax.jit(jax.grad(lambda o: jnp.sum(rc.compute_rollout_correction_weights(
      o - roll, m, "token", 2.0)[0])))(old)
  assert np.all(np.asarray(g) == 0)


# --------------------------------------------------------------- errors --


def test_option_and_threshold_errors():
  lr, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
  with pytest.raises(ValueError, match="token_k4.*valid options: token_k1"):
    rc.compute_rollout_rejection_mask(lr, m, "token_k4", 1.0)
  with pytest.raises(ValueError, match="exactly 2"):
    rc.compute_rollout_rejection_mask(lr, m, "token_k2,token_k3", "1,2,3")
  with pytest.raises(ValueError, match="single upper bound"):
    rc.compute_rollout_rejection_mask(lr, m, "token_k2", "0.1_2")
  with pytest.raises(ValueError, match="rollout_rs_threshold"):
    rc.compute_rollout_rejection_mask(lr, m, "token_k2", None)
  with pytest.raises(ValueError, match="positive"):
    rc.compute_rollout_rejection_mask(lr, m, "token_k3", "-1")
  with pytest.raises(ValueError, match="rollout_is"):
    rc.compute_rollout_correction_weights(lr, m, "tokens", 2.0)
  with pytest.raises(ValueError, match="lower <= upper"):
    rc.compute_rollout_correction_weights(lr, m, "token", "3_2")
  with pytest.raises(ValueError, match="at least one valid token"):
    rc.compute_rollout_correction_and_rejection_mask(lr, lr, jnp.zeros((2, 3)), "token")
  with pytest.raises(ValueError, match="does not match"):
    rc.compute_rollout_correction_and_rejection_mask(lr, jnp.zeros((2, 4)), m)
  with pytest.raises(ValueError, match="rollout_rs_threshold"):
    rc.compute_rollout_correction_and_rejection_mask(lr, lr, m, rollout_rs="token_k1")


# ------------------------------------------------------------- sharding --


def test_sharded_equals_unsharded():
  old, roll, m = make_batch(24, B=16, T=8, scale=0.3)

  def f(o, r, mm):
    return rc.compute_rollout_correction_and_rejection_mask(
        o, r, mm, "token", "0.7_1.8", True, "seq_mean_k1,token_k3", "0.8_1.3,0.1")

  want = jax.jit(f)(old, roll, m)
  devices = np.array(jax.devices()[:8])
  auto = jax.sharding.AxisType.Auto
  for mesh, spec in [(Mesh(devices.reshape(8), ("data",), axis_types=(auto,)), P("data")),
                     (Mesh(devices.reshape(2, 4), ("data", "fsdp"), axis_types=(auto,) * 2),
                      P("data", "fsdp"))]:
    tok = NamedSharding(mesh, spec)
    rep = NamedSharding(mesh, P())
    sharded = jax.jit(f, in_shardings=(tok,) * 3, out_shardings=(tok, tok, rep))
    w, mask, met = sharded(*[jax.device_put(a, tok) for a in (old, roll, m)])
    assert w.sharding.is_equivalent_to(tok, 2)
    close(w, np.asarray(want[0]), rtol=1e-6, atol=1e-7)
    close(mask, np.asarray(want[1]))
    for k, v in want[2].items():
      close(met[k], float(v), rtol=1e-6, atol=1e-6)
