"""Policy losses (spec §3): hand cases, NumPy reference, gradients, sharding."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from ml_collections import ConfigDict

from rljax.algos import policy_loss as pl
from rljax.algos.kl import kl_penalty
from tests.algos import np_ref_losses as ref

VERL_NAMES = [
    "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov",
    "kl_cov", "geo_mean", "dro", "cispo", "bypass_mode",
]
RTOL, ATOL = 1e-5, 1e-5


def make_config(**overrides) -> ConfigDict:
  base = {
      "clip_ratio": 0.2,
      "clip_ratio_low": 0.2,
      "clip_ratio_high": 0.28,
      "clip_ratio_c": 3.0,
      "tau_pos": 1.0,
      "tau_neg": 1.05,
      "loss_agg_mode": "token-mean",
      "loss_scale_factor": None,
      "entropy_coeff": 0.0,
      "use_kl_loss": False,
      "kl_loss_coef": 0.001,
      "kl_loss_type": "low_var_kl",
      "positive_nll_coef": None,
      "policy_loss": {
          "loss_mode": "vanilla",
          "clip_cov_ratio": 0.05,
          "clip_cov_lb": 0.05,
          "clip_cov_ub": 5.0,
          "kl_cov_ratio": 0.1,
          "ppo_kl_coef": 0.1,
          "dro_beta": 0.3,
          "aipo_rho": 2.0,
          "rollout_correction": {
              "loss_type": "ppo_clip",
              "rollout_is": "token",
              "rollout_is_threshold": 2.0,
              "rollout_is_batch_normalize": False,
              "rollout_rs": None,
              "rollout_rs_threshold": None,
          },
      },
  }
  cfg = ConfigDict(base)
  for key, value in overrides.items():
    node = cfg
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return cfg


def as_dict(cfg: ConfigDict) -> dict:
  return cfg.to_dict()


def make_batch(seed: int, B: int = 8, T: int = 12):
  """Random log-probs with variable lengths, interior gaps and one empty row."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):
    length = 0 if b == 3 else rng.integers(2, T + 1)
    mask[b, :length] = 1.0
    gaps = rng.random(T) < 0.2
    gaps[0] = False
    mask[b, gaps] = 0.0
  lp = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
  old = np.minimum(lp + rng.normal(0, 0.3, (B, T)), -0.01).astype(np.float32)
  adv = rng.normal(0, 1, (B, T)).astype(np.float32)
  adv[rng.random((B, T)) < 0.1] = 0.0
  w = rng.uniform(0.5, 1.5, (B, T)).astype(np.float32)
  pad = mask == 0
  lp[pad], old[pad], adv[pad] = -30.0, -25.0, 5.0
  return old, lp, adv, mask, w


_COMPILED = {}


def _compiled(name, mode, cfg, gbi, with_grad):
  """One jitted `(loss, metrics[, d loss / d log_prob])` per configuration."""
  key = (name, mode, json.dumps(cfg.to_dict(), sort_keys=True), repr(gbi), with_grad)
  if key not in _COMPILED:
    fn = pl.get_policy_loss(name)

    def run(o, l, a, m, w, rng):
      def loss_fn(x):
        return fn(o, x, a, m, mode, cfg, w, global_batch_info=gbi, rng=rng)

      if not with_grad:
        return loss_fn(l)
      (loss, met), grad = jax.value_and_grad(loss_fn, has_aux=True)(l)
      return loss, met, grad

    _COMPILED[key] = jax.jit(run)
  return _COMPILED[key]


def call(name, old, lp, adv, mask, mode="token-mean", cfg=None, w=None,
         gbi=None, rng=None):
  """`(pg_loss, metrics)` of a registered loss, jitted."""
  cfg = make_config() if cfg is None else cfg
  return _compiled(name, mode, cfg, gbi, False)(old, lp, adv, mask, w, rng)


def grad_of(name, old, lp, adv, mask, mode="token-mean", cfg=None, w=None,
            gbi=None, rng=None):
  """d pg_loss / d log_prob, jitted."""
  cfg = make_config() if cfg is None else cfg
  return _compiled(name, mode, cfg, gbi, True)(old, lp, adv, mask, w, rng)[2]


def close(a, b, rtol=RTOL, atol=ATOL):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=rtol, atol=atol)


def close_metrics(got, want):
  assert set(got) == set(want), (sorted(got), sorted(want))
  for k in want:
    close(got[k], want[k])


# ------------------------------------------------------------- registry --


