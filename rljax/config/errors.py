"""The error every configuration check raises, the checks' smallest helpers, and the marker of a key shown
without a value.

Packages below the config (sharding, models, rollout, ...) import this
module alone from it: it imports nothing from rljax."""

from __future__ import annotations

from typing import Any

NO_VALUE = object()


class ConfigError(ValueError):
  """A bad configuration value: names the key path, the value and the fix."""

  def __init__(self, key: str, value: Any, problem: str, fix: str):
    self.key, self.value, self.problem, self.fix = key, value, problem, fix
    shown = key if value is NO_VALUE else f"{key}={value!r}"
    super().__init__(f"{shown}: {problem}. Fix: {fix}")


def is_int(value: Any) -> bool:
  """An integer that is not a bool."""
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """An int or a float that is not a bool."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(ok: bool, key: str, value: Any, problem: str, fix: str) -> None:
  """Raises `ConfigError(key, value, problem, fix)` unless `ok`."""
  if not ok:
    raise ConfigError(key, value, problem, fix)
