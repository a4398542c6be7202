"""Where a run's config comes from on the command line: experiment files, Hydra's YAML flags, overrides."""

from __future__ import annotations

import os
import re
from typing import Sequence

from ml_collections import ConfigDict

from rljax.config import verl_yaml
from rljax.config.errors import NO_VALUE, ConfigError

# Hydra's flags that pick a YAML file; --config-name alone reads it from here.
HYDRA_CONFIG_FLAGS = ("--config-path", "--config-name")
HYDRA_CONFIG_DIR = "configs"
# --config-path values of verl's lines that name its own trainer configs (relative to verl/trainer, as Hydra reads
# them), and none
VERL_CONFIG_PATHS = ("config", "config/", HYDRA_CONFIG_DIR)
VERL_YAML_SUFFIXES = (".yaml", ".yml")

_CONFIG_ARG = re.compile(r"^--config\.(?P<path>[^=]+)(=(?P<value>.*))?$")
_VERL_ARG = re.compile(r"^(\+\+?|~)?[A-Za-z_][\w\-]*(\.[\w\-]+)*=")
_DELETE_ARG = re.compile(r"^~[A-Za-z_][\w\-]*(\.[\w\-]+)*$")


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates config overrides from the other command-line arguments.

  Both `--config.KEY=VALUE` (also `--config.KEY VALUE`) and verl's positional
  `KEY=VALUE` become `KEY=VALUE` strings, kept in command-line order so the
  last one wins whatever its syntax. Hydra's `+KEY=VALUE`, `++KEY=VALUE`
  and `~KEY[=VALUE]` are kept as they are (`apply_overrides` reads them).

  Returns:
    (overrides, remaining arguments for absl).
  """
  overrides, rest = [], []
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    match = _CONFIG_ARG.match(arg)
    if match:
      value = match.group("value")
      if value is None:
        if i + 1 >= len(args):
          raise ConfigError(match.group("path"), NO_VALUE, "the flag has no value", f"write --config.{match.group('path')}=VALUE")
        i += 1
        value = args[i]
      overrides.append(f"{match.group('path')}={value}")
    elif _VERL_ARG.match(arg) or _DELETE_ARG.match(arg):
      overrides.append(arg)
    else:
      rest.append(arg)
    i += 1
  return overrides, rest


def _flag_values(argv: Sequence[str], names: Sequence[str]) -> tuple[dict[str, str], list[str]]:
  """Takes the flags `names` (`--NAME=VALUE` or `--NAME VALUE`) out of `argv` -> (values, the rest)."""
  values, rest = {}, []
  args = list(argv)
  i = 0
  while i < len(args):
    flag, equals, value = args[i].partition("=")
    if flag not in names:
      rest.append(args[i])
    elif equals:
      values[flag] = value
    elif i + 1 < len(args):
      i += 1
      values[flag] = args[i]
    else:
      raise ConfigError(flag, NO_VALUE, "the flag has no value", f"write {flag}=VALUE")
    i += 1
  return values, rest


def hydra_config_file(argv: Sequence[str]) -> tuple[str | None, list[str]]:
  """Takes Hydra's `--config-path DIR --config-name NAME` out of the command line.

  verl launch lines pick their YAML file this way; `--config-name` alone
  reads it from `configs/`, and NAME may leave out `.yaml`. verl's own trainer
  configs (`ppo_trainer`, `ppo_megatron_trainer`: verl's lines name them with
  `--config-path=config`, which Hydra reads in verl's package) are rljax's
  where DIR is that (`VERL_CONFIG_PATHS`) and holds no such file
  (`verl_yaml.TRAINER_CONFIGS`).

  Returns:
    (DIR/NAME.yaml, `verl:NAME.yaml` for verl's trainer config, or None without
    those flags; the other arguments).

  Raises:
    ConfigError: a flag without a value, --config-path without
      --config-name, --config given as well, or no such file.
  """
  values, rest = _flag_values(argv, HYDRA_CONFIG_FLAGS)
  if not values:
    return None, rest
  name = values.get("--config-name")
  if name is None:
    raise ConfigError("--config-path", values["--config-path"], "names a directory but not the file in it",
                      "add --config-name=NAME, the YAML file's name")
  if any(arg == "--config" or arg.startswith("--config=") for arg in rest):
    raise ConfigError("--config-name", name, "--config names an experiment as well",
                      "use one: --config=FILE.py[:PRESET], or --config-path=DIR --config-name=NAME for a verl YAML file")
  file = name if name.endswith(VERL_YAML_SUFFIXES) else name + ".yaml"
  directory = values.get("--config-path", HYDRA_CONFIG_DIR)
  path = os.path.join(directory, file)
  found = os.path.isfile(os.path.expanduser(path))
  if not found and os.path.splitext(file)[0] in verl_yaml.TRAINER_CONFIGS and directory in VERL_CONFIG_PATHS:
    return f"{verl_yaml.TRAINER_CONFIG_PREFIX}{file}", rest  # verl's own, which Hydra finds in verl's package
  if not found:
    raise ConfigError("--config-name", name, f"no such YAML file {path}",
                      "give --config-path the directory that holds it (default: configs)")
  return path, rest


def load_config_file(spec: str) -> ConfigDict:
  """Imports an experiment file and returns its `get_config(arg)`.

  Args:
    spec: `path/to/file.py` or `path/to/file.py:ARG` (ml_collections'
      config_flags spelling; ARG picks a preset), or a verl YAML file
      (`FILE.yaml`), loaded as `configs/verl_yaml.py:FILE.yaml` loads it.
  """
  import importlib.util  # pylint: disable=import-outside-toplevel

  if spec.endswith(VERL_YAML_SUFFIXES) and (os.path.isfile(os.path.expanduser(spec))
                                            or spec.startswith(verl_yaml.TRAINER_CONFIG_PREFIX)):
    return verl_yaml.load_file(spec)
  path, _, arg = spec.partition(":")
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise ConfigError("--config", spec, "no such file", "pass an experiment file such as configs/grpo.py")
  module_spec = importlib.util.spec_from_file_location(
      "rljax_experiment_" + re.sub(r"\W", "_", os.path.abspath(path)), path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError("--config", spec, "defines no get_config(arg=None)", "add def get_config(arg=None) returning a ConfigDict")
  config = module.get_config(arg) if arg else module.get_config()
  if not isinstance(config, ConfigDict):
    raise ConfigError("--config", spec, f"get_config returned {type(config).__name__}", "return a ConfigDict built from rljax.config.get_base_config()")
  return config
