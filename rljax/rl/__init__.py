"""The RL trainer: verl's ray_trainer semantics as one JAX program on one mesh.

`run(config)` trains a finalized, validated config; `RLTrainer` is the
same run as an object (fit, validate, save, close). `rljax.rl.assembly`
assembles a run once for both the trainer and `rljax.compile`;
`rljax.rl.experience` holds the record one step's rows travel in.
"""

from rljax.rl.trainer import RLTrainer, Stream, run

__all__ = ["RLTrainer", "Stream", "run"]
