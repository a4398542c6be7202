"""Chunked token log-probs: equal to the full-logits reference, and much less memory."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import rljax.models as M
from rljax.models import logprobs


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


# 6 token chunks (padded) and 1 vocabulary block, 3 equal chunks, one chunk (no custom backward),
# 3 equal vocabulary blocks of 100, 3 blocks of 101 with 2 padding rows, temperature 0.7; softcapped
# logits (Gemma's final_logit_softcapping) through the written-out backward pass
@pytest.mark.parametrize("chunk_size,vocab,temperature,softcap", [
    (4, 50, 1.0, None), (7, 50, 1.0, None), (1024, 50, 1.0, None), (4, 300, 1.0, None), (4, 301, 1.0, None),
    (5, 301, 0.7, None), (5, 301, 0.7, 2.0)])
def test_gradients_equal_naive(chunk_size, vocab, temperature, softcap):
  hidden, weight, targets = _inputs(v=vocab)
  coef = jax.random.normal(jax.random.key(1), targets.shape)

  def loss(fn, h, w):
    logp, ent = fn(h, w, targets)
    return jnp.sum(coef * logp) + 0.1 * jnp.sum(ent)

  chunked = jax.value_and_grad(lambda h, w: loss(
      lambda *a: M.token_log_probs(*a, chunk_size=chunk_size, temperature=temperature, softcap=softcap), h, w),
      argnums=(0, 1))(hidden, weight)
  naive = jax.value_and_grad(lambda h, w: loss(
      lambda *a: M.naive_token_log_probs(*a, temperature=temperature, softcap=softcap), h, w),
      argnums=(0, 1))(hidden, weight)
  np.testing.assert_allclose(chunked[0], naive[0], rtol=1e-5)
  for a, b in zip(chunked[1], naive[1]):
    np.testing.assert_allclose(a, b, atol=1e-5)


def _logit_dots(jaxpr, vocab: int) -> list[tuple[int, ...]]:
  """(rows, positions) of the [rows, positions, (parts,) vocab] logits blocks the jaxpr computes, one per
  dot_general, nested ones included."""
  rows = []
  for eqn in jaxpr.eqns:
    shape = eqn.outvars[0].aval.shape if eqn.outvars else ()
    if eqn.primitive.name == "dot_general" and len(shape) >= 3 and shape[-1] == vocab:
      rows.append(shape[:2])
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      rows += _logit_dots(sub, vocab)
  return rows


def test_chunks_are_equal_and_one_chunk_is_not_recomputed():
  assert [logprobs.chunk_layout(n, 1024) for n in (1, 1024, 1025, 1536, 3000)] == [
      (1, 1), (1, 1024), (2, 513), (2, 768), (3, 1000)]
  with pytest.raises(ValueError, match="chunk_size=0: must be a positive number of tokens"):
    logprobs.chunk_layout(10, 0)
  hidden, weight, targets = _inputs(b=3, t=7)  # 21 tokens, V = 50

  def grad_dots(chunk_size):
    loss = lambda h, w: jnp.sum(M.token_log_probs(h, w, targets, chunk_size=chunk_size)[0])
    dots = _logit_dots(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden, weight).jaxpr, 50)
    return [shape for shape in dots if shape[0] == 3]  # [rows, positions, V] logits, not [1, D, V] weight grads

  # 12 tokens a chunk: 4 positions of each of the 3 rows, 2 chunks (not 3 of 3 with 2 padding positions);
  # the backward pass computes all 7 positions' logits one vocabulary block at a time (here one block).
  assert grad_dots(12) == [(3, 4), (3, 7)]
  # All 21 tokens in one chunk: the logits are computed once.
  assert grad_dots(21) == [(3, 7)]


def test_without_entropy():
  hidden, weight, targets = _inputs()
  logp, ent = M.token_log_probs(hidden, weight, targets, chunk_size=8, with_entropy=False)
  np.testing.assert_allclose(logp, M.naive_token_log_probs(hidden, weight, targets)[0],
                             atol=1e-5)
  assert not np.asarray(ent).any()


# 3 token chunks through the custom backward pass, one chunk, a softcap with a temperature
@pytest.mark.parametrize("chunk_size,temperature,softcap", [(4, 1.0, None), (1024, 0.7, None), (5, 0.7, 2.0)])
def test_sum_pi_squared_in_the_entropys_place_with_the_log_probs_gradient_unchanged(chunk_size, temperature,
                                                                                     softcap):
  """verl's calculate_sum_pi_squared_from_logits (Σ_v softmax(z)_v², written out in float64 here); the
  log-probs and their gradient are those of a pass without it, and the sum takes none."""
  hidden, weight, targets = _inputs(v=301)
  kwargs = dict(chunk_size=chunk_size, temperature=temperature, softcap=softcap, with_entropy=False)
  logp, sq = M.token_log_probs(hidden, weight, targets, sum_pi_squared=True, **kwargs)
  z = np.asarray(hidden, np.float64) @ np.asarray(weight, np.float64).T
  z = (z if softcap is None else softcap * np.tanh(z / softcap)) / temperature
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(sq, (p ** 2).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(logp, M.token_log_probs(hidden, weight, targets, **kwargs)[0], atol=1e-6)
  coef = jax.random.normal(jax.random.key(1), targets.shape)

  def loss(h, w, **extra):
    logp, second = M.token_log_probs(h, w, targets, **kwargs, **extra)
    return jnp.sum(coef * logp) + jnp.sum(second)

  with_sum = jax.grad(lambda h, w: loss(h, w, sum_pi_squared=True), argnums=(0, 1))(hidden, weight)
  without = jax.grad(loss, argnums=(0, 1))(hidden, weight)
  for a, b in zip(with_sum, without):
    np.testing.assert_allclose(a, b, atol=1e-6)
  with pytest.raises(ValueError, match="choose one"):
    M.token_log_probs(hidden, weight, targets, sum_pi_squared=True)


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


def test_zero_tokens():
  hidden, weight, targets = _inputs(b=2, t=0)
  logp, ent = M.token_log_probs(hidden, weight, targets, chunk_size=4)
  assert logp.shape == ent.shape == (2, 0)
  grads = jax.grad(lambda h, w: jnp.sum(M.token_log_probs(h, w, targets)[0]), argnums=(0, 1))(hidden, weight)
  assert grads[0].shape == (2, 0, 16) and not np.asarray(grads[1]).any()
