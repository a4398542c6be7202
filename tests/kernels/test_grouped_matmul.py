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
                                           ([16, 0, 0, 16, 0], 32, 16), ([3, 40, 0, 2, 1, 0, 7], 64, 16),
                                           ([20, 30, 4], 48, 16)])
def test_visits_store_every_row_once_in_order(sizes, rows, tm):
  # the last case's groups overrun the rows: they are cut there, as XLA's grouped matmul cuts them
  work = jax.tree.map(np.asarray, gmm.visits(jnp.asarray(sizes, jnp.int32), rows, tm))
  count, groups = int(work.count[0]), len(sizes)
  assert count <= rows // tm + groups  # the grid's static size
  stored = np.zeros(rows, int)
  for v in range(count):
    tile = np.arange(work.tile[v] * tm, (work.tile[v] + 1) * tm)
    g = work.group[v]
    stored[tile[(tile >= work.starts[g]) & (tile < work.ends[g])]] += 1
  np.testing.assert_array_equal(stored, 1)
  bounds = np.minimum(np.cumsum([0, *sizes, rows]), rows)
  np.testing.assert_array_equal(work.starts, bounds[:-1])
  np.testing.assert_array_equal(work.ends, bounds[1:])
  # every block index is in range; an expert's visit fetches its own kernel, and the kernel fetched never goes
  # back (a group's block is fetched once per column tile); the visits past the count repeat the last real one
  # (the pipeline fetches nothing for them)
  assert (work.tile < rows // tm).all() and (work.weights < groups).all() and (work.group <= groups).all()
  experts = work.group[:count] < groups
  np.testing.assert_array_equal(work.weights[:count][experts], work.group[:count][experts])
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
  assert gmm.grouped_matmul(x[:0], values, sizes * 0, scale, interpret=True).shape == (0, 256)


def test_a_column_tile_must_divide_the_outputs():
  x, values, scale, sizes = _problem(jnp.int8, width_out=192)
  with pytest.raises(ValueError, match="column tile 128 does not divide the kernels' 192"):
    gmm.grouped_matmul(x, values, sizes, scale, tiles=(16, 128), interpret=True)


def test_tiles_fit_the_block_budget():
  assert gmm.row_tile(0) == 16 and gmm.row_tile(70) == 80 and gmm.row_tile(4096) == 128
  # Qwen3-30B-A3B's experts: one column tile, or one per TensorCore (two rows blocks read, not six)
  assert gmm.column_tile(2048, 768, 1, 128, 2) == 768 and gmm.column_tile(2048, 768, 1, 128, 2, cores=2) == 384
  # split over fsdp 2 x tensor 2: [1024, 384] has no even split into 128s, so three tiles rather than one
  assert gmm.column_tile(1024, 384, 1, 128, 2, cores=2) == 128 and gmm.column_tile(1024, 384, 1, 128, 2) == 384
  assert gmm.column_tile(8192, 4096, 1, 128, 2) == 128  # 256 would need 12.1 MiB with its rows
  assert gmm.column_tile(32768, 4096, 2, 128, 2) is None  # the rows alone take 16 MiB
  # the kernels' gradient: [2048, 768] whole needs 14.3 MiB with a float32 sum; two TensorCores split it in two
  assert gmm.outer_tiles(2048, 768, 128, 2, 2) == (1024, 768) == gmm.outer_tiles(2048, 768, 128, 2, 2, cores=2)
  assert gmm.outer_tiles(1024, 512, 128, 2, 2) == (1024, 512) and gmm.outer_tiles(1024, 512, 128, 2, 2, 2)[0] == 512
  # float32 output blocks: [1280, 1024] whole fits beside bfloat16 ones (11.6 MiB), not beside float32 ones
  assert gmm.outer_tiles(1280, 1024, 128, 2, 2) == (1280, 1024)
  assert gmm.outer_tiles(1280, 1024, 128, 2, 4) == (640, 1024)
  x, values, scale, sizes = _problem(jnp.int8, width_in=32768, width_out=256, rows=128)
  assert not gmm.fits(x, values)
  with pytest.raises(ValueError, match=r"no column tile of \[32768, 256\] kernels fits 12 MiB"):
    gmm.grouped_matmul(x, values, sizes, scale, interpret=True)


def test_a_decode_step_over_four_expert_shards_through_the_kernel_equals_xla(monkeypatch):
  """`moe.dispatch` with float8 experts split over 4 devices (fsdp 2 x expert 4), its grouped matmuls in the
  kernel (in the interpreter), equals the same dispatch through XLA's; the shards overflowing their capacity
  take the other branch of the conditional, with the kernel too."""
  from tests.models import helpers
  rng = np.random.default_rng(2)
  n, d, f = 16, 32, 128
  x = jnp.asarray(rng.normal(size=(n, 1, d)), jnp.float32)
  ids = jnp.asarray(helpers.uneven_routing(n))  # one expert shard overflows its capacity, three do not
  weights = jnp.asarray(rng.uniform(size=(n, 1, 2)), jnp.float32)
  quantize = lambda w, axis: weight_quant.quantize(jnp.asarray(w, jnp.float32), (axis,),  # noqa: E731
                                                   jnp.float8_e4m3fn, jnp.float32)
  gate, up = (quantize(rng.normal(size=(8, d, f)), 1) for _ in range(2))
  down = quantize(rng.normal(size=(8, f, d)), 1)
  step = helpers.expert_split_decode(moe.dispatch)
  args = (x, ids, weights, gate, up, down)
  want = jax.jit(step)(*args)
  traced = []
  kernel = gmm.grouped_matmul
  monkeypatch.setattr(moe, "_kernel_takes", lambda rows, kernel: isinstance(kernel, weight_quant.QuantizedWeight))
  monkeypatch.setattr(gmm, "grouped_matmul", lambda *a, **k: traced.append(a[0].shape) or kernel(*a, **k))
  got = jax.jit(lambda *a: step(*a))(*args)  # traced anew, not the cached XLA one
  assert sorted(set(traced)) == [(16, 16), (16, 128), (32, 16), (32, 128)]  # both branches' gate/up and down
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)  # scales before or after the sum


