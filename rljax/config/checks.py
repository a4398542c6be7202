"""The public check helpers: each raises a `ConfigError` naming the key, the value and the fix.

rljax's RL (`validation`), SFT and evaluation configs are checked with them.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from typing import Any, Sequence

from ml_collections import ConfigDict

from rljax.config.errors import ConfigError, check
from rljax.config.fields import get_node


def check_enum(config: ConfigDict, key: str, allowed: Sequence[str]) -> None:
  """`key` holds one of `allowed`; the error suggests the closest one."""
  value = get_node(config, key)
  if value not in allowed:
    near = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise ConfigError(key, value, f"must be one of {', '.join(allowed)}", f"{hint}set {key} to one of them")


def check_positive(config: ConfigDict, key: str, allow_zero: bool = False) -> None:
  """`key` holds a number > 0 (>= 0 with `allow_zero`)."""
  value = get_node(config, key)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
      value >= 0 if allow_zero else value > 0)
  check(ok, key, value, "must be " + ("non-negative" if allow_zero else "positive"), f"set {key} to a value {'>= 0' if allow_zero else '> 0'}")


def check_range(config: ConfigDict, key: str, lo: float, hi: float, lo_open: bool = False) -> None:
  """`key` holds a number in [lo, hi] ((lo, hi] with `lo_open`)."""
  value = get_node(config, key)
  ok = value is not None and (lo < value if lo_open else lo <= value) and value <= hi
  check(ok, key, value, f"must lie in {'(' if lo_open else '['}{lo}, {hi}]", f"set {key} inside that range")


def check_data_files(config: ConfigDict, key: str, required: bool = True) -> None:
  """`key` holds one parquet path or a list of them (verl mixes data sets with a list).

  Args:
    config: the tree.
    key: data.train_files or data.val_files.
    required: without it, null or an empty value (no such data) passes.

  Raises:
    ConfigError: naming `key`.
  """
  files = get_node(config, key)
  if not required and not files:
    return
  paths = [files] if isinstance(files, str) else files
  ok = isinstance(paths, (list, tuple)) and bool(paths) and all(isinstance(p, str) and p for p in paths)
  check(ok, key, files, "must be a parquet file or a list of them", f"e.g. {key}=[a.parquet,b.parquet]")


# A Hugging Face Hub repository id: ORG/NAME.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def vision_language_type(path: Any) -> str | None:
  """The model type of the vision-language model directory `path` names (its config.json's), else None."""
  from rljax.models.config import VISION_LANGUAGE_TYPES, model_type_of  # pylint: disable=import-outside-toplevel
  if not isinstance(path, str):
    return None
  config_file = os.path.join(os.path.expanduser(path), "config.json")
  if not os.path.isfile(config_file):
    return None
  try:
    with open(config_file) as f:
      model_type = model_type_of(json.load(f))
  except (OSError, ValueError, AttributeError):
    return None  # an unreadable config.json is reported where the model loads
  return model_type if model_type in VISION_LANGUAGE_TYPES else None


def mtp_layers_of(path: Any) -> int | None:
  """The multi-token prediction layers of the model directory `path` names (a MiMo config.json's
  num_nextn_predict_layers; 0 for any other model), else None (no readable config.json)."""
  from rljax.models.config import model_type_of  # pylint: disable=import-outside-toplevel
  config_file = os.path.join(os.path.expanduser(path), "config.json") if isinstance(path, str) else ""
  if not os.path.isfile(config_file):
    return None
  try:
    with open(config_file) as f:
      hf = json.load(f)
    return int(hf.get("num_nextn_predict_layers") or 0) if model_type_of(hf) == "mimo" else 0
  except (OSError, ValueError, AttributeError, TypeError):
    return None  # an unreadable config.json is reported where the model loads


def _check_text_model(key: str, path: str) -> None:
  """Raises a ConfigError naming `key` when `path` is a model directory of a vision-language model (only the RL
  actor and the SFT model are fed images)."""
  model_type = vision_language_type(path)
  if model_type is not None:
    raise ConfigError(key, path, f"is a vision-language model ({model_type}): rljax trains one as the RL actor "
                      "(actor_rollout_ref.model.path) and the SFT model; as this model (evaluation, a critic or "
                      "reward model) it is not implemented yet", "use a text model here")


def check_model_path(key: str, path: Any, must_exist: bool = False, vision_language: bool = False) -> None:
  """Raises a ConfigError naming `key` unless `path` names a model rljax can read.

  rljax reads a local directory, a .gguf file or one of its aliases
  (`rljax.models.api.ALIASES`) and downloads nothing. A Hugging Face Hub id
  (`ORG/NAME` with no such local path) is always an error; another missing
  path only with `must_exist` (when a run starts): presets name
  `~/models/...` directories that need not exist where a config is only
  validated, printed or compiled (rljax.compile knows architectures by name).
  A directory holding a vision-language model is refused unless
  `vision_language` (the RL actor's).

  Args:
    key: the key holding the path, for the message.
    path: its value.
    must_exist: also reject a missing local path.
    vision_language: a vision-language model may be named here.
  """
  from rljax.models.api import ALIASES  # pylint: disable=import-outside-toplevel
  if isinstance(path, str) and not vision_language:
    _check_text_model(key, path)
  if not isinstance(path, str) or path.lower() in ALIASES or os.path.exists(os.path.expanduser(path)):
    return
  hub = _HUB_ID.match(path) is not None
  if not (hub or must_exist):
    return
  local = f"~/models/{path.rsplit('/', 1)[-1]}" if hub else path
  raise ConfigError(key, path, f"is not a local directory, a .gguf file or an alias ({', '.join(ALIASES)}); "
                    "rljax downloads no weights",
                    f"huggingface-cli download {path if hub else 'ORG/NAME'} --local-dir {local}, "
                    f"then set {key}={local}")
