"""The RL trainer: verl's ray_trainer semantics as one JAX program on one mesh.

`run(config)` trains a finalized, validated config; `RLTrainer` is the
same run as an object (fit, validate, save, close). `rljax.rl.assembly`
assembles a run once for both the trainer and `rljax.compile`;
`rljax.rl.experience` holds the record one step's rows travel in;
`rljax.rl.sources` gives a step its rows (one source per rollout mode),
`rljax.rl.scoring` scores them and `rljax.rl.stages` runs the forward passes,
advantages and updates over them.
"""

from rljax.rl.sources import Draw
from rljax.rl.trainer import RLTrainer, run

__all__ = ["Draw", "RLTrainer", "run"]
