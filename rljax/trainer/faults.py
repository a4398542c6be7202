"""Fault handling for the RL loop: non-finite metrics and preemption (SIGTERM).

`check_finite` stops a run at the first NaN/Inf metric instead of training on
(and checkpointing) garbage. `PreemptionGuard` turns SIGTERM (a preempted
TPU VM, a cluster scheduler, `kill`) into a flag the loop polls, so it can
save a checkpoint at the end of the step and exit cleanly.
"""

from __future__ import annotations

import math
import signal
import types
from typing import Any, Callable, Mapping


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
