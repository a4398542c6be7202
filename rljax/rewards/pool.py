"""A process pool that scores samples with a per-sample timeout.

Each worker is a process that runs the scorer on one sample at a time. A
sample that runs past `timeout_s` has its worker killed and replaced, and is
reported as timed out; a worker that dies (a crash, `os._exit`) is replaced
and its sample reported as an error. Either way the other samples go on.
Workers start with the "spawn" method (safe beside JAX's threads) and
announce themselves before they are given work, so start-up time is never
charged to a sample.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import multiprocessing.connection
import time
import traceback
import weakref
from typing import Any, Callable, Sequence

_READY = "ready"
_MAX_FAILED_STARTS = 3


@dataclasses.dataclass
class Outcome:
  """One sample's result: `value` on success, else `error` (a traceback)."""
  value: Any = None
  error: str | None = None
  timed_out: bool = False


def _worker_main(fn: Callable[..., Any],
                 conn: multiprocessing.connection.Connection) -> None:
  conn.send(_READY)
  while True:
    message = conn.recv()
    if message is None:
      return
    task_id, kwargs = message
    try:
      reply = (task_id, fn(**kwargs), None)
    except BaseException:  # pylint: disable=broad-except
      reply = (task_id, None, traceback.format_exc())
    try:
      conn.send(reply)
    except Exception:  # pylint: disable=broad-except
      conn.send((task_id, None, traceback.format_exc()))


class _Worker:
  """One scorer process and its end of the pipe."""

  def __init__(self, context: Any, fn: Callable[..., Any]):
    self.conn, child = context.Pipe()
    self.process = context.Process(target=_worker_main, args=(fn, child),
                                   daemon=True)
    self.process.start()
    child.close()
    self.ready = False
    self.task: int | None = None
    self.started = 0.0

  def stop(self) -> None:
    if self.process.is_alive():
      self.process.kill()
    self.process.join(timeout=5)
    self.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
  for worker in workers:
    worker.stop()


class ScorerPool:
  """Runs `fn(**kwargs)` for many kwargs in `num_workers` processes."""

  def __init__(self, fn: Callable[..., Any], num_workers: int,
               timeout_s: float):
    if num_workers <= 0:
      raise ValueError(f"num_workers={num_workers} must be positive")
    if timeout_s <= 0:
      raise ValueError(f"timeout_s={timeout_s} must be positive")
    self._fn = fn
    self._num_workers = num_workers
    self._timeout_s = timeout_s
    self._context = multiprocessing.get_context("spawn")
    self._workers: list[_Worker] = []
    self._failed_starts = 0
    self._finalizer = weakref.finalize(self, _stop_all, self._workers)

  def close(self) -> None:
    """Stops every worker."""
    self._finalizer()

  def _fill(self) -> None:
    while len(self._workers) < self._num_workers:
      self._workers.append(_Worker(self._context, self._fn))

  def _replace(self, worker: _Worker) -> None:
    worker.stop()
    self._workers.remove(worker)
    self._fill()

  def run(self, tasks: Sequence[dict[str, Any]]) -> list[Outcome]:
    """Outcomes of `fn(**task)` for every task, in order."""
    outcomes: list[Outcome | None] = [None] * len(tasks)
    queue = collections.deque(range(len(tasks)))
    self._fill()
    while queue or any(w.task is not None for w in self._workers):
      for worker in self._workers:
        if worker.ready and worker.task is None and queue:
          worker.task = queue.popleft()
          worker.started = time.monotonic()
          worker.conn.send((worker.task, tasks[worker.task]))
      self._wait()
      for worker in list(self._workers):
        self._collect(worker, outcomes)
    return [o if o is not None else Outcome(error="not run") for o in outcomes]

  def _wait(self) -> None:
    now = time.monotonic()
    deadlines = [w.started + self._timeout_s - now for w in self._workers
                 if w.task is not None]
    timeout = max(0.0, min(deadlines)) if deadlines else 1.0
    handles = [w.conn for w in self._workers]
    handles += [w.process.sentinel for w in self._workers]
    multiprocessing.connection.wait(handles, timeout=timeout)

  def _collect(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
    """Takes a worker's reply, or handles its death or timeout."""
    try:
      has_reply = worker.conn.poll()
    except (OSError, EOFError):
      has_reply = False
    if has_reply:
      try:
        message = worker.conn.recv()
      except (OSError, EOFError):
        message = None
      if message == _READY:
        worker.ready = True
        self._failed_starts = 0
        return
      if message is not None:
        task_id, value, error = message
        outcomes[task_id] = Outcome(value=value, error=error)
        worker.task = None
        return
    if not worker.process.is_alive():
      if not worker.ready:
        self._failed_starts += 1
        if self._failed_starts > _MAX_FAILED_STARTS:
          raise RuntimeError(
              f"reward scorer processes exit before starting (exit code "
              f"{worker.process.exitcode}); is the scorer picklable?")
      if worker.task is not None:
        outcomes[worker.task] = Outcome(
            error=f"scorer process died (exit code {worker.process.exitcode})")
      self._replace(worker)
      return
    if (worker.task is not None
        and time.monotonic() - worker.started > self._timeout_s):
      outcomes[worker.task] = Outcome(
          error=f"scorer timed out after {self._timeout_s} s", timed_out=True)
      self._replace(worker)
