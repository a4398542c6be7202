"""FLOPs of one expert projection's training (forward and both gradients) on a TPU chip, compiled here (the `tpu`
extra), and the rows the Pallas kernels multiply for a drawn routing.

    JAX_PLATFORMS=cpu python benchmarks/moe_training_flops.py [--topology v5p:2x2x1 --tokens 24576 --top_k 8
        --experts 128 --shards 8 --width_in 2048 --width_out 768 --seed 0 --dispatch_topology v5p:2x2x2]

The defaults are one chip of the `qwen3_30b_a3b_gsm8k` preset's update on
v5p-64: 3072 tokens per chip per micro-batch, all-gathered over the 8
chips of an expert group (24576 tokens, top 8 of 128 experts: 196608
token copies on every chip), 16 experts per chip, gate/up [2048, 768].

Two ways through `jax.grad` of a loss of rows [copies, width_in] @ the
chip's experts: XLA's grouped matmul (`jax.lax.ragged_dot`) and the Pallas
kernels (`rljax.kernels.grouped_matmul.trainable`). For each, the FLOPs
the compiled program declares with its loops counted
(`rljax.compile.hlo.loop_flops`; a Pallas call declares its
`pl.CostEstimate`, a bound of one visit per row tile and group) and its
HBM traffic. Then a routing is drawn (each token's k experts uniformly
without repeats, and a skewed one, expert e drawn with weight 1/(e+1)),
and the rows the kernels multiply (`product_rows`, the dynamic work: the
same count in the forward, the transposed product and `grouped_outer`) are
set against the rows routed to the chip's experts: with every copy in one
buffer, and taken `moe.capacity` rows at a time as the update now does
(`chunks` of them). Last, one layer's whole `moe.dispatch` and its gradient
over the 8 chips of `--dispatch_topology`, compiled with the grouped
matmuls sized for every copy and for `moe.capacity`: temporaries, declared
TFLOP and traffic per chip. Prints one JSON object per line. Compiler and
counting figures, not a timing.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.compile import hlo, topology
from rljax.kernels import grouped_matmul
from rljax.models import moe


def routing(rng: np.random.Generator, tokens: int, experts: int, top_k: int, skewed: bool) -> np.ndarray:
  """[tokens, top_k] distinct experts per token, uniform or with weight 1 / (e + 1) for expert e."""
  weights = 1.0 / np.arange(1, experts + 1) if skewed else np.ones(experts)
  keys = np.log(rng.uniform(size=(tokens, experts))) / weights  # Efraimidis-Spirakis: top-k keys, no repeats
  return np.argsort(-keys, axis=1)[:, :top_k]


def chip_sizes(ids: np.ndarray, experts: int, first: int, local: int) -> np.ndarray:
  """[local] copies routed to experts first .. first + local - 1."""
  return np.bincount(ids.reshape(-1), minlength=experts)[first:first + local]


def compiled_figures(fn, rows, kernels, sizes) -> dict:
  """Loop-counted declared TFLOP and HBM traffic (GiB) of jax.grad(sum(fn(rows, kernels, sizes)^2))."""
  loss = lambda r, w, s: jnp.sum(jnp.square(fn(r, w, s).astype(jnp.float32)))  # noqa: E731
  text = jax.jit(jax.grad(loss, (0, 1))).lower(rows, kernels, sizes).compile().as_text()
  return {"declared_tflop": round(hlo.loop_flops(text) / 1e12, 3), "traffic_gib": round(hlo.hbm_bytes(text) / 2**30, 2)}


def multiplied_rows(counts: np.ndarray, rows: int) -> tuple[int, int]:
  """(rows the kernels multiply, chunks) for a chip's copies per local expert `counts` [E'] sorted by expert
  and taken `rows` at a time (`moe._experts_chunked`; all of them in one when `rows` is every copy)."""
  tm = grouped_matmul.row_tile(rows)
  padded = -(-rows // tm) * tm
  starts = range(0, max(int(counts.sum()), 1), rows)
  total = 0
  for start in starts:
    sizes = moe._chunk_sizes(jnp.asarray(counts, jnp.int32), jnp.int32(start), rows)  # pylint: disable=protected-access
    total += int(grouped_matmul.product_rows(grouped_matmul.visits(sizes, padded, tm), tm))
  return total, len(starts)


def dispatch_figures(args, factor: float) -> dict:
  """Per-chip figures of jax.grad of one layer's `moe.dispatch` (gate, up, down) over `args.shards` chips of an
  expert axis, the experts' grouped matmuls sized for `factor` times a chip's even share of the gathered copies
  (`moe.CAPACITY_FACTOR`; `args.shards` = every copy): temporaries, declared TFLOP (loops counted; the
  chunk loop, whose trip count depends on the routing, once) and HBM traffic."""
  from rljax import config as config_lib, sharding  # pylint: disable=import-outside-toplevel
  from rljax.sharding import rules as rules_lib  # pylint: disable=import-outside-toplevel
  devices = topology.devices(topology.parse(args.dispatch_topology))
  mesh = sharding.build_mesh({"data": 1, "fsdp": 1, "tensor": 1, "sequence": 1, "expert": args.shards},
                             devices[:args.shards])
  rules = sharding.rules_from_config(config_lib.get_base_config())
  rows, length = args.tokens // 1536, 1536  # the preset's micro-batch: rows of 1536 tokens, split over the chips
  spec = lambda *axes: NamedSharding(mesh, PartitionSpec(*axes))  # noqa: E731
  x = jax.ShapeDtypeStruct((rows, length, args.width_in), jnp.bfloat16, sharding=spec("expert"))
  ids = jax.ShapeDtypeStruct((rows, length, args.top_k), jnp.int32, sharding=spec("expert"))
  weights = jax.ShapeDtypeStruct((rows, length, args.top_k), jnp.bfloat16, sharding=spec("expert"))
  gate = jax.ShapeDtypeStruct((args.experts, args.width_in, args.width_out), jnp.bfloat16, sharding=spec("expert"))
  down = jax.ShapeDtypeStruct((args.experts, args.width_out, args.width_in), jnp.bfloat16, sharding=spec("expert"))

  def loss(x, ids, weights, gate, up, down):
    with rules_lib.activation_sharding(mesh, rules):
      out = moe.dispatch(x, ids, weights, gate, up, down)
    return jnp.sum(jnp.square(out.astype(jnp.float32)))

  previous, moe.CAPACITY_FACTOR = moe.CAPACITY_FACTOR, factor
  try:
    compiled = jax.jit(jax.grad(loss, (0, 3, 4, 5))).lower(x, ids, weights, gate, gate, down).compile()
  finally:
    moe.CAPACITY_FACTOR = previous
  text = compiled.as_text()
  return {"capacity_factor": factor, "temp_gib": round(compiled.memory_analysis().temp_size_in_bytes / 2**30, 2),
          "declared_tflop": round(hlo.loop_flops(text) / 1e12, 3), "traffic_gib": round(hlo.hbm_bytes(text) / 2**30, 2)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--topology", default="v5p:2x2x1")
  parser.add_argument("--tokens", type=int, default=24576)
  parser.add_argument("--top_k", type=int, default=8)
  parser.add_argument("--experts", type=int, default=128)
  parser.add_argument("--shards", type=int, default=8)
  parser.add_argument("--width_in", type=int, default=2048)
  parser.add_argument("--width_out", type=int, default=768)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--dispatch_topology", default="v5p:2x2x2")
  args = parser.parse_args()
  device = topology.devices(topology.parse(args.topology))[:1]
  one = NamedSharding(Mesh(np.array(device), ("x",)), PartitionSpec())
  local, copies = args.experts // args.shards, args.tokens * args.top_k
  k, n = args.width_in, args.width_out
  rows = jax.ShapeDtypeStruct((copies, k), jnp.bfloat16, sharding=one)
  kernels = jax.ShapeDtypeStruct((local, k, n), jnp.bfloat16, sharding=one)
  sizes = jax.ShapeDtypeStruct((local,), jnp.int32, sharding=one)
  cores = moe.MEGACORE.get(device[0].device_kind, 1)
  print(json.dumps({"setup": vars(args), "device": device[0].device_kind, "copies": copies, "local_experts": local}))
  matmul = 2 * copies * k * n  # one [copies, K] x [K, N] product, every row
  ways = {"XLA grouped matmul": lambda r, w, s: jax.lax.ragged_dot(r, w, s),
          "Pallas kernels": lambda r, w, s: grouped_matmul.trainable(r, w, s, cores, False)}
  for name, fn in ways.items():
    figures = compiled_figures(fn, rows, kernels, sizes)
    over = round(figures["declared_tflop"] * 1e12 / matmul, 2)
    print(json.dumps({"way": name, **figures, "declared_over_all_rows": over}))
  rng = np.random.default_rng(args.seed)
  for skewed in (False, True):
    ids = routing(rng, args.tokens, args.experts, args.top_k, skewed)
    for chip in range(args.shards):
      counts = chip_sizes(ids, args.experts, chip * local, local)
      routed = int(counts.sum())
      row = {"routing": "skewed" if skewed else "uniform", "chip": chip, "routed_rows": routed}
      for name, rows in (("all_copies", copies), ("chunks", moe.capacity(copies, args.shards))):
        multiplied, chunks = multiplied_rows(counts, rows)
        row |= {f"{name}_multiplied": multiplied, f"{name}_ratio": round(multiplied / max(routed, 1), 3)}
      print(json.dumps({**row, "chunks": chunks}))
  for factor in (float(args.shards), moe.CAPACITY_FACTOR):
    print(json.dumps({"dispatch": args.dispatch_topology, **dispatch_figures(args, factor)}))


if __name__ == "__main__":
  main()
