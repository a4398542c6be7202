"""The error every configuration check raises, and the marker of a key shown without a value."""

from __future__ import annotations

from typing import Any

NO_VALUE = object()


class ConfigError(ValueError):
  """A bad configuration value: names the key path, the value and the fix."""

  def __init__(self, key: str, value: Any, problem: str, fix: str):
    self.key, self.value, self.problem, self.fix = key, value, problem, fix
    shown = key if value is NO_VALUE else f"{key}={value!r}"
    super().__init__(f"{shown}: {problem}. Fix: {fix}")
