"""Softmax attention of grouped queries over keys and values: XLA or Pallas kernels.

`attend` picks the implementation by `ModelConfig.attention_kernel`:

* `xla`: scores as one batched matmul, a float32 softmax under the dense
  [B, T, S] mask, then the weighted values. Runs everywhere.
* `pallas`: on TPU, `rljax.kernels.flash_attention` (splash attention) for
  passes whose queries sit at the same slots in every row (training,
  log-probs, prefill: `AttentionMask.offset`), and
  `rljax.kernels.decode_attention` over the live slots of the cache for one
  new token per row (`AttentionMask.live`). Elsewhere the same kernels run
  in Pallas' interpreter (slow: for tests). Other calls use `xla`.

Keys and values may be an 8-bit cache (`rljax.models.kv_quant.QuantizedKV`):
`xla` and the decode kernel read its 8-bit values as stored and apply the
per-token scales to the scores and the softmax weights; the flash kernel
(a prefill's own prompt) reads it dequantized.

Inside `rljax.sharding.activation_sharding` a kernel runs under `shard_map`:
each device computes its own rows (the `cache_batch` rule) and heads (the
`heads` / `kv_heads` rules), so no kernel input is gathered.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rljax.kernels import decode_attention as decode_lib
from rljax.kernels import flash_attention as flash_lib
from rljax.models import kv_quant
from rljax.models.kv_quant import QuantizedKV
from rljax.sharding import rules as rules_lib

KERNELS = ("xla", "pallas")


@dataclasses.dataclass(frozen=True)
class AttentionMask:
  """Which keys each query attends to, in the forms the implementations read.

  Attributes:
    dense: [B, T, S] bool (the `xla` path; computed lazily by XLA only where used).
    query_segments: [B, T] int, 0 for padding (flash); None when unknown.
    key_segments: [B, S] int, 0 for padding (flash).
    offset: static slot of query 0, the same in every row (flash), or None.
    window: static sliding window, or None.
    live: ([B] first, [B] one past the last) slot holding a real key (decode), or None.
  """

  dense: jax.Array
  query_segments: jax.Array | None = None
  key_segments: jax.Array | None = None
  offset: int | None = None
  window: int | None = None
  live: tuple[jax.Array, jax.Array] | None = None


def dense_attention(
    q: jax.Array, k: jax.Array | QuantizedKV, v: jax.Array | QuantizedKV, mask: jax.Array,
    softcap: float | None = None,
) -> jax.Array:
  """Softmax attention of scaled queries q [B, T, K, G, hd] over keys and values [B, K, S, hd].

  Keys and values are head-major, so the score and value contractions are
  batched matmuls over (B, K) with no transpose of the (cached) keys. An
  8-bit cache enters both contractions as stored: its key scales [B, K, S]
  multiply the scores, its value scales the weights.

  Args:
    mask: [B, T, S] bool, True where query t may attend to key s.
    softcap: None, or scores become softcap * tanh(scores / softcap) (Gemma).

  Returns:
    [B, T, K, G, hd] in q's dtype.
  """
  neg = jnp.finfo(jnp.float32).min
  keys, key_scale = _stored(k)
  values, value_scale = _stored(v)
  scores = jnp.einsum("btkgh,bksh->bkgts", q, keys.astype(q.dtype)).astype(jnp.float32)
  if key_scale is not None:
    scores = scores * key_scale.astype(jnp.float32)[:, :, None, None, :]
  if softcap is not None:
    scores = softcap * jnp.tanh(scores / softcap)
  scores = jnp.where(mask[:, None, None], scores, neg)
  weights = jax.nn.softmax(scores, axis=-1)
  if value_scale is not None:
    weights = weights * value_scale.astype(jnp.float32)[:, :, None, None, :]
  return _weighted_values(weights.astype(q.dtype), values.astype(q.dtype))


def _stored(kv: jax.Array | QuantizedKV) -> tuple[jax.Array, jax.Array | None]:
  """(the cache as stored [B, K, S, hd], its scales [B, K, S] or None when it is not quantized)."""
  return (kv.values, kv.scale) if isinstance(kv, QuantizedKV) else (kv, None)


def _weighted_values(weights: jax.Array, v: jax.Array) -> jax.Array:
  """Attention outputs [B, T, K, G, hd] from weights [B, K, G, T, S] and values [B, K, S, hd].

  For one new token (a decode step) the contraction is written without the
  T axis: with it, XLA on the CPU lays the [B, 1, K, G, hd] output out
  through a slow per-layer transpose, and the decode step at 192 cached
  slots took 1.6x longer.
  """
  if weights.shape[3] == 1:
    return jnp.einsum("bkgs,bksh->bkgh", weights[:, :, :, 0], v)[:, None]
  return jnp.einsum("bkgts,bksh->btkgh", weights, v)


def _per_device(fn, specs: tuple[tuple[str | None, ...], ...], out: tuple[str | None, ...], *args):
  """fn(*args) per device under shard_map, each arg split by its logical axis names (directly without a mesh)."""
  mesh = rules_lib.active_mesh()
  if mesh is None:
    return fn(*args)
  to_spec = lambda names, x: rules_lib.active_spec(names, x.shape)  # noqa: E731
  in_specs = tuple(to_spec(n, a) for n, a in zip(specs, args))
  out_spec = to_spec(out, args[0])
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)(*args)


def _heads_split_alike(q: jax.Array, k: jax.Array) -> bool:
  """Whether query heads and KV heads split over the same mesh axes (each device's query heads then use its own
  KV heads, as the kernel assumes); rules that split one and not the other take the XLA path."""
  heads = rules_lib.active_spec(("heads",), (q.shape[2] * q.shape[3],))
  kv_heads = rules_lib.active_spec(("kv_heads",), (k.shape[1],))
  return heads == kv_heads


def _flash(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask) -> jax.Array:
  b, t, kh, g, hd = q.shape
  heads_first = q.reshape(b, t, kh * g, hd).transpose(0, 2, 1, 3)
  interpret = not rules_lib.on_tpu()

  def kernel(q, k, v, qs, ks):
    return flash_lib.flash_attention(q, k, v, qs, ks, mask.offset, mask.window, interpret)

  row = ("cache_batch", "heads", None, None)
  out = _per_device(kernel, (row, ("cache_batch", "kv_heads", None, None), ("cache_batch", "kv_heads", None, None),
                             ("cache_batch", None), ("cache_batch", None)), row,
                    heads_first, kv_quant.dequantize(k, q.dtype), kv_quant.dequantize(v, q.dtype),
                    mask.query_segments, mask.key_segments)
  return out.transpose(0, 2, 1, 3).reshape(b, t, kh, g, hd)


def _decode(q: jax.Array, k: jax.Array | QuantizedKV, v: jax.Array | QuantizedKV, mask: AttentionMask) -> jax.Array:
  keys, key_scale = _stored(k)
  values, value_scale = _stored(v)
  interpret = not rules_lib.on_tpu()
  block = decode_lib.block_size(keys.shape[2])

  def kernel(q, k, v, key_mask, starts, ends, *scales):
    return decode_lib.decode_attention(q, k, v, key_mask, starts, ends, block=block, interpret=interpret,
                                       k_scale=scales[0] if scales else None, v_scale=scales[1] if scales else None)

  heads = ("cache_batch", "kv_heads", None, None)
  scales = () if key_scale is None else (key_scale, value_scale)
  out = _per_device(kernel, (heads, heads, heads, ("cache_batch", None), ("cache_batch",), ("cache_batch",),
                             *[("cache_batch", "kv_heads", None)] * len(scales)), heads,
                    q[:, 0], keys, values, mask.dense[:, 0], *mask.live, *scales)
  return out[:, None]


def attend(
    q: jax.Array, k: jax.Array | QuantizedKV, v: jax.Array | QuantizedKV, mask: AttentionMask, kernel: str = "xla",
    softcap: float | None = None,
) -> jax.Array:
  """Attention of scaled queries q [B, T, K, G, hd] over k, v [B, K, S, hd] (or an 8-bit cache): [B, T, K, G, hd].

  `kernel` is `ModelConfig.attention_kernel` (see the module docstring);
  `softcap` is `ModelConfig.attn_logit_softcapping`, which only `xla` does.
  """
  if kernel not in KERNELS:
    raise ValueError(f"attention_kernel={kernel!r}: must be one of {', '.join(KERNELS)}")
  if softcap is not None:
    if kernel == "pallas":
      raise ValueError(f"attn_logit_softcapping={softcap} is not supported by attention_kernel='pallas'; "
                       "use attention_kernel='xla'.")
    return dense_attention(q, k, v, mask.dense, softcap)
  if kernel == "pallas" and q.shape[1] == 1 and mask.live is not None:
    return _decode(q, k, v, mask)
  flash = mask.offset is not None and mask.query_segments is not None
  if kernel == "pallas" and flash and _heads_split_alike(q, _stored(k)[0]):
    return _flash(q, k, v, mask)
  return dense_attention(q, k, v, mask.dense)


__all__ = ["AttentionMask", "KERNELS", "attend", "dense_attention"]
