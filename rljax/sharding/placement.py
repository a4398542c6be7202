"""Placing a job's state and batches on its mesh.

Parameters are placed by their logical-axis rules (`rules.param_shardings`),
optimizer state like the parameters it tracks, batches by the batch rule,
assembled from each process's own rows in a multi-host job. The jitted
steps that use them are built by `rljax.rl.steps`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.sharding import hosts


def shard_like(tree: Any, shardings: Any) -> Any:
  """Places every leaf of `tree` by the matching leaf of `shardings`."""
  return jax.device_put(tree, shardings)


def optimizer_shardings(optimizer: optax.GradientTransformation, params: Any, param_shardings: Any,
                        mesh: Mesh) -> Any:
  """Shardings of `optimizer`'s state for `params` (arrays or ShapeDtypeStructs).

  Every sub-tree of the state shaped like the parameters (Adam's mu and nu)
  takes the parameters' shardings; everything else (step counts) is
  replicated over `mesh`.
  """
  param_def = jax.tree.structure(params)
  replicated = NamedSharding(mesh, PartitionSpec())

  def like_params(sub):
    return jax.tree.structure(sub) == param_def

  abstract = jax.eval_shape(optimizer.init, params)
  return jax.tree.map(lambda sub: param_shardings if like_params(sub) else replicated, abstract, is_leaf=like_params)


def init_optimizer(
    optimizer: optax.GradientTransformation, params: Any, param_shardings: Any, mesh: Mesh
) -> tuple[Any, Any]:
  """Optimizer state laid out like its parameters (`optimizer_shardings`), created in place on its devices.

  Returns:
    (opt_state, its shardings).
  """
  shardings = optimizer_shardings(optimizer, params, param_shardings, mesh)
  return jax.jit(optimizer.init, out_shardings=shardings)(params), shardings


def global_batch(local: Any, sharding: NamedSharding | Any) -> Any:
  """Assembles per-process batch shards into global arrays.

  Each process passes only the rows it loaded (its share of the batch axis,
  in process order); the result is a global jax.Array laid out by
  `sharding`. In a single-process run this is a device_put.
  """
  def one(x, s):
    return jax.make_array_from_process_local_data(s, np.asarray(x))
  if isinstance(sharding, NamedSharding):
    return jax.tree.map(lambda x: one(x, sharding), local)
  return jax.tree.map(one, local, sharding)


def local_rows(global_rows: int) -> slice:
  """The rows of a global batch this process feeds (even split by process)."""
  if global_rows % hosts.count():
    raise ValueError(f"a batch of {global_rows} rows does not split over {hosts.count()} processes")
  return hosts.share(global_rows)


def addressable_bytes(tree: Any) -> int:
  """Bytes this process's first device holds for `tree` (one shard per leaf)."""
  device = jax.local_devices()[0]
  total = 0
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      if shard.device == device:
        total += shard.data.size * shard.data.dtype.itemsize
  return total


@dataclasses.dataclass(frozen=True)
class Step:
  """A jitted function and the abstract arguments a run calls it with.

  Attributes:
    name: what the step is (`actor_update`, `decode`, ...), as `rljax.compile` prints it.
    fn: the jitted function.
    args: a tuple of pytrees of `jax.ShapeDtypeStruct`s with shardings.
  """

  name: str
  fn: Callable
  args: tuple

  def __call__(self, *args):
    return self.fn(*args)

  def lower(self) -> Any:
    """`fn` lowered on `args` (`.compile()` it for the mesh's devices)."""
    return self.fn.lower(*self.args)


def abstract(tree: Any, shardings: Any = None) -> Any:
  """ShapeDtypeStructs of `tree`'s leaves, with `shardings` (default: each leaf's own sharding)."""
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def shardings_of(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.sharding, tree)


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of a scalar: one copy on every device."""
  return NamedSharding(mesh, PartitionSpec())


def gradient_compiler_options(mesh: Mesh) -> dict[str, int]:
  """XLA options for a jit that reduce-scatters gradients: on TPU, keep every reduce-scatter one.

  For some shapes libtpu lowers a reduce-scatter as an all-reduce and a
  slice rather than relayout the array: twice the interconnect bytes for
  that gradient. Compiled for v5p:2x2x1 (libtpu 0.0.42), a bfloat16
  [18944, 3584] gradient scattered over its second axis (Qwen2.5-7B's MLP
  down-projection under fsdp=4) and a [4096, 64128] one over its first
  (Llama-3.1-8B's LM-head block) both became all-reduces, while [18944,
  4096] and [3584, 76032] stayed reduce-scatters. A relayout group
  threshold of 1 keeps all four reduce-scatters (tests/compile). The whole
  update's estimated time moves by under 1% either way (Qwen2.5-7B 0.0608 ->
  0.0609 s, Llama-3.1-8B 0.0610 -> 0.0614 s on v5p-8), so the option buys
  the halved bytes at no estimated cost. Empty off TPU.

  Where the devices of one reduce-scatter span several torus axes (v5e:4x4,
  v5p:2x2x2 and larger) libtpu lowers it as its multi-axis all-reduce and a
  slice whatever the option; scattering one torus axis at a time halves the
  bytes but the compiler estimates it 3.5x slower, so rljax leaves that
  choice to libtpu (BENCHMARKS.md).
  """
  if mesh.devices.flat[0].platform != "tpu":
    return {}
  return {"xla_tpu_relayout_group_size_threshold_for_reduce_scatter": 1}


def key_struct(mesh: Mesh) -> jax.ShapeDtypeStruct:
  """An abstract PRNG key, replicated."""
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated(mesh))
