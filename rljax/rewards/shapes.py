"""Reward for the synthetic shapes task (data_source "rljax/shapes"): the response names the colour and shape.

A response is right when, lowercased and with punctuation dropped, its words are exactly the ground truth's
("Red circle." matches "red circle"; "a red circle" does not: the task asks for the two words).
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
  """The lowercase words of `text`, punctuation dropped."""
  return _WORD.findall(text.lower())


def compute_score(solution_str: str, ground_truth: str) -> float:
  """1.0 when the response's words are the ground truth's, else 0.0."""
  return 1.0 if words(solution_str) == words(ground_truth) else 0.0
