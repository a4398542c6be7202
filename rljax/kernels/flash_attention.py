"""Causal attention for the training and log-prob passes: Pallas splash attention on TPU.

`jax.experimental.pallas.ops.tpu.splash_attention` computes softmax
attention block by block in VMEM (online softmax; no [T, S] score matrix in
HBM) with its own backward kernels, and skips the blocks a static mask
rules out (above the causal diagonal, outside a sliding window). Padding and
packed sequences are segment ids: a query attends only to keys of its own
segment.

Rows here are laid out as rljax's passes lay them: query t sits at cache
slot `offset + t` and attends to key slots `s <= offset + t` (and
`s > offset + t - window` with a sliding window) of the same segment;
segment 0 is padding. Lengths are padded to whole 128-slot blocks (padding
is segment 0, and its outputs are cut off).

Mosaic compiles no bfloat16 matmul at "highest" precision: trace TPU steps
under the default `jax_default_matmul_precision` (the splash backward is
traced when the gradient is, so a scope around the forward call is not
enough).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash

_LANES = 128


def _padded(length: int) -> int:
  return -(-length // _LANES) * _LANES


def _block(length: int) -> int:
  """The largest of 512, 256, 128 dividing `length` (a multiple of 128)."""
  return next(b for b in (512, 256, 128) if length % b == 0)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_len: int, kv_len: int, offset: int, window: int | None, interpret: bool):
  """A splash kernel for [heads, q_len, hd] queries over [kv_heads, kv_len, hd] keys (lengths padded)."""
  if window is None:
    one = splash.CausalMask((q_len, kv_len), offset=offset)
  else:
    one = splash.LocalMask((q_len, kv_len), window_size=(window - 1, 0), offset=offset)
  bq, bkv = _block(q_len), _block(kv_len)
  sizes = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                            block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  return splash.make_splash_mha(splash.MultiHeadMask([one] * heads), head_shards=1, q_seq_shards=1,
                                block_sizes=sizes, interpret=interpret)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segments: jax.Array, kv_segments: jax.Array,
                    offset: int = 0, window: int | None = None, interpret: bool = False) -> jax.Array:
  """Causal attention with segments, as one Pallas kernel per row.

  Args:
    q: [B, H, T, hd] scaled queries; heads h*G .. h*G + G - 1 share KV head h.
    k, v: [B, K, S, hd].
    q_segments: [B, T] int, 0 for padding; kv_segments: [B, S] likewise.
    offset: static slot of query 0 (query t attends to key slots <= offset + t).
    window: static sliding window (keys more than window - 1 slots back are masked).
    interpret: run in Pallas' interpreter (CPU).

  Returns:
    [B, H, T, hd] in q's dtype (padding rows hold arbitrary finite values).
  """
  b, h, t, _ = q.shape
  s = k.shape[2]
  tp, sp = _padded(t), _padded(s)
  pad = lambda x, n, axis: jnp.pad(x, [(0, n - x.shape[axis]) if i == axis else (0, 0) for i in range(x.ndim)])
  q, k, v = pad(q, tp, 2), pad(k, sp, 2), pad(v, sp, 2)
  segments = splash.SegmentIds(q=pad(q_segments.astype(jnp.int32), tp, 1),
                               kv=pad(kv_segments.astype(jnp.int32), sp, 1))
  with jax.ensure_compile_time_eval():  # the cached kernel's mask arrays must be concrete, not this trace's
    kernel = _kernel(h, tp, sp, int(offset), window, bool(interpret))
  out = jax.vmap(kernel)(q, k.astype(q.dtype), v.astype(q.dtype), segment_ids=segments)
  return out[:, :, :t]


def reference(q: jax.Array, k: jax.Array, v: jax.Array, q_segments: jax.Array, kv_segments: jax.Array,
              offset: int = 0, window: int | None = None) -> jax.Array:
  """The dense computation `flash_attention` equals (float32 scores), same arguments."""
  b, h, t, hd = q.shape
  kv_heads, s = k.shape[1], k.shape[2]
  diff = (offset + np.arange(t))[:, None] - np.arange(s)[None, :]
  allowed = diff >= 0
  if window is not None:
    allowed &= diff < window
  mask = jnp.asarray(allowed)[None] & (q_segments[:, :, None] == kv_segments[:, None, :])
  groups = h // kv_heads
  qg = q.reshape(b, kv_heads, groups, t, hd)
  scores = jnp.einsum("bkgth,bksh->bkgts", qg, k, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None], scores, -1e30)
  weights = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bkgts,bksh->bkgth", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return out.reshape(b, h, t, hd).astype(q.dtype)
