"""Logical-axis rules: parameter and activation axis names -> mesh axes.

Models name every parameter axis (`embed`, `mlp`, `heads`, `kv_heads`,
`head_dim`, `vocab`, `layers`) and activations use `batch` and `length`
beside the parameter names of their other axes (the MLP's hidden is
`(batch, length, mlp)`), `cache_batch` for the rows of a KV cache, and
`activation_length` for the positions of the residual stream between the
blocks, `(batch, activation_length, embed)`. By default that splits over
`sequence` and `tensor`: with tensor parallelism the residual stream is
split along the sequence (Megatron's sequence parallelism), so a block's
output projections reduce-scatter into it and its input projections
all-gather from it, instead of all-reducing whole activations. Rules are data,
`trainer.logical_axis_rules` in the config: a list of `[logical, mesh_axis]`
pairs where the mesh axis is one name, a list of names, or null
(replicated). The defaults shard parameters over `fsdp` on `embed` (FSDP)
and over `tensor` on `mlp`/`heads`/`kv_heads`/`vocab` (tensor parallelism);
batches split over `data` and `fsdp` together.

Activation constraints. Inside `activation_sharding(mesh, rules)`,
`constrain(x, names)` pins an activation to the mesh axes its names map to
(a mesh axis is used once per array, so a batch over `fsdp` leaves `embed`
unsharded). The jitted steps trace the model inside that context, so XLA
keeps activations batch-sharded and gathers the weights (FSDP) instead of
contracting over the sharded embedding and all-reducing activations.
Outside the context `constrain` does nothing.

Decode is the other way round (`decode_rules`): a decode step holds one
token per row, so activations are tiny and the weights are what costs.
There the batch of the residual stream splits over `data` only and `embed`
over `fsdp`, each device multiplies by the weight shard it holds (partial
sums, all-reduced: a few KiB per row), and only the KV cache keeps its rows
over `data` x `fsdp`. No weight is gathered.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
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


def rule_axes(rules: Rules | None, name: str) -> tuple[str, ...]:
  """The mesh axes the first rule for `name` maps to (empty: replicated or unlisted)."""
  for logical, axis in rules or ():
    if logical == name:
      return () if axis is None else (tuple(axis) if isinstance(axis, (tuple, list)) else (axis,))
  return ()


def with_cache_batch(rules: Rules | None) -> list[tuple[str, Any]]:
  """`rules` with `cache_batch` (KV-cache rows) mapped like `batch` unless the rules name it."""
  rules = list(rules or ())
  if any(logical == "cache_batch" for logical, _ in rules):
    return rules
  return [("cache_batch", rule_axes(rules, "batch") or None), *rules]


def decode_rules(rules: Rules | None) -> list[tuple[str, Any]]:
  """The rules of a decode step: weight-stationary (see the module docstring).

  `cache_batch` keeps the batch rule's axes; `batch` drops the axes that
  `embed` uses, so the residual stream is sharded over the embedding like
  the weights that read it.
  """
  rules = with_cache_batch(rules)
  embed = set(rule_axes(rules, "embed"))
  batch = tuple(a for a in rule_axes(rules, "batch") if a not in embed)
  rest = [(logical, axis) for logical, axis in rules if logical != "batch"]
  return [("batch", batch or None), *rest]


_ACTIVE = threading.local()


def gathered_rules(rules: Rules | None) -> list[tuple[str, Any]]:
  """`rules` without the batch rule's mesh axes on parameter names: the layout a weight is computed in
  once FSDP has gathered it (tensor-parallel axes and the experts' `exp` axis kept: an expert-parallel
  device computes with its own experts only)."""
  rules = list(rules or ())
  batch = set(rule_axes(rules, "batch"))
  out = []
  for logical, axis in rules:
    if logical not in ("batch", "cache_batch", "length", "exp"):
      axis = tuple(a for a in rule_axes([(logical, axis)], logical) if a not in batch) or None
    out.append((logical, axis))
  return out


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules | None, gather_weights: bool = True) -> Iterator[None]:
  """Within it (while a step is traced), `constrain` pins activations by `rules` over `mesh`.

  With `gather_weights`, `gather` all-gathers a layer's FSDP-sharded weights
  where the layer starts (training, log-prob and prefill passes); without it
  (decode) weights stay where they are.
  """
  previous = getattr(_ACTIVE, "value", None)
  rules = with_cache_batch(rules)
  _ACTIVE.value = (mesh, rules, gathered_rules(rules) if gather_weights else None)
  try:
    yield
  finally:
    _ACTIVE.value = previous


def active_state() -> tuple | None:
  """The enclosing `activation_sharding`'s state (None outside one), for `restored`."""
  return getattr(_ACTIVE, "value", None)


