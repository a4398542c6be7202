"""A separate_async job's weight syncs across processes, device to device: the trainer's processes cast and lay out
the weights as each rollout process's engine computes with them, then `jax.device_put` them onto the rollout's
devices (`CrossHostSend`); each rollout process takes them into its engine (`CrossHostReceive`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rljax.rl import separate
from rljax.rollout.engine import Engine
from rljax.sharding import hosts
from rljax.sharding.placement import abstract


def _layouts(sent: Any, trainer_devices: list[jax.Device], rollout_devices: list[jax.Device]) -> tuple[Any, Any]:
  """(mirror, target) NamedShardings of `sent` (the weights as a rollout process's engine lays them out over its
  own devices): the engine meshes of the rollout processes of `rollout_devices` stacked on a leading process
  axis, each holding all of them (target), and the same layout over as many of the trainer's devices (mirror),
  which a cross-host `jax.device_put` needs."""
  engine_mesh = jax.tree.leaves(sent)[0].sharding.mesh
  stacked = hosts.stacked_mesh(dict(engine_mesh.shape), rollout_devices)
  mirror = Mesh(np.array(trainer_devices[:stacked.size]).reshape(stacked.devices.shape), stacked.axis_names)
  return tuple(jax.tree.map(lambda x, m=m: NamedSharding(m, x.sharding.spec), sent) for m in (mirror, stacked))


def batches(trainer_devices: list[jax.Device], rollout_devices: list[jax.Device]) -> list[list[jax.Device]]:
  """The rollout's devices in runs of whole processes, in process order, each of as many devices as the trainer
  has at most: a weight sync sends to one run after another (all at once where the trainer has as many
  devices as the rollout)."""
  owners = hosts.processes(rollout_devices)
  fit = max(1, len(trainer_devices) // len(hosts.process_devices(owners[0], rollout_devices)))
  return [[d for p in owners[i:i + fit] for d in hosts.process_devices(p, rollout_devices)]
          for i in range(0, len(owners), fit)]


class CrossHostSend:
  """The trainer's side of a weight sync: its weights -> cast and laid out as every rollout process's engine
  computes with them, on as many of the trainer's devices, then sent to the rollout's devices (a run of
  rollout processes at a time, `batches`)."""

  def __init__(self, engine: Engine, params: Any, devices: list[jax.Device], rollout_devices: list[jax.Device]):
    """Args:
      engine: the engine of a rollout process (its mesh on that process's devices; every one's is alike).
      params: the trainer's weights (arrays or ShapeDtypeStructs).
      devices: the trainer's devices.
      rollout_devices: the rollout's devices.
    """
    sent = engine.compute_params(abstract(params))
    self._layouts = [_layouts(sent, devices, run) for run in batches(devices, rollout_devices)]
    self._cast = jax.jit(engine.weights.cast_impl)
    self._whole = NamedSharding(Mesh(np.array(devices), ("devices",)), jax.sharding.PartitionSpec())
    self._direct = len(hosts.processes(devices)) == 1  # a device_put onto some of the devices works in one process

  def _mirrored(self, x: jax.Array, mirror: NamedSharding) -> jax.Array:
    """`x` (on the trainer's devices) laid out by `mirror` (on some of them). Where the trainer spans several
    processes and the mirror only some of its devices, JAX refuses a `jax.device_put` between the two (a
    multi-controller reshard keeps the device set): `x` is replicated over the trainer's devices instead (their
    collectives, finished on every process before the next array's start) and each of the mirror's devices cuts
    its shard from its own copy."""
    if self._direct or mirror.mesh.devices.size == self._whole.mesh.devices.size:
      return jax.device_put(x, mirror)
    copies = jax.block_until_ready(jax.device_put(x, self._whole))
    whole = {shard.device: shard.data for shard in copies.addressable_shards}
    pieces = [whole[d][index] for d, index in mirror.addressable_devices_indices_map(x.shape).items()]
    return jax.make_array_from_single_device_arrays(x.shape, mirror, pieces, dtype=x.dtype)

  def __call__(self, params: Any) -> int:
    """Sends `params` (the trainer's weights); the bytes sent (to each rollout process)."""
    cast, local, laid_out = self._cast(params), None, None
    for mirror, target in self._layouts:
      if jax.tree.leaves(mirror) != laid_out:  # runs of as many processes share one copy
        # one array at a time onto the mirror: on several trainer processes two reshards in flight can take
        # their collectives in different orders on different hosts (`hosts.HostLocalCopy`)
        local = jax.tree.map(lambda x, s: jax.block_until_ready(self._mirrored(x, s)), cast, mirror)
        local = separate.copied(local, params)  # the next update donates what the send may still read
        laid_out = jax.tree.leaves(mirror)
      jax.device_put(local, target)
    return sum(x.nbytes for x in jax.tree.leaves(local))


class CrossHostReceive:
  """A rollout process's side of a weight sync: its engine's weights, as the trainer's `CrossHostSend` sends them."""

  def __init__(self, engine: Engine, params: Any, trainer_devices: list[jax.Device],
               rollout_devices: list[jax.Device]):
    """Args:
      engine: this process's engine.
      params: the trainer's weights, abstract (ShapeDtypeStructs on the trainer's devices).
      trainer_devices, rollout_devices: the trainer's devices, the rollout's.
    """
    sent = engine.compute_params(params)
    runs = batches(trainer_devices, rollout_devices)
    self._mine = next(i for i, r in enumerate(runs) if jax.process_index() in hosts.processes(r))
    self._transfers = []
    for run in runs:
      mirror, stacked = _layouts(sent, trainer_devices, run)
      sources = jax.tree.map(lambda x, s: jax.make_array_from_single_device_arrays(x.shape, s, [], dtype=x.dtype),
                             sent, mirror)
      self._transfers.append((sources, stacked))
    self._target = jax.tree.map(lambda x: x.sharding, sent)

  def __call__(self) -> Any:
    """The next weights the trainer sends (on this process's devices, once they arrive). Every rollout process
    takes part in every run's transfer, as the trainer's processes do, so that each process numbers the
    transfers alike (JAX pairs a cross-host transfer's two sides by their order)."""
    arrived = [jax.device_put(sources, stacked) for sources, stacked in self._transfers][self._mine]
    arrived = jax.block_until_ready(arrived)
    return jax.tree.map(lambda x, s: jax.make_array_from_single_device_arrays(
        x.shape, s, [shard.data for shard in x.addressable_shards]), arrived, self._target)


# ----- the trainer's side ----------------------------------------------------------------------


__all__ = ["CrossHostReceive", "CrossHostSend", "batches"]