def test_registry_has_verl_names():
  for name in VERL_NAMES:
    assert pl.get_policy_loss(name) is pl.POLICY_LOSS_REGISTRY.get(name)


def test_unknown_loss_lists_valid_names():
  with pytest.raises(KeyError) as err:
    pl.get_policy_loss("ppo2")
  msg = str(err.value)
  assert "ppo2" in msg and "policy_loss.loss_mode" in msg
  for name in VERL_NAMES:
    assert name in msg


# ------------------------------------------------------------ hand cases --


def row(*xs):
  return jnp.array([xs], jnp.float32)


def test_vanilla_hand_case_dual_clip():
  old = row(0.0, 0.0, 0.0, 0.0)
  lp = jnp.log(row(1.5, 0.5, 4.0, 1.1))
  adv = row(1.0, 1.0, -1.0, -1.0)
  m = row(1, 1, 1, 1)
  cfg = make_config(clip_ratio_high=0.2)
  loss, met = call("vanilla", old, lp, adv, m, cfg=cfg)
  # r = 1.5 clipped to 1.2 -> -1.2; r = 0.5 unclipped -> -0.5;
  # r = 4, A < 0: max(4, 1.2) = 4 capped by dual clip at 3; r = 1.1 -> 1.1.
  close(loss, (-1.2 - 0.5 + 3.0 + 1.1) / 4)
  close(met["actor/pg_clipfrac"], 0.25)
  close(met["actor/pg_clipfrac_lower"], 0.25)
  close(met["actor/ppo_kl"], -math.log(1.5 * 0.5 * 4.0 * 1.1) / 4)
  grad = grad_of("vanilla", old, lp, adv, m, cfg=cfg)
  close(grad, [[0.0, -0.5 / 4, 0.0, 1.1 / 4]])


def test_vanilla_clip_higher_and_log_ratio_clamp():
  old = row(0.0, 0.0, 0.0)
  lp = row(math.log(1.25), 25.0, -25.0)
  adv = row(1.0, 1.0, 1.0)
  m = row(1, 1, 1)
  cfg = make_config(clip_ratio_low=0.1, clip_ratio_high=0.3)
  loss, met = call("vanilla", old, lp, adv, m, cfg=cfg)
  # 1.25 < 1.3: unclipped; e^20 clipped to 1.3; e^-20 ~ 2e-9 < 0.9: l1 > l2.
  close(loss, (-1.25 - 1.3 - math.exp(-20)) / 3)
  close(met["actor/ppo_kl"], -(math.log(1.25) + 20 - 20) / 3)
  close(met["actor/pg_clipfrac"], 1 / 3)


def test_dppo_tv_and_kl_hand_case():
  old = jnp.log(row(0.5, 0.5, 0.5, 0.5))
  lp = jnp.log(row(0.8, 0.6, 0.2, 0.45))
  adv = row(1.0, 1.0, -1.0, -1.0)
  m = row(1, 1, 1, 1)
  cfg = make_config(clip_ratio_high=0.2)
  # p - p0 = [.3, .1, -.3, -.05]: tokens 0 and 2 leave the TV region.
  # Bernoulli KL = [.2231, .0204, .2231, .0050]: the same tokens leave.
  close(pl.binary_kl(lp, old), [[0.2231436, 0.0204112, 0.2231436, 0.0050253]])
  want = (-1.2 * math.log(0.6) + 0.9 * math.log(0.45)) / 4
  for name in ("dppo_tv", "dppo_kl"):
    loss, met = call(name, old, lp, adv, m, cfg=cfg)
    close(loss, want)
    close(met["actor/pg_clipfrac"], 0.5)
    close(met["actor/pg_clipfrac_lower"], 0.0)
    grad = grad_of(name, old, lp, adv, m, cfg=cfg)
    close(grad, [[0.0, -1.2 / 4, 0.0, 0.9 / 4]])


def test_dppo_truncation_uses_clip_ratio_c():
  old = jnp.log(row(0.01))
  lp = jnp.log(row(0.05))   # r = 5, p - p0 = 0.04 inside the TV region
  adv = row(1.0)
  m = row(1)
  loss, met = call("dppo_tv", old, lp, adv, m, cfg=make_config(clip_ratio_c=3.0))
  close(loss, -3.0 * math.log(0.05))
  close(met["actor/pg_clipfrac_lower"], 1.0)
  loss20, _ = call("dppo_tv", old, lp, adv, m, cfg=make_config(clip_ratio_c=20.0))
  close(loss20, -5.0 * math.log(0.05))


