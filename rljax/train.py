"""The training entry point.

    python -m rljax.train --config=configs/grpo.py[:PRESET] [--config.KEY=VALUE ...] [KEY=VALUE ...]

`--config` names an experiment file (`get_config(arg)`; `:ARG` picks a
preset), spelled as ml_collections' config_flags spells it. Overrides come in
two spellings that mean the same thing: `--config.data.train_batch_size=64`
and verl's positional `data.train_batch_size=64`, so a verl launch line
pastes over. Both go through one parser (`rljax.config.apply_overrides`) that
reads values as verl's Hydra does (`[console,tensorboard]`, `true`, `null`,
`1e-6`); config_flags' own override parser is not used because it cannot set
list-valued keys such as `trainer.logger`. `--dry_run` prints the resolved,
validated config as YAML and exits.
"""

import sys
from typing import Sequence

from absl import app, flags

from rljax import config as config_lib
from rljax import sharding

_CONFIG = flags.DEFINE_string(
    "config", None, "Experiment file, e.g. configs/grpo.py or configs/grpo.py:PRESET.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the resolved, validated config as YAML and exit.")

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


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    print(f"unexpected arguments {argv[1:]}: overrides are KEY=VALUE or --config.KEY=VALUE", file=sys.stderr)
    return 2
  if _CONFIG.value is None:
    print("--config is required, e.g. --config=configs/grpo.py", file=sys.stderr)
    return 2
  try:
    config = resolve(config_lib.load_config_file(_CONFIG.value), _OVERRIDES, distributed=not _DRY_RUN.value)
  except config_lib.ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    return 2
  if _DRY_RUN.value:
    sys.stdout.write(config_lib.to_yaml(config))
    return 0
  from rljax.trainer import loop  # pylint: disable=import-outside-toplevel
  loop.run(config)
  return 0


def run() -> None:
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
