"""The Pallas grouped matmul: its visits cover every row once, it equals XLA's grouped matmul on the dequantized
kernels in the interpreter, and on TPU it reads 8-bit experts as stored."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.compile import hlo, topology
from rljax.kernels import grouped_matmul as gmm
from rljax.models import moe, weight_quant
from rljax.sharding import rules as rules_lib


@pytest.mark.parametrize("sizes,rows,tm", [([5, 0, 17, 9], 48, 16), ([130, 1, 100], 384, 128), ([0, 0], 16, 16),
                                           ([16, 0, 0, 16, 0], 32, 16), ([3, 40, 0, 2, 1, 0, 7], 64, 16)])
def test_visits_store_every_row_once_in_order(sizes, rows, tm):
  work = jax.tree.map(np.asarray, gmm.visits(jnp.asarray(sizes, jnp.int32), rows, tm))
  count = int(work.count[0])
  assert count <= rows // tm + len(sizes)  # the grid's static size
  stored = np.zeros(rows, int)
  for v in range(count):
    tile = np.arange(work.tile[v] * tm, (work.tile[v] + 1) * tm)
    g = work.group[v]
    stored[tile[(tile >= work.starts[g]) & (tile < work.ends[g])]] += 1
  np.testing.assert_array_equal(stored, 1)
  group_of_row = np.repeat(np.arange(len(sizes) + 1), [*sizes, rows - sum(sizes)])
  np.testing.assert_array_equal(work.ends - work.starts, np.bincount(group_of_row, minlength=len(sizes) + 1))
  # the kernel fetched never goes back (a group's block is fetched once per column tile), and the visits past
  # the count repeat the last real one (the pipeline fetches nothing for them)
  assert (np.diff(work.weights) >= 0).all() and (np.diff(work.tile[:count]) >= 0).all()
  for field in (work.group, work.tile, work.weights):
    assert (field[count:] == field[count - 1]).all()


def _problem(dtype, rows=70, width_in=32, width_out=256, sizes=(0, 23, 1, 0, 30), seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(rows, width_in)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(len(sizes), width_in, width_out)), jnp.float32)
  if dtype == jnp.bfloat16:
    return x, w.astype(dtype), None, jnp.asarray(sizes, jnp.int32)
  q = weight_quant.quantize(w, (1,), dtype, jnp.bfloat16)
  return x, q.values, q.scale, jnp.asarray(sizes, jnp.int32)


@pytest.mark.parametrize("dtype,tiles", [(jnp.int8, (16, 128)), (jnp.float8_e4m3fn, None), (jnp.bfloat16, (32, 256))])
def test_grouped_matmul_equals_xla_on_the_dequantized_kernels(dtype, tiles):
  # 54 rows in groups (a tile shared by three of them, empty groups first and between), 16 past them; the
  # (16, 128) tiles give 5 row tiles and 2 column tiles
  x, values, scale, sizes = _problem(dtype)
  got = gmm.grouped_matmul(x, values, sizes, scale, tiles=tiles, interpret=True)
  want = gmm.reference(x, values, sizes, scale)
  assert got.shape == want.shape and got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-2)
  assert not np.asarray(got[54:]).any()


def test_a_column_tile_must_divide_the_outputs():
  x, values, scale, sizes = _problem(jnp.int8, width_out=192)
  with pytest.raises(ValueError, match="column tile 128 does not divide the kernels' 192"):
    gmm.grouped_matmul(x, values, sizes, scale, tiles=(16, 128), interpret=True)


def test_tiles_fit_the_block_budget():
  assert gmm.row_tile(5) == 16 and gmm.row_tile(70) == 80 and gmm.row_tile(4096) == 128
  assert gmm.column_tile(2048, 768, 1) == 768  # Qwen3-30B-A3B's experts: one block of all columns
  assert gmm.column_tile(8192, 4096, 1) == 256 and gmm.column_tile(8192, 4096, 2) == 256
  assert gmm.column_tile(32768, 4096, 2) == 128  # the smallest dividing tile when none fits


@jax.default_matmul_precision("default")
def test_on_tpu_moe_reads_float8_experts_as_stored():
  """`moe._grouped` on a v5p chip: float8 experts through the Pallas kernel move about their stored bytes plus
  the rows; XLA's grouped matmul given the same float8 values converts them into a temporary first."""
  experts, width_in, width_out, rows = 8, 1024, 512, 256
  device = topology.devices(topology.parse("v5p:2x2x1"))[:1]
  mesh = Mesh(np.array(device), ("x",))
  one = NamedSharding(mesh, PartitionSpec())
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=one)  # noqa: E731
  args = (spec((rows, width_in), jnp.bfloat16), spec((experts, width_in, width_out), jnp.float8_e4m3fn),
          spec((experts, 1, width_out), jnp.bfloat16), spec((experts,), jnp.int32))

  def grouped(x, values, scale, sizes):
    with rules_lib.activation_sharding(mesh, None):
      return moe._grouped(x, weight_quant.QuantizedWeight(values, scale), sizes)

  def xla(x, values, scale, sizes):
    return jax.lax.ragged_dot(x, values, sizes, preferred_element_type=x.dtype)

  stored = experts * width_in * width_out + 2 * rows * (width_in + width_out)
  kernel = jax.jit(grouped).lower(*args).compile().as_text()
  assert "jit(grouped_matmul)/pallas_call" in kernel
  assert hlo.hbm_bytes(kernel) <= 1.1 * stored
  assert hlo.hbm_bytes(jax.jit(xla).lower(*args).compile().as_text()) > 3 * stored
