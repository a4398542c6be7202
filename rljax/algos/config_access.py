"""Reading verl-style config nodes (ConfigDict, dict, dataclass, object) by attribute."""

from typing import Any


def config_get(config: Any, name: str, default: Any = None) -> Any:
  """`config.name`, or `default` when the node or the key is absent (None stays None)."""
  if config is None:
    return default
  getter = getattr(config, "get", None)
  if callable(getter):
    return getter(name, default)
  return getattr(config, name, default)


def config_value(config: Any, key: str, default: Any) -> Any:
  """`config.key`, with both an absent key and a None value giving `default`."""
  value = config_get(config, key, default)
  return default if value is None else value
