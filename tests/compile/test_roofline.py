"""rljax.compile's loop-counted roofline: matmul FLOPs with loop trip counts, chip rates, the time bound.

The compiler's `cost_analysis()` counts a loop body once; `hlo.loop_flops`
counts it once per iteration. Programs here are tiny, compiled for the CPU
or (one of them) for a TPU chip by libtpu.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax.compile import hlo, report, topology

LAYERS, ROWS, WIDTH = 6, 16, 64


def scanned_matmuls(w, x):
  """x [ROWS, WIDTH] through LAYERS layers of tanh(h @ w[i]) (w [LAYERS, WIDTH, WIDTH]), scanned."""
  return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]


def test_a_scan_over_layers_counts_each_layer_where_the_compiler_counts_one():
  w = jax.ShapeDtypeStruct((LAYERS, WIDTH, WIDTH), jnp.float32)
  x = jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.float32)
  compiled = jax.jit(scanned_matmuls).lower(w, x).compile()
  layer = 2 * ROWS * WIDTH * WIDTH
  assert hlo.loop_flops(compiled.as_text()) == LAYERS * layer
  assert layer <= compiled.cost_analysis()["flops"] <= 1.1 * layer  # the loop body, once


def test_a_batched_dot_counts_its_batch_dimensions():
  b, i, j, k = 3, 8, 32, 16
  lhs, rhs = jax.ShapeDtypeStruct((b, i, j), jnp.float32), jax.ShapeDtypeStruct((b, j, k), jnp.float32)
  text = jax.jit(lambda x, y: jnp.einsum("bij,bjk->bik", x, y)).lower(lhs, rhs).compile().as_text()
  assert hlo.loop_flops(text) == 2 * b * i * j * k
  assert hlo.dot_flops(output=(b, i, k), lhs=(b, i, j), contracting=[2]) == 2 * b * i * j * k


@jax.default_matmul_precision("default")  # Mosaic has no "highest" bfloat16 matmul (conftest sets highest)
def test_a_tpu_program_counts_its_convolutions_and_what_a_pallas_kernel_declares():
  """libtpu writes the layer's matmul as a `convolution`; the Pallas kernel's cost estimate counts once."""
  device = topology.devices(topology.parse("v5p:2x2x1"))[:1]
  one = NamedSharding(Mesh(np.array(device), ("x",)), P())
  declared = 2 * 128 ** 3

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  def step(w, x):
    cost = pl.CostEstimate(flops=declared, transcendentals=0, bytes_accessed=0)
    product = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32), cost_estimate=cost)(x, x)
    return scanned_matmuls(w, x), product

  w = jax.ShapeDtypeStruct((LAYERS, 128, 128), jnp.bfloat16, sharding=one)
  x = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16, sharding=one)
  compiled = jax.jit(step).lower(w, x).compile()
  text = compiled.as_text()
  assert " convolution(" in text and "tpu_custom_call" in text
  layer = 2 * 128 * 128 * 128
  assert hlo.loop_flops(text) == LAYERS * layer + declared
  assert compiled.cost_analysis()["flops"] <= 1.1 * (layer + declared)


CONVOLUTION_IN_A_LOOP = """
HloModule written

