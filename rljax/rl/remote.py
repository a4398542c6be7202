"""separate_async on several processes: the trainer on some processes, the rollout on others (verl's trainer.v1
with the rollout on nodes of its own).

With `jax.distributed` over several processes, the first ones holding the
training mesh's devices and as many others the
`actor_rollout_ref.rollout.nnodes x n_gpus_per_node` devices (the last ones
JAX lists), each process runs its role's programs on its role's devices only
(`rljax.sharding.hosts.set_group`). The trainer's process i and the
rollout's process i are a pair, which exchange their messages alone:

* each rollout process runs the separate_async stream of its share of the
  data on an engine over its own devices (`rljax.rl.separate`: the data, the
  engine, dynamic sampling's judge), as each host of a one-role job rolls
  out its own share, and sends each step's picked groups to its trainer
  process through JAX's coordination service (`put`, `take`: a few MB of
  tokens and scores per step);
* the trainer's processes update, validate and compute remax's baselines on
  an engine over their own mesh, checkpoint, log, and send the weights the
  schedule says to every rollout process device to device
  (`CrossHostSend`): cast to rollout.dtype and laid out as each rollout
  process's engine lays them out (each engine's mesh stacked on a process
  axis, `hosts.stacked_mesh`), on as many of the trainer's devices, then
  `jax.device_put` onto the rollout's devices (a cross-host transfer between
  two shardings of the same layout; the CPU backend's over sockets,
  `rljax.sharding.distributed`).

Each trainer process starts its rollout process (`start`: the first step and
the stream's position, so a resumed run continues where its checkpoint was)
with the weights of the first step, and ends it by announcing no more
weights (or a start of None, where it trains no step). A process that fails
tells every other (`abort`), a killed one stops them through JAX's
heartbeats. Each weight send is announced first, so each rollout process's
receiving thread takes every version in order, between its decode chunks,
whatever it decodes. Which weights decode which batch is
`streaming.Schedule`'s, as in one process, so the run's metrics equal the
one-process run's.
"""

from __future__ import annotations

import pickle
import threading
import traceback
from typing import Any, Callable

import jax
import numpy as np
from jax._src import distributed as jax_distributed
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from rljax import sharding
from rljax.config.errors import ConfigError
from rljax.rl import separate, streaming
from rljax.rollout.engine import Engine
from rljax.sharding import hosts
from rljax.sharding.placement import abstract

_PREFIX = "rljax/separate"
_CHUNK_BYTES = 16 << 20
_WAIT_MS = 1_000


