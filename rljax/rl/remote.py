"""separate_async on several processes: the trainer on some processes, the rollout on others (verl's trainer.v1
with the rollout on nodes of its own).

With `jax.distributed` over several processes, the first ones holding the
training mesh's devices and the others the
`actor_rollout_ref.rollout.nnodes x n_gpus_per_node` devices (the last ones
JAX lists), each process runs its role's programs on its role's devices only
(`rljax.sharding.hosts.set_group`). One role's process count is a
multiple of the other's: trainer process i and the rollout processes it
trains the groups of (`served`: a run of R/T of them, in order, or where
the trainer has k times the rollout's processes, part i mod k of rollout
process i // k's groups) exchange their messages alone:

* each rollout process runs the separate_async stream of its share of the
  data on an engine over its own devices (`rljax.rl.separate`: the data, the
  engine, dynamic sampling's judge), as each host of a one-role job rolls
  out its own share, and sends each step's picked groups to its trainer
  process through JAX's coordination service (`put`, `take`: a few MB of
  tokens and scores per step), which trains them one rollout process's
  after the other (`streaming.merged`); or, to k trainer processes, in k
  equal parts (`streaming.split`);
* the trainer's processes update, validate and compute remax's baselines on
  an engine over their own mesh, checkpoint, log, and send the weights the
  schedule says to every rollout process device to device
  (`CrossHostSend`): cast to rollout.dtype and laid out as each rollout
  process's engine lays them out (rollout processes' engine meshes stacked
  on a process axis, as many at a time as the trainer has devices for,
  `batches`), on as many of the trainer's devices, then `jax.device_put`
  onto the rollout's devices (a cross-host transfer between two shardings
  of the same layout; the CPU backend's over sockets,
  `rljax.sharding.distributed`).

Each trainer process starts its rollout processes (the first of a rollout
process's trainer processes alone; `start`: the first step, the parts and
the stream's position, so a resumed run continues where its checkpoint was)
with the weights of the first step, and ends them by announcing no more
weights (or a start of None, where it trains no step). A process that fails
stops every other (`rljax.sharding.failures`; a rollout process's watchdog
also closes what its rollout waits on). Each weight send is announced first,
so each rollout process's receiving thread takes every version in order,
between its decode chunks, whatever it decodes. Which weights decode which
batch is `streaming.Schedule`'s, as in one process, so the run's metrics
equal the one-process run's.
"""

from __future__ import annotations

import pickle
import threading
import traceback
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from rljax import sharding
from rljax.config.errors import ConfigError
from rljax.rl import separate, streaming
from rljax.rollout.engine import Engine
from rljax.sharding import failures, hosts
from rljax.sharding.placement import abstract

_PREFIX = "rljax/separate"
_CHUNK_BYTES = 16 << 20


