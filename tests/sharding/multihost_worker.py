"""One process of the two-process test: 4 CPU devices, gloo collectives.

Usage: python multihost_worker.py OUT.npz   (env: JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID, XLA_FLAGS with 4 host devices)
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax import sharding  # noqa: E402
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


def main(out):
  assert sharding.initialize(), "the worker must run as a multi-process job"
  assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  rows = sharding.local_rows(tiny_step.BATCH)
  loss, host, _, _ = tiny_step.run_step(mesh, lambda full: {k: v[rows] for k, v in full.items()})
  flat = {"/".join(map(str, k)): v for k, v in jax.tree_util.tree_flatten_with_path(host)[0]}
  check_global_rows()
  if jax.process_index() == 0:
    np.savez(out, loss=loss, **{k: v for k, v in flat.items()})
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv[1])
