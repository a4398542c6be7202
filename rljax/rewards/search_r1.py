"""Search-R1 QA reward (verl's `search_r1_like_qa_em`): exact match of the
last `<answer>...</answer>`.

The answer is the (stripped) text of the response's last
`<answer>...</answer>` pair, newlines allowed inside. It and each golden
answer are normalised as in SQuAD's evaluation: lower case, ASCII
punctuation removed, the articles "a", "an", "the" removed, whitespace
collapsed. A match with any golden answer scores `score`, divided by 4 when
the response holds more than 10 `<answer>` or `</answer>` tags; a wrong
answer scores `format_score`; no answer scores 0.

The ground truth is the row's `{"target": answers}`, `answers` one string or
a sequence of strings.
"""

from __future__ import annotations

import re
import string
from typing import Any, Iterable, Mapping

MAX_TAGS = 10
_OPEN, _CLOSE = "<answer>", "</answer>"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
  """Lower case, no punctuation, no articles, single spaces."""
  text = text.lower().translate(_PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def golden_answers(ground_truth: Mapping[str, Any]) -> list[str]:
  """The golden answers in `ground_truth["target"]` as a list."""
  target = ground_truth["target"]
  return [target] if isinstance(target, str) else list(target)


def exact_match(prediction: str, golden: Iterable[str]) -> bool:
  """Whether `prediction` equals any golden answer after normalisation."""
  pred = normalize_answer(prediction)
  return any(normalize_answer(g) == pred for g in golden)


def extract_solution(solution_str: str) -> str | None:
  """The stripped content of the last `<answer>...</answer>`, or None.

  Pairs are read left to right, each `<answer>` closed by the first
  `</answer>` after it (verl's non-greedy regex), in linear time.
  """
  last = None
  pos = 0
  while True:
    start = solution_str.find(_OPEN, pos)
    if start < 0:
      break
    end = solution_str.find(_CLOSE, start + len(_OPEN))
    if end < 0:
      break
    last = solution_str[start + len(_OPEN):end]
    pos = end + len(_CLOSE)
  return None if last is None else last.strip()


def compute_score(solution_str: str, ground_truth: Mapping[str, Any],
                  format_score: float = 0.0, score: float = 1.0) -> float:
  """`score` (/4 with too many tags) if right, `format_score` if wrong, 0 if
  there is no answer."""
  answer = extract_solution(solution_str)
  if answer is None:
    return 0.0
  if not exact_match(answer, golden_answers(ground_truth)):
    return format_score
  tags = max(solution_str.count(_OPEN), solution_str.count(_CLOSE))
  return score / 4 if tags > MAX_TAGS else score
