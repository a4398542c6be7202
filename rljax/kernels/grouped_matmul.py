"""Grouped matmul over expert kernels, and its gradients: Pallas TPU kernels that read 8-bit experts as stored
and multiply only the row tiles their groups hold.

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

Training (`trainable`): XLA's gradient of its grouped matmul with respect
to the kernels is, on TPU, a dense product per group over every row (the
forward and both gradients declare 2 + G times one product). Here the
rows' gradient is the same kernel over the transposed kernels, and the
kernels' gradient (`grouped_outer`) the same visits accumulating each
group's rows^T @ gradients in a float32 VMEM block, stored at the group's
last visit: each multiplies `product_rows` rows, the routed rows plus at
most two partial tiles per group.

On the CPU the same kernels run in Pallas' interpreter (tests compare them
with XLA's grouped matmul and its gradients).
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


def _splits(width: int) -> list[int]:
  """The tiles a width splits into evenly, widest first: all of it, or a multiple of 128 (TPU lanes)."""
  return [width // c for c in range(1, max(1, width // 128) + 1)
          if width % c == 0 and (c == 1 or width // c % 128 == 0)]


def column_tile(width_in: int, width_out: int, itemsize: int, row_tile: int, row_itemsize: int,
                cores: int = 1) -> int | None:
  """Output columns per tile: the widest of all of them or a multiple of 128 dividing `width_out` whose blocks
  fit `_BLOCK_BUDGET` of VMEM (the rows' [row_tile, width_in] and the kernel's [width_in, tile],
  double-buffered, the kernel's converted, the output's), preferring a multiple of `cores` tiles, then at
  least `cores` of them (a chip's TensorCores split the column tiles); None when none fits."""
  def need(tn):
    return 2 * row_tile * width_in * row_itemsize + width_in * tn * (2 * itemsize + row_itemsize) \
        + 2 * row_tile * tn * row_itemsize
  fitting = [tn for tn in _splits(width_out) if need(tn) <= _BLOCK_BUDGET]
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


def product_rows(work: Visits, tm: int) -> jax.Array:
  """[] the rows the kernels multiply for this work, per column tile: `tm` per visit to a group (the rows past
  the groups get none). Their FLOPs are 2 * product_rows * K * N, against 2 * sum(sizes) * K * N routed; the
  grid's static size, and so the `pl.CostEstimate`, allows for one visit per row tile and group."""
  v = jnp.arange(work.group.shape[0])
  return tm * jnp.sum((v < work.count[0]) & (work.group < work.starts.shape[0] - 1))


def _kernel(group_ref, tile_ref, weights_ref, starts_ref, ends_ref, count_ref, x_ref, w_ref, *refs,
            tm: int, experts: int, scaled: bool, transpose: bool):
  s_ref, o_ref = refs if scaled else (None, refs[0])
  v = pl.program_id(1)
  g = group_ref[v]
  row = tile_ref[v] * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
  mine = (row >= starts_ref[g]) & (row < ends_ref[g])
  real = v < count_ref[0]

  @pl.when(real & (g < experts))
  def _product():
    x = x_ref[...]
    y = jax.lax.dot_general(x, w_ref[...].astype(x.dtype), (((1,), (1 if transpose else 0,)), ((), ())),
                            precision=_PRECISION, preferred_element_type=jnp.float32)
    if scaled:
      y = y * s_ref[...].astype(jnp.float32)
    o_ref[...] = jnp.where(mine, y.astype(o_ref.dtype), o_ref[...])

  @pl.when(real & (g == experts))
  def _zeros():
    o_ref[...] = jnp.where(mine, jnp.zeros((), o_ref.dtype), o_ref[...])


@functools.partial(jax.jit, static_argnames=("tiles", "cores", "interpret", "transpose"))
def grouped_matmul(rows: jax.Array, values: jax.Array, sizes: jax.Array, scale: jax.Array | None = None,
                   tiles: tuple[int, int] | None = None, cores: int = 1, interpret: bool = False,
                   transpose: bool = False) -> jax.Array:
  """rows [M, K] @ their groups' kernels: [M, N] in rows' dtype.

  Args:
    rows: [M, K], sorted by group: sizes[0] rows of group 0, then group 1's, ...;
      rows past sum(sizes) give zeros.
    values: [G, K, N] the kernels as stored (int8, float8 or the rows' dtype); [G, N, K] with `transpose`.
    sizes: [G] int32 rows per group (rows past M are cut, as `jax.lax.ragged_dot` does).
    scale: [G, 1, N] per-output-channel scales (group e's kernel is values[e] * scale[e]), or None.
    tiles: (rows, columns) per tile (default `row_tile(M)` and `column_tile`); the columns must divide N, and
      on TPU both must suit its layout (rows a multiple of 16, columns of 128 or all of N).
    cores: the chip's TensorCores, which split the column tiles (`column_tile` prefers a multiple of them).
    interpret: run in Pallas' interpreter (CPU).
    transpose: multiply by each kernel transposed (rows @ values[e].T; the rows' gradient of a product).

  Raises:
    ValueError: the column tile does not divide N, no column tile's blocks fit in VMEM (`fits`), or a
      transposed product is given scales.
  """
  m, k = rows.shape
  experts, n = values.shape[0], values.shape[1 if transpose else 2]
  if transpose and scale is not None:
    raise ValueError("grouped_matmul: a transposed product takes no per-output-channel scales")
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
  if transpose:
    kernel_spec = pl.BlockSpec((None, tn, k), lambda j, v, group, tile, weights, *_: (weights[v], j, 0))
  else:
    kernel_spec = pl.BlockSpec((None, k, tn), lambda j, v, group, tile, weights, *_: (weights[v], 0, j))
  scaled = scale is not None
  in_specs = [pl.BlockSpec((tm, k), row_index), kernel_spec]
  in_specs += [pl.BlockSpec((None, 1, tn), lambda j, v, group, tile, weights, *_: (weights[v], 0, j))] \
      if scaled else []
  # at most row tiles + groups visits, each a full [tm, K] x [K, tn] product per column tile
  cost = pl.CostEstimate(
      flops=2 * (padded + experts * tm) * k * n, transcendentals=0,
      bytes_accessed=values.size * item + (n // tn) * padded * k * row_item + padded * n * row_item
      + (scale.size * scale.dtype.itemsize if scaled else 0))
  out = pl.pallas_call(
      functools.partial(_kernel, tm=tm, experts=experts, scaled=scaled, transpose=transpose),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(work), grid=(n // tn, padded // tm + experts), in_specs=in_specs,
          out_specs=pl.BlockSpec((tm, tn), lambda j, v, group, tile, *_: (tile[v], j))),
      out_shape=jax.ShapeDtypeStruct((padded, n), rows.dtype),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=cost,
      interpret=interpret,
  )(*work, x, values, *((scale,) if scaled else ()))
  return out[:m]


def outer_tiles(width_in: int, width_out: int, row_tile: int, itemsize: int, out_itemsize: int,
                cores: int = 1) -> tuple[int, int] | None:
  """(K, N) per tile of `grouped_outer`'s [G, K, N] output: the largest block (the fewest re-reads of the rows
  and gradients) whose VMEM (the rows' [row_tile, tk] and the gradients' [row_tile, tn] double-buffered, in
  `itemsize` bytes, the output's [tk, tn] double-buffered in `out_itemsize`, and its float32 sum) fits
  `_BLOCK_BUDGET`, among those making a multiple of `cores` blocks where any does (a chip's TensorCores split
  them); None when none fits."""
  def need(tk, tn):
    return 2 * row_tile * (tk + tn) * itemsize + tk * tn * (2 * out_itemsize + 4)
  fitting = [(tk, tn) for tk in _splits(width_in) for tn in _splits(width_out) if need(tk, tn) <= _BLOCK_BUDGET]
  split = [(tk, tn) for tk, tn in fitting if (width_in // tk) * (width_out // tn) % cores == 0]
  return max(split or fitting, key=lambda t: (t[0] * t[1], t[1]), default=None)


def _outer_kernel(group_ref, tile_ref, weights_ref, starts_ref, ends_ref, count_ref, x_ref, g_ref, o_ref, acc_ref,
                  *, tm: int, experts: int):
  v = pl.program_id(2)
  g = group_ref[v]
  real = (v < count_ref[0]) & (g < experts)
  opens = (v == 0) | (group_ref[jnp.maximum(v - 1, 0)] != g)
  closes = (v == count_ref[0] - 1) | (group_ref[jnp.minimum(v + 1, group_ref.shape[0] - 1)] != g)

  @pl.when(real & opens)
  def _start():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  @pl.when(real)
  def _accumulate():
    row = tile_ref[v] * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
    mine = (row >= starts_ref[g]) & (row < ends_ref[g])
    x = jnp.where(mine, x_ref[...], jnp.zeros((), x_ref.dtype))
    dy = jnp.where(mine, g_ref[...], jnp.zeros((), g_ref.dtype))  # another group's inf must not meet a 0 here
    acc_ref[...] += jax.lax.dot_general(x, dy, (((0,), (0,)), ((), ())), precision=_PRECISION,
                                        preferred_element_type=jnp.float32)

  @pl.when(real & closes)
  def _store():
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("dtype", "tiles", "cores", "interpret"))
def grouped_outer(rows: jax.Array, grads: jax.Array, sizes: jax.Array, dtype: jnp.dtype,
                  tiles: tuple[int, int, int] | None = None, cores: int = 1, interpret: bool = False) -> jax.Array:
  """Per group, its rows' outer products with their gradients summed: [G, K, N] in `dtype` (the kernels'
  gradient of `grouped_matmul`; zero for a group with no rows).

  Args:
    rows: [M, K] sorted by group as `grouped_matmul` takes them (rows past the groups count nowhere).
    grads: [M, N] the products' gradients, in the same order.
    sizes: [G] int32 rows per group.
    dtype: the output's dtype (the kernels').
    tiles: (rows, K, N) per tile (default `row_tile(M)` and `outer_tiles`).
    cores: the chip's TensorCores, which split the output tiles (`outer_tiles` prefers a multiple of them).
    interpret: run in Pallas' interpreter (CPU).

  Raises:
    ValueError: no tile's blocks fit in VMEM, or a tile does not divide its width.
  """
  m, k = rows.shape
  n, experts = grads.shape[1], sizes.shape[0]
  tm = tiles[0] if tiles else row_tile(m)
  tk, tn = tiles[1:] if tiles else (outer_tiles(k, n, tm, jnp.dtype(rows.dtype).itemsize, jnp.dtype(dtype).itemsize,
                                                cores) or (None, None))
  if tk is None:
    raise ValueError(f"grouped_outer: no tile of the [{k}, {n}] kernels' gradient fits {_BLOCK_BUDGET >> 20} MiB "
                     "of VMEM beside its rows")
  if k % tk or n % tn:
    raise ValueError(f"grouped_outer: tiles ({tk}, {tn}) do not divide the kernels' [{k}, {n}]")
  padded = max(tm, -(-m // tm) * tm)
  x = jnp.pad(rows, ((0, padded - m), (0, 0)))
  dy = jnp.pad(grads.astype(rows.dtype), ((0, padded - m), (0, 0)))
  work = visits(sizes, padded, tm)
  out = pl.pallas_call(
      functools.partial(_outer_kernel, tm=tm, experts=experts),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=len(work), grid=(k // tk, n // tn, padded // tm + experts),
          in_specs=[pl.BlockSpec((tm, tk), lambda i, j, v, group, tile, *_: (tile[v], i)),
                    pl.BlockSpec((tm, tn), lambda i, j, v, group, tile, *_: (tile[v], j))],
          out_specs=pl.BlockSpec((None, tk, tn), lambda i, j, v, group, tile, weights, *_: (weights[v], i, j)),
          scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)]),
      out_shape=jax.ShapeDtypeStruct((experts, k, n), dtype),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
      cost_estimate=pl.CostEstimate(
          flops=2 * (padded + experts * tm) * k * n, transcendentals=0,
          bytes_accessed=(n // tn) * padded * k * x.dtype.itemsize + (k // tk) * padded * n * dy.dtype.itemsize
          + experts * k * n * jnp.dtype(dtype).itemsize),
      interpret=interpret,
  )(*work, x, dy)
  # a group with no rows (or none before M) has no visit, so its block is never stored
  return jnp.where((work.ends > work.starts)[:-1, None, None], out, jnp.zeros((), dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def trainable(rows: jax.Array, values: jax.Array, sizes: jax.Array, cores: int = 1,
              interpret: bool = False) -> jax.Array:
  """`grouped_matmul` of rows [M, K] by unscaled kernels [G, K, N] -> [M, N], differentiable in both: the rows'
  gradient is the transposed product, the kernels' `grouped_outer`, each visiting only the rows in groups."""
  return grouped_matmul(rows, values, sizes, cores=cores, interpret=interpret)


def _trainable_forward(rows, values, sizes, cores, interpret):
  return trainable(rows, values, sizes, cores, interpret), (rows, values, sizes)


def _trainable_backward(cores, interpret, saved, grads):
  rows, values, sizes = saved
  d_rows = grouped_matmul(grads.astype(rows.dtype), values, sizes, cores=cores, interpret=interpret,
                          transpose=True)
  d_values = grouped_outer(rows, grads, sizes, values.dtype, cores=cores, interpret=interpret)
  return d_rows, d_values, None


trainable.defvjp(_trainable_forward, _trainable_backward)


def fits(rows: jax.Array, values: jax.Array, gradients: bool = False) -> bool:
  """Whether `grouped_matmul` has a column tile for rows [M, K] and kernels [G, K, N] (`column_tile`), and with
  `gradients` its transposed product and `grouped_outer` have tiles too (`trainable`)."""
  (m, k), n = rows.shape, values.shape[2]
  tm, item, row_item = row_tile(m), jnp.dtype(values.dtype).itemsize, jnp.dtype(rows.dtype).itemsize
  if column_tile(k, n, item, tm, row_item) is None:
    return False
  return not gradients or (column_tile(n, k, item, tm, row_item) is not None
                           and outer_tiles(k, n, tm, row_item, item) is not None)


def reference(rows: jax.Array, values: jax.Array, sizes: jax.Array, scale: jax.Array | None = None) -> jax.Array:
  """What `grouped_matmul` computes, through XLA's grouped matmul on the dequantized kernels (float32)."""
  kernels = values.astype(jnp.float32) * (1.0 if scale is None else scale.astype(jnp.float32))
  return jax.lax.ragged_dot(rows.astype(jnp.float32), kernels, sizes).astype(rows.dtype)


__all__ = ["Visits", "column_tile", "fits", "grouped_matmul", "grouped_outer", "outer_tiles", "product_rows",
           "reference", "row_tile", "trainable", "visits"]
