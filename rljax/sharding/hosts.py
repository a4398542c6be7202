"""What a multi-process job moves between its hosts, and what stays on one.

Each host decodes its own prompts on its own chips, so the rollout runs on a
host-local mesh (`local_mesh`), and the trainer's globally sharded weights
reach it through one on-device all-gather across hosts (`host_local_copier`):
the weights are laid out over a mesh of every host's local mesh stacked on a
leading process axis, replicated along it, and each host then reads its own
shards as a host-local array, without a trip through host memory. A step's
rows stay on the host that generated them (`process_rows`) and its
statistics cross hosts as a few numbers each (`process_sum`), except where
a statistic over the whole batch must equal one process's to the bit (the
fields it reads go to every host, `gathered_rows`) and where dynamic
sampling moves kept rows between hosts (`global_rows`).

In a single-process job every function here is the identity or close to it.

A job whose processes play different roles (separate_async on several
processes: the trainer's processes and the rollout's) runs each role's
programs on its own processes only: `set_group` names this process's, and
`count`, `index`, the exchanges here and `barrier` span them alone.
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.sharding.mesh import build_mesh

_GROUP: tuple[int, ...] | None = None  # this process's role's processes; None: every process


def set_group(group: Sequence[int] | None) -> None:
  """The processes this process's programs and exchanges span (its role's), or None for every process."""
  global _GROUP
  _GROUP = None if group is None else tuple(sorted(group))


def group() -> tuple[int, ...]:
  """This process's role's processes (every process unless `set_group` said otherwise)."""
  return tuple(range(jax.process_count())) if _GROUP is None else _GROUP


def count() -> int:
  """The processes of this process's role (`jax.process_count()` unless roles split the job)."""
  return len(group())


def index() -> int:
  """This process's place among its role's processes (`jax.process_index()` unless roles split the job)."""
  return group().index(jax.process_index())


def processes(devices: Iterable[jax.Device]) -> list[int]:
  """The processes (hosts) that `devices` belong to, in order."""
  return sorted({d.process_index for d in devices})


def process_devices(process: int, devices: Iterable[jax.Device] | None = None) -> list[jax.Device]:
  """The devices of one process among `devices` (default: the job's), in id order."""
  return sorted((d for d in (jax.devices() if devices is None else devices) if d.process_index == process),
                key=lambda d: d.id)


def local_mesh(shape: dict[str, int], devices: Iterable[jax.Device] | None = None) -> Mesh:
  """`shape` (rljax's axes) over this process's devices (among `devices`, default the job's), laid out as
  every process lays out its own."""
  return build_mesh(shape, process_devices(jax.process_index(), devices))


def stacked_mesh(shape: dict[str, int], devices: Sequence[jax.Device]) -> Mesh:
  """Every process's local mesh of `shape` over its share of `devices`, stacked on a leading `process` axis."""
  meshes = [build_mesh(shape, process_devices(p, devices)) for p in processes(devices)]
  return Mesh(np.stack([m.devices for m in meshes]), ("process", *meshes[0].axis_names))


class HostLocalCopy:
  """`tree -> cast(tree)` laid out by `shardings` (NamedShardings over one local mesh, a pytree like `tree`)
  on every host.

  The cast runs where the weights lie (elementwise, so the gather moves
  the cast bytes). Then each array, one at a time, is gathered across the
  hosts while staying split within each host as the job's mesh splits it
  (each host's chips then hold the whole array between them), and laid out
  within each host as `shardings` say: the stacked mesh of every host's
  local mesh, replicated along its process axis, so each host's devices
  hold exactly the host-local layout, which this host wraps as host-local
  arrays (no copy). Two steps per array keep the temporaries to about one
  host's share of one array, where a direct reshard between the two
  layouts goes through whole copies. `tree` holds arrays sharded over the
  job's mesh, whose devices are `devices`: a TPU mesh orders them by the
  chips' coordinates, the stacked mesh host by host, so each step is
  `jax.device_put`'s reshard between two device orders (`programs`: the
  same programs, for `rljax.compile`).
  """

  def __init__(self, shardings: Any, cast: Callable[[Any], Any], devices: Sequence[jax.Device]):
    self._local, self._treedef = jax.tree.flatten(shardings)
    mesh = self._local[0].mesh
    self._devices = list(devices)
    stacked = stacked_mesh(dict(zip(mesh.axis_names, mesh.devices.shape)), self._devices)
    self._stacked = [NamedSharding(stacked, s.spec) for s in self._local]
    self._cast = jax.jit(cast)
    self._meshes: dict[tuple[tuple[str, int], ...], Mesh] = {}

  def _stages(self, source: NamedSharding, target: NamedSharding) -> list[NamedSharding]:
    """The layouts an array of `source`'s goes through to `target`: gathered across hosts and split within
    each as `source` splits it, then `target` (`target` alone where the job's mesh does not divide per host)."""
    shape = _host_shape(dict(source.mesh.shape), len(processes(self._devices)))
    if shape is None:
      return [target]
    key = tuple(shape.items())
    if key not in self._meshes:
      self._meshes[key] = stacked_mesh(shape, self._devices)
    return [NamedSharding(self._meshes[key], source.spec), target]

  def __call__(self, tree: Any) -> Any:
    out = []
    for x, target, local in zip(self._treedef.flatten_up_to(self._cast(tree)), self._stacked, self._local):
      for stage in self._stages(x.sharding, target):
        # each copy ends before the next starts: two cross-host copies in flight can run their collectives in
        # different orders on different hosts and wait on each other for ever (seen on the CPU: one host in an
        # array's all-gather, the other in the previous array's permute), and the temporaries stay one array's
        x = jax.block_until_ready(jax.device_put(x, stage))
      out.append(jax.make_array_from_single_device_arrays(x.shape, local, [s.data for s in x.addressable_shards]))
    return self._treedef.unflatten(out)

  def programs(self, tree: Any) -> list[tuple[Callable[..., Any], tuple[Any], bool]]:
    """(jitted reshard, its abstract argument, whether its output only feeds the next) for each step of each
    leaf of `tree` (ShapeDtypeStructs on the job's mesh), in order: the programs `__call__`'s device_puts run,
    each input relabelled into its output's device order."""
    out = []
    # the cast's outputs lie as the compiler lays them out (as their inputs, or a quantized weight's scales
    # as its reductions leave them)
    laid_out = self._cast.lower(tree).compile().output_shardings
    for x, current, target in zip(self._treedef.flatten_up_to(jax.eval_shape(self._cast, tree)),
                                  self._treedef.flatten_up_to(laid_out), self._stacked):
      stages = self._stages(current, target)
      for i, stage in enumerate(stages):
        arg = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_in_device_order(current, list(stage.mesh.devices.flat)))
        out.append((jax.jit(lambda a: a, out_shardings=stage), (arg,), i < len(stages) - 1))
        current = stage
    return out


