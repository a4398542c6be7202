"""GSM8K rule reward: the number after "####" (strict) or the last number.

Only the last 300 characters of a response are searched (a GSM8K answer
comes at the end, and the regex then stays fast on long responses). Both the
extracted answer and the ground truth are compared after removing thousands
separators, "$" and a trailing ".", so "#### 1,200." matches "1200".
"""

from __future__ import annotations

import re

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"-?[0-9.,]+")


def normalize_number(text: str) -> str:
  """"1,200." -> "1200"; "$5" -> "5"."""
  return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
  """The answer in a response, or None.

  Args:
    solution_str: the decoded response.
    method: "strict": the last "#### N" (the format GSM8K teaches);
      "flexible": the last number anywhere.

  Returns:
    The answer with separators removed, or None when there is none.
  """
  if method not in ("strict", "flexible"):
    raise ValueError(f"method {method!r}: expected 'strict' or 'flexible'")
  tail = solution_str[-CLIP_CHARS:]
  pattern = _STRICT if method == "strict" else _FLEXIBLE
  for candidate in reversed(pattern.findall(tail)):
    answer = normalize_number(candidate)
    if answer and answer not in (".", "-"):
      return answer
  return None


def compute_score(solution_str: str, ground_truth: str, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
  """`score` for the right answer, `format_score` for a wrong one, else 0."""
  answer = extract_solution(solution_str, method)
  if answer is None:
    return 0.0
  right = answer == normalize_number(str(ground_truth))
  return score if right else format_score