def roles(config: ConfigDict, devices: list[Any] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """(the trainer's processes, the rollout's) of a separate_async job on several processes; None otherwise.

  Args:
    config: the job's config.
    devices: the job's devices (default: JAX's), each with its `process_index`.

  Raises:
    ConfigError: a process holds devices of both, neither role's process count is a multiple of the other's
      (each trainer process trains the groups of as many rollout processes as every other, or an equal part of
      one's), the batch's prompts do not split equally over either role's processes, or the trainer has
      fewer devices than one rollout process (its weights are laid out as a rollout process's on as many of them).
  """
  devices = jax.devices() if devices is None else devices
  if len(hosts.processes(devices)) == 1 or not sharding.rollout_device_count(config):
    return None
  trainer_devices, rollout_devices = sharding.split_devices(config, devices)
  trainer, rollout = hosts.processes(trainer_devices), hosts.processes(rollout_devices)
  per_process = len(hosts.process_devices(rollout[-1], devices))
  if set(trainer) & set(rollout):
    raise ConfigError("actor_rollout_ref.rollout.n_gpus_per_node", config.actor_rollout_ref.rollout.n_gpus_per_node,
                      f"the rollout's {len(rollout_devices)} devices share process {min(set(trainer) & set(rollout))} "
                      "with the trainer's: on several processes each process trains or rolls out",
                      f"give the rollout whole processes (n_gpus_per_node={per_process}, the devices of each)")
  if len(rollout) % len(trainer) and len(trainer) % len(rollout):
    raise ConfigError("actor_rollout_ref.rollout.nnodes", config.actor_rollout_ref.rollout.nnodes,
                      f"separate_async on several processes gives each trainer process the groups of as many rollout "
                      f"processes as every other, or an equal part of one's (each rolls out its share of the data; "
                      f"this job's trainer spans {len(trainer)} processes, its rollout {len(rollout)})",
                      "give one role a multiple of the other's processes (actor_rollout_ref.rollout.nnodes a "
                      "multiple or a divisor of trainer.nnodes, one process per node), or "
                      "trainer.v1.trainer_mode=colocate_async")
  if config.data.train_batch_size % max(len(trainer), len(rollout)):
    raise ConfigError("data.train_batch_size", config.data.train_batch_size,
                      f"does not split over separate_async's {len(trainer)} trainer and {len(rollout)} rollout "
                      "processes (each takes an equal share of every batch's prompts)",
                      f"make it a multiple of {max(len(trainer), len(rollout))}")
  if len(trainer_devices) < per_process:
    raise ConfigError("actor_rollout_ref.rollout.n_gpus_per_node", config.actor_rollout_ref.rollout.n_gpus_per_node,
                      f"the trainer's {len(trainer_devices)} devices send the weights laid out as a rollout process's "
                      f"{per_process} devices hold them, on as many of their own",
                      f"give the trainer at least {per_process} devices")
  return tuple(trainer), tuple(rollout)


# ----- messages through the coordination service ---------------------------------------------

def _blocking_get(key: str) -> bytes:
  """The value of `key` once set (waits as long as it takes: a lost process stops the job through JAX's
  heartbeats, a failed one through `abort`).

  Raises:
    failures.PeerFailed: another process aborted.
  """
  while True:
    try:
      return failures.client().blocking_key_value_get_bytes(key, failures.WAIT_MS)
    except Exception as error:  # pylint: disable=broad-except
      if "DEADLINE_EXCEEDED" not in str(error):
        raise
    failed = failures.aborted()
    if failed is not None:
      raise failures.PeerFailed(failed)


def served(trainers: int, rollouts: int) -> tuple[range, int, int]:
  """(the rollout processes, by their places in the rollout's role, whose groups this trainer process trains;
  its part of each one's groups; the parts each one's split into), of `rollouts` for `trainers` trainer
  processes: each trainer process a run of as many rollout processes, or where the trainer has more processes,
  an equal run of one's groups, in order, so the trainers' rows in process order are the rollout's in process
  order."""
  if trainers > rollouts:
    parts = trainers // rollouts
    return range(hosts.index() // parts, hosts.index() // parts + 1), hosts.index() % parts, parts
  per = rollouts // trainers
  return range(hosts.index() * per, (hosts.index() + 1) * per), 0, 1


def _key(name: str, rollout: int | None) -> str:
  """Message `name`'s key: a rollout process's (its place in its role; None: this process's own) and its
  trainer process's."""
  return f"{_PREFIX}/{hosts.index() if rollout is None else rollout}/{name}"


def put(name: str, value: Any, rollout: int | None = None) -> None:
  """Sends `value` (picklable) as message `name` between rollout process `rollout` (None: this one) and its
  trainer process."""
  data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
  pieces = [data[i:i + _CHUNK_BYTES] for i in range(0, len(data), _CHUNK_BYTES)] or [b""]
  for i, piece in enumerate(pieces):
    failures.client().key_value_set_bytes(f"{_key(name, rollout)}/{i}", piece)
  failures.client().key_value_set_bytes(f"{_key(name, rollout)}/pieces", str(len(pieces)).encode())


def take(name: str, rollout: int | None = None) -> Any:
  """Message `name` between rollout process `rollout` (None: this one) and its trainer process, once the other
  side sent it (and removes it)."""
  pieces = int(_blocking_get(f"{_key(name, rollout)}/pieces").decode())
  data = b"".join(_blocking_get(f"{_key(name, rollout)}/{i}") for i in range(pieces))
  failures.client().key_value_delete(_key(name, rollout))  # and the keys under it
  return pickle.loads(data)


# ----- the weights, device to device --------------------------------------------------------

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

class RemoteRollout:
  """A trainer process's view of its rollout processes: a `separate.RolloutDriver`'s interface (weights out, each
  step's picked groups in, theirs one after the other) and a stream's resume positions. Where the trainer has
  more processes than the rollout, each rollout process's first trainer process (part 0) starts, feeds and ends
  it, and every one takes its part of its groups."""

  def __init__(self, send: Callable[[Any], int], schedule: streaming.Schedule, first_step: int, last_step: int,
               starts: dict[int, dict[str, Any] | None], part: int = 0, parts: int = 1):
    """Args:
      send: the trainer's weights -> on the rollout's devices (`CrossHostSend`); the bytes sent.
      schedule: which weights each step's batch decodes under.
      first_step, last_step: the steps the rollout picks, first_step..last_step - 1.
      starts: the rollout processes this one trains the groups of (`served`), each with its stream's position at
        first_step (`streaming.host_position`: a checkpoint's), or None from the data's start.
      part, parts: this process's part of each one's groups, split into `parts` (`served`).
    """
    self.send, self.schedule, self.first_step, self.last_step = send, schedule, first_step, last_step
    self.rollouts = tuple(starts)
    self.turns = separate.DeviceTurns()  # validation and remax decode on the trainer's devices: no one to wait for
    self.stream = None
    self.part, self.leads = part, part == 0
    self._starts = {j: {"first_step": first_step, "position": position, "parts": parts}
                    for j, position in starts.items()}
    self._positions: dict[int, list[dict[str, Any]]] = {}
    self._next_step, self._sends, self._ended = first_step, 0, False
    self.sent_bytes = 0

  @property
  def primed(self) -> bool:
    """The rollout was started (with the weights of the first step)."""
    return self._sends > 0

  def publish(self, version: int, params: Any) -> bool:
    """Sends the weights of `version` to the rollout if some step decodes under them; whether it did."""
    if self._ended or not separate.sends(self.schedule, self.first_step, self.last_step, version):
      return False
    for rollout in self.rollouts if self.leads else ():
      if not self.primed:
        put("start", self._starts[rollout], rollout)
      put(f"weights/{self._sends}", version, rollout)
    self._sends += 1  # announced: its end comes after it whatever the send does
    self.sent_bytes = self.send(params)
    return True

  def next(self) -> streaming.Picked:
    """The groups of the next step, as the rollout processes picked them (theirs one after the other).

    Raises:
      StopIteration: the data ended before a batch of groups finished.
      RuntimeError: a rollout process failed (its traceback in the message).
    """
    messages = []
    for rollout in self.rollouts:
      messages.append(take(f"picked/{self._next_step}/{self.part}", rollout))
      if messages[-1][0] == "error":
        raise RuntimeError(f"the rollout process failed at step {self._next_step + 1}:\n{messages[-1][1]}")
    for kind, *body in messages:
      if kind == "stop":
        raise StopIteration(body[0])
    self._next_step += 1
    self._positions[self._next_step] = [position for _, _, position in messages]
    self._positions.pop(self._next_step - 2, None)
    return streaming.merged([picked for _, picked, _ in messages])

  def position(self, trained: int) -> list[dict[str, Any]]:
    """Each rollout process's stream position once `trained` steps are trained (sent with step trained - 1's
    groups), from its first trainer process alone."""
    return [dict(p) for p in self._positions[trained]] if self.leads else []

  def close(self) -> None:
    """Tells a started rollout that no more weights come (it then stops); one not started may still be started
    by another `RemoteRollout` (a restored run's), or told it never is (`end`)."""
    if self.primed and not self._ended and self.leads:
      for rollout in self.rollouts:
        put(f"weights/{self._sends}", None, rollout)
    self._ended = True

  def end(self) -> None:
    """Ends the rollout processes' runs: `close`, or where they were never started (the run trained no step),
    tells them that they do not start."""
    if not self.primed and not self._ended and self.leads:
      for rollout in self.rollouts:
        put("start", None, rollout)
    self.close()


# ----- the rollout's side ----------------------------------------------------------------------

def _receive(driver: separate.RolloutDriver, receive: CrossHostReceive, failed: list[str]) -> None:
  """A rollout process's receiving thread: each announced version's weights into the driver's box, between
  the decode chunks, until the trainer announces no more; then, or on an error (its traceback into `failed`),
  the rollout stops."""
  try:
    for sends in range(1 << 62):
      version = take(f"weights/{sends}")
      if version is None:  # the trainer's end: a failed one aborted first
        failed_trainer = failures.aborted()
        if failed_trainer is not None:
          raise failures.PeerFailed(failed_trainer)
        break
      with driver.turns.exclusive():
        driver.box.publish(version, receive())
  except BaseException:  # pylint: disable=broad-except
    failed.append(f"receiving the trainer's weights failed:\n{traceback.format_exc()}")
  finally:
    driver.rollout.stopping = True
    driver.box.close()


def serve(start: dict[str, Any], driver: separate.RolloutDriver, position: Callable[[int], dict[str, Any]],
          receive: CrossHostReceive) -> None:
  """A rollout process's run: picks each step's groups (`driver`, started at `start["first_step"]`) and sends
  them, in `start["parts"]` parts (one per trainer process it serves), with the stream's `position` after them,
  while a thread receives the weights; returns once the trainer announced no more weights. The data's end, or an
  error, goes to the trainer processes as that step's message."""
  driver.rollout.turn = driver.turns.chunk  # the weights arrive between its decode chunks
  failed: list[str] = []
  receiver = threading.Thread(target=_receive, args=(driver, receive, failed), name="rljax-weights", daemon=True)
  receiver.start()
  step, parts = start["first_step"], range(start["parts"])

  def told(step: int, *message: Any) -> None:
    for part in parts:
      put(f"picked/{step}/{part}", message)

  def stop(error: str) -> None:  # another process failed: whatever the rollout waits on, it stops
    failed.append(error)
    driver.rollout.stopping = True
    driver.turns.close()
    driver.box.close()

  try:
    with failures.Watchdog(stop):
      while step < driver.last_step:
        picked, after = streaming.split(driver.pick(), len(parts)), position(step + 1)
        for part in parts:
          put(f"picked/{step}/{part}", ("picked", picked[part], after))
        step += 1
  except (separate.Closed, streaming.Stopped):
    if failed:  # the weights stopped coming, or another process failed: an error, not the trainer's end
      told(step, "error", failed[0])
      raise RuntimeError(f"the rollout stopped:\n{failed[0]}") from None
  except StopIteration as stop:
    told(step, "stop", str(stop))
  except BaseException:  # pylint: disable=broad-except
    told(step, "error", traceback.format_exc())
    raise
  receiver.join()
  if failed:
    raise RuntimeError(f"the rollout stopped:\n{failed[0]}")


__all__ = ["CrossHostReceive", "CrossHostSend", "RemoteRollout", "batches", "put", "roles", "serve", "served", "take"]
