"""GSM8K rule reward (verl's `gsm8k`): the number after "####" (strict) or
the last number (flexible), compared with the ground truth as a string.

Only the last 300 characters of a response are searched (a GSM8K answer
comes at the end, and the regex then stays fast on long responses). As in
verl, a number is a run of digits, "." and "," (with an optional leading
"-"):

- strict removes "," (and "$") from the answer, so "#### 1,200" matches
  "1200"; a trailing "." stays, so "#### 42." does not match "42";
- flexible takes the last such run that is not "" or "." verbatim, commas
  and trailing dots included ("So it is 7." gives "7.").

The ground truth is compared as given (verl's GSM8K data holds plain
integers such as "1200").
"""

from __future__ import annotations

import re

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_NOT_NUMBERS = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
  """The answer in a response, or None.

  Args:
    solution_str: the decoded response.
    method: "strict": the last "#### N" (the format GSM8K teaches), commas
      and "$" removed; "flexible": the last number-like run anywhere.

  Returns:
    The answer, or None when there is none.
  """
  if method not in ("strict", "flexible"):
    raise ValueError(f"method {method!r}: expected 'strict' or 'flexible'")
  tail = solution_str[-CLIP_CHARS:]
  if method == "strict":
    found = _STRICT.findall(tail)
    return found[-1].replace(",", "").replace("$", "") if found else None
  found = _FLEXIBLE.findall(tail)
  if not found:
    return None
  numbers = [f for f in found if f not in _NOT_NUMBERS]
  return numbers[-1] if numbers else found[0]


def compute_score(solution_str: str, ground_truth: str, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
  """`score` for the right answer, `format_score` for a wrong one, else 0."""
  answer = extract_solution(solution_str, method)
  if answer is None:
    return 0.0
  return score if answer == ground_truth else format_score
