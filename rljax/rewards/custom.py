"""Loading user code from a file: reward functions (and dataset classes).

`custom_reward_function.path` / `.name` name a Python file and a function in
it with verl's signature:

    def compute_score(data_source, solution_str, ground_truth, extra_info=None,
                      **kwargs) -> float | dict

A dict result must hold a "score" key; its other keys are reported per
sample (reward_extra_info). For `reward_manager: batch` the function takes
lists instead: `compute_score(data_sources, solution_strs, ground_truths,
extra_infos, **kwargs) -> list[float | dict]`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any


def load_from_file(path: str, name: str, what: str) -> Any:
  """The attribute `name` of the Python file at `path`.

  The module is imported once per process under a name derived from the
  file's absolute path, so objects defined in it pickle by reference in this
  process.

  Raises:
    FileNotFoundError: naming the path.
    AttributeError: naming `name` and listing what the file defines.
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
  if not hasattr(module, name):
    defined = sorted(n for n in vars(module) if not n.startswith("_"))
    raise AttributeError(
        f"{what}: {name!r} not found in {path}; it defines {defined}")
  return getattr(module, name)


class FileFunction:
  """A function in a user file, picklable (by path) for worker processes.

  Calling it calls the function with `reward_kwargs` added.
  """

  def __init__(self, path: str, name: str = "compute_score",
               reward_kwargs: dict[str, Any] | None = None):
    self.path = os.path.abspath(os.path.expanduser(path))
    self.name = name
    self.reward_kwargs = dict(reward_kwargs or {})
    self._fn = None
    self._load()

  def _load(self) -> Any:
    if self._fn is None:
      fn = load_from_file(self.path, self.name, "custom_reward_function")
      if not callable(fn):
        raise TypeError(f"custom_reward_function {self.name!r} in {self.path} "
                        "is not callable")
      self._fn = fn
    return self._fn

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    return self._load()(*args, **{**self.reward_kwargs, **kwargs})

  def __getstate__(self) -> dict[str, Any]:
    return {"path": self.path, "name": self.name,
            "reward_kwargs": self.reward_kwargs, "_fn": None}

  def __repr__(self) -> str:
    return f"FileFunction({self.path!r}, {self.name!r})"
