"""The command line shared by `rljax.generate` and `rljax.eval`.

    python -m rljax.<tool> --config=configs/<tool>.py[:ARG] [--config.KEY=VALUE ...] [KEY=VALUE ...] [--dry_run]

Overrides take both spellings and go through the parser `rljax.train` uses
(`rljax.config.split_overrides` / `apply_overrides`), so values read as
verl's Hydra reads them, Hydra's `+KEY=VALUE` and `~KEY` work, and the last
one wins whatever its spelling. A verl YAML file (Hydra's `--config-name`)
configures only `rljax.train`, and is named as such an error here.
`--config` and `--dry_run` are read with argparse rather than absl flags, so
the entry points are plain functions (`main(argv) -> exit status`) that can
share a process with `rljax.train`'s absl flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Callable, Sequence

from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax.sharding import distributed
from rljax.utils import platforms

LOGGER_NAME = "rljax.evaluation"
# Errors of bad input (files, rows, columns, keys): printed as one line, exit status 1.
INPUT_ERRORS = (FileNotFoundError, KeyError, ValueError)


@dataclasses.dataclass(frozen=True)
class Command:
  """A parsed command line.

  Attributes:
    config: the experiment file spec (`path.py` or `path.py:ARG`).
    overrides: `KEY=VALUE` strings in command-line order.
    dry_run: print the resolved, validated config and stop.
  """

  config: str
  overrides: tuple[str, ...]
  dry_run: bool


def parse(argv: Sequence[str], prog: str, description: str) -> Command:
  """Splits out the overrides, then reads --config and --dry_run.

  Raises:
    ConfigError: an override flag without a value, or a verl YAML file
      (`--config-name`, `--config=FILE.yaml`).
    SystemExit: from argparse, for unknown arguments or a missing --config.
  """
  overrides, rest = config_lib.split_overrides(list(argv))
  yaml_file, rest = config_lib.hydra_config_file(rest)
  example = f"configs/{prog.rsplit('.', 1)[-1]}.py"
  parser = argparse.ArgumentParser(prog=prog, description=description)
  parser.add_argument("--config", required=True, help=f"experiment file, e.g. {example}")
  parser.add_argument("--dry_run", action="store_true", help="print the resolved, validated config as YAML and exit")
  args = parser.parse_args(rest if yaml_file is None else [*rest, f"--config={yaml_file}"])
  if args.config.endswith(config_lib.VERL_YAML_SUFFIXES):
    raise config_lib.ConfigError("--config", args.config, f"is a verl YAML file, which configures rljax.train, not {prog}",
                                 f"pass --config={example} and give the keys as KEY=VALUE overrides")
  return Command(config=args.config, overrides=tuple(overrides), dry_run=args.dry_run)


def resolve(command: Command, validate: Callable[[ConfigDict], ConfigDict],
            defaults: Callable[[], ConfigDict]) -> ConfigDict:
  """The experiment file's config with the overrides applied (`~KEY` restores `defaults()`'s value), validated."""
  config = config_lib.load_config_file(command.config)
  config_lib.apply_overrides(config, command.overrides, defaults=defaults)
  return validate(config)


def error_text(error: BaseException) -> str:
  """The message of an error (a KeyError's without its quotes)."""
  if isinstance(error, KeyError) and error.args:
    return str(error.args[0])
  return str(error)


def enable_progress_log() -> None:
  """Progress lines of `rljax.evaluation` to stderr (once per process)."""
  logger = logging.getLogger(LOGGER_NAME)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  if not logger.handlers:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger.addHandler(handler)


def main(argv: Sequence[str], prog: str, description: str, validate: Callable[[ConfigDict], ConfigDict],
         run: Callable[[ConfigDict], object], defaults: Callable[[], ConfigDict]) -> int:
  """Parses, resolves and validates the config, then calls `run(config)`.

  `defaults` builds the tool's config tree with its defaults (`~KEY`).

  Returns:
    The exit status: 0 done, 1 bad input (the message names file, row or
    column), 2 bad config or command line (the message names the key).
  """
  platforms.skip_absent_tpu()  # no libtpu start-up noise on a host without a TPU
  try:
    command = parse(argv, prog, description)
    config = resolve(command, validate, defaults)
  except config_lib.ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    return 2
  if command.dry_run:
    sys.stdout.write(config_lib.to_yaml(config))
    return 0
  enable_progress_log()
  try:
    if "trainer" in config:  # rljax.generate: one process per host, as rljax.train (rljax.eval runs on one)
      distributed.initialize(config)
    run(config)
  except config_lib.ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    return 2
  except INPUT_ERRORS as error:
    print(f"{prog}: error: {error_text(error)}", file=sys.stderr)
    return 1
  return 0
