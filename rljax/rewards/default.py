"""`default_compute_score`: a row's rule reward, chosen by its data_source."""

from __future__ import annotations

import functools
from typing import Any, Callable

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