def test_gspo_hand_case():
  old = jnp.zeros((2, 3))
  lp = jnp.array([[math.log(1.1), math.log(1.2), 0.0],
                  [math.log(2.0), math.log(2.0), 7.0]])
  adv = jnp.array([[1.0, 1.0, 1.0], [1.0, -1.0, 9.0]])
  m = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)
  cfg = make_config(clip_ratio_high=0.2)
  sr0 = 1.32 ** (1 / 3)
  loss, met = call("gspo", old, lp, adv, m, "seq-mean-token-mean", cfg)
  # row 0: all unclipped -> -sr0; row 1: sr = 2: A=1 -> -1.2, A=-1 -> 2.
  close(loss, (-sr0 + (-1.2 + 2.0) / 2) / 2)
  close(met["actor/pg_clipfrac"], 1 / 5)
  close(met["actor/ppo_kl"], -(math.log(1.32) + 2 * math.log(2)) / 5)
  grad = grad_of("gspo", old, lp, adv, m, "seq-mean-token-mean", cfg)
  close(grad, [[-sr0 / 6, -sr0 / 6, -sr0 / 6], [0.0, 2.0 / 4, 0.0]])


def test_sapo_hand_case_forces_seq_mean_token_mean():
  old = row(0.0, 0.0)
  lp = row(0.0, math.log(1.5))
  adv = row(1.0, -1.0)
  m = row(1, 1)
  loss, met = call("sapo", old, lp, adv, m, "token-sum")
  gate_neg = 1 / (1 + math.exp(-1.05 * 0.5)) * 4 / 1.05
  close(loss, (-2.0 + gate_neg) / 2)
  assert float(met["actor/pg_clipfrac"]) == 0.0
  close(met["actor/ppo_kl"], -math.log(1.5) / 2)


def test_gpg_hand_case():
  lp = jnp.log(row(0.5, 0.25, 0.9))
  adv = row(2.0, 1.0, 100.0)
  m = row(1, 1, 0)
  loss, met = call("gpg", lp, lp, adv, m)
  close(loss, (2 * math.log(2) + math.log(4)) / 2)
  assert met == {}


def test_clip_cov_hand_case():
  lp = row(-1.0, -3.0, -3.0, -1.5)
  old = lp - 0.05
  adv = row(1.0, -1.0, 2.0, -1.0)
  m = row(1, 1, 1, 1)
  # cov = (A - .25)(lp + 2.125) = [.84, 1.09, -1.53, -.78]: tokens 0, 1 in (0.5, 5).
  cfg = make_config(**{"policy_loss.clip_cov_ratio": 1.0, "policy_loss.clip_cov_lb": 0.5})
  key = jax.random.key(0)
  loss, met = call("clip_cov", old, lp, adv, m, cfg=cfg, rng=key)
  r = math.exp(0.05)
  close(loss, (-2 * r + r) / 4)
  close(met["actor/pg_clipfrac"], 0.5)
  close(met["actor/ppo_kl"], -0.05)
  assert "actor/pg_clipfrac_lower" not in met
  grad = grad_of("clip_cov", old, lp, adv, m, cfg=cfg, rng=key)
  close(grad, [[0.0, 0.0, -2 * r / 4, r / 4]])
  # ratio 0.25 of 4 tokens -> exactly one of the two candidates is detached.
  cfg1 = make_config(**{"policy_loss.clip_cov_ratio": 0.25, "policy_loss.clip_cov_lb": 0.5})
  losses = set()
  for seed in range(8):
    loss1, met1 = call("clip_cov", old, lp, adv, m, cfg=cfg1, rng=jax.random.key(seed))
    close(met1["actor/pg_clipfrac"], 0.25)
    losses.add(round(float(loss1), 5))
  # token 0 detached -> (r - 2r + r)/4 = 0; token 1 detached -> (-r - 2r + r)/4.
  assert losses == {0.0, round(-r / 2, 5)}


def test_clip_cov_requires_rng():
  x = row(0.0)
  with pytest.raises(ValueError, match="rng"):
    pl.compute_policy_loss_clip_cov(x, x, x, x + 1, "token-mean", make_config())


def test_kl_cov_hand_case():
  lp = row(-1.0, -3.0, -3.0, -1.5)
  old = lp - 0.1
  adv = row(1.0, -1.0, 2.0, -1.0)
  m = row(1, 1, 1, 1)
  cfg = make_config(**{"policy_loss.kl_cov_ratio": 0.25})
  # cov = [.84, 1.09, -1.53, -.78]: k = 1 -> token 1 gets + 0.1 * |0.1|.
  r = math.exp(0.1)
  loss, met = call("kl_cov", old, lp, adv, m, cfg=cfg)
  close(loss, (-r + r + 0.01 - 2 * r + r) / 4)
  assert set(met) == {"actor/ppo_kl"}
  close(met["actor/ppo_kl"], 0.1)


