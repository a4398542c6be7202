"""How a job of several processes ends when one of them fails: every process within seconds, each printing
the failed one's error.

A process whose run raises tells the others (`abort`: the error under a key of JAX's coordination service), closes
what it holds and exits (`fail`, `exit_failed`). Every process is watched from the moment it joins the job (`watch`,
called by `rljax.sharding.distributed.initialize`): a thread reads another's abort within a second, and a process
still running `_GRACE_S` later (inside a collective or a transfer whose failed side never comes, or in JAX's
shutdown barrier) exits; a `Watchdog` over a block can also stop what the block waits on. Exits skip JAX's teardown,
whose shutdown barrier a stuck process never reaches and whose transfer server waits for half-done transfers;
process 0, which holds the coordination service, leaves last (`_await_leaving`: a process still talking to the
service when it goes aborts). A killed process stops the others through JAX's heartbeats
(`rljax.sharding.distributed.heartbeat_timeout_s`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, NoReturn, TypeVar

from jax._src import distributed as jax_distributed

from rljax.config.errors import ConfigError

_PREFIX = "rljax/job"
WAIT_MS = 1_000  # how often a waiting process looks for another's abort
_GRACE_S = 10  # how long a process waits, once another aborted, for its own run to end before it exits
_CLOSING_S = 60  # how long a failed process's close may take (a checkpoint being written finishes)
_LEAVING_S = 15  # how long process 0 of a failed job waits for each other to know of it (`_await_leaving`)
_LEFT_S = 1  # how long process 0 waits after the others said they left (their last instructions before exiting)
_LEAVING = threading.Lock()  # one thread of a failed process exits it
_exiting = threading.Event()  # this process ends itself (`fail`, `exit_failed`): its watchdogs stand down
_STOPPING_S = 5  # how long a process at its normal exit waits for each watchdog's last look at the service

Built = TypeVar("Built")
Result = TypeVar("Result")


def run_together(build: Callable[[], Built], body: Callable[[Built], Result],
                 close: Callable[[Built], None]) -> tuple[Built, Result]:
  """(what `build` makes, `body` of it), closed (`close`) after. In a job of several processes, an exception ends
  this process (`fail`: the others told; what was built closed, if anything), and so does another process's
  failure told by the end of `body` (this one's run may have ended well; the job's did not)."""
  if not joined():
    built = build()
    try:
      return built, body(built)
    finally:
      close(built)
  built = None
  try:
    built = build()
    result = body(built)
  except Exception as error:  # pylint: disable=broad-except
    fail(error, (lambda: None) if built is None else functools.partial(close, built))
  except BaseException:
    if built is not None:
      close(built)
    raise
  peer = aborted()
  if peer is not None:
    fail(PeerFailed(peer), functools.partial(close, built))
  close(built)
  return built, result


def fail(error: BaseException, close: Callable[[], None]) -> NoReturn:
  """Ends this process of a job of several after `error`, the other processes told (`abort`; `exit_failed`): a
  config error printed as the command line prints one, with status 2; else the traceback, with another process's
  error where that one failed first (this one's may follow from it), with status 1."""
  _exiting.set()
  trace = "".join(traceback.format_exception(error))
  if not isinstance(error, PeerFailed) and not abort(trace):
    trace = "\n".join(filter(None, (trace, aborted())))
  if isinstance(error, ConfigError):
    exit_failed(f"config error: {error}", 2, close)
  exit_failed(trace, 1, close)


def client() -> Any:
  """JAX's coordination service client of this process."""
  return jax_distributed.global_state.client


def joined() -> bool:
  """Whether this process is one of several of a `jax.distributed` job (read without starting JAX's backend)."""
  return client() is not None and jax_distributed.global_state.num_processes > 1


def _index() -> int:
  """This process's index in the `jax.distributed` job."""
  return jax_distributed.global_state.process_id


class PeerFailed(RuntimeError):
  """Another process failed (its error in the message)."""


def abort(error: str) -> bool:
  """Tells the other processes this one failed with `error` (whatever they wait for, they stop); whether it was
  the first to (the first error told stands)."""
  try:
    client().key_value_set_bytes(f"{_PREFIX}/abort", error.encode())
  except Exception:  # pylint: disable=broad-except  (another process aborted first)
    return False
  return True


def aborted() -> str | None:
  """Another process's error, as this one reports it, if one aborted."""
  try:
    failed = client().key_value_try_get_bytes(f"{_PREFIX}/abort").decode()
  except Exception:  # pylint: disable=broad-except  (not found)
    return None
  return f"another process of this job failed:\n{failed}"


def exit_failed(error: str, status: int = 1, close: Callable[[], None] = lambda: None) -> NoReturn:
  """Ends this process of a failed job with exit `status`: runs `close` (for at most `_CLOSING_S`: it finishes a
  checkpoint being written, and may wait on the failed process), prints `error` and exits without tearing JAX
  down, the others told (`abort`). A cross-host weight transfer whose other side failed never ends, and destroying
  JAX's client waits for it. Process 0 holds the coordination service, so it first waits for the others to have
  left (`_await_leaving`)."""
  _exiting.set()
  _announce(f"told/{_index()}")
  closing = threading.Thread(target=close, name="rljax-close", daemon=True)
  closing.start()
  closing.join(_CLOSING_S)
  with _LEAVING:
    print(error, file=sys.stderr, flush=True)
    logging.shutdown()
    _announce(f"left/{_index()}")
    if _index() == 0:
      _await_leaving(jax_distributed.global_state.num_processes)
    sys.stdout.flush()
    os._exit(status)


def _announce(name: str) -> None:
  """Sets the key `name` for the other processes (best effort: the service may be gone)."""
  try:
    client().key_value_set_bytes(f"{_PREFIX}/{name}", b"")
  except Exception:  # pylint: disable=broad-except  (process 0 left: nobody waits for this one)
    pass


def _announced(name: str, deadline: float) -> bool:
  """Whether another process sets the key `name` before `deadline` (time.monotonic())."""
  try:
    client().blocking_key_value_get_bytes(f"{_PREFIX}/{name}", max(int(1000 * (deadline - time.monotonic())), 1))
  except Exception:  # pylint: disable=broad-except  (not set in time)
    return False
  return True


def _await_leaving(count: int) -> None:
  """Process 0's wait, before it exits with the coordination service (a process still talking to the service
  then aborts): each other process says it knows of the failure within `_LEAVING_S` (as it fails, or as its watchdog
  reads the abort, within `WAIT_MS`), and then leaves within `_GRACE_S` (its run ends, or its watchdog ends it)
  and its close's `_CLOSING_S`; a killed one never says, and is waited on no longer."""
  started = time.monotonic()
  for process in range(1, count):
    if _announced(f"told/{process}", started + _LEAVING_S):
      _announced(f"left/{process}", started + _LEAVING_S + _GRACE_S + _CLOSING_S)
  time.sleep(_LEFT_S)


class Watchdog:
  """While its `with` block runs, a thread that watches for another process's abort: it calls `stop` with the
  error (the block should then end), and if the block has not ended `_GRACE_S` later (this process waits inside a
  collective or a transfer whose other side failed, which never ends), it ends the process (`exit_failed`, with no
  close: the blocked thread holds what a close would wait for). A process already exiting on its own (`fail`,
  `exit_failed`) is left to it."""

  def __init__(self, stop: Callable[[str], None] = lambda error: None):
    self._stop = stop
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._watch, name="rljax-watchdog", daemon=True)

  def __enter__(self) -> "Watchdog":
    self._thread.start()
    return self

  def __exit__(self, *exc: Any) -> None:
    self.join()

  def join(self) -> None:
    """Stops the watching and waits (at most `_STOPPING_S`) for the thread's last look at the service to end."""
    self._done.set()
    if self._thread is not threading.current_thread():
      self._thread.join(_STOPPING_S)

  def _watch(self) -> None:
    while not self._done.wait(WAIT_MS / 1000):
      error = None if _exiting.is_set() else aborted()
      if error is not None:
        _announce(f"told/{_index()}")
        self._stop(error)
        if not self._done.wait(_GRACE_S) and not _exiting.is_set():
          exit_failed(error)
        return


def watch() -> None:
  """Watches this process of a job of several for another's abort until it exits (`Watchdog`, over a block that
  never ends): wherever it is (building, running, closing, in JAX's shutdown barrier), it ends within `_GRACE_S` of
  the news unless it is exiting already. At a normal exit, `_leave` ends the watching."""
  atexit.register(_leave, Watchdog().__enter__())  # pylint: disable=unnecessary-dunder-call


def _leave(watchdog: Watchdog) -> None:
  """A normal exit's end of the job (at exit, before JAX's own teardown, which then finds it done): JAX's shutdown
  barrier, still watched, then the watching stopped. A daemon thread still inside a call to the service's client as
  the interpreter finalizes is ended there by the interpreter, and that aborts the process (`terminate called after
  throwing an instance of ''`)."""
  jax_distributed.shutdown()
  watchdog.join()


__all__ = ["PeerFailed", "Watchdog", "WAIT_MS", "abort", "aborted", "client", "exit_failed", "fail", "joined",
           "run_together", "watch"]
