"""Grouped matmul over 8-bit expert kernels: a Pallas TPU kernel that reads them as stored.

Rows sorted by group (`sizes[e]` rows for expert e, then rows belonging to
no expert) are multiplied by their group's kernel:

  out[r] = rows[r] @ (values[e] * scale[e])   for r in group e
  out[r] = 0                                  for r past the groups

XLA's grouped matmul (`jax.lax.ragged_dot`) is a custom call on TPU, which
cannot fuse a convert. On v5p and v6e libtpu converts float8 kernels into
a bfloat16 temporary first (about eight times the stored bytes per call;
v5p's int8 1.1x, `benchmarks/moe_grouped_traffic.py`). This kernel fetches
each group's kernel block in its 8-bit form and converts it in VMEM.

Work is a list of visits: the row tiles of `tm` rows each group overlaps,
group by group (a tile two groups share is visited once per group, each
visit storing its group's rows). The rows past the groups form one more
group whose rows are stored as zeros, with no product. There are at most
`row tiles + groups` visits, a static grid size; the visits past the real
count map to the last real visit's blocks, so the pipeline fetches nothing
for them and the body skips them. A group's kernel block is fetched once
per column tile, when the visits move to that group; a tile's rows once
per column tile; each output block is written once.

On the CPU the same kernel runs in Pallas' interpreter (tests compare it
with `reference`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_ROW_TILE = 128
# VMEM bytes a column tile's blocks may take (under the 16 MiB Mosaic allows a kernel by default)
_BLOCK_BUDGET = 12 * 2**20
# Mosaic has no "highest"-precision bfloat16 matmul: the kernel's own precision, whatever
# jax_default_matmul_precision says (float32 inputs are exact either way in the interpreter).
_PRECISION = jax.lax.Precision.DEFAULT


class Visits(NamedTuple):
  """The grid's work: per visit [V] (V = row tiles + G, the most there can be), per group [G + 1], the count [1].

  Attributes:
    group: the group a visit stores (G: the rows past the groups).
    tile: the row tile it stores into.
    weights: the kernel it fetches (its group's, the previous real group's for the rows past the groups).
    starts, ends: each group's rows [G + 1], the last being the rows past the groups.
    count: [1] the number of real visits.
  """

  group: jax.Array
  tile: jax.Array
  weights: jax.Array
  starts: jax.Array
  ends: jax.Array
  count: jax.Array


def row_tile(rows: int) -> int:
  """Rows per tile: 128, or all of them rounded up to 16 (bfloat16's sublane packing) when fewer."""
  return min(_ROW_TILE, max(16, -(-rows // 16) * 16))


def column_tile(width_in: int, width_out: int, itemsize: int, row_tile: int, row_itemsize: int,
                cores: int = 1) -> int | None:
  """Output columns per tile: the widest of all of them or a multiple of 128 dividing `width_out` whose blocks
  fit `_BLOCK_BUDGET` of VMEM (the rows' [row_tile, width_in] and the kernel's [width_in, tile],
  double-buffered, the kernel's converted, the output's), preferring a multiple of `cores` tiles, then at
  least `cores` of them (a chip's TensorCores split the column tiles); None when none fits."""
  def need(tn):
    return 2 * row_tile * width_in * row_itemsize + width_in * tn * (2 * itemsize + row_itemsize) \
        + 2 * row_tile * tn * row_itemsize
  tiles = [width_out // c for c in range(1, max(1, width_out // 128) + 1)
           if width_out % c == 0 and (c == 1 or width_out // c % 128 == 0)]
  fitting = [tn for tn in tiles if need(tn) <= _BLOCK_BUDGET]
  split = [tn for tn in fitting if width_out // tn % cores == 0] + [tn for tn in fitting if width_out // tn >= cores]
  return (split + fitting + [None])[0]


def visits(sizes: jax.Array, rows: int, tm: int) -> Visits:
  """The visits of `rows` (a multiple of `tm`) rows in groups of `sizes` [G] rows, then the rest (groups past
  `rows` rows are cut there, as XLA's grouped matmul takes no row past its operand's)."""
  experts = sizes.shape[0]
  bounds = jnp.minimum(jnp.cumsum(sizes.astype(jnp.int32)), rows)
  ends = jnp.concatenate([bounds, jnp.full((1,), rows, jnp.int32)])
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), bounds])
  first = jax.lax.div(starts, tm)
  per_group = jnp.where(ends > starts, jax.lax.div(jnp.maximum(ends - 1, 0), tm) - first + 1, 0)
  total = jnp.cumsum(per_group)
  count = total[-1]
  v = jnp.minimum(jnp.arange(rows // tm + experts, dtype=jnp.int32), count - 1)
  group = jnp.searchsorted(total, v, side="right").astype(jnp.int32)
  tile = first[group] + v - (total[group] - per_group[group])
  weights = jax.lax.cummax(jnp.where(group < experts, group, 0))
  return Visits(group, tile, weights, starts, ends, count[None])


def _kernel(group_ref, tile_ref, weights_ref, starts_ref, ends_ref, count_ref, x_ref, w_ref, *refs,
            tm: int, experts: int, scaled: bool):
  s_ref, o_ref = refs if scaled else (None, refs[0])
  v = pl.program_id(1)
  g = group_ref[v]
  row = tile_ref[v] * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
  mine = (row >= starts_ref[g]) & (row < ends_ref[g])
  real = v < count_ref[0]

  @pl.when(real & (g < experts))
  def _product():
    x = x_ref[...]
    y = jax.lax.dot_general(x, w_ref[...].astype(x.dtype), (((1,), (0,)), ((), ())), precision=_PRECISION,
                            preferred_element_type=jnp.float32)
    if scaled:
      y = y * s_ref[...].astype(jnp.float32)
    o_ref[...] = jnp.where(mine, y.astype(o_ref.dtype), o_ref[...])

  @pl.when(real & (g == experts))
  def _zeros():
    o_ref[...] = jnp.where(mine, jnp.zeros((), o_ref.dtype), o_ref[...])


@functools.partial(jax.jit, static_argnames=("tiles", "cores", "interpret"))
def grouped_matmul(rows: jax.Array, values: jax.Array, sizes: jax.Array, scale: jax.Array | None = None,
                   tiles: tuple[int, int] | None = None, cores: int = 1, interpret: bool = False) -> jax.Array:
  """rows [M, K] @ their groups' kernels: [M, N] in rows' dtype.

  Args:
    rows: [M, K], sorted by group: sizes[0] rows of group 0, then group 1's, ...;
      rows past sum(sizes) give zeros.
    values: [G, K, N] the kernels as stored (int8, float8 or the rows' dtype).
    sizes: [G] int32 rows per group (rows past M are cut, as `jax.lax.ragged_dot` does).
    scale: [G, 1, N] per-output-channel scales (group e's kernel is values[e] * scale[e]), or None.
    tiles: (rows, columns) per tile (default `row_tile(M)` and `column_tile`); the columns must divide N, and
      on TPU both must suit its layout (rows a multiple of 16, columns of 128 or all of N).
    cores: the chip's TensorCores, which split the column tiles (`column_tile` prefers a multiple of them).
    interpret: run in Pallas' interpreter (CPU).

  Raises:
    ValueError: the column tile does not divide N, or no column tile's blocks fit in VMEM (`fits`).
  """
  m, k = rows.shape
  experts, _, n = values.shape
  if m == 0:
    return jnp.zeros((0, n), rows.dtype)
  row_item, item = jnp.dtype(rows.dtype).itemsize, jnp.dtype(values.dtype).itemsize
  tm = tiles[0] if tiles else row_tile(m)
  tn = tiles[1] if tiles else column_tile(k, n, item, tm, row_item, cores)
  if tn is None:
    raise ValueError(f"grouped_matmul: no column tile of [{k}, {n}] kernels fits {_BLOCK_BUDGET >> 20} MiB of "
                     "VMEM beside its rows (check `fits` first)")
  if n % tn:
    raise ValueError(f"grouped_matmul: column tile {tn} does not divide the kernels' {n} output columns")
  padded = -(-m // tm) * tm
  x = jnp.pad(rows, ((0, padded - m), (0, 0)))
  work = visits(sizes, padded, tm)
  row_index = lambda j, v, group, tile, *_: (tile[v], 0)  # noqa: E731
  kernel_index = lambda j, v, group, tile, weights, *_: (weights[v], 0, j)  # noqa: E731
  scaled = scale is not None
  in_specs = [pl.BlockSpec((tm, k), row_index), pl.BlockSpec((None, k, tn), kernel_index)]
  in_specs += [pl.BlockSpec((None, 1, tn), kernel_index)] if scaled else []
  # at most row tiles + groups visits, each a full [tm, K] x [K, tn] product per column tile
  cost = pl.CostEstimate(
      flops=2 * (padded + experts * tm) * k * n, transcendentals=0,
      bytes_accessed=values.size * item + (n // tn) * padded * k * row_item + padded * n * row_item
      + (scale.size * scale.dtype.itemsize if scaled else 0))
  out = pl.pallas_call(
      functools.partial(_kernel, tm=tm, experts=experts, scaled=scaled),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(work), grid=(n // tn, padded // tm + experts), in_specs=in_specs,
          out_specs=pl.BlockSpec((tm, tn), lambda j, v, group, tile, *_: (tile[v], j))),
      out_shape=jax.ShapeDtypeStruct((padded, n), rows.dtype),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=cost,
      interpret=interpret,
  )(*work, x, values, *((scale,) if scaled else ()))
  return out[:m]


def fits(rows: jax.Array, values: jax.Array) -> bool:
  """Whether `grouped_matmul` has a column tile for rows [M, K] and kernels [G, K, N] (`column_tile`)."""
  return column_tile(rows.shape[1], values.shape[2], jnp.dtype(values.dtype).itemsize, row_tile(rows.shape[0]),
                     jnp.dtype(rows.dtype).itemsize) is not None


def reference(rows: jax.Array, values: jax.Array, sizes: jax.Array, scale: jax.Array | None = None) -> jax.Array:
  """What `grouped_matmul` computes, through XLA's grouped matmul on the dequantized kernels (float32)."""
  kernels = values.astype(jnp.float32) * (1.0 if scale is None else scale.astype(jnp.float32))
  return jax.lax.ragged_dot(rows.astype(jnp.float32), kernels, sizes).astype(rows.dtype)


__all__ = ["Visits", "column_tile", "fits", "grouped_matmul", "reference", "row_tile", "visits"]
