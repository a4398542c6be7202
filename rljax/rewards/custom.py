"""Reward functions in a user file (`custom_reward_function`).

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

import os
from typing import Any

from rljax.utils.user_code import load_from_file


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
