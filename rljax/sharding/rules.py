"""Logical-axis rules: parameter and activation axis names -> mesh axes.

Models name every parameter axis (`embed`, `mlp`, `heads`, `kv_heads`,
`head_dim`, `vocab`, `layers`) and activations use `batch` and `length`.
Rules are data, `trainer.logical_axis_rules` in the config: a list of
`[logical, mesh_axis]` pairs where the mesh axis is one name, a list of
names, or null (replicated). The defaults shard parameters over `fsdp` on
`embed` (FSDP) and over `tensor` on `mlp`/`heads`/`kv_heads`/`vocab` (tensor
parallelism); batches split over `data` and `fsdp` together.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = Sequence[tuple[str, Any]]


def rules_from_config(config) -> list[tuple[str, Any]]:
  """`trainer.logical_axis_rules` as (logical, mesh axes) pairs."""
  pairs = []
  for entry in config.trainer.logical_axis_rules:
    if len(entry) != 2:
      raise ValueError(f"trainer.logical_axis_rules entry {list(entry)!r} is not a [logical, mesh_axis] pair")
    logical, axis = entry
    pairs.append((logical, tuple(axis) if isinstance(axis, (list, tuple)) else axis))
  return pairs


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Rules | None) -> PartitionSpec:
  """PartitionSpec for an array whose axes carry logical `names`.

  The first rule for a name wins. A mesh axis is used at most once per array
  (later axes that want it are replicated), mesh axes of size 1 are dropped,
  and a dimension its mesh axes do not divide is replicated.
  """
  table: dict[str, Any] = {}
  for logical, axis in rules or ():
    table.setdefault(logical, axis)
  used: set[str] = set()
  spec = []
  for name, dim in zip(names, shape):
    axis = table.get(name) if name is not None else None
    axes = () if axis is None else (tuple(axis) if isinstance(axis, (tuple, list)) else (axis,))
    axes = tuple(a for a in axes if a in mesh.shape and a not in used and mesh.shape[a] > 1)
    size = math.prod(mesh.shape[a] for a in axes)
    if not axes or dim % size:
      spec.append(None)
      continue
    used.update(axes)
    spec.append(axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def param_names(var: nnx.Variable) -> tuple[str | None, ...]:
  """The logical axis names a model gave a parameter (None where unnamed)."""
  names = var.get_metadata().get("out_sharding")
  return tuple(names) if names else (None,) * len(var.shape)


def param_shardings(model_or_state: Any, mesh: Mesh, rules: Rules | None) -> Any:
  """NamedSharding for every parameter of a model or an nnx.State of Params.

  Returns:
    An nnx.State with the same structure whose leaves are NamedShardings.
  """
  state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) else model_or_state
  return jax.tree.map(
      lambda v: v.replace(NamedSharding(mesh, logical_to_spec(param_names(v), v.shape, mesh, rules))),
      state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules: Rules | None, ndim: int = 2) -> NamedSharding:
  """Sharding of a `[batch, ...]` array: batch axis by the `batch` rule."""
  table = dict(rules or ())
  axis = table.get("batch")
  axes = () if axis is None else (tuple(axis) if isinstance(axis, (tuple, list)) else (axis,))
  axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1)
  lead = None if not axes else (axes[0] if len(axes) == 1 else axes)
  return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))))