def _reference_outer(rows, grads, sizes):
  """Per group, sum of its rows' outer products with their gradients (float32, numpy)."""
  rows, grads = np.asarray(rows, np.float32), np.asarray(grads, np.float32)
  bounds = np.minimum(np.cumsum([0, *np.asarray(sizes)]), rows.shape[0])
  return np.stack([rows[a:b].T @ grads[a:b] for a, b in zip(bounds[:-1], bounds[1:])])


@pytest.mark.parametrize("sizes,tiles", [((0, 23, 1, 0, 30), (16, 128, 128)), ((0, 23, 1, 0, 30), None),
                                         ((40, 50, 9), (16, 256, 128)), ((0, 0, 0), (16, 128, 128))])
def test_grouped_outer_sums_each_groups_outer_products(sizes, tiles):
  # tiles (16, 128, 128): 5 row tiles, 2 x 2 output tiles; (40, 50, 9) overruns the 70 rows (cut there, the
  # last group's kernel gradient zero); (0, 0, 0): every row past the groups, every gradient zero
  x, _, _, sizes = _problem(jnp.bfloat16, width_in=256, sizes=sizes)
  grads = jnp.asarray(np.random.default_rng(1).normal(size=(70, 256)), jnp.bfloat16)
  got = gmm.grouped_outer(x, grads, sizes, jnp.float32, tiles=tiles, interpret=True)
  assert got.shape == (len(sizes), 256, 256) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), _reference_outer(x, grads, sizes), rtol=1e-2, atol=1e-2)


