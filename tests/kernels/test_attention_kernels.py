"""Pallas attention kernels: equal to dense attention in the interpreter (values and gradients), compile for TPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import SingleDeviceSharding

from rljax.compile import topology
from rljax.kernels import decode_attention as decode_lib
from rljax.kernels import flash_attention as flash_lib
from rljax.models import CausalLM, ModelConfig, init_cache, kv_quant


def _qkv(b, h, k, t, s, hd, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (b, h, t, hd)), jax.random.normal(keys[1], (b, k, s, hd)),
          jax.random.normal(keys[2], (b, k, s, hd)))


# (offset, S, window): causal self-attention; responses after a 12-slot shared prompt; a sliding window of 5
@pytest.mark.slow
@pytest.mark.parametrize("offset,kv_len,window", [(0, 20, None), (12, 32, None), (0, 20, 5)])
def test_flash_attention_equals_dense_values_and_gradients(offset, kv_len, window):
  q, k, v = _qkv(2, 4, 2, 20, kv_len, 16)
  q_seg = jnp.array([[0] * 3 + [1] * 17, [1] * 15 + [0] * 5])  # left padding in row 0, right padding in row 1
  kv_seg = jnp.concatenate([jnp.ones((2, kv_len - 20), jnp.int32), q_seg], axis=1)
  real = (q_seg > 0)[:, None, :, None]
  weights = jnp.cos(jnp.arange(16.0))

  def loss(fn):
    return lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v, q_seg, kv_seg, offset, window), 0) * weights)

  flash = lambda *a: flash_lib.flash_attention(*a, interpret=True)  # noqa: E731
  np.testing.assert_allclose(jnp.where(real, flash(q, k, v, q_seg, kv_seg, offset, window), 0),
                             jnp.where(real, flash_lib.reference(q, k, v, q_seg, kv_seg, offset, window), 0), atol=1e-5)
  got = jax.grad(loss(flash), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(flash_lib.reference), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_a_kernel_first_built_inside_a_trace_serves_the_next_trace():
  # the kernels are cached by shape: one first built while tracing a jit must hold concrete masks, or the next jit
  # of the same shape meets the first one's tracers (this shape is used by no other test, so the cache is cold)
  q, k, v = _qkv(1, 2, 1, 24, 24, 8)
  seg = jnp.ones((1, 24), jnp.int32)
  run = lambda q: flash_lib.flash_attention(q, k, v, seg, seg, 0, None, interpret=True)  # noqa: E731
  first = jax.jit(run)(q)
  np.testing.assert_allclose(jax.jit(lambda q: run(q) * 2)(q), 2 * first, rtol=1e-6)


def test_decode_attention_reads_only_live_blocks_and_equals_dense():
  b, kh, g, s, hd = 3, 2, 4, 384, 16
  keys = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(keys[0], (b, kh, g, hd))
  k = jax.random.normal(keys[1], (b, kh, s, hd))
  v = jax.random.normal(keys[2], (b, kh, s, hd))
  starts, ends = jnp.array([0, 100, 200]), jnp.array([384, 140, 201])
  slots = jnp.arange(s)
  mask = (slots >= starts[:, None]) & (slots < ends[:, None])
  mask = mask.at[0, 5].set(False)  # a hole inside the live range is masked, not skipped
  want = decode_lib.reference(q, k, v, mask)
  np.testing.assert_allclose(decode_lib.decode_attention(q, k, v, mask, starts, ends, block=128, interpret=True),
                             want, atol=1e-5)
  # blocks outside [starts, ends) are never read: poisoning them changes nothing
  outside = (slots[None] // 128 < starts[:, None] // 128) | (slots[None] // 128 > (ends[:, None] - 1) // 128)
  poisoned = jnp.where(outside[:, None, :, None], jnp.nan, k)
  np.testing.assert_allclose(decode_lib.decode_attention(q, poisoned, v, mask, starts, ends, block=128,
                                                         interpret=True), want, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.float8_e4m3fn])
def test_decode_attention_over_an_8bit_cache_equals_dense_over_its_dequantized_values(dtype):
  b, kh, g, s, hd = 2, 2, 4, 256, 16
  keys = jax.random.split(jax.random.key(4), 3)
  q = jax.random.normal(keys[0], (b, kh, g, hd))
  k = kv_quant.quantize(3 * jax.random.normal(keys[1], (b, kh, s, hd)), dtype, jnp.float32)
  v = kv_quant.quantize(jax.random.normal(keys[2], (b, kh, s, hd)), dtype, jnp.float32)
  starts, ends = jnp.array([0, 130]), jnp.array([200, 256])
  slots = jnp.arange(s)
  mask = (slots >= starts[:, None]) & (slots < ends[:, None])
  want = decode_lib.reference(q, kv_quant.dequantize(k, jnp.float32), kv_quant.dequantize(v, jnp.float32), mask)
  got = decode_lib.decode_attention(q, k.values, v.values, mask, starts, ends, block=128, interpret=True,
                                    k_scale=k.scale, v_scale=v.scale)
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("dtype,bound", [(jnp.int8, 0.5 / 127), (jnp.float8_e4m3fn, 2.0 ** -4)])
def test_an_8bit_cache_holds_each_vector_to_its_format_rounding(dtype, bound):
  x = jax.random.normal(jax.random.key(5), (2, 3, 7, 16)) * jnp.arange(1, 8)[None, None, :, None]
  x = x.at[0, 0, 0].set(0.0)  # a vector of zeros (nothing written) keeps scale 0 and stays 0
  stored = kv_quant.quantize(x, dtype, jnp.float32)
  assert stored.values.dtype == dtype and stored.scale.shape == (2, 3, 7)
  error = jnp.abs(kv_quant.dequantize(stored, jnp.float32) - x)
  assert float(jnp.max(error / jnp.max(jnp.abs(x), axis=-1, keepdims=True).clip(1e-30))) <= bound
  assert float(stored.scale[0, 0, 0]) == 0.0 and not jnp.any(jnp.isnan(kv_quant.dequantize(stored, jnp.float32)))


@pytest.mark.slow
def test_pallas_model_equals_xla_model_in_training_and_decode():
  cfg = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True)
  xla = CausalLM(cfg, nnx.Rngs(0))
  pallas = nnx.merge(nnx.graphdef(CausalLM(cfg.replace(attention_kernel="pallas"), nnx.Rngs(0))), nnx.state(xla))
  ids = jax.random.randint(jax.random.key(2), (2, 10), 0, 64)
  mask = jnp.array([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
  real = mask.astype(bool)[..., None]
  np.testing.assert_allclose(jnp.where(real, pallas(ids, mask), 0), jnp.where(real, xla(ids, mask), 0), atol=1e-4)
  cache = init_cache(cfg, 2, 16)
  _, cache_x = xla.step(ids, cache, mask, query_offset=0)
  _, cache_p = pallas.step(ids, init_cache(cfg, 2, 16), mask, query_offset=0)
  token = jnp.array([[5], [9]])
  logits_x, _ = xla.step(token, cache_x)
  logits_p, _ = pallas.step(token, cache_p)
  np.testing.assert_allclose(logits_p, logits_x, atol=1e-4)
  # an int8 cache: the decode kernel and XLA read it alike, and both stay near the full-precision cache
  _, int8_x = xla.step(ids, init_cache(cfg, 2, 16, jnp.int8), mask, query_offset=0)
  _, int8_p = pallas.step(ids, init_cache(cfg, 2, 16, jnp.int8), mask, query_offset=0)
  assert int8_x.k[0].values.dtype == jnp.int8
  quantized_x, _ = xla.step(token, int8_x)
  np.testing.assert_allclose(pallas.step(token, int8_p)[0], quantized_x, atol=1e-4)
  np.testing.assert_allclose(quantized_x, logits_x, atol=2e-2)


@jax.default_matmul_precision("default")  # conftest asks for "highest", which Mosaic has no bfloat16 matmul for
def test_kernels_compile_for_tpu():
  device = topology.devices(topology.parse("v5p:2x2x1"))[0]
  on = SingleDeviceSharding(device)
  spec = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype, sharding=on)  # noqa: E731
  flash = jax.jit(jax.grad(lambda q, k, v, qs, ks: jnp.sum(flash_lib.flash_attention(q, k, v, qs, ks, 128)
                                                          .astype(jnp.float32)), argnums=(0, 1, 2)))
  flash.lower(spec((2, 8, 256, 128)), spec((2, 2, 384, 128)), spec((2, 2, 384, 128)),
              spec((2, 256), jnp.int32), spec((2, 384), jnp.int32)).compile()
  decode = jax.jit(decode_lib.decode_attention)
  compiled = decode.lower(spec((8, 2, 4, 128)), spec((8, 2, 1024, 128)), spec((8, 2, 1024, 128)),
                          spec((8, 1024), jnp.bool_), spec((8,), jnp.int32), spec((8,), jnp.int32)).compile()
  assert "tpu_custom_call" in compiled.as_text()
  # over an int8 cache with its scales: Mosaic takes 8-bit blocks
  int8 = decode.lower(spec((8, 2, 4, 128)), spec((8, 2, 1024, 128), jnp.int8), spec((8, 2, 1024, 128), jnp.int8),
                      spec((8, 1024), jnp.bool_), spec((8,), jnp.int32), spec((8,), jnp.int32),
                      k_scale=spec((8, 2, 1024)), v_scale=spec((8, 2, 1024))).compile()
  assert "tpu_custom_call" in int8.as_text()
