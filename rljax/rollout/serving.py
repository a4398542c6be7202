"""Serving an rljax engine with JetStream's own orchestrator (the `jetstream` extra).

JetStream's driver threads kill their whole process (SIGKILL, the traceback
printed to stdout) when one of them raises. A server can rely on a
supervisor to restart it; a process that embeds the orchestrator (a
notebook, a trainer, a test run) dies without a trace. The driver built
here keeps that error instead: the failed thread logs it, and `stop()`
raises it.

A caller that runs `LLMOrchestrator.Decode` under `asyncio.run` stops the
driver before that loop closes: a request's end reaches the loop as two
callbacks from the detokenize thread, and the caller can see the first,
finish and close the loop before the second ("Event loop is closed").
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rljax.rollout import jetstream_compat
from rljax.rollout.engine import Engine
from rljax.rollout.jetstream_adapter import ResultTokens

_CONSTRUCTION = threading.Lock()  # the driver's thread class is swapped in JetStream's module while one is built


class DriverThreadError(RuntimeError):
  """A JetStream driver thread (prefill, transfer, generate or detokenize) raised."""


def make_driver(engine: Engine, params: Any, **kwargs) -> Any:
  """A `jetstream.core.orchestrator.Driver` that prefills and generates with `engine`.

  A driver thread that raises no longer kills the process: it logs its
  traceback and stops working; `driver.thread_errors` lists `(thread name,
  exception)` and `driver.stop()` raises `DriverThreadError` from the first.

  Args:
    engine: the rljax engine (built with a tokenizer for text requests).
    params: the parameters to serve (e.g. a loaded checkpoint's).
    **kwargs: passed to Driver (e.g. interleaved_mode=True).

  Raises:
    ImportError: google-jetstream is not installed.
  """
  orchestrator = jetstream_compat.import_quietly("jetstream.core.orchestrator")
  if orchestrator is None:
    raise ImportError("serving needs google-jetstream: pip install 'rljax[jetstream]'")
  jetstream_compat.install_tree_map_alias()
  # The engine module leaves JetStream (and the TensorFlow it imports) out of every
  # run that does not serve; JetStream's orchestrator takes the engine's results for
  # tokens by `isinstance(..., engine_api.ResultTokens)`.
  engine_api = orchestrator.engine_api
  missing = sorted(name for name in engine_api.Engine.__abstractmethods__ if not hasattr(Engine, name))
  if missing:  # what subclassing JetStream's Engine would have refused
    raise TypeError(f"rljax's Engine lacks JetStream's Engine methods {missing}")
  engine_api.Engine.register(Engine)
  engine_api.ResultTokens.register(ResultTokens)
  errors: list[tuple[str, Exception]] = []
  with _CONSTRUCTION:
    kill_on_error = orchestrator.JetThread
    orchestrator.JetThread = _error_keeping_thread(kill_on_error, errors)
    try:
      driver = _error_raising_driver(orchestrator.Driver)(
          prefill_engines=[engine], generate_engines=[engine], prefill_params=[params], generate_params=[params],
          **kwargs)
    finally:
      orchestrator.JetThread = kill_on_error
  driver.thread_errors = errors
  return driver


def _error_keeping_thread(base: type, errors: list) -> type:
  """A subclass of JetStream's `JetThread` that appends its exception to `errors` and logs it (stderr), where
  `JetThread` kills the process."""

  class ErrorKeepingThread(base):

    def run(self):
      try:
        threading.Thread.run(self)
      except Exception as e:  # pylint: disable=broad-exception-caught
        logging.getLogger(__name__).exception("JetStream driver thread %s failed", self.name)
        errors.append((self.name, e))

  return ErrorKeepingThread


def _error_raising_driver(base: type) -> type:
  """A subclass of JetStream's `Driver` whose `stop()` raises the first error its threads kept."""

  class ErrorRaisingDriver(base):

    def stop(self):
      super().stop()
      if self.thread_errors:
        name, error = self.thread_errors[0]
        raise DriverThreadError(f"JetStream driver thread {name} failed: {error!r}") from error

  return ErrorRaisingDriver
