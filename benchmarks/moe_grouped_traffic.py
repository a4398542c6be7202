"""HBM traffic of one expert projection's grouped matmul on a TPU chip, compiled here (the `tpu` extra).

    JAX_PLATFORMS=cpu python benchmarks/moe_grouped_traffic.py [--topology v5p:2x2x1 --rows 512 --experts 16
                                                               --width_in 2048 --width_out 768]

`rows` bfloat16 rows through `experts` kernels [width_in, width_out], six
ways: XLA's grouped matmul (`jax.lax.ragged_dot`) on bfloat16 kernels, on
int8 kernels as stored with the rows' scales on the product, on int8
kernels dequantized to bfloat16 first (the convert cannot fuse into the
grouped matmul, a custom call), on float8 kernels as stored; and the Pallas
kernel (`rljax.kernels.grouped_matmul`) on int8 and on float8 kernels.
Prints one JSON object per line: the setup, then each way's HBM traffic
(`rljax.compile.hlo.hbm_bytes`, which charges a Pallas call its whole
operands: the kernel's own reads are not simulated) and kernel bytes in
MiB. Compiler figures, not a timing.
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


def _scaled_ragged_dot(rows, values, scale, sizes):
  """XLA's grouped matmul on int8 kernels as stored, each row's expert's scales on the product."""
  y = jax.lax.ragged_dot(rows, values, sizes, preferred_element_type=rows.dtype)
  return y * moe._row_scales(scale, sizes, rows.shape[0]).astype(rows.dtype)


def ways(device_kind: str) -> dict:
  """{name: (kernel dtype, fn(rows, kernel values, scales, sizes))}; the Pallas kernel's column tiles split over
  the chip's TensorCores as `rljax.models.moe` splits them."""
  cores = moe.MEGACORE.get(device_kind, 1)
  pallas = lambda r, w, s, g: grouped_matmul.grouped_matmul(r, w, g, s, cores=cores)  # noqa: E731
  return {
      "bfloat16": (jnp.bfloat16, lambda r, w, s, g: jax.lax.ragged_dot(r, w, g)),
      "int8 as stored": (jnp.int8, _scaled_ragged_dot),
      "int8 dequantized": (jnp.int8, lambda r, w, s, g: jax.lax.ragged_dot(r, w.astype(r.dtype) * s, g)),
      "float8 as stored": (jnp.float8_e4m3fn,
                           lambda r, w, s, g: jax.lax.ragged_dot(r, w, g, preferred_element_type=r.dtype)),
      "int8 through the Pallas kernel": (jnp.int8, pallas),
      "float8 through the Pallas kernel": (jnp.float8_e4m3fn, pallas),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--topology", default="v5p:2x2x1")
  parser.add_argument("--rows", type=int, default=512)
  parser.add_argument("--experts", type=int, default=16)
  parser.add_argument("--width_in", type=int, default=2048)
  parser.add_argument("--width_out", type=int, default=768)
  args = parser.parse_args()
  device = topology.devices(topology.parse(args.topology))[:1]
  one = NamedSharding(Mesh(np.array(device), ("x",)), PartitionSpec())
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=one)  # noqa: E731
  print(json.dumps({"setup": vars(args), "device": device[0].device_kind}))
  for name, (dtype, fn) in ways(device[0].device_kind).items():
    compiled = jax.jit(fn).lower(spec((args.rows, args.width_in), jnp.bfloat16),
                                 spec((args.experts, args.width_in, args.width_out), dtype),
                                 spec((args.experts, 1, args.width_out), jnp.bfloat16),
                                 spec((args.experts,), jnp.int32)).compile()
    kernel = args.experts * args.width_in * args.width_out * jnp.dtype(dtype).itemsize
    print(json.dumps({"way": name, "traffic_mib": round(hlo.hbm_bytes(compiled.as_text()) / 2**20, 2),
                      "kernel_mib": round(kernel / 2**20, 2)}))


if __name__ == "__main__":
  main()