def test_geo_mean_hand_case_ignores_agg_mode():
  old = jnp.zeros((2, 2))
  lp = jnp.array([[0.5, -0.1], [-0.5, 3.0]])
  adv = jnp.array([[1.0, 1.0], [-2.0, 5.0]])
  m = jnp.array([[1, 1], [1, 0]], jnp.float32)
  cfg = make_config(clip_ratio_high=0.2)
  # row 0: clipped log-ratios [.2, -.1] -> exp(.05); row 1: -0.2 -> exp(-.2), adv -2.
  want = (-math.exp(0.05) + 2 * math.exp(-0.2)) / 2
  for mode in ("token-mean", "token-sum"):
    loss, met = call("geo_mean", old, lp, adv, m, mode, cfg, gbi={"dp_size": 4})
    close(loss, want)
  close(met["actor/pg_clipfrac"], 1 / 3)
  close(met["actor/pg_clipfrac_lower"], 1 / 3)
  close(met["actor/ppo_kl"], 0.1 / 3)


def test_dro_hand_case_and_beta_check():
  old, lp, adv, m = jnp.log(row(0.25)), jnp.log(row(0.5)), row(1.0), row(1)
  cfg = make_config(**{"policy_loss.dro_beta": 0.5})
  loss, met = call("dro", old, lp, adv, m, cfg=cfg)
  close(loss, math.log(2) + 0.25 * math.log(2) ** 2)
  close(met["actor/ppo_kl"], -math.log(2))
  grad = grad_of("dro", old, lp, adv, m, cfg=cfg)
  close(grad, [[-1 + 0.5 * math.log(2)]])
  with pytest.raises(ValueError, match="dro_beta"):
    call("dro", old, lp, adv, m, cfg=make_config(**{"policy_loss.dro_beta": None}))


def test_cispo_hand_case():
  old = row(0.0, 0.0)
  lp = jnp.log(row(1.5, 0.9))
  adv = row(1.0, -1.0)
  m = row(1, 1)
  cfg = make_config(clip_ratio_high=0.2)
  loss, met = call("cispo", old, lp, adv, m, cfg=cfg)
  close(loss, (-1.2 * math.log(1.5) + 0.9 * math.log(0.9)) / 2)
  close(met["actor/pg_clipfrac"], 0.5)
  grad = grad_of("cispo", old, lp, adv, m, cfg=cfg)
  close(grad, [[-0.6, 0.45]])


def test_bypass_mode_reinforce_with_is_and_rejection():
  rollout = jnp.log(row(0.1, 0.1))
  lp = jnp.log(row(0.3, 0.05))   # IS ratio [3, 0.5] -> TIS weights [2, 0.5]
  adv = row(1.0, 1.0)
  m = row(1, 1)
  cfg = make_config(**{"policy_loss.rollout_correction.loss_type": "reinforce"})
  loss, met = call("bypass_mode", rollout, lp, adv, m, cfg=cfg)
  close(loss, (-2 * math.log(0.3) - 0.5 * math.log(0.05)) / 2)
  close(met["actor/ppo_kl"], -math.log(1.5) / 2)
  close(met["rollout_corr/rollout_is_mean"], 1.25)
  # k1 = -lr = [-log 3, log 2]; keep log(.5) <= k1 <= log(4): token 0 rejected.
  cfg_rs = make_config(**{
      "policy_loss.rollout_correction.loss_type": "reinforce",
      "policy_loss.rollout_correction.rollout_rs": "token_k1",
      "policy_loss.rollout_correction.rollout_rs_threshold": "0.5_4.0",
  })
  loss, met = call("bypass_mode", rollout, lp, adv, m, cfg=cfg_rs)
  close(loss, -0.5 * math.log(0.05))
  close(met["rollout_corr/rollout_rs_masked_fraction"], 0.5)
  grad = grad_of("bypass_mode", rollout, lp, adv, m, cfg=cfg)
  close(grad, [[-2 / 2, -0.5 / 2]])


