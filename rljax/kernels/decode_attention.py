"""Decode attention over the live part of a KV cache: a Pallas TPU kernel.

One new token per row attends to its row's cache. Row b's real keys lie in
slots `[starts[b], ends[b])` (a prompt left-padded inside its prefill
bucket, then the generated tokens; `mask` marks which of them are real).
The kernel walks the cache in blocks of `block` slots: grid
`(rows, kv_heads, S / block)`, the block axis last and sequential. Blocks
outside `[starts, ends)` map to the nearest live block, so the pipeline
fetches nothing new for them and the body skips them: a step reads the live
part of each row's cache, not all S slots. Inside a live block the scores
are masked by `mask` and folded into an online softmax (running max, sum
and weighted values in VMEM), which is written out after the last block.

For q [B, K, G, hd] (G query heads per KV head, already scaled), caches
[B, K, S, hd] and mask [B, S]:

  out[b, k, g] = sum_s softmax_s(q[b,k,g] . k[b,k,s] | mask[b,s]) v[b,k,s]

An 8-bit cache (`rljax.models.kv_quant`) is read as stored, with its
per-token scales beside it in blocks of the same slots: the key scales
multiply the scores and the value scales the softmax weights.

On the CPU the same kernel runs in Pallas' interpreter (tests compare it
with the dense reference, `reference`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_NEG = -1e30
_LANES = 128
# Mosaic has no "highest"-precision bfloat16 matmul: the kernel's own precision, whatever
# jax_default_matmul_precision says (float32 inputs are exact either way in the interpreter).
_PRECISION = jax.lax.Precision.DEFAULT


def block_size(length: int) -> int:
  """Cache slots per block: 512, 256 or 128 when they divide `length`, else the whole cache."""
  for block in (512, 256, 128):
    if length % block == 0:
      return block
  return length


def _live_blocks(b, starts_ref, ends_ref, block: int):
  """(first, last) block holding row b's live slots (lax.div: slots are non-negative, and Mosaic
  lowers a floor division through a sign query of the host's device)."""
  first = jax.lax.div(starts_ref[b], block)
  last = jax.lax.div(jnp.maximum(ends_ref[b] - 1, starts_ref[b]), block)
  return first, last


