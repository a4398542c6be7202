"""Tests for rljax.algos.kl: estimators, gradients, reward KL, controllers."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rljax.algos import kl
from tests.algos import np_ref_advantages as ref

BASE_NAMES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
ALL_NAMES = BASE_NAMES + [n + "+" for n in BASE_NAMES]

# d = logprob - ref = [.5, -1, 0, -29, 25, -15]
LOGPROB = np.array([[-1.0, -2.0, -0.5], [-30.0, -0.5, -16.0]], np.float32)
REF = np.array([[-1.5, -1.0, -0.5], [-1.0, -25.5, -1.0]], np.float32)
D = [0.5, -1.0, 0.0, -29.0, 25.0, -15.0]


def _k3_by_hand(d):
  x = min(max(-d, -20.0), 20.0)
  return min(max(math.exp(x) - x - 1.0, -10.0), 10.0)


BY_HAND = {
    "kl": D, "k1": D,
    "abs": [abs(d) for d in D],
    "mse": [0.5 * d * d for d in D], "k2": [0.5 * d * d for d in D],
    "low_var_kl": [_k3_by_hand(d) for d in D],
    "k3": [_k3_by_hand(d) for d in D],
}


@pytest.mark.parametrize("name", ALL_NAMES)
def test_values_by_hand(name):
  out = kl.kl_penalty(LOGPROB, REF, name)
  assert out.shape == (2, 3) and out.dtype == jnp.float32
  expected = np.array(BY_HAND[name.rstrip("+")]).reshape(2, 3)
  np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_k3_clamps():
  # d = .5: x = -.5, value e^{-.5} + .5 - 1.
  assert abs(BY_HAND["k3"][0] - (math.exp(-0.5) + 0.5 - 1)) < 1e-12
  assert BY_HAND["k3"][3] == 10.0  # x = 29 -> 20, e^20 - 21 -> 10
  assert BY_HAND["k3"][4] == 10.0  # x = -25 -> -20, e^-20 + 19 -> 10
  assert BY_HAND["k3"][5] == 10.0  # x = 15, e^15 - 16 -> 10


def _grad_logprob(name):
  return jax.grad(lambda lp: jnp.sum(kl.kl_penalty(lp, REF, name)))(
      jnp.asarray(LOGPROB))


def _grad_ref(name):
  return jax.grad(lambda r: jnp.sum(kl.kl_penalty(LOGPROB, r, name)))(
      jnp.asarray(REF))


def test_gradients_match_spec():
  d = np.array(D).reshape(2, 3)
  np.testing.assert_allclose(_grad_logprob("k1"), np.ones_like(d))
  np.testing.assert_allclose(_grad_logprob("abs"), np.sign(d))  # 0 at d = 0
  np.testing.assert_allclose(_grad_logprob("k2"), d)
  # k3: 1 - e^{-d} where no clamp is active. d = -29 and 25 clamp x; d = -15
  # gives e^15 - 16 > 10, clamping the value: all three have gradient 0.
  k3 = np.array([1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0, 0, 0, 0])
  np.testing.assert_allclose(_grad_logprob("k3"), k3.reshape(2, 3), rtol=1e-6)
  np.testing.assert_allclose(_grad_logprob("low_var_kl"), k3.reshape(2, 3),
                             rtol=1e-6)


@pytest.mark.parametrize("name", [n + "+" for n in BASE_NAMES])
def test_straight_through_gradient_is_d(name):
  d = np.array(D).reshape(2, 3)
  np.testing.assert_allclose(_grad_logprob(name), d, rtol=1e-6)
  np.testing.assert_allclose(_grad_ref(name), -d, rtol=1e-6)


def test_gradients_match_reference_on_random_inputs():
  rng = np.random.default_rng(0)
  lp = rng.normal(-2, 1.5, size=(4, 6)).astype(np.float32)
  rp = rng.normal(-2, 1.5, size=(4, 6)).astype(np.float32)
  for name in ALL_NAMES:
    value = kl.kl_penalty(lp, rp, name)
    np.testing.assert_allclose(value, ref.kl_penalty(lp, rp, name),
                               rtol=1e-5, atol=1e-5, err_msg=name)
    grad = jax.grad(lambda x: jnp.sum(kl.kl_penalty(x, rp, name)))(lp)
    np.testing.assert_allclose(grad, ref.kl_penalty_grad(lp, rp, name),
                               rtol=1e-5, atol=1e-5, err_msg=name)


def _np_full_kl(logits, ref_logits):
  def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
  lp, lq = log_softmax(logits), log_softmax(ref_logits)
  return (np.exp(lp) * (lp - lq)).sum(-1)


def test_full_kl_from_logits():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 3
  ref_logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 3
  out = kl.kl_penalty_full(logits, ref_logits)
  np.testing.assert_allclose(out, _np_full_kl(logits, ref_logits), rtol=1e-5,
                             atol=1e-6)
  assert np.all(np.asarray(out) >= 0)
  np.testing.assert_allclose(kl.kl_penalty_full(logits, logits), 0, atol=1e-6)
  lp = np.zeros((2, 3), np.float32)
  via_name = kl.kl_penalty(lp, lp, "full", logits=logits, ref_logits=ref_logits)
  np.testing.assert_array_equal(via_name, out)
  # full+ keeps the exact value and takes the k2 gradient wrt logprob.
  rp = np.full((2, 3), -0.5, np.float32)
  plus = kl.kl_penalty(lp, rp, "full+", logits=logits, ref_logits=ref_logits)
  np.testing.assert_allclose(plus, out, rtol=1e-6)
  grad = jax.grad(lambda x: jnp.sum(kl.kl_penalty(
      x, rp, "full+", logits=logits, ref_logits=ref_logits)))(lp)
  np.testing.assert_allclose(grad, lp - rp)


def test_full_kl_gradient_matches_finite_differences():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(1, 1, 5))
  ref_logits = rng.normal(size=(1, 1, 5)).astype(np.float32)
  grad = jax.grad(lambda x: kl.kl_penalty_full(x, ref_logits).sum())(
      logits.astype(np.float32))
  h = 1e-5
  for v in range(5):
    up, down = logits.copy(), logits.copy()
    up[..., v] += h
    down[..., v] -= h
    fd = (_np_full_kl(up, ref_logits) - _np_full_kl(down, ref_logits)) / (2 * h)
    np.testing.assert_allclose(grad[0, 0, v], fd[0, 0], atol=1e-5)


def test_errors_name_the_fix():
  with pytest.raises(ValueError, match="kl_penalty_full"):
    kl.kl_penalty(LOGPROB, REF, "full")
  with pytest.raises(ValueError) as info:
    kl.kl_penalty(LOGPROB, REF, "k4")
  for name in ALL_NAMES + ["full", "full+"]:
    assert name in str(info.value)
  assert set(kl.KL_PENALTY_NAMES) == set(ALL_NAMES + ["full", "full+"])


def test_compute_rewards_by_hand():
  scores = np.array([[0.0, 0.0, 1.0]], np.float32)
  old = np.array([[-1.0, -2.0, -0.5]], np.float32)
  ref_lp = np.array([[-1.5, -1.0, -0.5]], np.float32)
  out = kl.compute_rewards(scores, old, ref_lp, 0.1)
  np.testing.assert_allclose(out, [[-0.05, 0.1, 1.0]], rtol=1e-6)


# ----------------------------------------------------------------------------
# Controllers.
# ----------------------------------------------------------------------------


def test_fixed_controller():
  ctrl = kl.FixedKLController(value=0.05)
  assert ctrl.update(3.0, 100) is ctrl
  assert ctrl.value == 0.05


def test_adaptive_controller_by_hand():
  ctrl = kl.AdaptiveKLController(value=0.1, target=0.1, horizon=100)
  # kl 0.5: error 4 clipped to 0.2 -> 0.1 * (1 + 0.2 * 10/100) = 0.102
  assert ctrl.update(0.5, 10).value == pytest.approx(0.102, rel=1e-12)
  # kl 0.05: error -0.5 clipped to -0.2 -> 0.098
  assert ctrl.update(0.05, 10).value == pytest.approx(0.098, rel=1e-12)
  # kl 0.11: error 0.1 -> 0.1 * (1 + 0.1 * 10/100) = 0.101
  assert ctrl.update(0.11, 10).value == pytest.approx(0.101, rel=1e-12)
  assert ctrl.value == 0.1  # immutable
  with pytest.raises(ValueError, match="horizon"):
    kl.AdaptiveKLController(value=0.1, target=0.1, horizon=0)


def test_adaptive_controller_matches_reference_over_many_steps():
  ours = kl.AdaptiveKLController(value=0.2, target=0.05, horizon=1000)
  theirs = ref.AdaptiveKL(0.2, 0.05, 1000)
  for step, current in enumerate(np.linspace(0.0, 0.2, 40)):
    ours = ours.update(float(current), 16 + step)
    theirs.update(float(current), 16 + step)
  assert ours.value == pytest.approx(theirs.value, rel=1e-12)


def test_controllers_are_pytrees_under_jit():
  ctrl = kl.AdaptiveKLController(value=0.1, target=0.1, horizon=100)
  new = jax.jit(lambda c, x: c.update(x, 10))(ctrl, jnp.float32(0.5))
  assert isinstance(new, kl.AdaptiveKLController)
  assert new.horizon == 100 and new.target == 0.1
  np.testing.assert_allclose(new.value, 0.102, rtol=1e-6)
  fixed = jax.jit(lambda c: c.update(1.0, 3))(kl.FixedKLController(0.3))
  np.testing.assert_allclose(fixed.value, 0.3, rtol=1e-7)


def test_get_kl_controller_from_config():
  cfg = ml_collections.ConfigDict(
      {"type": "fixed", "kl_coef": 0.002, "horizon": 10000, "target_kl": 0.1})
  ctrl = kl.get_kl_controller(cfg)
  assert isinstance(ctrl, kl.FixedKLController) and ctrl.value == 0.002
  cfg.type = "adaptive"
  ctrl = kl.get_kl_controller(cfg)
  assert isinstance(ctrl, kl.AdaptiveKLController)
  assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.002, 0.1, 10000)
  ctrl = kl.get_kl_controller({"type": "adaptive"})  # verl's defaults
  assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.001, 0.1, 10000)
  with pytest.raises(ValueError, match="kl_ctrl.type"):
    kl.get_kl_controller({"type": "pid"})
  with pytest.raises(ValueError, match="horizon"):
    kl.get_kl_controller({"type": "adaptive", "horizon": 0})


# ----------------------------------------------------------------------------
# KL in the reward.
# ----------------------------------------------------------------------------


def _kl_batch():
  rng = np.random.default_rng(3)
  b, t = 8, 6
  mask = (np.arange(t)[None] < rng.integers(1, t + 1, size=b)[:, None])
  mask = mask.astype(np.float32)
  mask[2, 1] = 0  # a hole
  return (rng.normal(size=(b, t)).astype(np.float32),
          rng.normal(-2, 1, size=(b, t)).astype(np.float32),
          rng.normal(-2, 1, size=(b, t)).astype(np.float32),
          mask)


@pytest.mark.parametrize("name", ["kl", "low_var_kl", "k2+"])
@pytest.mark.parametrize("ctrl_type", ["fixed", "adaptive"])
def test_apply_kl_penalty_matches_reference(name, ctrl_type):
  scores, old, ref_lp, mask = _kl_batch()
  config = {"type": ctrl_type, "kl_coef": 0.05, "target_kl": 0.1,
            "horizon": 100}
  ctrl = kl.get_kl_controller(config)
  ref_ctrl = (ref.FixedKL(0.05) if ctrl_type == "fixed"
              else ref.AdaptiveKL(0.05, 0.1, 100))
  rewards, new_ctrl, metrics = kl.apply_kl_penalty(
      scores, old, ref_lp, mask, ctrl, kl_penalty=name)
  want, want_metrics = ref.apply_kl_penalty(scores, old, ref_lp, mask,
                                            ref_ctrl, name)
  np.testing.assert_allclose(rewards, want, rtol=1e-5, atol=1e-5)
  assert set(metrics) == {"actor/reward_kl_penalty",
                          "actor/reward_kl_penalty_coeff"}
  for key in metrics:
    np.testing.assert_allclose(metrics[key], want_metrics[key], rtol=1e-5)
  np.testing.assert_allclose(new_ctrl.value, ref_ctrl.value, rtol=1e-6)
  assert ctrl.value == 0.05  # the old controller is untouched


def test_apply_kl_penalty_by_hand():
  scores = np.array([[0.0, 1.0], [2.0, 0.0]], np.float32)
  old = np.array([[-1.0, -2.0], [-0.5, -3.0]], np.float32)
  ref_lp = np.array([[-1.5, -1.0], [-1.0, -9.0]], np.float32)
  mask = np.array([[1, 1], [1, 0]], np.float32)
  rewards, ctrl, metrics = kl.apply_kl_penalty(
      scores, old, ref_lp, mask, kl.FixedKLController(0.5))
  # k1 = [.5, -1], [.5, (6 masked)]; rewards = scores - .5 * k1 * m.
  np.testing.assert_allclose(rewards, [[-0.25, 1.5], [1.75, 0.0]], rtol=1e-6)
  # per-row means: -0.25 and 0.5 -> batch mean 0.125.
  np.testing.assert_allclose(metrics["actor/reward_kl_penalty"], 0.125,
                             rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/reward_kl_penalty_coeff"], 0.5)


def test_kl_sharded_equals_unsharded():
  scores, old, ref_lp, mask = _kl_batch()
  ctrl = kl.AdaptiveKLController(value=0.05, target=0.1, horizon=100)

  def step(scores, old, ref_lp, mask, ctrl):
    rewards, new_ctrl, metrics = kl.apply_kl_penalty(
        scores, old, ref_lp, mask, ctrl, kl_penalty="k3")
    return rewards, kl.kl_penalty(old, ref_lp, "k3+"), new_ctrl.value, metrics

  want = jax.jit(step)(scores, old, ref_lp, mask, ctrl)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
  tok = NamedSharding(mesh, P(("data", "fsdp"), None))
  rep = NamedSharding(mesh, P())
  fn = jax.jit(step, in_shardings=(tok, tok, tok, tok, rep),
               out_shardings=(tok, tok, rep, rep))
  got = fn(scores, old, ref_lp, mask, ctrl)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
