"""The SFT entry point.

    python -m rljax.sft --config=configs/sft.py[:PRESET] [--config.KEY=VALUE ...] [KEY=VALUE ...]

The same command line as `python -m rljax.train`: `--config` names an
experiment file whose `get_config(arg)` returns an SFT config
(`rljax.sft.get_sft_config()` plus changes), and overrides come as
`--config.data.max_length=512` or verl's `data.max_length=512`, read by
`rljax.config`'s parser. `--dry_run` prints the resolved, validated config
as YAML and exits.
"""

import sys
from typing import Sequence

from absl import app, flags

from rljax import config as config_lib
from rljax import sharding
from rljax.sft import config as sft_config

_CONFIG = flags.DEFINE_string("config", None, "Experiment file, e.g. configs/sft.py or configs/sft.py:PRESET.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved, validated config as YAML and exit.")

_OVERRIDES: list[str] = []


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flag parser that first takes out both override syntaxes."""
  try:
    overrides, rest = config_lib.split_overrides(argv[1:])
  except config_lib.ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    sys.exit(2)
  _OVERRIDES[:] = overrides
  try:
    return flags.FLAGS([argv[0], *rest])
  except flags.Error as error:
    print(f"{error}\nPass --helpfull to see the flags.", file=sys.stderr)
    sys.exit(2)


def resolve(config, overrides: Sequence[str], device_count: int | None = None, distributed: bool = False):
  """Overrides -> (multi-host start-up) -> deprecated keys and aliases -> validation."""
  config_lib.apply_overrides(config, overrides)
  if distributed:
    sharding.initialize(config)
  sft_config.finalize(config, device_count)
  return sft_config.validate(config, config_lib.resolve_world_size(config, device_count))


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    print(f"unexpected arguments {argv[1:]}: overrides are KEY=VALUE or --config.KEY=VALUE", file=sys.stderr)
    return 2
  if _CONFIG.value is None:
    print("--config is required, e.g. --config=configs/sft.py", file=sys.stderr)
    return 2
  try:
    config = resolve(config_lib.load_config_file(_CONFIG.value), _OVERRIDES, distributed=not _DRY_RUN.value)
  except config_lib.ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    return 2
  if _DRY_RUN.value:
    sys.stdout.write(config_lib.to_yaml(config))
    return 0
  from rljax.sft import trainer  # pylint: disable=import-outside-toplevel
  trainer.run(config)
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