def _kernel(starts_ref, ends_ref, q_ref, k_ref, v_ref, mask_ref, *refs, block: int, quantized: bool):
  if quantized:
    k_scale_ref, v_scale_ref, o_ref, m_ref, l_ref, acc_ref = refs
  else:
    o_ref, m_ref, l_ref, acc_ref = refs
  b, j = pl.program_id(0), pl.program_id(2)

  @pl.when(j == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, _NEG, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  first, last = _live_blocks(b, starts_ref, ends_ref, block)

  @pl.when((j >= first) & (j <= last))
  def _fold():
    q = q_ref[...]
    # an 8-bit cache goes into the matmuls as it is stored; its scales multiply the scores and the weights
    keys, values = (k_ref[...].astype(q.dtype), v_ref[...].astype(q.dtype)) if quantized else (k_ref[...], v_ref[...])
    scores = jax.lax.dot_general(q, keys, (((1,), (1,)), ((), ())), precision=_PRECISION,
                                 preferred_element_type=jnp.float32)
    if quantized:
      scores = scores * k_scale_ref[...].astype(jnp.float32)
    valid = mask_ref[...] != 0
    scores = jnp.where(valid, scores, _NEG)
    m_prev = m_ref[...][:, :1]
    m_new = jnp.maximum(m_prev, jnp.max(scores, axis=-1, keepdims=True))
    p = jnp.where(valid, jnp.exp(scores - m_new), 0.0)
    alpha = jnp.exp(m_prev - m_new)
    l_new = alpha * l_ref[...][:, :1] + jnp.sum(p, axis=-1, keepdims=True)
    weights = p * v_scale_ref[...].astype(jnp.float32) if quantized else p
    pv = jax.lax.dot_general(weights.astype(values.dtype), values, (((1,), (0,)), ((), ())), precision=_PRECISION,
                             preferred_element_type=jnp.float32)
    acc_ref[...] = alpha * acc_ref[...] + pv
    m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
    l_ref[...] = jnp.broadcast_to(l_new, l_ref.shape)

  @pl.when(j == pl.num_programs(2) - 1)
  def _write():
    total = jnp.maximum(l_ref[...][:, :1], 1e-30)
    o_ref[...] = (acc_ref[...] / total).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, starts: jax.Array,
                     ends: jax.Array, block: int | None = None, interpret: bool = False,
                     k_scale: jax.Array | None = None, v_scale: jax.Array | None = None) -> jax.Array:
  """Attention of one new token per row over the live slots of its cache.

  Args:
    q: [B, K, G, hd] scaled queries.
    k, v: [B, K, S, hd] the cache, the new token's key and value included.
    mask: [B, S] bool, True for real keys.
    starts, ends: [B] int32, every real key of row b lies in [starts[b], ends[b]).
    block: slots per block (default `block_size(S)`); must divide S.
    interpret: run in Pallas' interpreter (CPU).
    k_scale, v_scale: [B, K, S] with an 8-bit cache (`rljax.models.kv_quant`):
      key s of row b, head k is k[b, k, s] * k_scale[b, k, s], and so for values.

  Returns:
    [B, K, G, hd] in q's dtype.
  """
  batch, heads, groups, dim = q.shape
  length = k.shape[2]
  block = block or block_size(length)
  if length % block:
    raise ValueError(f"decode_attention: block {block} does not divide the cache length {length}")

  def kv_index(b, h, j, starts_ref, ends_ref):
    first, last = _live_blocks(b, starts_ref, ends_ref, block)
    return b, h, jnp.clip(j, first, last), 0

  def mask_index(b, h, j, starts_ref, ends_ref):
    first, last = _live_blocks(b, starts_ref, ends_ref, block)
    return b, 0, jnp.clip(j, first, last)

  def q_index(b, h, j, starts_ref, ends_ref):
    return b, h, 0, 0

  def scale_index(b, h, j, starts_ref, ends_ref):
    first, last = _live_blocks(b, starts_ref, ends_ref, block)
    return b, h, 0, jnp.clip(j, first, last)

  kv_spec = pl.BlockSpec((None, None, block, dim), kv_index)
  q_spec = pl.BlockSpec((None, None, groups, dim), q_index)
  quantized = k_scale is not None
  scales = (k_scale[:, :, None, :], v_scale[:, :, None, :]) if quantized else ()
  scale_specs = [pl.BlockSpec((None, None, 1, block), scale_index)] * len(scales)
  item = jnp.dtype(k.dtype).itemsize
  cost = pl.CostEstimate(
      flops=4 * batch * heads * groups * length * dim, transcendentals=batch * heads * groups * length,
      bytes_accessed=2 * k.size * item + sum(x.size * x.dtype.itemsize for x in scales) + mask.size * 4
      + 2 * q.size * jnp.dtype(q.dtype).itemsize)
  return pl.pallas_call(
      functools.partial(_kernel, block=block, quantized=quantized),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2,
          grid=(batch, heads, length // block),
          in_specs=[q_spec, kv_spec, kv_spec, pl.BlockSpec((None, 1, block), mask_index), *scale_specs],
          out_specs=q_spec,
          scratch_shapes=[pltpu.VMEM((groups, _LANES), jnp.float32), pltpu.VMEM((groups, _LANES), jnp.float32),
                          pltpu.VMEM((groups, dim), jnp.float32)]),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
      cost_estimate=cost,
      interpret=interpret,
  )(starts.astype(jnp.int32), ends.astype(jnp.int32), q, k, v, mask.astype(jnp.int32)[:, None, :], *scales)


def reference(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """The dense computation `decode_attention` equals (float32 softmax; k, v dequantized already)."""
  scores = jnp.einsum("bkgh,bksh->bkgs", q, k, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None, :], scores, _NEG)
  weights = jax.nn.softmax(scores, axis=-1)
  return jnp.einsum("bkgs,bksh->bkgh", weights.astype(v.dtype), v,
                    preferred_element_type=jnp.float32).astype(q.dtype)
