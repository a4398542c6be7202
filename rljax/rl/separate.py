"""separate_async: generation on devices of its own, overlapping the updates (verl's trainer.v1).

`actor_rollout_ref.rollout.nnodes x n_gpus_per_node` devices (the last
ones JAX lists) hold the engine, its KV cache and a rollout-dtype copy of
the weights; the trainer trains on the others. A thread of its own drives
the engine: the stream of `rljax.rl.streaming` (slots refilled as responses
end, partial rollouts, staleness policy, dynamic sampling, tool turns), each
picked batch of groups into a queue the trainer reads. While the trainer
updates on batch b, the rollout decodes the next ones.

Weights go to the rollout devices after every
`trainer.v1.separate_async.parameter_sync_step`-th update, device to
device: cast to rollout.dtype where they lie, then `jax.device_put` into the
engine's layout (`rljax.rollout.weights.SendCopy`). Which weights decode a
batch is fixed by `staleness.Schedule`, not by timing: the rollout waits for
the version batch b is due to decode under (`WeightBox.take`), so a run is
the same whatever the speeds of the two sides, and equal to colocate_async
run with the same schedule (tests/rl/test_separate.py).

`RolloutDriver` runs the same loop inline (no thread) when colocate_async
is given a lagged schedule: that is the reference the threaded run equals.

Programs never run on the same devices from both threads at once: the
trainer's own decodes on the rollout's devices (validation, remax's
baselines) take their turn between the rollout's decode chunks
(`DeviceTurns`), and the rollout thread runs nothing on the trainer's
devices (dynamic sampling's judge with a reward model, whose forward pass
runs there, is refused under separate_async).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

from rljax.rl import staleness, streaming


class Closed(Exception):
  """The driver was closed while its rollout waited for weights or for its turn on the devices."""


class DeviceTurns:
  """Turns on the rollout's devices: the rollout thread's decode chunks, and the trainer thread's own decodes there
  (validation, remax's baselines) between them. Two programs launched from two threads could reach the devices in
  different orders, and their collectives then wait on each other; a waiting trainer goes first."""

  def __init__(self):
    self._cond = threading.Condition()
    self._busy = False
    self._waiting = 0
    self._closed = False

  @contextlib.contextmanager
  def chunk(self) -> Iterator[None]:
    """The rollout thread's turn (after any the trainer waits for).

    Raises:
      Closed: the turns were closed while waiting.
    """
    with self._cond:
      self._cond.wait_for(lambda: not self._busy and not self._waiting or self._closed)
      self._raise_if_closed()
      self._busy = True
    try:
      yield
    finally:
      self._release()

  @contextlib.contextmanager
  def exclusive(self) -> Iterator[None]:
    """The trainer thread's turn, once the chunk in progress ends.

    Raises:
      Closed: the turns were closed while waiting.
    """
    with self._cond:
      self._waiting += 1
      self._cond.wait_for(lambda: not self._busy or self._closed)
      self._waiting -= 1
      self._raise_if_closed()
      self._busy = True
    try:
      yield
    finally:
      self._release()

  def close(self) -> None:
    """Whoever waits for a turn, or asks for one from now on, stops (`Closed`): the turn in progress may never
    end (a transfer whose other side failed)."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  def _raise_if_closed(self) -> None:
    if self._closed:
      raise Closed()

  def _release(self) -> None:
    with self._cond:
      self._busy = False
      self._cond.notify_all()


class WeightBox:
  """The rollout-side weights by policy version: the trainer publishes, the rollout takes the version it is due to
  decode under (older versions are dropped once a newer one is taken)."""

  def __init__(self):
    self._cond = threading.Condition()
    self._weights: dict[int, Any] = {}
    self._closed = False

  def publish(self, version: int, weights: Any) -> None:
    with self._cond:
      self._weights[version] = weights
      self._cond.notify_all()

  def take(self, version: int) -> Any:
    """The weights of `version`, once published (blocks until then).

    Raises:
      Closed: the box was closed while waiting.
    """
    with self._cond:
      self._cond.wait_for(lambda: version in self._weights or self._closed)
      if self._closed:
        raise Closed()
      self._weights = {v: w for v, w in self._weights.items() if v >= version}
      return self._weights[version]

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._weights.clear()
      self._cond.notify_all()


def copied(sent: Any, params: Any) -> Any:
  """`sent` with a copy of each array that is one of `params`' own (an engine that reads the trainer's arrays in
  place: the next update donates them)."""
  own = {id(x) for x in jax.tree.leaves(params)}
  return jax.tree.map(lambda x: jnp.copy(x) if id(x) in own else x, sent)


def sends(schedule: staleness.Schedule, first_step: int, last_step: int, version: int) -> bool:
  """Whether the weights of policy `version` go to a rollout that picks steps first_step..last_step - 1 on
  `schedule`: those of the first step, and each later version some step decodes under."""
  due = version == first_step or (version > first_step and schedule.publishes(version))
  return due and max(schedule.weights_for(last_step - 1), first_step) >= version


class RolloutDriver:
  """An `AsyncRollout` run on a `Schedule`: batch b is picked under the weights of version
  `max(schedule.weights_for(b), first_step)`, for steps first_step..last_step - 1.

  Threaded (separate_async), a thread picks the batches ahead into a queue while the trainer updates; inline, each
  `next` picks its batch on the caller's thread. Either way the weights come from `publish`.
  """

  def __init__(self, rollout: streaming.AsyncRollout, schedule: staleness.Schedule, first_step: int,
               last_step: int, send: Callable[[Any], Any] | None, threaded: bool, epoch: Callable[[], int] = lambda: 0):
    """Args:
      rollout: the stream of groups (it must hold its weights between picks).
      schedule: which weights each step's batch decodes under.
      first_step: the first step it picks for (a resumed run's step); its weights must be published first.
      last_step: the step it stops before.
      send: the trainer's weights -> the engine's (cast and laid out on the engine's devices); None where the
        weights arrive in its box otherwise (`rljax.rl.remote`: from another process).
      threaded: pick on a thread of its own.
      epoch: the data's epoch, read after each pick where the rollout reads the data (`Picked.epoch`).
    """
    self.rollout, self.schedule, self.send, self.epoch = rollout, schedule, send, epoch
    self.turns = DeviceTurns()
    if threaded:
      rollout.turn = self.turns.chunk
    self.first_step, self.last_step = first_step, last_step
    self.box = WeightBox()
    self.next_step = first_step
    self.decoding_version: int | None = None
    self.sent_bytes = 0
    self._queue: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._run, name="rljax-rollout", daemon=True) if threaded else None
    self._started = self._primed = False

  def weights_for(self, step: int) -> int:
    return max(self.schedule.weights_for(step), self.first_step)

  @property
  def primed(self) -> bool:
    """The weights of the first step were published."""
    return self._primed

  def publish(self, version: int, params: Any) -> bool:
    """Sends the trainer's weights of `version` to the rollout if some step decodes under them; whether it did."""
    if not sends(self.schedule, self.first_step, self.last_step, version):
      return False
    if self._started and not self._thread.is_alive():  # it stopped (the data ended, or an error it queued)
      return False
    self._primed = True
    with self.turns.exclusive():  # the copy onto the rollout's devices, between its decode chunks
      sent = copied(self.send(params), params)
    self.sent_bytes = sum(x.nbytes for x in jax.tree.leaves(sent))
    self.box.publish(version, sent)
    if self._thread is not None and not self._started:
      self._started = True
      self._thread.start()
    return True

  def pick(self) -> streaming.Picked:
    """The next step's groups, decoded under the weights the schedule gives it."""
    step = self.next_step
    version = self.weights_for(step)
    params = self.box.take(version) if version != self.decoding_version else None
    picked = self.rollout.next_groups(params, version, trains_at=step)
    picked.epoch = self.epoch()
    self.decoding_version, self.next_step = version, step + 1
    return picked

  def _run(self) -> None:
    """The rollout thread: picks each step's groups into the queue; an error (the data's end included) goes there
    too, and ends it."""
    try:
      while self.next_step < self.last_step:
        self._queue.put(self.pick())
      self._queue.put(StopIteration(f"the rollout picked the run's last step ({self.last_step})"))
    except (Closed, streaming.Stopped):
      pass
    except BaseException as error:  # pylint: disable=broad-except
      self._queue.put(error)

  def next(self) -> streaming.Picked:
    """The groups of the next step (waits for the thread's pick, or picks them here).

    Raises:
      StopIteration: the data ended before a batch of groups finished; any error the rollout met.
    """
    if self._thread is None:
      return self.pick()
    item = self._queue.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self) -> None:
    """Stops the rollout thread (whatever it waits on) and closes the stream."""
    self.rollout.stopping = True
    self.box.close()
    if self._thread is not None and self._started:
      self._thread.join()
    self.rollout.close()


class StepTickets:
  """The training loop's batches under separate_async: None for each step (the rollout thread reads the data, and
  the step trains the groups it picked)."""

  def __iter__(self) -> "StepTickets":
    return self

  def __next__(self) -> None:
    return None


__all__ = ["Closed", "DeviceTurns", "RolloutDriver", "StepTickets", "WeightBox", "copied", "sends"]
