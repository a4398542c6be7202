"""How libtpu lowers a gradient reduce-scatter, and what rljax's gradient compiler options change.

    python benchmarks/tpu_reduce_scatter.py [--topologies v5p-8,v6e-8,v5e-16,v5p-16] [--updates v5p-8]

Part 1, per topology: a bfloat16 sum of per-chip [4096, 16032] partials
scattered over all chips (an LM-head block gradient of Llama-3.1-8B's
shape), compiled three ways: one `psum_scatter` (libtpu's choice), one
`psum_scatter` per torus axis of the device ring (ring reduce-scatters
only), each with rljax's gradient options. Prints the collectives' bytes by
kind and the compiler's time estimate. Part 2, per `--updates` topology:
the Qwen2.5-7B and Llama-3.1-8B actor updates at MaxText's shapes
(benchmarks/tpu_compile.py) without and with `gradient_compiler_options`.
"""

import argparse
import json
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import mesh_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from rljax import config as config_lib, sharding  # noqa: E402
from rljax.compile import hlo, plan, topology  # noqa: E402
from rljax.train import resolve  # noqa: E402
from rljax.rl import steps as steps_module  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20


def torus_runs(coords: list[tuple[int, ...]]) -> list[int]:
  """Group sizes, innermost first, that split a ring of chips into runs along one torus axis at a time."""
  sizes, ring = [], coords
  while len(ring) > 1:
    run = 1
    while run < len(ring) and len({i for c in ring[1:run + 1] for i, x in enumerate(c) if x != ring[0][i]}) <= 1:
      run += 1
    run = len(ring) if run == 1 or len(ring) % run else run
    sizes.append(run)
    ring = ring[::run]
  return sizes


def staged_scatter(value: jax.Array, axis: str, sizes: list[int]) -> jax.Array:
  """`psum_scatter(value, axis, scatter_dimension=0, tiled=True)` as one reduce-scatter per group size in `sizes`.

  value: [rows, ...] on each device, rows divisible by prod(sizes); position p on the axis has digits
  p = p0 + sizes[0] * (p1 + sizes[1] * ...), and stage k sums over the devices differing in digit k only.
  """
  n, rows = math.prod(sizes), value.shape[0]
  value = value.reshape(*reversed(sizes), rows // n, *value.shape[1:])
  stride = 1
  for k, size in enumerate(sizes):
    value = jnp.moveaxis(value, len(sizes) - 1 - k, 0)
    groups = [[base + stride * j for j in range(size)] for base in range(n) if (base // stride) % size == 0]
    shape = value.shape
    value = jax.lax.psum_scatter(value.reshape(-1, *shape[len(sizes) - k + 1:]), axis, scatter_dimension=0,
                                 tiled=True, axis_index_groups=groups)
    value = value.reshape(shape[1:])
    stride *= size
  return value.reshape(rows // n, *value.shape[1:])


def scatter_rows(name: str) -> list[dict]:
  target = topology.parse(name)
  devices = mesh_utils.create_device_mesh((target.chips,), topology.devices(target))
  mesh = Mesh(devices, ("fsdp",))
  sizes = torus_runs([tuple(d.coords) for d in devices])
  parts = jax.ShapeDtypeStruct((target.chips, 4096, 16032), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
  ways = {"one psum_scatter": lambda x: jax.lax.psum_scatter(x[0], "fsdp", scatter_dimension=0, tiled=True),
          f"per torus axis {sizes}": lambda x: staged_scatter(x[0], "fsdp", sizes)}
  rows = []
  for way, body in ways.items():
    reduce = jax.shard_map(body, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"), check_vma=False)
    compiled = jax.jit(reduce).lower(parts).compile(sharding.gradient_compiler_options(mesh))
    summary = hlo.collectives(compiled.as_text())
    rows.append({"topology": name, "way": way, "estimated_s": (compiled.cost_analysis() or {}).get("optimal_seconds"),
                 "collectives_mib": {k: round(v / MiB, 1) for k, v in summary.by_kind.items() if v}})
  return rows


def update_rows(name: str, preset: str) -> list[dict]:
  from tpu_compile import maxtext_shapes  # pylint: disable=import-outside-toplevel
  target = topology.parse(name)
  devices = topology.devices(target)
  rows, real = [], steps_module.gradient_compiler_options
  for options in ("none", "rljax"):
    steps_module.gradient_compiler_options = real if options == "rljax" else (lambda mesh: {})
    config = resolve(config_lib.load_config_file(f"configs/grpo.py:{preset}"), maxtext_shapes(len(devices)),
                     device_count=len(devices))
    mesh = sharding.make_mesh(config, devices=devices)
    update = next(p for p in plan.rl_steps(config, mesh) if p.step.name.startswith("actor_update"))
    result, _ = plan.compile_step(update, target.hbm_bytes)
    rows.append({"topology": name, "preset": preset, "gradient_options": options, "estimated_s": result.seconds,
                 "peak_gib": round(result.required / GiB, 2), "ratio_to_fsdp_min": result.ratio,
                 "collectives_gib": {k: round(v / GiB, 3) for k, v in result.collectives.items() if v}})
  steps_module.gradient_compiler_options = real
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topologies", default="v5p-8,v6e-8,v5e-16,v5p-16")
  parser.add_argument("--updates", default="v5p-8", help="topologies for the whole-update comparison ('' for none)")
  args = parser.parse_args()
  for name in filter(None, args.topologies.split(",")):
    for row in scatter_rows(name):
      print(json.dumps(row), flush=True)
  for name in filter(None, args.updates.split(",")):
    for preset in ("qwen2_5_7b_gsm8k", "llama3_1_8b_gsm8k"):
      for row in update_rows(name, preset):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
