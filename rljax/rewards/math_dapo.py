r"""DAPO's math reward (verl's `math_dapo`): the last `Answer:` line, +1 / -1.

Only the last 300 characters of a response are read. The answer is the
text after the last `Answer:` (any case, spaces allowed around the colon) up
to the end of its line; both it and the ground truth go through Minerva's
normalisation (`normalize_final_answer`: the part after the last `=`, units
and filler words such as "dollars", "degrees", `\text{}` wrappers, spaces
and `$` dropped, `\fracab` -> `\frac{a}{b}`, `1,000` -> `1000`) and must then
be equal strings. A response without an `Answer:` line is read as under
`strict_box_verify` below when it has a `\boxed{}` (as verl 0.9.1 does).

The score is a dict, as in verl: {"score": 1.0 or -1.0, "acc": bool,
"pred": the normalised answer}. With `strict_box_verify=True` the answer is
instead the content of the last `\boxed{...}` in the last 100 characters,
compared verbatim (no normalisation; "pred" is None when there is no box).
"""

from __future__ import annotations

import re
from typing import Any

from rljax.rewards.math_answer import matched_braces_end

CLIP_CHARS = 300
STRICT_CLIP_CHARS = 100
NO_ANSWER = "[INVALID]"
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_BRACED_BOX = "\\boxed{"

# Rewrites applied in order (Minerva's normalisation).
_REWRITES = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

# Units, filler words and markup removed next, in order.
_DROPPED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km",
    "units", "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents",
    "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}",
    "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)

# Regex rewrites applied after the removals, in order.
_PATTERNS = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),
)


def normalize_final_answer(answer: str) -> str:
  """Minerva's canonical form of a final answer (see the module docstring)."""
  answer = answer.split("=")[-1]
  for old, new in _REWRITES:
    answer = answer.replace(old, new)
  for word in _DROPPED:
    answer = answer.replace(word, "")
  for pattern, replacement in _PATTERNS:
    answer = pattern.sub(replacement, answer)
  answer = answer.replace("$", "")
  if answer.replace(",", "").isdigit():
    answer = answer.replace(",", "")
  return answer.strip()


def last_answer_line(text: str) -> str:
  """The text after the last `Answer:`, or "[INVALID]"."""
  found = _ANSWER_LINE.findall(text)
  return found[-1] if found else NO_ANSWER


def last_braced_box(text: str) -> str | None:
  r"""Content of the last `\boxed{...}`, or None."""
  start = text.rfind(_BRACED_BOX)
  if start < 0:
    return None
  end = matched_braces_end(text, start)
  return None if end is None else text[start + len(_BRACED_BOX):end]


def verify(solution_str: str, ground_truth: str,
           strict_box_verify: bool = False) -> tuple[bool, str | None]:
  """(correct, the answer as compared) for a (clipped) response."""
  boxed = last_braced_box(solution_str[-STRICT_CLIP_CHARS:])
  if strict_box_verify:
    return boxed == ground_truth, boxed
  line = last_answer_line(solution_str)
  if line == NO_ANSWER and boxed is not None:
    return boxed == ground_truth, boxed
  pred = normalize_final_answer(line)
  return pred == normalize_final_answer(ground_truth), pred


def compute_score(solution_str: str, ground_truth: str,
                  strict_box_verify: bool = False) -> dict[str, Any]:
  """{"score": 1.0 / -1.0, "acc": right or not, "pred": the answer read}."""
  correct, pred = verify(solution_str[-CLIP_CHARS:], ground_truth,
                         strict_box_verify)
  return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