def _host_shape(shape: dict[str, int], hosts: int) -> dict[str, int] | None:
  """One host's share of a mesh of `shape` over `hosts` hosts: its axes divided by `hosts`, outermost first
  (None when they do not divide)."""
  out, left = dict(shape), hosts
  for axis in out:
    take = math.gcd(out[axis], left)
    out[axis], left = out[axis] // take, left // take
  return out if left == 1 else None


def _in_device_order(sharding: NamedSharding, order: Sequence[jax.Device]) -> NamedSharding:
  """`sharding` (each device holding the same block) over a mesh listing its devices in `order`: how
  `jax.device_put` lets one program take an array of one device order and return one of another."""
  index = {d: i for i, d in enumerate(order)}
  mesh = Mesh(np.array(order).reshape(sharding.mesh.devices.shape), sharding.mesh.axis_names)
  return NamedSharding(mesh, sharding.spec, _logical_device_ids=tuple(index[d] for d in sharding.mesh.devices.flat))


def process_rows(x: jax.Array, axis: int = 0) -> np.ndarray:
  """This process's rows of a global array whose `axis` is split over processes in process order (as
  `jax.make_array_from_process_local_data` lays out each host's rows): its addressable block, on the host.

  Raises:
    ValueError: the addressable shards do not tile one block (the array is not laid out that way).
  """
  if x.is_fully_addressable:
    return np.asarray(x)
  shards = {tuple((s.start or 0, s.stop if s.stop is not None else n) for s, n in zip(shard.index, x.shape)):
            shard.data for shard in x.addressable_shards}
  start = [min(r[d][0] for r in shards) for d in range(x.ndim)]
  stop = [max(r[d][1] for r in shards) for d in range(x.ndim)]
  out = np.empty([b - a for a, b in zip(start, stop)], x.dtype)
  covered = 0
  for ranges, data in shards.items():
    out[tuple(slice(a - s0, b - s0) for (a, b), s0 in zip(ranges, start))] = np.asarray(data)
    covered += int(np.prod([b - a for a, b in ranges]))
  whole_elsewhere = all((a, b) == (0, n) for d, (a, b, n) in enumerate(zip(start, stop, x.shape)) if d != axis)
  if covered != out.size or not whole_elsewhere or out.shape[axis] * count() != x.shape[axis]:
    raise ValueError(f"array of shape {x.shape} ({x.sharding}) is not split over processes along axis {axis}")
  return out