def test_bypass_mode_ppo_clip_equals_vanilla_on_rollout_log_prob():
  old, lp, adv, mask, w = make_batch(1)
  cfg = make_config()
  loss, met = call("bypass_mode", old, lp, adv, mask, cfg=cfg, w=w)
  want, want_met = call("vanilla", old, lp, adv, mask, cfg=cfg)
  close(loss, float(want))
  for k, v in want_met.items():
    close(met[k], float(v))
  assert any(k.startswith("rollout_corr/") for k in met)
  with pytest.raises(ValueError, match="rollout_correction"):
    call("bypass_mode", old, lp, adv, mask,
         cfg=make_config(**{"policy_loss.rollout_correction": None}))


def test_aipo_hand_case():
  old = row(0.0, 0.0)
  lp = jnp.log(row(3.0, 0.5))
  adv = row(1.0, -1.0)
  m = row(1, 1)
  loss, met = call("aipo", old, lp, adv, m)
  close(loss, (-2.0 + 0.5) / 2)
  close(met["actor/pg_clipfrac"], 0.5)
  grad = grad_of("aipo", old, lp, adv, m)
  close(grad, [[0.0, 0.25]])


def test_vanilla_rejects_clip_ratio_c_at_most_one():
  x = row(0.0)
  with pytest.raises(ValueError, match="clip_ratio_c"):
    call("vanilla", x, x, x, x + 1, cfg=make_config(clip_ratio_c=1.0))


def test_clip_ratio_low_high_fall_back_to_clip_ratio():
  cfg = make_config(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=None)
  assert pl.clip_bounds(cfg) == (0.1, 0.1)
  old = row(0.0)
  lp = jnp.log(row(1.5))
  loss, _ = call("vanilla", old, lp, row(1.0), row(1), cfg=cfg)
  close(loss, -1.1)


# ----------------------------------------------------- NumPy reference --

MODES = ["token-mean", "seq-mean-token-sum-norm"]
GBI = {"dp_size": 1, "batch_num_tokens": 40.0, "global_batch_size": 8,
       "loss_scale_factor": 16}


def ref_loss(name, old, lp, adv, mask, mode, cfg, w, gbi):
  c = as_dict(cfg)
  g = gbi or {}
  if name == "vanilla":
    return ref.vanilla(old, lp, adv, mask, mode, c, w, **g)
  if name in ("dppo_tv", "dppo_kl"):
    return ref.dppo(name[-2:], old, lp, adv, mask, mode, c, w, **g)[:2]
  if name == "gspo":
    return ref.gspo(old, lp, adv, mask, mode, c, w, **g)[:2]
  if name == "sapo":
    return ref.sapo(old, lp, adv, mask, mode, c, w, **g)
  if name == "gpg":
    return ref.gpg(old, lp, adv, mask, mode, c, w, **g)
  if name == "kl_cov":
    return ref.kl_cov(old, lp, adv, mask, mode, c, w, **g)[:2]
  if name == "geo_mean":
    return ref.geo_mean(old, lp, adv, mask, mode, c, w, **g)
  if name == "dro":
    return ref.dro(old, lp, adv, mask, mode, c, w, **g)
  if name == "cispo":
    return ref.cispo(old, lp, adv, mask, mode, c, w, **g)[:2]
  if name == "aipo":
    return ref.aipo(old, lp, adv, mask, mode, c["policy_loss"]["aipo_rho"], w, **g)
  raise KeyError(name)


DETERMINISTIC = ["vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg",
                 "kl_cov", "geo_mean", "dro", "cispo", "aipo"]


def test_matches_numpy_reference():
  """Every deterministic loss vs the NumPy reference, one compile per config."""
  cfg = make_config()
  for seed, mode, use_w, gbi in [(0, MODES[0], False, None),
                                 (1, MODES[1], True, GBI)]:
    old, lp, adv, mask, w = make_batch(seed)
    ww = w if use_w else None

    def f(o, l, a, m, weights):
      return {name: pl.get_policy_loss(name)(o, l, a, m, mode, cfg, weights,
                                             global_batch_info=gbi)
              for name in DETERMINISTIC}

    got = jax.jit(f)(old, lp, adv, mask, ww)
    for name in DETERMINISTIC:
      want, want_met = ref_loss(name, old, lp, adv, mask, mode, cfg, ww, gbi)
      close(got[name][0], want)
      close_metrics(got[name][1], want_met)


