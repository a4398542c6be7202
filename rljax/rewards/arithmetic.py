"""Reward for rljax's synthetic arithmetic task: the response's last number.

A response is right when its last number equals the ground truth as a number
("The answer is 1,000." and "1000.0" both match "1000"). A response with a
number that is wrong earns `format_score`; one with no number earns 0.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
  """The value of the last number in `text`, or None."""
  for token in reversed(_NUMBER.findall(text)):
    try:
      return float(token.replace(",", ""))
    except ValueError:
      continue
  return None


def compute_score(solution_str: str, ground_truth: str,
                  format_score: float = 0.0, score: float = 1.0) -> float:
  """`score` if right, `format_score` if wrong, 0 with no number at all."""
  answer = last_number(solution_str)
  if answer is None:
    return 0.0
  return score if answer == float(str(ground_truth).replace(",", "")) \
      else format_score
