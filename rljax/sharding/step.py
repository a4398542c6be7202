"""Sharded train steps over the pure (graphdef, params) split.

A train step is one jitted function of arrays: forward, loss, backward and
the optax update, with parameters, optimizer state and batch placed by
NamedShardings and the old parameter and optimizer buffers donated, so the
update does not hold two copies in memory.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]


def shard_like(tree: Any, shardings: Any) -> Any:
  """Places every leaf of `tree` by the matching leaf of `shardings`."""
  return jax.device_put(tree, shardings)


def init_optimizer(
    optimizer: optax.GradientTransformation, params: Any, param_shardings: Any, mesh: Mesh
) -> tuple[Any, Any]:
  """Optimizer state laid out like its parameters.

  Every sub-tree of the state shaped like the parameters (Adam's mu and nu)
  takes the parameters' shardings; everything else (step counts) is
  replicated over `mesh`. The state is created in place on its devices.

  Returns:
    (opt_state, its shardings).
  """
  param_def = jax.tree.structure(params)
  replicated = NamedSharding(mesh, PartitionSpec())

  def like_params(sub):
    return jax.tree.structure(sub) == param_def

  abstract = jax.eval_shape(optimizer.init, params)
  shardings = jax.tree.map(lambda sub: param_shardings if like_params(sub) else replicated,
                           abstract, is_leaf=like_params)
  return jax.jit(optimizer.init, out_shardings=shardings)(params), shardings


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    param_shardings: Any,
    opt_shardings: Any,
    batch_shardings: Any,
) -> Callable[[Any, Any, Any], tuple[Any, Any, jax.Array, Any]]:
  """A jitted `step(params, opt_state, batch) -> (params, opt_state, loss, aux)`.

  Args:
    loss_fn: `(params, batch) -> (scalar loss, aux pytree)`.
    optimizer: an optax transformation.
    param_shardings, opt_shardings, batch_shardings: NamedSharding pytrees
      matching params, optimizer state and batch.

  Returns:
    The step; `params` and `opt_state` are donated.
  """

  def step(params, opt_state, batch):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, aux

  return jax.jit(
      step,
      in_shardings=(param_shardings, opt_shardings, batch_shardings),
      out_shardings=(param_shardings, opt_shardings, None, None),
      donate_argnums=(0, 1),
  )


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
  count, index = jax.process_count(), jax.process_index()
  if global_rows % count:
    raise ValueError(f"a batch of {global_rows} rows does not split over {count} processes")
  per = global_rows // count
  return slice(index * per, (index + 1) * per)


def addressable_bytes(tree: Any) -> int:
  """Bytes this process's first device holds for `tree` (one shard per leaf)."""
  device = jax.local_devices()[0]
  total = 0
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      if shard.device == device:
        total += shard.data.size * shard.data.dtype.itemsize
  return total