def test_clip_cov_matches_reference_given_selection():
  cfg = make_config(**{"policy_loss.clip_cov_ratio": 0.1})
  c = as_dict(cfg)
  for seed in range(3):
    old, lp, adv, mask, w = make_batch(seed)
    key = jax.random.key(seed)
    cand, clip_num = ref.clip_cov_candidates(old, lp, adv, mask, c)
    ratio = np.exp(lp.astype(np.float64) - old)
    clipped = (-adv * np.clip(ratio, 0.8, 1.28)) > (-adv * ratio)
    sel = np.asarray(pl.clip_cov_detach_mask(
        jnp.where(mask > 0, adv, 0.0), jnp.where(mask > 0, lp, 0.0), mask,
        jnp.asarray(clipped), 0.1, 0.05, 5.0, key))
    assert sel.sum() == min(clip_num, cand.sum()) > 0
    assert not (sel & ~cand).any()
    loss, met = call("clip_cov", old, lp, adv, mask, "token-mean", cfg, w, rng=key)
    want, want_met = ref.clip_cov(old, lp, adv, mask, "token-mean", c, sel, w)
    close(loss, want)
    close_metrics(met, want_met)


def test_bypass_mode_matches_reference():
  for seed, loss_type, rs in [(0, "reinforce", None), (1, "reinforce", "seq_mean_k3"),
                              (2, "ppo_clip", "token_k2")]:
    cfg = make_config(**{
        "policy_loss.rollout_correction.loss_type": loss_type,
        "policy_loss.rollout_correction.rollout_is": "sequence",
        "policy_loss.rollout_correction.rollout_is_threshold": 3.0,
        "policy_loss.rollout_correction.rollout_rs": rs,
        "policy_loss.rollout_correction.rollout_rs_threshold": 0.05,
    })
    old, lp, adv, mask, _ = make_batch(seed)
    loss, met = call("bypass_mode", old, lp, adv, mask, "seq-mean-token-sum", cfg)
    w, m2, corr = ref.rollout_correction(lp, old, mask, "sequence", 3.0, False, rs, 0.05)
    if loss_type == "reinforce":
      want, want_met = ref.reinforce(old, lp, adv, m2, "seq-mean-token-sum", w)
    else:
      want, want_met = ref.vanilla(old, lp, adv, m2, "seq-mean-token-sum", as_dict(cfg))
    close(loss, want)
    close_metrics(met, {**want_met, **corr})


# ------------------------------------------------------------- gradients --


def jgrad(name, old, lp, adv, mask, mode, cfg, w=None, gbi=None):
  return np.asarray(grad_of(name, old, lp, adv, mask, mode, cfg, w, gbi))


@pytest.mark.parametrize("name,mode", [
    ("vanilla", "token-mean"), ("dppo_tv", "seq-mean-token-sum"),
    ("dppo_kl", "token-mean"), ("gspo", "seq-mean-token-mean"),
    ("cispo", "seq-mean-token-sum-norm")])
def test_gradient_matches_spec_formula(name, mode):
  cfg = make_config()
  c = as_dict(cfg)
  old, lp, adv, mask, w = make_batch(4)
  got = jgrad(name, old, lp, adv, mask, mode, cfg, w)
  if name == "vanilla":
    want = ref.vanilla_grad(old, lp, adv, mask, mode, c, w)
  elif name.startswith("dppo"):
    want = ref.dppo(name[-2:], old, lp, adv, mask, mode, c, w)[2]
  elif name == "gspo":
    want = ref.gspo(old, lp, adv, mask, mode, c, w)[2]
  else:
    want = ref.cispo(old, lp, adv, mask, mode, c, w)[2]
  close(got, want, rtol=1e-4, atol=1e-6)
  assert np.all(got[mask == 0] == 0)


@pytest.mark.parametrize("name,mode", [
    ("sapo", "token-mean"), ("gpg", "seq-mean-token-mean"), ("dro", "token-sum"),
    ("geo_mean", "token-mean"), ("kl_cov", "token-mean"), ("aipo", "token-mean")])
def test_gradient_matches_finite_differences(name, mode):
  cfg = make_config()
  old, lp, adv, mask, w = make_batch(5, B=4, T=6)
  got = jgrad(name, old, lp, adv, mask, mode, cfg, w)
  lp64 = lp.astype(np.float64)
  want = np.zeros_like(lp64)
  h = 1e-6
  for idx in zip(*np.nonzero(mask)):
    up, dn = lp64.copy(), lp64.copy()
    up[idx] += h
    dn[idx] -= h
    fu = ref_loss(name, old, up, adv, mask, mode, cfg, w, None)[0]
    fd = ref_loss(name, old, dn, adv, mask, mode, cfg, w, None)[0]
    want[idx] = (fu - fd) / (2 * h)
  close(got, want, rtol=1e-4, atol=1e-5)
  assert np.all(got[mask == 0] == 0)


