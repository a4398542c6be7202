"""Chunked token log-probs: equal to the full-logits reference, and much less memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax.models as M


def _inputs(b=3, t=7, d=16, v=50, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  hidden = jax.random.normal(k1, (b, t, d))
  weight = jax.random.normal(k2, (v, d)) * 0.5
  targets = jax.random.randint(k3, (b, t), 0, v)
  return hidden, weight, targets


@pytest.mark.parametrize("chunk_size,temperature", [(4, 1.0), (5, 0.7), (1024, 1.3)])
def test_values_equal_naive(chunk_size, temperature):
  hidden, weight, targets = _inputs()
  logp, ent = M.token_log_probs(hidden, weight, targets, chunk_size=chunk_size,
                                temperature=temperature)
  ref_logp, ref_ent = M.naive_token_log_probs(hidden, weight, targets, temperature)
  np.testing.assert_allclose(logp, ref_logp, atol=1e-5)
  np.testing.assert_allclose(ent, ref_ent, atol=1e-5)
  # Hand check for one token: log softmax written out.
  z = np.asarray(hidden[1, 2] @ weight.T, np.float64) / temperature
  want = z[int(targets[1, 2])] - np.log(np.exp(z - z.max()).sum()) - z.max()
  np.testing.assert_allclose(logp[1, 2], want, atol=1e-5)


def test_gradients_equal_naive():
  hidden, weight, targets = _inputs()
  coef = jax.random.normal(jax.random.key(1), targets.shape)

  def loss(fn, h, w):
    logp, ent = fn(h, w, targets)
    return jnp.sum(coef * logp) + 0.1 * jnp.sum(ent)

  chunked = jax.grad(lambda h, w: loss(
      lambda *a: M.token_log_probs(*a, chunk_size=4), h, w), argnums=(0, 1))(hidden, weight)
  naive = jax.grad(lambda h, w: loss(M.naive_token_log_probs, h, w),
                   argnums=(0, 1))(hidden, weight)
  for a, b in zip(chunked, naive):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_without_entropy():
  hidden, weight, targets = _inputs()
  logp, ent = M.token_log_probs(hidden, weight, targets, chunk_size=8, with_entropy=False)
  np.testing.assert_allclose(logp, M.naive_token_log_probs(hidden, weight, targets)[0],
                             atol=1e-5)
  assert not np.asarray(ent).any()


def _peak_bytes(fn, *shapes):
  compiled = jax.jit(fn).lower(*shapes).compile()
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.output_size_in_bytes


def test_peak_memory_is_small_fraction_at_qwen_vocab():
  """V=152k, B*T=16k: compiled temp memory of value+grad, chunked vs naive."""
  b, t, d, v = 16, 1024, 64, 152064
  shapes = (jax.ShapeDtypeStruct((b, t, d), jnp.float32),
            jax.ShapeDtypeStruct((v, d), jnp.float32),
            jax.ShapeDtypeStruct((b, t), jnp.int32))

  def grad_of(fn):
    return jax.grad(lambda h, w, y: jnp.sum(fn(h, w, y)[0]) + jnp.sum(fn(h, w, y)[1]),
                    argnums=(0, 1))

  chunked = _peak_bytes(grad_of(lambda h, w, y: M.token_log_probs(h, w, y, chunk_size=512)),
                        *shapes)
  naive = _peak_bytes(grad_of(M.naive_token_log_probs), *shapes)
  assert naive > b * t * v * 4  # at least the full float32 logits.
  assert chunked < 0.05 * naive, (chunked, naive)