def global_rows(fn: Callable[[Any, Any], tuple[Any, Any]], rows: Any, shared: Any = ()) -> tuple[Any, Any]:
  """`fn(rows, shared) -> (row_out, other_out)` over every host's rows at once, compiled.

  `rows` is a pytree of this host's rows ([n, ...] NumPy arrays, n the same on every host); `fn` sees them
  as global arrays of every host's rows in process order ([P * n, ...], one device per host), so a gather
  of rows from other hosts (or a statistic over the batch) moves what it needs on device. `row_out` (a
  pytree of [P * m, ...] arrays) comes back as this host's block of rows ([m, ...]), `other_out` whole.
  `shared` (the same on every host) enters replicated. One process calls `fn` directly.
  """
  if count() == 1:
    return fn(rows, shared)
  mesh = Mesh(np.array([process_devices(p)[0] for p in group()]), ("process",))
  split, whole = NamedSharding(mesh, PartitionSpec("process")), NamedSharding(mesh, PartitionSpec())
  rows = jax.tree.map(lambda x: jax.make_array_from_process_local_data(split, np.asarray(x)), rows)
  shared = jax.tree.map(lambda x: jax.make_array_from_process_local_data(whole, np.asarray(x)), shared)
  row_out, other_out = jax.eval_shape(fn, rows, shared)
  out = jax.jit(fn, out_shardings=(jax.tree.map(lambda _: split, row_out), jax.tree.map(lambda _: whole, other_out)))(
      rows, shared)
  return jax.tree.map(process_rows, out[0]), jax.tree.map(np.asarray, out[1])


def gathered_rows(fn: Callable[[Any, Any], tuple[Any, Any]], rows: Any, shared: Any = ()) -> tuple[Any, Any]:
  """`fn(rows, shared) -> (row_out, other_out)` on every host's rows, with the numbers one process gets.

  Every host gathers every host's `rows` (a pytree of [n, ...] arrays) in process order and calls `fn`
  on them as one process does, then keeps its own block of `row_out`. For statistics over the batch
  that must not depend on how many hosts hold it (a float sum's order would): the cost is the rows `fn`
  reads, sent to every host.
  """
  if count() == 1:
    return fn(rows, shared)
  row_out, other_out = fn(jax.tree.map(process_concat, rows), shared)
  return jax.tree.map(lambda x: np.asarray(x)[share(x.shape[0])], row_out), other_out


def process_concat(values: np.ndarray) -> np.ndarray:
  """Every host's `values` ([n, ...] each) one after another along the first axis, in process order
  ([P * n, ...])."""
  if count() == 1:
    return np.asarray(values)
  return np.asarray(_allgather(np.asarray(values), tiled=True))


def _allgather(values: np.ndarray, tiled: bool = False) -> np.ndarray:
  """Every process's `values` of this role ([n, ...] each, the same shape) stacked ([P, n, ...]) or, `tiled`,
  concatenated ([P * n, ...]) in process order: `multihost_utils.process_allgather` over the role's processes (its
  own over the whole job)."""
  if _GROUP is None:
    return np.asarray(multihost_utils.process_allgather(values, tiled=tiled))
  rows = np.asarray(values)
  rows = rows if tiled and rows.ndim else rows[None]
  devices = [process_devices(p) for p in group()]
  mesh = Mesh(np.array(devices), ("process", "local"))
  split = NamedSharding(mesh, PartitionSpec("process"))
  parts = [jax.device_put(rows, d) for d in devices[index()]]
  x = jax.make_array_from_single_device_arrays((len(devices) * rows.shape[0], *rows.shape[1:]), split, parts)
  return np.asarray(jax.jit(_identity, out_shardings=NamedSharding(mesh, PartitionSpec()))(x).addressable_data(0))


def _identity(x: Any) -> Any:
  return x  # one function, so that `jax.jit` compiles each gather once


def barrier(name: str) -> None:
  """Waits until every process of this role reaches the barrier `name`."""
  if count() > 1:
    _allgather(np.uint32(zlib.crc32(name.encode())))


def process_objects(value: Any) -> list[Any]:
  """Every host's `value` (JSON-serialisable), in process order."""
  if count() == 1:
    return [value]
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  longest = int(np.asarray(_allgather(np.int32(data.size))).max())  # exact (no float)
  width = 1 << max(0, longest - 1).bit_length()  # a power of two: one gather program for many lengths
  every = np.asarray(_allgather(np.pad(data, (0, width - data.size))))
  return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in every]


def process_union(names: Sequence[str]) -> list[str]:
  """The sorted union of every host's `names` (each host may hold other ones)."""
  return sorted({name for names_of_host in process_objects(sorted(set(names))) for name in names_of_host})


def share(rows: int) -> slice:
  """This host's contiguous share of `rows` rows split over the hosts in process order (the first
  `rows % hosts` hosts take one row more)."""
  size, extra = divmod(rows, count())
  start = index() * size + min(index(), extra)
  return slice(start, start + size + (index() < extra))


def process_sum(values: Sequence[float] | np.ndarray) -> np.ndarray:
  """Elementwise sum over processes of a small float64 vector (each host's statistics)."""
  values = np.asarray(values, np.float64)
  if count() == 1:
    return values
  return np.asarray(_allgather(values)).sum(0)


def process_total(value: float) -> float:
  """One number summed over processes."""
  return float(process_sum([value])[0])


def process_extrema(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Elementwise (max, min) over processes of a small float64 vector."""
  values = np.asarray(values, np.float64)
  if count() == 1:
    return values, values
  every = np.asarray(_allgather(values))
  return every.max(0), every.min(0)