def test_grouped_outer_keeps_other_rows_gradients_out():
  # a non-finite gradient of a row past the groups (another device's copy) or of another group's row in a
  # shared tile must not reach a group's sum through a masked zero
  x, _, _, sizes = _problem(jnp.bfloat16, width_in=128, sizes=(0, 23, 1, 0, 30))
  grads = np.random.default_rng(1).normal(size=(70, 128))
  grads[[22, 69]] = np.inf  # group 1's last row (its tile shared with groups 2 and 4), a row past the groups
  got = np.asarray(gmm.grouped_outer(x, jnp.asarray(grads, jnp.float32), sizes, jnp.float32, tiles=(16, 128, 128),
                                     interpret=True))
  assert not np.isfinite(got[1]).all() and np.isfinite(got[[0, 2, 3, 4]]).all()


def test_the_kernels_gradients_equal_xlas():
  """`trainable`'s forward and both gradients (the transposed product, `grouped_outer`) equal those of XLA's
  grouped matmul, float32 in the interpreter: groups sharing tiles, empty ones, rows past the groups."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(70, 128)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(5, 128, 256)), jnp.float32)
  sizes = jnp.asarray([0, 23, 1, 0, 30], jnp.int32)
  mix = jnp.asarray(rng.normal(size=(70, 256)), jnp.float32)
  loss = lambda fn: lambda x, w: jnp.sum(jnp.sin(fn(x, w) * mix))  # noqa: E731
  with jax.default_matmul_precision("highest"):
    got = jax.value_and_grad(loss(lambda x, w: gmm.trainable(x, w, sizes, 1, True)), (0, 1))(x, w)
    want = jax.value_and_grad(loss(lambda x, w: jax.lax.ragged_dot(x, w, sizes)), (0, 1))(x, w)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
  assert not np.asarray(got[1][0])[54:].any() and not np.asarray(got[1][1])[[0, 3]].any()
  with pytest.raises(ValueError, match="transposed product takes no per-output-channel scales"):
    gmm.grouped_matmul(x, w, sizes, jnp.ones((5, 1, 128)), transpose=True, interpret=True)


def test_an_update_over_four_expert_shards_through_the_kernels_equals_xla(monkeypatch):
  """`moe.dispatch` in an update's layout (weights gathered, experts split 4 ways, fsdp 2), its grouped
  matmuls and their gradients in the Pallas kernels (in the interpreter), has XLA's gradients."""
  from tests.models import helpers
  x, ids, weights, gate, up, down = helpers.uneven_dispatch(16, 32, 128, seed=4)
  step = helpers.expert_split_update(
      lambda x, gate, up, down: jnp.sum(jnp.tanh(moe.dispatch(x, ids, weights, gate, up, down))))
  grad = jax.grad(step, (0, 1, 2, 3))
  with jax.default_matmul_precision("highest"):
    want = jax.jit(grad)(x, gate, up, down)
    traced, meshes = [], []
    trainable = gmm.trainable
    # the gradient's chunks are traced after the forward's sharding context has closed, and choose in it too
    monkeypatch.setattr(moe, "_trainable_takes",
                        lambda rows, kernel, trained: meshes.append(rules_lib.active_mesh()) or trained)
    monkeypatch.setattr(gmm, "trainable", lambda *a: traced.append(a[0].shape) or trainable(*a))
    got = jax.jit(lambda *a: grad(*a))(x, gate, up, down)
  # each device's 8 tokens (gathered over the expert axis) give 16 copies, which its grouped matmuls take 8 at a
  # time (`moe.capacity`): 16 go to the first shard of one fsdp half (two chunks), none to the others (none),
  # and 4 to each shard of the other half (one)
  assert set(traced) == {(8, 32), (8, 128)} and len(meshes) >= 6 and None not in meshes, meshes
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