%fused (p0: bf16[8,256], p1: bf16[256,512]) -> bf16[8,512] {
  %p0 = bf16[8,256]{1,0} parameter(0)
  %p1 = bf16[256,512]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[8,512]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%body (t: (s32[], bf16[8,256], bf16[256,512])) -> (s32[], bf16[8,256], bf16[256,512]) {
  %t = (s32[], bf16[8,256]{1,0}, bf16[256,512]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[8,256]{1,0} get-tuple-element(%t), index=1
  %w = bf16[256,512]{1,0} get-tuple-element(%t), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = bf16[8,512]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused
  ROOT %out = (s32[], bf16[8,256]{1,0}, bf16[256,512]{1,0}) tuple(%next, %x, %w)
}

%cond (c: (s32[], bf16[8,256], bf16[256,512])) -> pred[] {
  %c = (s32[], bf16[8,256]{1,0}, bf16[256,512]{1,0}) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %limit = s32[] constant(12)
  ROOT %lt = pred[] compare(%n, %limit), direction=LT
}

ENTRY %main (x: bf16[8,256], w: bf16[256,512]) -> (s32[], bf16[8,256], bf16[256,512]) {
  %x = bf16[8,256]{1,0} parameter(0)
  %w = bf16[256,512]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[8,256]{1,0}, bf16[256,512]{1,0}) tuple(%zero, %x, %w)
  ROOT %loop = (s32[], bf16[8,256]{1,0}, bf16[256,512]{1,0}) while(%init), condition=%cond, body=%body
}
"""


def test_a_convolution_inside_a_fusion_inside_a_loop_counts_per_iteration():
  assert hlo.loop_flops(CONVOLUTION_IN_A_LOOP) == 12 * 2 * 8 * 512 * 256


def test_convolutions_count_the_taps_that_read_input_not_padding():
  # a 3x3 kernel from 16 to 32 features over a 10x10 image, no padding: 8x8 outputs of 3 x 3 x 16 products
  assert hlo.convolution_flops((1, 10, 10, 16), (3, 3, 16, 32), (1, 8, 8, 32), "b01f_01io->b01f", "size=3x3") == (
      2 * 8 * 8 * 32 * 9 * 16)
  # padded by 1: the border outputs' taps on the padding do not count (10 x 10 outputs, 28 x 28 valid pairs)
  assert hlo.valid_taps(input_size=10, output_size=10, kernel_size=3, pad_low=1) == 28
  # libtpu's form of a projection to 8 heads (btd,dnh->btnh), from an actor update compiled for v5p: the heads
  # are a window of 8 over an input of 1 padded 7 each side, so each output head reads one tap, not 8
  flops = hlo.convolution_flops((2, 256, 1024, 1), (1024, 8, 128, 1), (2, 256, 8, 128), "0bf1_i1o0->0b1f",
                                "size=1x8 pad=0_0x7_7 rhs_reversal=0x1")
  assert flops == hlo.dot_flops(output=(2, 256, 8, 128), lhs=(2, 256, 1024), contracting=[2])


def test_the_roofline_adds_collectives_to_the_larger_of_compute_and_hbm_time():
  chip = topology.Chip(peak_flops=100e12, hbm_bandwidth=1e12, ici_bandwidth=0.5e12)
  # compute-bound: 2 s of FLOPs, 0.5 s of HBM, 1 s of collectives
  assert report.roofline_seconds(200e12, 0.5e12, 0.5e12, chip) == pytest.approx(3.0)
  # memory-bound: 0.1 s of FLOPs, 4 s of HBM, no collective
  assert report.roofline_seconds(10e12, 4e12, 0.0, chip) == pytest.approx(4.0)
  v5p = topology.parse("v5p-8").chip
  assert report.roofline_seconds(459e12, 0, 0, v5p) == pytest.approx(1.0)
  assert report.roofline_seconds(0, 2765e9, 600e9, v5p) == pytest.approx(2.0)  # 1 s of HBM + 1 s of ICI


def test_chip_rates_are_known_for_each_kind_but_v4():
  assert topology.parse("v5litepod-16").chip == topology.CHIPS["v5e"]
  assert topology.parse("v6e-8").chip.peak_flops == 918e12
  assert topology.parse("v4-8").chip is None
  kinds = {topology.devices(topology.parse(n))[0].device_kind: g for n, g in [("v5p:2x2x1", "v5p"), ("v5e:2x2", "v5e"),
                                                                              ("v6e:2x2", "v6e")]}
  assert all(topology.chip_of(kind) == topology.CHIPS[g] for kind, g in kinds.items()), kinds


def test_reports_carry_the_roofline_beside_the_loop_once_estimate():
  one = report.StepReport(name="a", hbm=1 << 30, flops=1e12, seconds=0.01, loop_flops=6e12, roofline_seconds=0.5)
  two = report.StepReport(name="b", hbm=1 << 30, flops=1e12, seconds=0.01, loop_flops=2e12, roofline_seconds=0.25)
  both = report.in_sequence("a+b", [(one, True), (two, False)], 1 << 30)
  assert both.loop_flops == 8e12 and both.roofline_seconds == 0.75
  assert report.in_sequence("a+c", [(one, True), (report.StepReport(name="c", hbm=1), False)], 1).roofline_seconds is None
  assert {"loop_flops", "roofline_seconds", "flops", "seconds"} <= set(both.as_dict())
  header, row = report.table([both]).splitlines()
  assert "roof s" in header and "est s (loop once)" in header and "TFLOP (loop once)" in header
  assert " 0.75 " in row and " 8.00 " in row


def test_a_scatter_into_a_donated_buffer_moves_its_rows_not_the_buffer():
  """`buffer.at[rows].set(new)` on a donated buffer updates it in place: HBM traffic counts the rows written and
  read (and the indices), as for a dynamic-update-slice, not the 64 rows of the buffer."""
  buffer, rows = jax.ShapeDtypeStruct((64, 1024), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32)
  new = jax.ShapeDtypeStruct((2, 1024), jnp.float32)
  # with XLA's CPU fusion emitters (the suite turns them off, conftest), which keep the scatter an op: a TPU program
  # holds it as one
  text = jax.jit(lambda b, r, n: b.at[r].set(n, mode="drop"), donate_argnums=(0,)).lower(buffer, rows, new).compile(
      {"xla_cpu_use_fusion_emitters": True})
  assert "scatter" in text.as_text()
  row = 1024 * 4
  assert 2 * 2 * row <= hlo.hbm_bytes(text.as_text()) <= 2 * 2 * row + 64, hlo.hbm_bytes(text.as_text())


def test_a_conditional_counts_its_costliest_branch():
  """One run takes one branch: HBM traffic counts the costlier branch's (each reads the whole [1024, 1024]
  matrix), not both."""
  w, p = jax.ShapeDtypeStruct((1024, 1024), jnp.float32), jax.ShapeDtypeStruct((), jnp.bool_)
  text = jax.jit(lambda w, p: jax.lax.cond(p, lambda w: jnp.sum(w, axis=0), lambda w: jnp.max(w, axis=0), w)
                 ).lower(w, p).compile().as_text()
  assert "conditional" in text
  whole = 1024 * 1024 * 4
  assert whole <= hlo.hbm_bytes(text) < 1.1 * whole, hlo.hbm_bytes(text)


def test_reports_name_the_loops_whose_trip_count_depends_on_the_data():
  # a while loop that runs until its data says stop is counted once (as a chunk loop that usually runs once):
  # the report counts such loops and the CLI names the steps whose figures rest on them
  def chunks(x, n):
    return jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.tanh(c[1] @ x)), (0, x))[1]

  x, n = jax.ShapeDtypeStruct((ROWS, ROWS), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)
  data = report.from_compiled("update", jax.jit(chunks).lower(x, n).compile(), 1 << 30)
  w = jax.ShapeDtypeStruct((LAYERS, WIDTH, WIDTH), jnp.float32)
  layers = report.from_compiled("scan", jax.jit(scanned_matmuls).lower(w, x.update(shape=(ROWS, WIDTH))).compile(),
                                1 << 30)
  assert (data.unknown_loops, layers.unknown_loops) == (1, 0)
  assert data.loop_flops == 2 * ROWS ** 3
  assert report.once_counted([layers]) is None
  assert report.once_counted([layers, data]).startswith("update (1): TFLOP, roof s, traffic and collectives count one")
  assert report.in_sequence("both", [(data, True), (data, False)], 1 << 30).unknown_loops == 2
