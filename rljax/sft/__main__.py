"""The SFT entry point.

    python -m rljax.sft --config=configs/sft.py[:PRESET] [--config.KEY=VALUE ...] [KEY=VALUE ...]

The same command line as `python -m rljax.train` (`rljax.launch`):
`--config` names an experiment file whose `get_config(arg)` returns an SFT
config (`rljax.sft.get_sft_config()` plus changes), and overrides come as
`--config.data.max_length=512` or verl's `data.max_length=512`. `--dry_run`
prints the resolved, validated config as YAML and exits.
"""

from typing import Sequence

from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import launch, sharding
from rljax.sft import config as sft_config


def resolve(config, overrides: Sequence[str], device_count: int | None = None, distributed: bool = False):
  """Overrides -> (multi-host start-up) -> deprecated keys and aliases -> validation."""
  config_lib.apply_overrides(config, overrides, defaults=sft_config.get_sft_config)
  if distributed:
    sharding.initialize(config)
  sft_config.finalize(config, device_count)
  return sft_config.validate(config, sharding.resolve_world_size(config, device_count))


def train(config: ConfigDict) -> None:
  """Checks that model.partial_pretrain is on this machine (ConfigError naming it), then trains."""
  config_lib.check_model_path("model.partial_pretrain", config.model.partial_pretrain, must_exist=True,
                              vision_language=True)
  from rljax.sft import trainer  # pylint: disable=import-outside-toplevel
  trainer.run(config)


if __name__ == "__main__":
  launch.run(resolve, train, "configs/sft.py", reads_verl_yaml=False)
