"""YAML as verl writes it: reading text with OmegaConf's float rule, writing the resolved tree and single values."""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from ml_collections import ConfigDict


def to_plain(config: ConfigDict) -> dict:
  """The resolved tree as plain Python (references followed, lists as lists)."""
  def plain(value):
    if isinstance(value, dict):
      return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
      return str(value)
    return value
  return plain(config.to_dict())


def format_value(value: Any) -> str:
  """A value as YAML flow text: null, true, 1e-06, [a, b], {k: v}."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, str):
    return value if value else "''"
  if isinstance(value, (list, tuple)):
    return "[" + ", ".join(format_value(v) for v in value) + "]"
  if isinstance(value, (dict, ConfigDict)):
    return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
  return repr(value)


def to_yaml(config: ConfigDict) -> str:
  """The resolved config as YAML in verl's layout (ppo_trainer.yaml keys)."""
  return yaml.safe_dump(to_plain(config), sort_keys=False, default_flow_style=None, width=100)


class YamlLoader(yaml.SafeLoader):
  """YAML as OmegaConf (verl) reads it: `1e-6` is a float (PyYAML alone reads a string)."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def parse_yaml(text: str) -> Any:
  """Parses YAML text with OmegaConf's float rule (verl's files write `lr: 1e-6`)."""
  return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)
