"""The command line `python -m rljax.train` and `python -m rljax.sft` share.

    python -m rljax.{train,sft} --config=FILE[:PRESET] [--config.KEY=VALUE ...] [KEY=VALUE ...] [--dry_run]
    python -m rljax.train --config-path=DIR --config-name=NAME [KEY=VALUE ...]

`--config` names an experiment file (`get_config(arg)`; `:ARG` picks a
preset), spelled as ml_collections' config_flags spells it. Overrides come in
two spellings that mean the same thing: `--config.data.train_batch_size=64`
and verl's positional `data.train_batch_size=64`, so a verl launch line
pastes over. Both go through one parser (`rljax.config.apply_overrides`) that
reads values as verl's Hydra does (`[console,tensorboard]`, `true`, `null`,
`1e-6`, `{a: 1}`); config_flags' own override parser is not used because it
cannot set list-valued keys such as `trainer.logger`. Hydra's `+KEY=VALUE`
and `++KEY=VALUE` set a key (adding one only below a free-form dictionary),
`~KEY` resets it to its default. Hydra's `--config-path DIR --config-name
NAME` loads the verl YAML file DIR/NAME.yaml (DIR defaults to configs/) as
`--config=configs/verl_yaml.py:DIR/NAME.yaml` does (rljax.train only).
`--dry_run` prints the resolved, validated config as YAML and exits.
"""

import functools
import sys
from typing import Callable, Sequence

from absl import app, flags
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax.sharding import failures
from rljax.utils import platforms

CONFIG = flags.DEFINE_string("config", None, "Experiment file, e.g. configs/grpo.py or configs/grpo.py:PRESET.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved, validated config as YAML and exit.")

_OVERRIDES: list[str] = []

# resolve(config, overrides, distributed=...) -> the resolved, validated config.
Resolve = Callable[..., ConfigDict]


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl flag parser that first takes out the overrides, and reads Hydra's `--config-name` as `--config=FILE.yaml`.

  It runs before the tool touches JAX's devices, so it also keeps JAX from starting libtpu on a host with no
  TPU (`rljax.utils.platforms`).
  """
  platforms.skip_absent_tpu()
  try:
    overrides, rest = config_lib.split_overrides(argv[1:])
    yaml_file, rest = config_lib.hydra_config_file(rest)
  except config_lib.ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    sys.exit(2)
  if yaml_file is not None:
    rest.append(f"--config={yaml_file}")
  _OVERRIDES[:] = overrides
  try:
    return flags.FLAGS([argv[0], *rest])
  except flags.Error as error:
    print(f"{error}\nPass --helpfull to see the flags.", file=sys.stderr)
    sys.exit(2)


def overrides() -> list[str]:
  """The KEY=VALUE overrides `parse_flags` took out of the command line."""
  return list(_OVERRIDES)


def _load(example: str, reads_verl_yaml: bool) -> ConfigDict:
  """The config `--config` names; a verl YAML file only where the tool reads the RL tree."""
  if not reads_verl_yaml and CONFIG.value.endswith(config_lib.VERL_YAML_SUFFIXES):
    raise config_lib.ConfigError("--config", CONFIG.value, "is a verl YAML file, which configures rljax.train",
                                 f"pass --config={example} and give the keys as KEY=VALUE overrides")
  return config_lib.load_config_file(CONFIG.value)


def quiet_by_default() -> None:
  """Library INFO logs (orbax's checkpointing, JAX's start-up) behind absl's verbosity: `app.run` turns INFO on
  when the command line does not set it, and this turns it back to WARNING, so that the console holds the progress
  bar, the step lines and the warnings. `--verbosity=0` (or `-v 0`) shows INFO again."""
  if not flags.FLAGS["verbosity"].present:
    flags.FLAGS.verbosity = -1


def main(argv: Sequence[str], resolve: Resolve, train: Callable[[ConfigDict], object], example: str,
         reads_verl_yaml: bool = True) -> int:
  """Resolves the config from the flags, then prints it (--dry_run) or trains; returns the exit status.

  A ConfigError, from resolving or from `train` (a model path that is not
  there), is printed as one line with exit status 2.
  """
  quiet_by_default()
  if len(argv) > 1:
    print(f"unexpected arguments {argv[1:]}: overrides are KEY=VALUE or --config.KEY=VALUE", file=sys.stderr)
    return 2
  if CONFIG.value is None:
    print(f"--config is required, e.g. --config={example}", file=sys.stderr)
    return 2
  try:
    config = resolve(_load(example, reads_verl_yaml), _OVERRIDES, distributed=not _DRY_RUN.value)
    if _DRY_RUN.value:
      sys.stdout.write(config_lib.to_yaml(config))
      return 0
    train(config)
  except Exception as error:  # pylint: disable=broad-except
    if failures.joined():  # one process of several: the others stop too (a file missing on one host)
      failures.fail(error, lambda: None)
    if not isinstance(error, config_lib.ConfigError):
      raise
    print(f"config error: {error}", file=sys.stderr)
    return 2
  return 0


def run(resolve: Resolve, train: Callable[[ConfigDict], object], example: str, reads_verl_yaml: bool = True) -> None:
  """Parses sys.argv and runs `main`; exits with its status.

  Args:
    resolve: overrides, finalize and validate (`rljax.train.resolve`).
    train: runs the resolved config.
    example: the experiment file named in messages.
    reads_verl_yaml: whether a verl YAML file (`--config-name`) configures this tool.
  """
  app.run(functools.partial(main, resolve=resolve, train=train, example=example, reads_verl_yaml=reads_verl_yaml),
          flags_parser=parse_flags)
