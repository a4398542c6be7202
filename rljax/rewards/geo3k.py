r"""Geometry3K reward (verl's `geo3k`): 0.9 * accuracy + 0.1 * format.

Accuracy: the content of the response's last `\boxed{...}` (the text "None"
when there is none) graded against the ground truth by the `mathruler`
flavour of `answer_grader.grade_answer` (so `2\sqrt{3}` matches `\sqrt{12}`
and `\frac{1}{2}` matches `0.5`). Format: the whole response has the shape
`<think>...</think>...\boxed{...}...`. A right, well-formatted response
scores 1.0; right without the format 0.9; wrong but well formatted 0.1.
"""

from __future__ import annotations

from rljax.rewards import answer_grader

FORMAT_WEIGHT = 0.1
NO_BOX = "None"
_OPEN, _CLOSE = "<think>", "</think>"
_BOX = "\\boxed{"


def format_reward(response: str) -> float:
  r"""1.0 for `<think>...</think>...\boxed{...}...`, else 0.0.

  The same test as verl's regex (`<think>.*</think>.*\\boxed\{.*\}.*`,
  dots matching newlines), made by searching for each part after the
  previous one, which takes linear time where the regex can backtrack for
  a cubic one.
  """
  if not response.startswith(_OPEN):
    return 0.0
  at = len(_OPEN)
  for part in (_CLOSE, _BOX, "}"):
    found = response.find(part, at)
    if found < 0:
      return 0.0
    at = found + len(part)
  return 1.0


def extract_boxed_content(text: str) -> str:
  r"""Stripped content of the last `\boxed{...}`, or "None"."""
  start = text.rfind(_BOX)
  if start < 0:
    return NO_BOX
  depth = 0
  content = text[start + len(_BOX):]
  for i, ch in enumerate(content):
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth < 0:
        return content[:i].strip()
  return NO_BOX


def acc_reward(response: str, ground_truth: str) -> float:
  """1.0 when the boxed answer is graded right, else 0.0."""
  answer = extract_boxed_content(response)
  right = answer_grader.grade_answer(answer, ground_truth,
                                     answer_grader.MATHRULER)
  return 1.0 if right else 0.0


def compute_score(solution_str: str, ground_truth: str,
                  format_score: float = FORMAT_WEIGHT) -> float:
  """(1 - format_score) * accuracy + format_score * format."""
  return ((1.0 - format_score) * acc_reward(solution_str, ground_truth)
          + format_score * format_reward(solution_str))
