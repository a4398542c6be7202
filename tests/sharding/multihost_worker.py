"""One process of the two-process test: 4 CPU devices, gloo collectives.

Usage: python multihost_worker.py OUT.npz   (env: JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID, XLA_FLAGS with 4 host devices)
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from rljax import sharding  # noqa: E402
from rljax.models import weight_quant  # noqa: E402
from rljax.models.weight_quant import QuantizedWeight  # noqa: E402
from rljax.sharding import hosts  # noqa: E402
from tests.sharding import tiny_step  # noqa: E402


def _whitened_and_reversed(rows, scale):
  """([rows] whitened over the batch times scale, the rows in reverse order), (the batch mean,)"""
  x = rows["x"]
  mean = x.mean()
  return {"white": (x - mean) / x.std() * scale, "reversed": x[::-1]}, (mean,)


def check_global_rows():
  """hosts.global_rows sees every host's rows: its statistics and gathers are the one-process ones."""
  every = np.arange(16, dtype=np.float32).reshape(8, 2) ** 1.5
  mine = every.reshape(2, 4, 2)[jax.process_index()]
  (out, (mean,)) = hosts.global_rows(_whitened_and_reversed, {"x": mine}, np.float32(2.0))
  want, (want_mean,) = _whitened_and_reversed({"x": every}, np.float32(2.0))
  np.testing.assert_allclose(mean, want_mean, rtol=1e-6)
  for name, value in out.items():
    np.testing.assert_allclose(value, want[name].reshape(2, 4, 2)[jax.process_index()], rtol=1e-5, err_msg=name)


def check_host_local_copy():
  """hosts.HostLocalCopy gives each host the whole weights in its own layout, also from a mesh whose device
  order interleaves the processes (a TPU mesh orders its chips by their coordinates, not host by host)."""
  interleaved = [d for pair in zip(hosts.process_devices(0), hosts.process_devices(1)) for d in pair]
  mesh = sharding.build_mesh({"data": 1, "fsdp": 8, "tensor": 1, "sequence": 1}, interleaved)
  whole = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
  weights = {"w": jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("fsdp")), lambda i: whole[i])}
  local = hosts.local_mesh({"data": 1, "fsdp": 2, "tensor": 2, "sequence": 1})
  target = {"w": NamedSharding(local, P("fsdp", "tensor"))}
  copy = hosts.HostLocalCopy(target, lambda tree: jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree), interleaved)
  out = copy(weights)["w"]
  assert out.is_fully_addressable and out.sharding == target["w"] and out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out, np.float32), whole)
  # a quantizing cast (rollout.quantization): the 8-bit values and their per-column scales, the reduction's
  # output laid out as the compiler leaves it, each reach the host's layout
  quantized = {"w": QuantizedWeight(target["w"], NamedSharding(local, P(None, "tensor")))}
  copy = hosts.HostLocalCopy(quantized, lambda tree: {"w": weight_quant.quantize(tree["w"], (0,), jnp.int8,
                                                                                   jnp.float32)}, interleaved)
  out = copy(weights)["w"]
  assert out.values.dtype == jnp.int8 and out.values.sharding == quantized["w"].values
  assert out.scale.is_fully_addressable and out.scale.sharding == quantized["w"].scale
  np.testing.assert_allclose(np.asarray(weight_quant.dequantize(out, jnp.float32)), whole, atol=whole.max() / 254)


def main(out):
  assert sharding.initialize(), "the worker must run as a multi-process job"
  assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  rows = sharding.local_rows(tiny_step.BATCH)
  loss, host, _, _ = tiny_step.run_step(mesh, lambda full: {k: v[rows] for k, v in full.items()})
  flat = {"/".join(map(str, k)): v for k, v in jax.tree_util.tree_flatten_with_path(host)[0]}
  check_global_rows()
  check_host_local_copy()
  if jax.process_index() == 0:
    np.savez(out, loss=loss, **{k: v for k, v in flat.items()})
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv[1])
