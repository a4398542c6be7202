"""User code named in a config: an attribute of a Python file (a reward function, a dataset class, a tool class).

The file is imported once per process under a module name derived from its
absolute path, so the objects it defines pickle by reference (the reward
scorer's worker processes load them again from the path).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any


def load_module(path: str, what: str) -> Any:
  """The Python file at `path` as a module, imported once per process under a name derived from the file's
  absolute path (so objects defined in it pickle by reference in this process).

  Raises:
    FileNotFoundError: naming the path.
  """
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{what} file not found: {path}")
  digest = hashlib.sha1(path.encode()).hexdigest()[:12]
  module_name = f"rljax_user_{digest}"
  module = sys.modules.get(module_name)
  if module is None:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
      raise ImportError(f"cannot import {what} file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
      spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[module_name]
      raise
  return module


def load_from_file(path: str, name: str, what: str) -> Any:
  """The attribute `name` of the Python file at `path` (`load_module`).

  Raises:
    FileNotFoundError: naming the path.
    AttributeError: naming `name` and listing what the file defines.
  """
  path = os.path.abspath(os.path.expanduser(path))
  module = load_module(path, what)
  if not hasattr(module, name):
    defined = sorted(n for n in vars(module) if not n.startswith("_"))
    raise AttributeError(
        f"{what}: {name!r} not found in {path}; it defines {defined}")
  return getattr(module, name)
