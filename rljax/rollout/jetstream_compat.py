"""Importing google-jetstream 0.2.2 on today's JAX, without side effects.

Two things need care. JetStream's orchestrator module sets the root logger
to DEBUG and adds a handler when it is imported: imports here restore the
user's root logger. And 0.2.2's orchestrator calls `jax.tree_map`, which JAX
removed (0.6); `install_tree_map_alias()` points that name at `jax.tree.map`
before a Driver runs, or its generate thread dies on the first request.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from types import ModuleType

import jax


@contextlib.contextmanager
def keep_root_logger():
  """Restores the root logger's level and handlers after the block."""
  root = logging.getLogger()
  level, handlers = root.level, list(root.handlers)
  try:
    yield
  finally:
    root.setLevel(level)
    root.handlers[:] = handlers


def import_quietly(name: str) -> ModuleType | None:
  """Imports a JetStream module (None if google-jetstream is not installed)."""
  with keep_root_logger():
    try:
      return importlib.import_module(name)
    except ImportError:
      return None


def install_tree_map_alias() -> None:
  """Gives JetStream 0.2.2 the `jax.tree_map` it calls (= `jax.tree.map`)."""
  if "tree_map" not in vars(jax):
    jax.tree_map = jax.tree.map
