"""The training entry point.

    python -m rljax.train --config=configs/grpo.py[:PRESET] [--config.KEY=VALUE ...] [KEY=VALUE ...]

The command line is `rljax.launch`'s: `--config` names an experiment file
(`get_config(arg)`; `:ARG` picks a preset) or Hydra's `--config-path DIR
--config-name NAME` a verl YAML file, overrides come as
`--config.data.train_batch_size=64`, verl's `data.train_batch_size=64` or
Hydra's `+KEY=VALUE` / `~KEY`, and `--dry_run` prints the resolved,
validated config as YAML and exits.
"""

import logging
from typing import Sequence

from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import launch, sharding

_LOG = logging.getLogger("rljax.train")


def resolve(config, overrides: Sequence[str], device_count: int | None = None, distributed: bool = False):
  """Overrides -> (multi-host start-up) -> deprecated-key mapping -> validation.

  Overrides of keys rljax accepts but ignores are listed in one warning.

  With `distributed`, JAX's distributed runtime starts before anything asks
  JAX for its devices (it must come first).
  """
  config_lib.apply_overrides(config, overrides)
  ignored = config_lib.ignored_overrides(overrides, config)
  if ignored:
    _LOG.warning("%d override(s) set verl keys that change nothing in rljax (docs/configuration.md says why): %s",
                 len(ignored), ", ".join(ignored))
  if distributed:
    sharding.initialize(config)
  config_lib.finalize(config, device_count, explicit=[config_lib.parse_override(o)[1] for o in overrides])
  world = sharding.resolve_world_size(config, device_count)
  return config_lib.validate(config, world)


def train(config: ConfigDict) -> None:
  """Checks that every model the run loads is on this machine (ConfigError naming the key), then trains."""
  for key in config_lib.model_path_keys(config):
    config_lib.check_model_path(key, config_lib.get_node(config, key), must_exist=True,
                                vision_language=key == "actor_rollout_ref.model.path")
  from rljax import rl  # pylint: disable=import-outside-toplevel
  rl.run(config)


def run() -> None:
  launch.run(resolve, train, "configs/grpo.py")


if __name__ == "__main__":
  run()
