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
  process through JAX's coordination service (`rljax.rl.transport`: a few MB
  of tokens and scores per step), which trains them one rollout process's
  after the other (`merged`); or, to k trainer processes, in k
  equal parts (`split`);
* the trainer's processes update, validate and compute remax's baselines on
  an engine over their own mesh, checkpoint, log, and send the weights the
  schedule says to every rollout process device to device
  (`rljax.rl.cross_host_weights`): cast to rollout.dtype and laid out as each rollout
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
batch is `staleness.Schedule`'s, as in one process, so the run's metrics
equal the one-process run's.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
from typing import Any, Callable, Sequence

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax import sharding
from rljax.config.errors import ConfigError
from rljax.data import dataset
from rljax.rl import separate, staleness, streaming
from rljax.rl.cross_host_weights import CrossHostReceive
from rljax.rl.transport import put, take
from rljax.sharding import failures, hosts

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


# ----- one rollout process's picks to its trainer processes ------------------------------------

def merged(picks: Sequence[streaming.Picked]) -> streaming.Picked:
  """The groups of several `picks` (several rollout processes', for one trainer process) as one, in order:
  columns, rows and spans concatenated, each row's group offset by the groups before it, the counts summed, the
  samplers' measurements averaged, the latest epoch."""
  if len(picks) == 1:
    return picks[0]
  first = picks[0]
  offsets = np.cumsum([0] + [len(p.spans) for p in picks[:-1]])
  columns = {k: _joined([p.columns[k] for p in picks]) for k in first.columns}
  fields = {f.name: _joined([getattr(p.rollout, f.name) for p in picks]) for f in dataclasses.fields(first.rollout)}
  fields["prompt_index"] = np.concatenate([p.rollout.prompt_index + o for p, o in zip(picks, offsets)])
  rollout = dataclasses.replace(first.rollout, **fields)
  epochs = [p.epoch for p in picks if p.epoch is not None]
  return streaming.Picked(columns, rollout, np.concatenate([p.spans for p in picks]), first.version,
                          sum(p.evicted for p in picks), sum(p.filtered for p in picks),
                          None if any(p.scores is None for p in picks) else [s for p in picks for s in p.scores],
                          max(epochs) if epochs else None)


def split(picked: streaming.Picked, parts: int) -> list[streaming.Picked]:
  """`picked` (one rollout process's groups) as `parts` runs of as many groups, in order (one per trainer process
  it serves; `merged` undoes it): columns, rows, spans and scores sliced, each row's group counted from its
  run's first, the counts on the first run (each is summed over the hosts), the samplers' measurements on each.

  Raises:
    ValueError: its groups do not split into `parts` runs of as many.
  """
  groups = len(picked.spans)
  if groups % parts:
    raise ValueError(f"{groups} groups do not split into {parts} equal parts")
  size, rows = groups // parts, len(picked.rollout.prompt_index) // max(groups, 1)
  return [_part(picked, range(p * size, (p + 1) * size), rows, first=p == 0) for p in range(parts)]


def _part(picked: streaming.Picked, groups: range, rows: int, first: bool) -> streaming.Picked:
  """The groups `groups` of `picked` (each of `rows` rows) as a Picked of their own; `first`: it keeps the
  counts."""
  rollout = picked.rollout
  fields = {f.name: _sliced(getattr(rollout, f.name), slice(groups.start * rows, groups.stop * rows))
            for f in dataclasses.fields(rollout)}
  fields["prompt_index"] = fields["prompt_index"] - groups.start
  at = slice(groups.start, groups.stop)
  columns = {k: _sliced(v, at) for k, v in picked.columns.items()}
  return streaming.Picked(columns, dataclasses.replace(rollout, **fields), picked.spans[at], picked.version,
                          picked.evicted if first else 0, picked.filtered if first else 0,
                          None if picked.scores is None else picked.scores[at], picked.epoch)


def _sliced(value: Any, at: slice) -> Any:
  """Rows `at` of one host's field (arrays and lists sliced; measurements and None kept)."""
  return value if value is None or isinstance(value, dict) else value[at]


def _joined(values: list[Any]) -> Any:
  """Several hosts' values of one field, as one host's: arrays and lists concatenated (object arrays kept object
  arrays), measurements (dicts of numbers) averaged, None kept."""
  if values[0] is None:
    return None
  if isinstance(values[0], dict):
    return {k: float(np.mean([v[k] for v in values])) for k in values[0]}
  if isinstance(values[0], list):
    return [x for v in values for x in v]
  if values[0].dtype == object:
    return dataset.object_array([x for v in values for x in v])
  return np.concatenate(values)


class RemoteRollout:
  """A trainer process's view of its rollout processes: a `separate.RolloutDriver`'s interface (weights out, each
  step's picked groups in, theirs one after the other) and a stream's resume positions. Where the trainer has
  more processes than the rollout, each rollout process's first trainer process (part 0) starts, feeds and ends
  it, and every one takes its part of its groups."""

  def __init__(self, send: Callable[[Any], int], schedule: staleness.Schedule, first_step: int, last_step: int,
               starts: dict[int, dict[str, Any] | None], part: int = 0, parts: int = 1):
    """Args:
      send: the trainer's weights -> on the rollout's devices (`CrossHostSend`); the bytes sent.
      schedule: which weights each step's batch decodes under.
      first_step, last_step: the steps the rollout picks, first_step..last_step - 1.
      starts: the rollout processes this one trains the groups of (`served`), each with its stream's position at
        first_step (`positions.host_position`: a checkpoint's), or None from the data's start.
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
        # named as a peer's failure whichever process tells the job first: the rollout process aborts right after
        raise RuntimeError(f"another process of this job failed: the rollout process, at step "
                           f"{self._next_step + 1}:\n{messages[-1][1]}")
    for kind, *body in messages:
      if kind == "stop":
        raise StopIteration(body[0])
    self._next_step += 1
    self._positions[self._next_step] = [position for _, _, position in messages]
    self._positions.pop(self._next_step - 2, None)
    return merged([picked for _, picked, _ in messages])

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
        picked, after = split(driver.pick(), len(parts)), position(step + 1)
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


__all__ = ["RemoteRollout", "merged", "roles", "serve", "served", "split"]
