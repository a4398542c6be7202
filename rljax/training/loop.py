"""The outer training loop the RL and SFT trainers share, and its fault handling.

`train_loop` steps a trainer to its last step: it logs, validates and
saves on schedule. `check_finite` stops a run at the first NaN/Inf metric
instead of training on (and checkpointing) garbage. `PreemptionGuard` turns
SIGTERM (a preempted TPU VM, a cluster scheduler, `kill`) into a flag the
loop polls, so it can save a checkpoint at the end of the step and exit
cleanly.
"""

from __future__ import annotations

import logging
import math
import signal
import types
from typing import Any, Callable, Mapping

_LOG = logging.getLogger(__name__)


class NonFiniteError(FloatingPointError):
  """A metric was NaN or Inf; `step` and `names` say where."""

  def __init__(self, step: int, names: list[str]):
    self.step = step
    self.names = names
    super().__init__(
        f"step {step}: non-finite metric(s) {', '.join(names)}; the run stops before "
        "updating or checkpointing on them (lower the learning rate, check the rewards, "
        "or resume from the last checkpoint)."
    )


class DataExhausted(Exception):
  """A step needed another batch of training data (dynamic sampling) and the data had ended."""


def _is_finite(value: Any) -> bool:
  try:
    return math.isfinite(float(value))
  except (TypeError, ValueError):
    return True


def check_finite(metrics: Mapping[str, Any], step: int) -> None:
  """Raises NonFiniteError naming `step` and every NaN/Inf metric.

  Args:
    metrics: name -> scalar (Python, numpy or jax); non-numeric values are
      ignored.
    step: the global step, for the message.
  """
  bad = sorted(name for name, value in metrics.items() if not _is_finite(value))
  if bad:
    raise NonFiniteError(step, bad)


Handler = Callable[[int, types.FrameType | None], Any] | int | None


class PreemptionGuard:
  """Context manager: SIGTERM sets `should_stop` instead of killing the process.

  The previous handler is restored on exit. Must be entered on the main
  thread (Python delivers signals there).

  Example::

    with PreemptionGuard() as guard:
      for step in steps:
        train_step()
        if guard.should_stop:
          checkpointer.save(step, ...)
          break
  """

  def __init__(self, signum: int = signal.SIGTERM):
    self.signum = signum
    self.should_stop = False
    self._previous: Handler = None

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del signum, frame
    self.should_stop = True

  def __enter__(self) -> "PreemptionGuard":
    self.should_stop = False
    self._previous = signal.signal(self.signum, self._handle)
    return self

  def __exit__(self, *exc: Any) -> None:
    signal.signal(self.signum, self._previous if self._previous is not None else signal.SIG_DFL)


def train_loop(job: Any, total_steps: int, validation_due: Callable[[int], bool],
               save_due: Callable[[int], bool], save_last: bool = True) -> dict[str, float]:
  """The training loop both trainers (RL and SFT) run, with its fault handling.

  Steps `job` until `job.step == total_steps`, the data ends (also inside a
  step that draws more batches) or SIGTERM arrives: each step's metrics are
  checked for NaN/Inf (`check_finite`), joined by validation metrics when
  `validation_due(step)`, and logged;
  a checkpoint is saved when `save_due(step)`, on SIGTERM (then the loop
  stops), and after the last step if that one was not saved and `save_last`
  (verl's save_freq <= 0 saves no last step). Waits for asynchronous saves
  and closes the tracker before it returns.

  Args:
    job: a trainer with `step`, `count_step()` (one more step trained), `saved_step`, `train_iter`,
      `train_step(batch)`, `validate()`, `save()`, `tracker` and `checkpointer`.
    total_steps: the step to stop at.
    validation_due, save_due: whether step N (just finished) validates / saves.

  Returns:
    The last step's metrics ({} when no step ran).
  """
  last: dict[str, float] = {}
  with PreemptionGuard() as guard:
    while job.step < total_steps:
      try:
        batch = next(job.train_iter)
      except StopIteration:
        break
      try:
        metrics = job.train_step(batch)
      except DataExhausted:
        _LOG.warning("the training data ended inside step %d, before it had a full batch: not trained",
                     job.step + 1)
        break
      check_finite(metrics, job.step + 1)
      job.count_step()
      if validation_due(job.step):
        metrics.update(job.validate())
      job.tracker.log(metrics, job.step)
      last = metrics
      if guard.should_stop or save_due(job.step):
        job.save()
      if guard.should_stop:
        _LOG.warning("SIGTERM: saved step %d, stopping", job.step)
        break
  if save_last and job.saved_step != job.step:
    job.save()
  job.checkpointer.wait()
  job.tracker.close()
  return last