@jax.default_matmul_precision("default")
def test_on_tpu_the_kernels_gradient_visits_only_the_groups():
  """On a v5p chip XLA's grouped matmul's kernel gradient is a dense product per group: forward and both
  gradients declare 2 + G times one product over every row. An update's pass takes the Pallas kernels
  (`moe._grouped`), which declare a bound of one visit per row tile and group each, and multiply only
  the row tiles the groups overlap (`product_rows`)."""
  experts, width_in, width_out, rows = 16, 1024, 512, 4096
  device = topology.devices(topology.parse("v5p:2x2x1"))[:1]
  mesh = Mesh(np.array(device), ("x",))
  one = NamedSharding(mesh, PartitionSpec())
  args = (jax.ShapeDtypeStruct((rows, width_in), jnp.bfloat16, sharding=one),
          jax.ShapeDtypeStruct((experts, width_in, width_out), jnp.float32, sharding=one),
          jax.ShapeDtypeStruct((experts,), jnp.int32, sharding=one))

  def flops(trained):
    def loss(x, w, sizes):
      with rules_lib.activation_sharding(mesh, None):
        return jnp.sum(jnp.square(moe._grouped(x, w, sizes, trained).astype(jnp.float32)))
    return hlo.loop_flops(jax.jit(jax.grad(loss, (0, 1))).lower(*args).compile().as_text())

  product = 2 * rows * width_in * width_out
  assert flops(False) == (2 + experts) * product
  assert flops(True) == 3 * 2 * (rows + experts * 128) * width_in * width_out  # 3 x 1.5 products
  # the rows the kernels multiply: a whole tile per visit, so a tile shared by k groups is multiplied k times;
  # 16 groups of 1000 rows (an eighth of 131072) overlap 8 or 9 tiles each: 1.12x the routed rows
  sizes = jnp.full((experts,), 1000, jnp.int32)
  assert int(gmm.product_rows(gmm.visits(sizes, 131072, 128), 128)) == 140 * 128
  # 16 groups of 8 rows share one tile, multiplied once per group: 16x the routed rows
  assert int(gmm.product_rows(gmm.visits(sizes // 125, 131072, 128), 128)) == 16 * 128


@jax.default_matmul_precision("default")
def test_on_tpu_moe_reads_float8_experts_as_stored():
  """`moe._grouped` on a v5p chip takes the Pallas kernel for float8 experts and adds no temporary around it
  (`hbm_bytes` charges the kernel its operands, so this checks what is outside it); XLA's grouped matmul given
  the same float8 values converts them into a temporary first."""
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


@pytest.mark.parametrize("chip,taken", [("v5p:2x2x1", ("float8_e4m3fn",)), ("v6e:2x2", ("float8_e4m3fn",)),
                                        ("v5e:2x2", ())])
def test_moe_takes_the_kernel_where_xla_converts_the_experts(chip, taken):
  mesh = Mesh(np.array(topology.devices(topology.parse(chip))[:1]), ("x",))
  rows = jax.ShapeDtypeStruct((512, 2048), jnp.bfloat16)
  for dtype in ("int8", "float8_e4m3fn"):
    kernel = weight_quant.QuantizedWeight(jax.ShapeDtypeStruct((16, 2048, 768), dtype),
                                          jax.ShapeDtypeStruct((16, 1, 768), jnp.bfloat16))
    with rules_lib.activation_sharding(mesh, None):
      assert moe._kernel_takes(rows, kernel) == (dtype in taken)
    if jax.default_backend() != "tpu":
      assert not moe._kernel_takes(rows, kernel)  # off TPU
    with rules_lib.activation_sharding(mesh, None):  # float32 rows keep XLA's precision
      assert not moe._kernel_takes(jax.ShapeDtypeStruct((512, 2048), jnp.float32), kernel)
  big = weight_quant.QuantizedWeight(jax.ShapeDtypeStruct((16, 32768, 768), "float8_e4m3fn"),
                                     jax.ShapeDtypeStruct((16, 1, 768), jnp.bfloat16))
  with rules_lib.activation_sharding(mesh, None):  # no column tile fits: XLA's grouped matmul
    assert not moe._kernel_takes(jax.ShapeDtypeStruct((512, 32768), jnp.bfloat16), big)
