"""The RL trainer: the loop, actor/critic updates, checkpoints, tracking, faults.

RLTrainer / run join rollout, rewards, advantages and the jitted updates
(verl's ray_trainer semantics on one mesh).

Checkpointer / resolve_resume keep complete orbax steps under
`trainer.default_local_dir`; Tracker writes metrics to `trainer.logger`'s
backends; check_finite / PreemptionGuard stop a run cleanly on NaN/Inf
metrics or SIGTERM.
"""

from rljax.trainer.checkpointing import (
    Checkpointer,
    keep_limit,
    resolve_resume,
    restore_from_path,
    split_step_path,
)
from rljax.trainer.faults import NonFiniteError, PreemptionGuard, check_finite
from rljax.trainer.tracking import Tracker, plot_curves

_LAZY = {"RLTrainer", "run"}


def __getattr__(name: str):
  """RLTrainer and run load rljax.trainer.loop (and the rollout engine) on first use only,
  so importing the checkpoint or tracking helpers stays fast."""
  if name in _LAZY:
    from rljax.trainer import loop  # pylint: disable=import-outside-toplevel
    return getattr(loop, name)
  raise AttributeError(f"module 'rljax.trainer' has no attribute {name!r}")


__all__ = [
    "Checkpointer",
    "NonFiniteError",
    "PreemptionGuard",
    "RLTrainer",
    "Tracker",
    "check_finite",
    "keep_limit",
    "plot_curves",
    "resolve_resume",
    "restore_from_path",
    "run",
    "split_step_path",
]