def roles(config: ConfigDict, devices: list[Any] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """(the trainer's processes, the rollout's) of a separate_async job on several processes; None otherwise.

  Args:
    config: the job's config.
    devices: the job's devices (default: JAX's), each with its `process_index`.

  Raises:
    ConfigError: a process holds devices of both, the two roles span different numbers of processes (each
      rollout process serves one trainer process's share of the data), or the trainer has fewer devices than
      the rollout (its weights are laid out as the rollout's on as many of them).
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
  if len(trainer) != len(rollout):
    raise ConfigError("actor_rollout_ref.rollout.nnodes", config.actor_rollout_ref.rollout.nnodes,
                      f"separate_async on several processes pairs each trainer process with a rollout process that "
                      f"rolls out its share of the data (this job's trainer spans {len(trainer)} processes, its "
                      f"rollout {len(rollout)})",
                      "give the trainer and the rollout as many processes each (trainer.nnodes = "
                      "actor_rollout_ref.rollout.nnodes, one process per node), or "
                      "trainer.v1.trainer_mode=colocate_async")
  if len(trainer_devices) < len(rollout_devices):
    raise ConfigError("actor_rollout_ref.rollout.n_gpus_per_node", config.actor_rollout_ref.rollout.n_gpus_per_node,
                      f"the trainer's {len(trainer_devices)} devices send the weights laid out as the rollout's "
                      f"{len(rollout_devices)} devices hold them, on as many of their own",
                      "give the trainer at least as many devices as the rollout")
  return tuple(trainer), tuple(rollout)


# ----- messages through the coordination service ---------------------------------------------

def _client() -> Any:
  return jax_distributed.global_state.client


class PeerFailed(RuntimeError):
  """Another process failed (its error in the message)."""


def abort(error: str) -> None:
  """Tells the other processes this one failed with `error` (whatever they wait for, they stop); the first error
  told stands."""
  try:
    _client().key_value_set_bytes(f"{_PREFIX}/abort", error.encode())
  except Exception:  # pylint: disable=broad-except  (another process aborted first)
    pass


def _aborted() -> str | None:
  """Another process's error, if one aborted."""
  try:
    return _client().key_value_try_get_bytes(f"{_PREFIX}/abort").decode()
  except Exception:  # pylint: disable=broad-except  (not found)
    return None


def _blocking_get(key: str) -> bytes:
  """The value of `key` once set (waits as long as it takes: a lost process stops the job through JAX's
  heartbeats, a failed one through `abort`).

  Raises:
    PeerFailed: another process aborted.
  """
  while True:
    try:
      return _client().blocking_key_value_get_bytes(key, _WAIT_MS)
    except Exception as error:  # pylint: disable=broad-except
      if "DEADLINE_EXCEEDED" not in str(error):
        raise
    failed = _aborted()
    if failed is not None:
      raise PeerFailed(f"another process of this separate_async job failed:\n{failed}")


def _key(name: str) -> str:
  """Message `name`'s key: its pair's (a trainer process and the rollout process of the same place in its role)."""
  return f"{_PREFIX}/{hosts.index()}/{name}"


def put(name: str, value: Any) -> None:
  """Sends `value` (picklable) as message `name` to the other process of this one's pair."""
  data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
  pieces = [data[i:i + _CHUNK_BYTES] for i in range(0, len(data), _CHUNK_BYTES)] or [b""]
  for i, piece in enumerate(pieces):
    _client().key_value_set_bytes(f"{_key(name)}/{i}", piece)
  _client().key_value_set_bytes(f"{_key(name)}/pieces", str(len(pieces)).encode())


def take(name: str) -> Any:
  """Message `name`, once the other process of this one's pair sent it (and removes it)."""
  pieces = int(_blocking_get(f"{_key(name)}/pieces").decode())
  data = b"".join(_blocking_get(f"{_key(name)}/{i}") for i in range(pieces))
  _client().key_value_delete(_key(name))  # and the keys under it
  return pickle.loads(data)


# ----- the weights, device to device --------------------------------------------------------

def _layouts(sent: Any, trainer_devices: list[jax.Device], rollout_devices: list[jax.Device]) -> tuple[Any, Any]:
  """(mirror, target) NamedShardings of `sent` (the weights as a rollout process's engine lays them out over its
  own devices): every rollout process's engine mesh stacked on a leading process axis, each holding all of
  them (target), and the same layout over as many of the trainer's devices (mirror), which a cross-host
  `jax.device_put` needs."""
  engine_mesh = jax.tree.leaves(sent)[0].sharding.mesh
  stacked = hosts.stacked_mesh(dict(engine_mesh.shape), rollout_devices)
  mirror = Mesh(np.array(trainer_devices[:stacked.size]).reshape(stacked.devices.shape), stacked.axis_names)
  return tuple(jax.tree.map(lambda x, m=m: NamedSharding(m, x.sharding.spec), sent) for m in (mirror, stacked))


class CrossHostSend:
  """The trainer's side of a weight sync: its weights -> cast and laid out as every rollout process's engine
  computes with them, on as many of the trainer's devices, then sent to the rollout's devices."""

  def __init__(self, engine: Engine, params: Any, devices: list[jax.Device], rollout_devices: list[jax.Device]):
    """Args:
      engine: the engine of a rollout process (its mesh on that process's devices; every one's is alike).
      params: the trainer's weights (arrays or ShapeDtypeStructs).
      devices: the trainer's devices.
      rollout_devices: the rollout's devices.
    """
    self._mirror, self._target = _layouts(engine.compute_params(abstract(params)), devices, rollout_devices)
    self._cast = jax.jit(engine.cast_impl)

  def __call__(self, params: Any) -> int:
    """Sends `params` (the trainer's weights); the bytes sent (to each rollout process)."""
    cast = self._cast(params)
    # one array at a time onto the mirror: on several trainer processes two reshards in flight can take their
    # collectives in different orders on different hosts (`hosts.HostLocalCopy`)
    local = jax.tree.map(lambda x, s: jax.block_until_ready(jax.device_put(x, s)), cast, self._mirror)
    local = separate.copied(local, params)  # the next update donates what the send may still read
    jax.device_put(local, self._target)
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
    mirror, self._stacked = _layouts(sent, trainer_devices, rollout_devices)
    self._sources = jax.tree.map(lambda x, s: jax.make_array_from_single_device_arrays(x.shape, s, [], dtype=x.dtype),
                                 sent, mirror)
    self._target = jax.tree.map(lambda x: x.sharding, sent)

  def __call__(self) -> Any:
    """The next weights the trainer sends (on this process's devices, once they arrive)."""
    arrived = jax.block_until_ready(jax.device_put(self._sources, self._stacked))
    return jax.tree.map(lambda x, s: jax.make_array_from_single_device_arrays(
        x.shape, s, [shard.data for shard in x.addressable_shards]), arrived, self._target)


# ----- the trainer's side ----------------------------------------------------------------------

class RemoteRollout:
  """A trainer process's view of its rollout process: a `separate.RolloutDriver`'s interface (weights out, each step's
  picked groups in) and a stream's resume positions."""

  def __init__(self, send: Callable[[Any], int], schedule: streaming.Schedule, first_step: int, last_step: int,
               position: dict[str, Any] | None, data_position: Any):
    """Args:
      send: the trainer's weights -> on the rollout's devices (`CrossHostSend`); the bytes sent.
      schedule: which weights each step's batch decodes under.
      first_step, last_step: the steps the rollout picks, first_step..last_step - 1.
      position: the stream's position at first_step (a checkpoint's), or None from the data's start.
      data_position: the data iterator's position at first_step (None: its start).
    """
    self.send, self.schedule, self.first_step, self.last_step = send, schedule, first_step, last_step
    self.turns = separate.DeviceTurns()  # validation and remax decode on the trainer's devices: no one to wait for
    self.stream = None
    self._start = {"first_step": first_step, "stream_position": position, "data_position": data_position}
    self._positions: dict[int, dict[str, Any]] = {}
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
    if not self.primed:
      put("start", self._start)
    put(f"weights/{self._sends}", version)
    self._sends += 1  # announced: its end comes after it whatever the send does
    self.sent_bytes = self.send(params)
    return True

  def next(self) -> streaming.Picked:
    """The groups of the next step, as the rollout process picked them.

    Raises:
      StopIteration: the data ended before a batch of groups finished.
      RuntimeError: the rollout process failed (its traceback in the message).
    """
    kind, *body = take(f"picked/{self._next_step}")
    if kind == "stop":
      raise StopIteration(body[0])
    if kind == "error":
      raise RuntimeError(f"the rollout process failed at step {self._next_step + 1}:\n{body[0]}")
    picked, position = body
    self._next_step += 1
    self._positions[self._next_step] = position
    self._positions.pop(self._next_step - 2, None)
    return picked

  def position(self, trained: int) -> dict[str, Any]:
    """The stream's resume position once `trained` steps are trained (sent with step trained - 1's groups)."""
    return dict(self._positions[trained])

  def close(self) -> None:
    """Tells a started rollout that no more weights come (it then stops); one not started may still be started
    by another `RemoteRollout` (a restored run's), or told it never is (`end`)."""
    if self.primed and not self._ended:
      put(f"weights/{self._sends}", None)
    self._ended = True

  def end(self) -> None:
    """Ends the rollout process's run: `close`, or where it was never started (the run trained no step), tells
    it that it does not start."""
    if not self.primed and not self._ended:
      put("start", None)
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
        failed_trainer = _aborted()
        if failed_trainer is not None:
          raise PeerFailed(f"another process of this separate_async job failed:\n{failed_trainer}")
        break
      with driver.turns.exclusive():
        driver.box.publish(version, receive())
  except BaseException:  # pylint: disable=broad-except
    failed.append(traceback.format_exc())
  finally:
    driver.rollout.stopping = True
    driver.box.close()


def serve(start: dict[str, Any], driver: separate.RolloutDriver, position: Callable[[int], dict[str, Any]],
          receive: CrossHostReceive) -> None:
  """A rollout process's run: picks each step's groups (`driver`, started at `start["first_step"]`) and sends
  them with the stream's `position` after them, while a thread receives the weights; returns once the trainer
  announced no more weights. The data's end, or an error, goes to the trainer as that step's message."""
  driver.rollout.turn = driver.turns.chunk  # the weights arrive between its decode chunks
  failed: list[str] = []
  receiver = threading.Thread(target=_receive, args=(driver, receive, failed), name="rljax-weights", daemon=True)
  receiver.start()
  step = start["first_step"]
  try:
    while step < driver.last_step:
      picked = driver.pick()
      put(f"picked/{step}", ("picked", picked, position(step + 1)))
      step += 1
  except (separate.Closed, streaming.Stopped):
    if failed:  # the weights stopped coming: an error, not the trainer's end
      put(f"picked/{step}", ("error", failed[0]))
      raise RuntimeError(f"receiving the trainer's weights failed:\n{failed[0]}") from None
  except StopIteration as stop:
    put(f"picked/{step}", ("stop", str(stop)))
  except BaseException:  # pylint: disable=broad-except
    put(f"picked/{step}", ("error", traceback.format_exc()))
    raise
  receiver.join()
  if failed:
    raise RuntimeError(f"receiving the trainer's weights failed:\n{failed[0]}")


__all__ = ["CrossHostReceive", "CrossHostSend", "PeerFailed", "RemoteRollout", "abort", "put", "roles", "serve", "take"]