ALL_LOSSES = VERL_NAMES + ["aipo"]


def all_losses(cfg, mode):
  """`f(old, lp, adv, mask, w, rng) -> {name: (loss, metrics, grad)}` for every loss."""

  def f(o, l, a, m, w, rng):
    out = {}
    for name in ALL_LOSSES:
      fn = pl.get_policy_loss(name)

      def loss_fn(x, fn=fn):
        return fn(o, x, a, m, mode, cfg, w, rng=rng)

      (loss, met), grad = jax.value_and_grad(loss_fn, has_aux=True)(l)
      out[name] = (loss, met, grad)
    return out

  return f


def test_non_finite_padding_is_ignored():
  old, lp, adv, mask, w = make_batch(6)
  bad_lp, bad_old, bad_adv = lp.copy(), old.copy(), adv.copy()
  pad = mask == 0
  bad_lp[pad], bad_old[pad], bad_adv[pad] = np.nan, np.inf, np.nan
  f = jax.jit(all_losses(make_config(), "seq-mean-token-sum"))
  key = jax.random.key(0)
  clean = f(old, lp, adv, mask, w, key)
  dirty = f(bad_old, bad_lp, bad_adv, mask, w, key)
  for name in ALL_LOSSES:
    close(dirty[name][0], float(clean[name][0]), rtol=1e-6, atol=1e-7)
    for k, v in clean[name][1].items():
      close(dirty[name][1][k], float(v), rtol=1e-6, atol=1e-7)
    grad = np.asarray(dirty[name][2])
    assert np.all(np.isfinite(grad)), name
    assert np.all(grad[pad] == 0), name
    close(grad, np.asarray(clean[name][2]), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------- sharding --


def meshes():
  devices = np.array(jax.devices()[:8])
  auto = jax.sharding.AxisType.Auto
  return [Mesh(devices.reshape(8), ("data",), axis_types=(auto,)),
          Mesh(devices.reshape(2, 4), ("data", "fsdp"), axis_types=(auto, auto))]


def token_spec(mesh):
  return P(*mesh.axis_names) if len(mesh.axis_names) == 2 else P("data", None)


@pytest.mark.slow
def test_sharded_equals_unsharded():
  """Batch over 8 devices (1x8) and batch x tokens over a 2x4 mesh."""
  old, lp, adv, mask, w = make_batch(7, B=16, T=8)
  cfg = make_config(**{"policy_loss.kl_cov_ratio": 0.05, "policy_loss.clip_cov_ratio": 0.05})
  f = all_losses(cfg, "seq-mean-token-mean")
  key = jax.random.key(3)
  want = jax.jit(f)(old, lp, adv, mask, w, key)
  for mesh in meshes():
    tok = NamedSharding(mesh, token_spec(mesh))
    rep = NamedSharding(mesh, P())
    out_shardings = {name: (rep, rep, tok) for name in ALL_LOSSES}
    sharded = jax.jit(f, in_shardings=(tok,) * 5 + (rep,), out_shardings=out_shardings)
    args = [jax.device_put(x, tok) for x in (old, lp, adv, mask, w)]
    got = sharded(*args, jax.device_put(key, rep))
    for name in ALL_LOSSES:
      loss, met, grad = got[name]
      assert grad.sharding.is_equivalent_to(tok, 2)
      assert len(grad.sharding.device_set) == 8
      close(loss, float(want[name][0]), rtol=1e-6, atol=1e-6)
      for k, v in want[name][1].items():
        close(met[k], float(v), rtol=1e-6, atol=1e-6)
      close(grad, np.asarray(want[name][2]), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------- total actor loss --


def test_ppo_loss_composition():
  old, lp, adv, mask, w = make_batch(8)
  rng = np.random.default_rng(8)
  ref_lp = (lp + rng.normal(0, 0.2, lp.shape)).astype(np.float32)
  entropy = rng.uniform(0.5, 3.0, lp.shape).astype(np.float32)
  positive = np.array([True, False] * 4)
  cfg = make_config(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.05,
                    loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=10,
                    positive_nll_coef=0.2, **{"policy_loss.loss_mode": "gspo"})
  gbi = {"dp_size": 1, "batch_num_tokens": 30.0, "global_batch_size": 9}
  loss, met = jax.jit(lambda *a: pl.ppo_loss(cfg, pl.PolicyInputs(*a), global_batch_info=gbi))(
      lp, old, adv, mask, entropy, ref_lp, w, positive)
  c = as_dict(cfg)
  g = {**gbi, "loss_scale_factor": 10}
  mode = "seq-mean-token-sum-norm"
  pg, _, _ = ref.gspo(old, lp, adv, mask, mode, c, w, **g)
  ent = ref.agg_loss(entropy, mask, mode, **g)
  kld = np.asarray(kl_penalty(jnp.asarray(lp), jnp.asarray(ref_lp), "low_var_kl"))
  kl = ref.agg_loss(kld, mask, mode, **g)
  pm = mask * positive[:, None]
  nll = -ref.msum(lp, pm) / pm.sum()
  close(met["actor/pg_loss"], pg)
  close(met["actor/entropy_loss"], ent)
  close(met["actor/kl_loss"], kl)
  close(met["actor/kl_coef"], 0.05)
  close(met["actor/positive_nll_loss"], nll)
  close(loss, pg - 0.01 * ent + 0.05 * kl + 0.2 * nll)
  assert "actor/pg_clipfrac" in met


@pytest.mark.parametrize("loss_mode", ["geo_mean", "vanilla"])
def test_empty_row_slots_do_not_dilute_a_loss_averaged_over_rows(loss_mode):
  # a packed micro-batch under a token budget: 5 real rows (the batch's first, non-empty ones), 3 empty slots
  old, lp, adv, mask, _ = make_batch(10)
  keep = np.flatnonzero(mask.sum(-1) > 0)[:5]
  real = [x[keep] for x in (lp, old, adv, mask)]
  slotted = [np.concatenate([x, np.zeros((3, x.shape[1]), x.dtype)]) for x in real]
  cfg = make_config(**{"policy_loss.loss_mode": loss_mode})
  gbi = {"dp_size": 1, "batch_num_tokens": float(real[3].sum()), "global_batch_size": 5}
  alone, _ = pl.ppo_loss(cfg, pl.PolicyInputs(*real), global_batch_info=gbi)
  in_slots, _ = pl.ppo_loss(cfg, pl.PolicyInputs(*slotted, rows=5), global_batch_info=gbi)
  close(in_slots, float(alone))


def test_ppo_loss_defaults_are_plain_policy_loss():
  old, lp, adv, mask, _ = make_batch(9)
  cfg = make_config()
  loss, met = pl.ppo_loss(cfg, pl.PolicyInputs(lp, old, adv, mask))
  want, _ = call("vanilla", old, lp, adv, mask, cfg=cfg)
  close(loss, float(want))
  assert set(met) == {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
                      "actor/pg_clipfrac_lower"}


def test_positive_nll_loss_hand_case():
  lp = jnp.log(jnp.array([[0.5, 0.25, 0.9], [0.1, 0.1, 0.1]]))
  m = jnp.array([[1, 1, 0], [1, 1, 1]], jnp.float32)
  got = pl.positive_nll_loss(lp, m, jnp.array([True, False]))
  close(got, (math.log(2) + math.log(4)) / 2)
  close(pl.positive_nll_loss(lp, m, jnp.array([False, False])), 0.0)


@pytest.mark.parametrize("name", VERL_NAMES + ["aipo"])
def test_losses_read_global_batch_info_from_the_config_as_verl_does(name):
  rng = np.random.default_rng(0)
  shape = (4, 6)
  old, new = (jnp.asarray(rng.normal(-1.0, 0.3, shape), jnp.float32) for _ in range(2))
  adv = jnp.asarray(rng.normal(size=shape), jnp.float32)
  mask = jnp.asarray(rng.random(shape) > 0.3, jnp.float32)
  info = {"dp_size": 2, "batch_num_tokens": 40.0, "global_batch_size": 16, "loss_scale_factor": None}
  cfg = make_config(loss_agg_mode="seq-mean-token-sum")
  fn = pl.get_policy_loss(name)
  keyword = fn(old, new, adv, mask, "seq-mean-token-sum", cfg, global_batch_info=info, rng=jax.random.key(0))[0]
  local = fn(old, new, adv, mask, "seq-mean-token-sum", cfg, rng=jax.random.key(0))[0]
  cfg.global_batch_info = info
  from_config = fn(old, new, adv, mask, "seq-mean-token-sum", cfg, rng=jax.random.key(0))[0]
  np.testing.assert_allclose(from_config, keyword, rtol=1e-6)
  if name not in ("sapo", "geo_mean"):  # as verl's: seq-mean-token-mean (no batch info), a plain mean
    assert not np.isclose(float(local), float(keyword))