@contextlib.contextmanager
def restored(state: tuple | None) -> Iterator[None]:
  """Within it, the `activation_sharding` whose `active_state()` was `state`: a custom gradient makes the same
  choices (kernels, chip) as its forward pass even where the gradient is taken outside that pass's context
  (traced after it has closed; the trainer's steps take theirs inside)."""
  previous = getattr(_ACTIVE, "value", None)
  _ACTIVE.value = state
  try:
    yield
  finally:
    _ACTIVE.value = previous


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """`x` with a sharding constraint from its logical axis `names` (x unchanged outside `activation_sharding`)."""
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return x
  mesh, rules, _ = active
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(names, x.shape, mesh, rules)))


def gathers() -> bool:
  """Whether the enclosing context gathers weights (`activation_sharding(gather_weights=True)`)."""
  active = getattr(_ACTIVE, "value", None)
  return active is not None and active[2] is not None


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gathered(x: jax.Array, whole: NamedSharding, sharded: NamedSharding) -> jax.Array:
  return jax.lax.with_sharding_constraint(x, whole)


def _gathered_fwd(x, whole, sharded):
  return _gathered(x, whole, sharded), None


def _gathered_bwd(whole, sharded, _, grad):
  return (jax.lax.with_sharding_constraint(grad, sharded),)


_gathered.defvjp(_gathered_fwd, _gathered_bwd)


def relayout(x: jax.Array, names: Sequence[str | None], grad_names: Sequence[str | None]) -> jax.Array:
  """`x` laid out by `names`, its gradient by `grad_names` (inside `activation_sharding`; x itself outside).

  Moving an activation from a sequence-split layout to a whole one (an
  all-gather) with a plain constraint would make its gradient whole too: an
  all-reduce of partial sums. Here the gradient goes back to `grad_names`'
  layout, which XLA reaches by a reduce-scatter.
  """
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return x
  mesh, rules, _ = active
  to = NamedSharding(mesh, logical_to_spec(names, x.shape, mesh, rules))
  back = NamedSharding(mesh, logical_to_spec(grad_names, x.shape, mesh, rules))
  return _gathered(x, to, back)


