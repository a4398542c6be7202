"""What the RL and SFT trainers share: update cores, optimizers, checkpoints, tracking, the outer loop.

- `updates`: a gradient laid out as its parameters, accumulated over
  micro-batches, and one optimizer update (the cores of every step).
- `optim`: AdamW with verl's learning-rate schedules from an `optim` node.
- `checkpointing`: complete orbax steps under `trainer.default_local_dir`
  (`Checkpointer`, `resolve_resume`).
- `tracking`: metrics to `trainer.logger`'s backends, and the curves.
- `loop`: `train_loop`, the outer loop with its fault handling (NaN/Inf
  metrics, SIGTERM).
- `metrics`: verl's throughput figures.
"""

from rljax.training.checkpointing import Checkpointer, keep_limit, resolve_resume, restore_from_path, split_step_path
from rljax.training.loop import DataExhausted, NonFiniteError, PreemptionGuard, check_finite, train_loop
from rljax.training.tracking import Tracker, plot_curves

__all__ = [
    "Checkpointer", "DataExhausted", "NonFiniteError", "PreemptionGuard", "Tracker", "check_finite", "keep_limit",
    "plot_curves", "resolve_resume", "restore_from_path", "split_step_path", "train_loop",
]
