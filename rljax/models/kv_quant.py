"""A KV cache stored in 8 bits: int8 or float8 values with one scale per token and KV head.

A cache layer holding ``QuantizedKV`` instead of an array keeps each written
key (or value) vector ``x`` [head_dim] as ``round(x / s)`` in 8 bits with
``s = max|x| / R`` (R: 127 for int8, the format's largest finite value for
float8) in the compute dtype beside it: half the bytes of a bfloat16 cache
(plus 2 bytes per token and head for the scale), so twice the slots fit in
the same memory, and a decode step, bound by the cache it reads, reads
about half of it. Attention never materialises the dequantized cache: the
key scale multiplies the scores and the value scale the softmax weights
(`rljax.models.attention`), so the 8-bit arrays go straight into the two
contractions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

# rollout.kv_cache_dtype -> storage dtype ("auto": the compute dtype, unquantized)
KV_CACHE_DTYPES = {"auto": None, "int8": jnp.int8, "fp8": jnp.float8_e4m3fn, "fp8_e4m3": jnp.float8_e4m3fn,
                   "fp8_e5m2": jnp.float8_e5m2}


class QuantizedKV(NamedTuple):
  """One layer's cached keys (or values) in 8 bits.

  Attributes:
    values: [B, K, S, head_dim] int8 or float8.
    scale: [B, K, S] in the compute dtype: values[b, k, s] * scale[b, k, s]
      is the stored vector (0 where nothing was written).
  """

  values: jax.Array
  scale: jax.Array


def is_quantized(dtype: Any) -> bool:
  """Whether a cache of `dtype` is stored quantized (8-bit integer or float)."""
  return dtype is not None and jnp.dtype(dtype) in {jnp.dtype(d) for d in KV_CACHE_DTYPES.values() if d is not None}


def largest(dtype: Any) -> float:
  """The largest finite magnitude of an 8-bit `dtype` (127 for int8)."""
  return float(jnp.iinfo(dtype).max if jnp.issubdtype(dtype, jnp.integer) else jnp.finfo(dtype).max)


def empty(shape: tuple[int, ...], dtype: Any, scale_dtype: Any) -> QuantizedKV:
  """An all-zero cache layer of `shape` [B, K, S, head_dim] stored as `dtype`, scales in `scale_dtype`."""
  return QuantizedKV(values=jnp.zeros(shape, dtype), scale=jnp.zeros(shape[:-1], scale_dtype))


def quantize_along(x: jax.Array, axes: tuple[int, ...], dtype: Any, scale_dtype: Any) -> tuple[jax.Array, jax.Array]:
  """x -> (values in `dtype`, scales of x's shape with 1 on `axes`): one scale per slice along `axes`, its
  largest magnitude over the 8-bit range (0 for an all-zero slice).

  The scale is rounded to `scale_dtype` before dividing, so values * scale
  reproduces x to the 8-bit format's rounding, whatever the scale's dtype.
  """
  x = x.astype(jnp.float32)
  top = largest(dtype)
  scale = (jnp.max(jnp.abs(x), axis=axes, keepdims=True) / top).astype(scale_dtype)
  wide = scale.astype(jnp.float32)
  q = jnp.clip(x / jnp.where(wide > 0, wide, 1.0), -top, top)
  if jnp.issubdtype(dtype, jnp.integer):
    q = jnp.round(q)
  return q.astype(dtype), scale


def quantize(x: jax.Array, dtype: Any, scale_dtype: Any) -> QuantizedKV:
  """x [..., head_dim] -> QuantizedKV with one scale per vector (`quantize_along` its last axis)."""
  values, scale = quantize_along(x, (-1,), dtype, scale_dtype)
  return QuantizedKV(values=values, scale=scale[..., 0])


def dequantize(kv: QuantizedKV | jax.Array, dtype: Any) -> jax.Array:
  """The stored vectors [..., head_dim] in `dtype` (an unquantized array is only cast)."""
  if not isinstance(kv, QuantizedKV):
    return kv.astype(dtype)
  return (kv.values.astype(jnp.float32) * kv.scale.astype(jnp.float32)[..., None]).astype(dtype)


__all__ = ["KV_CACHE_DTYPES", "QuantizedKV", "dequantize", "empty", "is_quantized", "largest", "quantize",
           "quantize_along"]
