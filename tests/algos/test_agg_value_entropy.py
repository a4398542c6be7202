"""agg_loss (spec §2), value loss (§4.1), entropy (§0, §3.13)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.algos import agg, entropy as ent, value_loss as vl
from tests.algos import np_ref_losses as ref

MODES = agg.LOSS_AGG_MODES


def close(a, b, rtol=1e-5, atol=1e-5):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=rtol, atol=atol)


def make_loss_batch(seed, B=8, T=10, empty_row=True):
  rng = np.random.default_rng(seed)
  mask = np.zeros((B, T), np.float32)
  for b in range(B):
    length = 0 if (empty_row and b == 2) else rng.integers(1, T + 1)
    mask[b, :length] = 1.0
    gaps = rng.random(T) < 0.2
    gaps[0] = False
    mask[b, gaps] = 0.0
  loss = rng.normal(0, 1, (B, T)).astype(np.float32)
  loss[mask == 0] = 77.0
  return loss, mask


# ------------------------------------------------------------- agg_loss --


def test_agg_loss_hand_cases():
  L = jnp.array([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 5.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
  m = jnp.array([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]], jnp.float32)
  # valid: row0 1+2+3 (3 tokens), row1 4+5 (2 tokens), row2 empty.
  close(agg.agg_loss(L, m, "token-mean"), 15 / 5)
  close(agg.agg_loss(L, m, "token-sum"), 15.0)
  close(agg.agg_loss(L, m, "seq-mean-token-sum"), (6 + 9) / 2)
  close(agg.agg_loss(L, m, "seq-mean-token-sum-norm"), (6 + 9) / 2 / 4)
  close(agg.agg_loss(L, m, "seq-mean-token-sum-norm", loss_scale_factor=3), (6 + 9) / 2 / 3)
  close(agg.agg_loss(L, m, "seq-mean-token-mean"), (2 + 4.5) / 2)
  close(agg.agg_loss(L, m, "token-mean", dp_size=2, batch_num_tokens=10), 15 / 10 * 2)
  close(agg.agg_loss(L, m.astype(bool), "seq-mean-token-mean", global_batch_size=3), 6.5 / 3)


def test_agg_loss_token_mean_of_empty_mask_is_nan_as_verl():
  L = jnp.ones((2, 3))
  assert np.isnan(float(agg.agg_loss(L, jnp.zeros((2, 3)), "token-mean")))


def test_agg_loss_errors():
  L, m = jnp.ones((2, 3)), jnp.ones((2, 3))
  with pytest.raises(ValueError, match="token-avg.*valid modes: token-mean"):
    agg.agg_loss(L, m, "token-avg")
  with pytest.raises(ValueError, match="batch_num_tokens"):
    agg.agg_loss(L, m, "token-mean", dp_size=2)
  with pytest.raises(ValueError, match="global_batch_size"):
    agg.agg_loss(L, m, "seq-mean-token-mean", dp_size=2)


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_matches_reference(mode):
  f = jax.jit(agg.agg_loss, static_argnames=("loss_agg_mode", "dp_size"))
  for seed, kw in [(0, {}), (1, {"dp_size": 2, "batch_num_tokens": 50.0,
                                 "global_batch_size": 11, "loss_scale_factor": 7})]:
    L, m = make_loss_batch(seed)
    close(f(L, m, mode, **kw), ref.agg_loss(L, m, mode, **kw))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_losses_sum_to_mini_batch_loss(mode):
  L, m = make_loss_batch(3, B=8)
  info = agg.global_batch_info(jnp.asarray(m), loss_scale_factor=None)
  f = jax.jit(lambda l, mm, n, g: agg.agg_loss(
      l, mm, mode, batch_num_tokens=n, global_batch_size=g))
  whole = f(L, m, info["batch_num_tokens"], info["global_batch_size"])
  parts = sum(float(f(L[i:i + 2], m[i:i + 2], info["batch_num_tokens"],
                      info["global_batch_size"])) for i in range(0, 8, 2))
  close(parts, float(whole), rtol=1e-6, atol=1e-6)
  # With no empty row, the global normalisation equals the default one.
  L2, m2 = make_loss_batch(4, B=8, empty_row=False)
  info2 = agg.global_batch_info(jnp.asarray(m2))
  parts2 = sum(float(f(L2[i:i + 4], m2[i:i + 4], info2["batch_num_tokens"],
                       info2["global_batch_size"])) for i in (0, 4))
  close(parts2, float(agg.agg_loss(L2, m2, mode)), rtol=1e-6, atol=1e-6)


def test_micro_batch_gradients_sum_to_mini_batch_gradient():
  L, m = make_loss_batch(5)
  info = agg.global_batch_info(jnp.asarray(m))
  g = jax.jit(jax.grad(lambda l, mm: agg.agg_loss(
      l, mm, "token-mean", batch_num_tokens=info["batch_num_tokens"])))
  whole = g(L, m)
  parts = np.concatenate([np.asarray(g(L[i:i + 4], m[i:i + 4])) for i in (0, 4)])
  close(parts, np.asarray(whole), rtol=1e-6, atol=1e-7)
  close(whole, ref.agg_weights(m, "token-mean", batch_num_tokens=float(m.sum())))


# ----------------------------------------------------------- value loss --


def make_value_batch(seed, B=8, T=10):
  rng = np.random.default_rng(seed)
  _, m = make_loss_batch(seed, B, T)
  values = rng.normal(0, 1, (B, T)).astype(np.float32)
  vpreds = (values + rng.normal(0, 0.8, (B, T))).astype(np.float32)
  returns = (values + rng.normal(0, 1, (B, T))).astype(np.float32)
  return vpreds, returns, values, m


def test_value_loss_hand_case():
  v = jnp.array([[1.0, 0.0, 2.0]])
  old = jnp.array([[0.0, 0.0, 0.0]])
  ret = jnp.array([[0.0, 1.0, 0.0]])
  m = jnp.array([[1, 1, 0]], jnp.float32)
  # token 0: v=1, clip=0.5: l1 = 1, l2 = .25 -> 1; token 1: v=0=clip: 1 and 1.
  loss, frac = vl.compute_value_loss(v, ret, old, m, 0.5)
  close(loss, 0.5 * (1 + 1) / 2)
  close(frac, 0.0)
  # token 0 with returns 2: l1 = 1, l2 = (0.5 - 2)^2 = 2.25 -> clipped wins.
  loss, frac = vl.compute_value_loss(v, ret + jnp.array([[2.0, 0, 0]]), old, m, 0.5)
  close(loss, 0.5 * (2.25 + 1) / 2)
  close(frac, 0.5)
  grad = jax.grad(lambda x: vl.compute_value_loss(
      x, ret + jnp.array([[2.0, 0, 0]]), old, m, 0.5)[0])(v)
  close(grad, [[0.0, -0.5, 0.0]])


@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_reference_and_gradient(mode):
  vpreds, returns, values, m = make_value_batch(7)
  f = jax.jit(lambda *a: vl.compute_value_loss(*a, 0.5, mode))
  loss, frac = f(vpreds, returns, values, m)
  want_loss, want_frac = ref.value_loss(vpreds, returns, values, m, 0.5, mode)
  close(loss, want_loss)
  close(frac, want_frac)
  grad = jax.jit(jax.grad(
      lambda v: vl.compute_value_loss(v, returns, values, m, 0.5, mode)[0]))(vpreds)
  close(grad, ref.value_loss_grad(vpreds, returns, values, m, 0.5, mode), rtol=1e-4, atol=1e-6)


def test_value_loss_global_batch_and_padding():
  vpreds, returns, values, m = make_value_batch(8)
  kw = {"dp_size": 1, "batch_num_tokens": 100.0}
  loss, _ = vl.compute_value_loss(vpreds, returns, values, m, 0.2, "token-mean", **kw)
  close(loss, ref.value_loss(vpreds, returns, values, m, 0.2, "token-mean", **kw)[0])
  bad = vpreds.copy()
  bad[m == 0] = np.nan
  g = jax.grad(lambda v: vl.compute_value_loss(v, returns, values, m, 0.2)[0])(bad)
  assert np.all(np.asarray(g)[m == 0] == 0) and np.all(np.isfinite(np.asarray(g)))


# -------------------------------------------------------------- entropy --


def test_entropy_hand_cases():
  logits = jnp.array([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -jnp.inf, -jnp.inf]])
  close(ent.entropy_from_logits(logits[:1]), [math.log(4)])
  # p = (3/4, 1/4): H = -(.75 ln .75 + .25 ln .25)
  close(ent.entropy_from_logits(jnp.array([[math.log(3.0), 0.0]])),
        [-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))])
  close(ent.logprobs_from_logits(jnp.array([[math.log(3.0), 0.0]]), jnp.array([1])),
        [math.log(0.25)])


def test_entropy_matches_reference_and_chunked():
  rng = np.random.default_rng(0)
  logits = (rng.normal(0, 3, (3, 7, 50))).astype(np.float32)
  want = ref.entropy(logits)
  close(jax.jit(ent.entropy_from_logits)(logits), want)
  chunked = jax.jit(lambda l: ent.entropy_from_logits_with_chunking(l, chunk_size=4))
  close(chunked(logits), want)
  labels = rng.integers(0, 50, (3, 7))
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  close(ent.logprobs_from_logits(logits, labels),
        np.take_along_axis(logits, labels[..., None], -1)[..., 0] - lse)
  g_full = jax.jit(jax.grad(lambda l: jnp.sum(ent.entropy_from_logits(l) * 0.3)))(logits)
  g_chunk = jax.jit(jax.grad(lambda l: jnp.sum(chunked(l) * 0.3)))(logits)
  close(g_chunk, np.asarray(g_full), rtol=1e-5, atol=1e-6)


def test_chunked_entropy_never_materialises_full_softmax():
  n, v, chunk = 4096, 1024, 128
  x = jax.ShapeDtypeStruct((n, v), jnp.float32)
  full_bytes = n * v * 4

  def temp_bytes(fn):
    return jax.jit(jax.value_and_grad(lambda l: jnp.sum(fn(l)))).lower(x).compile(
        ).memory_analysis().temp_size_in_bytes

  plain = temp_bytes(ent.entropy_from_logits)
  chunked = temp_bytes(lambda l: ent.entropy_from_logits_with_chunking(l, chunk))
  # Unchunked, the backward pass keeps [N, V] float32 softmax residuals;
  # chunked, the scratch is O(chunk * V) (the [N, V] gradient is an output).
  assert plain >= full_bytes
  assert chunked < full_bytes / 4


def test_entropy_loss():
  rng = np.random.default_rng(1)
  logits = rng.normal(0, 2, (4, 6, 11)).astype(np.float32)
  _, m = make_loss_batch(1, 4, 6)
  got = jax.jit(lambda lg, mm: {
      mode: ent.compute_entropy_loss(lg, mm, mode) for mode in MODES})(logits, m)
  token_entropy = ref.entropy(logits)
  for mode in MODES:
    close(got[mode], ref.agg_loss(token_entropy, m, mode))


def test_value_loss_and_entropy_sharded_equal_unsharded():
  vpreds, returns, values, m = make_value_batch(9, B=16, T=8)
  logits = np.random.default_rng(9).normal(0, 2, (16, 8, 24)).astype(np.float32)
  devices = np.array(jax.devices()[:8])
  auto = jax.sharding.AxisType.Auto

  def f(v, r, old, mask, lg):
    loss, frac = vl.compute_value_loss(v, r, old, mask, 0.3, "seq-mean-token-mean")
    grad = jax.grad(lambda x: vl.compute_value_loss(x, r, old, mask, 0.3)[0])(v)
    e = ent.entropy_from_logits_with_chunking(lg, chunk_size=32)
    return loss, frac, grad, e, ent.compute_entropy_loss(lg, mask)

  want = jax.jit(f)(vpreds, returns, values, m, logits)
  for mesh, spec in [(Mesh(devices.reshape(8), ("data",), axis_types=(auto,)), P("data")),
                     (Mesh(devices.reshape(2, 4), ("data", "fsdp"), axis_types=(auto,) * 2),
                      P("data", "fsdp"))]:
    tok = NamedSharding(mesh, spec)
    rep = NamedSharding(mesh, P())
    sharded = jax.jit(f, in_shardings=(tok,) * 5, out_shardings=(rep, rep, tok, tok, rep))
    got = sharded(*[jax.device_put(a, tok) for a in (vpreds, returns, values, m, logits)])
    for g, w in zip(got, want):
      close(g, np.asarray(w), rtol=1e-6, atol=1e-6)
