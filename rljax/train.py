"""The training entry point.

    python -m rljax.train --config=configs/grpo.py[:PRESET] [--config.KEY=VALUE ...] [KEY=VALUE ...]

The command line is `rljax.launch`'s: `--config` names an experiment file
(`get_config(arg)`; `:ARG` picks a preset), overrides come as
`--config.data.train_batch_size=64` or verl's `data.train_batch_size=64`,
and `--dry_run` prints the resolved, validated config as YAML and exits.
"""

from typing import Sequence

from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import launch, sharding


def resolve(config, overrides: Sequence[str], device_count: int | None = None, distributed: bool = False):
  """Overrides -> (multi-host start-up) -> deprecated-key mapping -> validation.

  With `distributed`, JAX's distributed runtime starts before anything asks
  JAX for its devices (it must come first).
  """
  config_lib.apply_overrides(config, overrides)
  if distributed:
    sharding.initialize(config)
  config_lib.finalize(config, device_count)
  world = config_lib.resolve_world_size(config, device_count)
  return config_lib.validate(config, world)


def train(config: ConfigDict) -> None:
  from rljax.trainer import loop  # pylint: disable=import-outside-toplevel
  loop.run(config)


def run() -> None:
  launch.run(resolve, train, "configs/grpo.py")


if __name__ == "__main__":
  run()
