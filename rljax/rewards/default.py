"""`default_compute_score`: a row's rule reward, chosen by its data_source."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import pyarrow.parquet as pq

from rljax.rewards import arithmetic
from rljax.rewards import gsm8k
from rljax.rewards import math_answer

SYNTHETIC_ARITHMETIC = "rljax/arithmetic"

_SCORERS: dict[str, Callable[[str, str], float]] = {
    "openai/gsm8k": gsm8k.compute_score,
    "lighteval/MATH": math_answer.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math_answer.compute_score,
    "HuggingFaceH4/MATH-500": math_answer.compute_score,
    SYNTHETIC_ARITHMETIC: arithmetic.compute_score,
}


def known_data_sources() -> list[str]:
  """The data_source values `default_compute_score` can score."""
  return sorted(_SCORERS)


def first_unknown_source(sources: Iterable[Any]) -> tuple[int, Any] | None:
  """(row, data_source) of the first row no built-in scorer handles, or None."""
  for row, source in enumerate(sources):
    if source not in _SCORERS:
      return row, source
  return None


def check_data_sources(files: Iterable[str]) -> None:
  """Fails up front when a parquet row's data_source has no built-in scorer.

  Without `custom_reward_function.path` every row is scored by
  `default_compute_score`; an unknown data_source would score 0 on every
  step instead of training. Files without a data_source column are left to
  the data loader's own checks.

  Raises:
    ValueError: naming the file, row and data_source, and the fix.
  """
  for file in files:
    schema = pq.read_schema(file)
    if "data_source" not in schema.names:
      continue
    column = pq.read_table(file, columns=["data_source"]).column("data_source").to_pylist()
    unknown = first_unknown_source(column)
    if unknown is not None:
      row, source = unknown
      raise ValueError(
          f"{file}: row {row} has data_source {source!r}, which no built-in reward scores "
          f"(built-in: {known_data_sources()}). Set custom_reward_function.path (and .name) to a "
          "function that scores it, or enable reward_model.")


def default_compute_score(data_source: str, solution_str: str,
                          ground_truth: Any, extra_info: Any = None,
                          **kwargs: Any) -> float:
  """The rule score of one response, like verl's default_compute_score.

  Args:
    data_source: the row's data_source; selects the scorer.
    solution_str: the decoded response.
    ground_truth: reward_model["ground_truth"].
    extra_info: the row's extra_info (unused by the built-in scorers).
    **kwargs: passed to the scorer (e.g. method="flexible" for gsm8k).

  Returns:
    The score as a float.

  Raises:
    NotImplementedError: for a data_source with no built-in scorer.
  """
  del extra_info
  scorer = _SCORERS.get(data_source)
  if scorer is None:
    raise NotImplementedError(
        f"no built-in reward for data_source {data_source!r}; built-in: "
        f"{known_data_sources()}. Set custom_reward_function.path to score it.")
  if kwargs:
    scorer = functools.partial(scorer, **kwargs)
  return float(scorer(solution_str, str(ground_truth)))