def gather(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """A weight with logical axis `names`, all-gathered over the batch axes where the context gathers weights.

  An explicit gather is one value of the traced program: under
  `jax.checkpoint` the backward pass recomputes it once and both the
  recomputed forward and the gradient matmuls read it (XLA's own gathers,
  inserted per use, would run once for each). Its gradient goes straight
  to the weight's own sharding, which XLA reaches by a reduce-scatter (the
  transpose of a plain sharding constraint would ask for the whole,
  all-reduced gradient first).
  """
  active = getattr(_ACTIVE, "value", None)
  if active is None or active[2] is None:
    return x
  mesh, rules, whole_rules = active
  whole = NamedSharding(mesh, logical_to_spec(names, x.shape, mesh, whole_rules))
  sharded = NamedSharding(mesh, logical_to_spec(names, x.shape, mesh, rules))
  return _gathered(x, whole, sharded)


def active_mesh() -> Mesh | None:
  """The mesh of the enclosing `activation_sharding` (None outside one)."""
  active = getattr(_ACTIVE, "value", None)
  return None if active is None else active[0]


def _device() -> jax.Device:
  """A device the program being traced runs on (the active mesh's first, else the default backend's)."""
  mesh = active_mesh()
  return mesh.devices.flat[0] if mesh is not None else jax.devices()[0]


def on_tpu() -> bool:
  """Whether the program being traced runs on TPU (the active mesh's devices, else the default backend)."""
  return _device().platform == "tpu"


def device_kind() -> str:
  """The kind of chip the program being traced runs on (`jax.Device.device_kind`, e.g. "TPU v5" for v5p)."""
  return _device().device_kind


def active_spec(names: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec:
  """The PartitionSpec `constrain` would give an array of `shape` named `names` (replicated outside a context)."""
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return PartitionSpec()
  mesh, rules, _ = active
  return logical_to_spec(names, shape, mesh, rules)


def weight_spec(names: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec:
  """The PartitionSpec a weight named `names` has where a layer computes with it: gathered (`gather`) in a
  gathering context, as stored otherwise (replicated outside a context)."""
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return PartitionSpec()
  mesh, rules, whole_rules = active
  return logical_to_spec(names, shape, mesh, whole_rules if whole_rules is not None else rules)


def spec_axes(entry: Any) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names) as a tuple."""
  return () if entry is None else (entry if isinstance(entry, tuple) else (entry,))


def reduce_partials(parts: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """The sum over axis 0 of per-device partial sums, reduce-scattered to the layout of `names`.

  `parts` is [S, ...] with S split like the batch (one partial sum per group
  of rows, computed where those rows live). Inside `activation_sharding`
  each device holds its own partial; the sum is a `psum_scatter` straight to
  the layout `names` asks for (a `psum` over batch axes that layout does not
  use), never an all-reduce of the whole array. Outside, a plain sum.
  """
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return jnp.sum(parts, axis=0)
  mesh, rules, _ = active
  in_spec = logical_to_spec(("batch", *names), parts.shape, mesh, rules)
  out_spec = logical_to_spec(names, parts.shape[1:], mesh, rules)
  batch_axes = spec_axes(in_spec[0])
  if not batch_axes:
    return jnp.sum(parts, axis=0)

  def reduce(local):
    value = local[0]
    used = set()
    for dim, entry in enumerate(out_spec):
      axes = tuple(a for a in spec_axes(entry) if a in batch_axes)
      if axes:
        value = jax.lax.psum_scatter(value, axes, scatter_dimension=dim, tiled=True)
        used.update(axes)
    rest = tuple(a for a in batch_axes if a not in used)
    return jax.lax.psum(value, rest) if rest else value

  return jax.shard_map(reduce, mesh=mesh, in_specs=(in_spec,), out_specs=out_spec, check_vma=False,
                       axis_names=set(batch_axes) | {a for e in in_spec[1:] for a in spec_axes(e)})(parts)


def vocab_shards(vocab: int) -> int:
  """Devices a vocabulary of `vocab` entries splits over in the active context (1 outside one)."""
  active = getattr(_ACTIVE, "value", None)
  spec = None if active is None else active_spec(("vocab",), (vocab,))[0]
  return 1 if spec is None else math.prod(active[0].shape[a] for a in spec_axes(spec))


def batch_shards(rows: int) -> int:
  """Devices the batch axis of `rows` rows splits over in the active context (1 outside one)."""
  active = getattr(_ACTIVE, "value", None)
  if active is None:
    return 1
  mesh, rules, _ = active
  spec = logical_to_spec(("batch",), (rows,), mesh, rules)[0]
  axes = () if spec is None else (spec if isinstance(spec, tuple) else (spec,))
  return math.prod(mesh.shape[a] for a in axes)


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

  def one(var: nnx.Variable) -> nnx.Variable:
    # a value of several arrays (the engine's 8-bit weights and their scales, a stacked weight's layers) lays
    # each out by its trailing names
    names = tuple(var.get_metadata().get("out_sharding") or ())
    return var.replace(jax.tree.map(
        lambda x: NamedSharding(mesh, logical_to_spec(names[len(names) - x.ndim:] if names else (None,) * x.ndim,
                                                      x.shape, mesh, rules)),
        var.get_value()))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules: Rules | None, ndim: int = 2) -> NamedSharding:
  """Sharding of a `[batch, ...]` array: batch axis by the `batch` rule."""
  table = dict(rules or ())
  axis = table.get("batch")
  axes = () if axis is None else (tuple(axis) if isinstance(axis, (tuple, list)) else (axis,))
  axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1)
  lead = None if not axes else (axes[0] if len(axes) == 1 else axes)
  return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))))
