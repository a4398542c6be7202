r"""PRIME's math reward (verl's `prime_math`, for the numina_* sources).

The answer is cut out of the response by `extract_answer`: the text after the
last "answer:" / "answer is" / "answers are", before a following "is the
answer", then the content of the last `\boxed{...}` (or `\fbox{...}`) in
what is left, then whatever follows the last "be ", "is ", "=", ": ",
"get "... in it. It scores 1.0 when `answer_grader.grade_answer` (PRIME
flavour) accepts it, or else when `math_equal` does, and 0.0 otherwise.

`math_equal` accepts: equal strings (ignoring case and spaces), numbers
within a relative 1e-4 (also the truth divided or multiplied by 100, for
percentages: `0.5` and `50` both match `50%`), `$5` for `5`, `12_8`-style
bases read as their digits, `\pi` replaced by 3.14159... (and by 3.14 as a
second try), equal tuples, intervals and comma-separated lists element by
element, a `Point(a, b)` against `(a, b)`, and a list or sympy's
`Matrix([...])` against a `pmatrix`, entry by entry. verl's last step
(sympy's symbolic equality) never succeeds in verl (its timeout wrapper is
used as a context manager, which fails), so it is not reproduced; verl
reads `Matrix(...)` with sympy, rljax only when its entries are number
literals.

verl evaluates answer text with Python's `eval` in two places; rljax uses
`safe_arith.evaluate` there, which computes literal arithmetic only.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from rljax.rewards import answer_grader
from rljax.utils import safe_arith
from rljax.rewards.math_answer import matched_braces_end

MAX_PREDICTION_CHARS = 1000
MAX_DEPTH = 100
PERCENT_TOLERANCE = 1e-4

_AFTER_MARKERS = ("answer:", "answer is", "answers are")
_BEFORE_MARKERS = ("is answer", "is the answer", "are answers",
                   "are the answers")
_LAST_MARKERS = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n",
                 "are\n", ":\n", "get\n")
_PMATRIX = "\\begin{pmatrix}"
_PI = re.compile(r"\\pi")
_INTERVALS = (
    (re.compile(r"^Interval\((.*)\)$"), "[{}]"),
    (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[{})"),
    (re.compile(r"^Interval\.Lopen\((.*)\)$"), "({}]"),
    (re.compile(r"^Interval\.open\((.*)\)$"), "({})"),
)


class GraderFailure(Exception):
  """Where verl's grader raises: the response then scores 0."""


def last_box_content(text: str) -> str | None:
  r"""Stripped content of the last `\boxed`/`\fbox` group, or None."""
  start = text.rfind("\\boxed")
  if start < 0:
    start = text.rfind("\\fbox")
    if start < 0:
      return None
  end = matched_braces_end(text, start)
  if end is None:
    return None
  return text[text.find("{", start) + 1:end].strip()


def _after_last(text: str, markers: tuple[str, ...]) -> str:
  """`text` cut after the last occurrence of each marker in turn."""
  for marker in markers:
    at = text.lower().rfind(marker)
    if at != -1:
      text = text[at + len(marker):].strip()
  return text


def extract_answer(response: str) -> str:
  """The answer text of a response (see the module docstring)."""
  response = _after_last(response, _AFTER_MARKERS)
  for marker in _BEFORE_MARKERS:
    at = response.lower().rfind(marker)
    if at != -1:
      response = response[:at].strip()
  boxed = last_box_content(response)
  if boxed:
    response = boxed
  at = response.lower().rfind(". ") if ". " in response else -1
  if at != -1:
    response = response[:at].strip()
  return _after_last(response, _LAST_MARKERS)


def is_digit(value: Any) -> tuple[bool, float | None]:
  """(True, value) when `value` reads as a float, commas (or `{,}`) aside."""
  text = str(value)
  text = text.replace("{,}", "") if "{,}" in text else text.replace(",", "")
  try:
    return True, float(text)
  except ValueError:
    return False, None


def handle_base(value: Any) -> Any:
  """`"1011_2"` -> 1011 (the digits, as an int); other values unchanged."""
  if not (isinstance(value, str) and "_" in value):
    return value
  try:
    return int(float(value.split("_")[0]))
  except (ValueError, OverflowError) as e:
    raise GraderFailure(f"base notation {value!r}") from e


def handle_pi(value: Any, pi: float) -> Any:
  r"""`\pi` -> `*pi` after a digit, `1*pi` elsewhere (pi's digits); then
  the text is computed when it is only arithmetic, in which the name `pi`
  is pi too (else the text is kept)."""
  if not (isinstance(value, str) and "\\pi" in value):
    return value
  pieces = []
  end = 0
  for match in _PI.finditer(value):
    start = match.start()
    # Right after another replaced \pi the text ends with a digit of pi.
    after_digit = start == end > 0 or (start > 0 and value[start - 1].isdigit())
    pieces.append(value[end:start] + ("*" if after_digit else "1*") + str(pi))
    end = match.end()
  value = "".join(pieces) + value[end:]
  try:
    return safe_arith.evaluate(value, {"pi": pi})
  except safe_arith.NotArithmetic:
    return value


def normalize(answer: Any, pi: float) -> Any:
  """`$5` -> `5`, `5%` -> `5`, bases and `\\pi` handled."""
  if isinstance(answer, str):
    if re.match(r"\$\d+(\.\d+)?", answer):
      return answer[1:]
    if re.match(r"^\d+(\.\d+)?%$", answer) or \
        re.match(r"^\d+(\.\d+)?\\%$", answer):
      return answer.replace("\\%", "").replace("%", "")
  return handle_pi(handle_base(answer), pi)


def format_intervals(text: str) -> str:
  """sympy's `Interval(a, b)` spellings -> `[a, b]`, `(a, b]`, ..."""
  for pattern, template in _INTERVALS:
    match = pattern.match(text)
    if match:
      return template.format(match.group(1))
  return text


def _numbers_equal(prediction: float, reference: float,
                   include_percentage: bool) -> bool:
  candidates = ([reference / 100, reference, reference * 100]
                if include_percentage else [reference])
  return any(math.isclose(c, prediction, rel_tol=PERCENT_TOLERANCE)
             for c in candidates)


def _parts_equal(predictions: list[Any], references: list[Any],
                 include_percentage: bool, depth: int) -> bool:
  return len(predictions) == len(references) and all(
      math_equal(p, r, include_percentage, depth=depth + 1)
      for p, r in zip(predictions, references))


def _matrix_rows(reference: str) -> list[Any]:
  r"""A `pmatrix` reference's rows, split as verl splits them."""
  body = reference.removeprefix("\\\\begin{pmatrix}").removeprefix(_PMATRIX)
  body = body.removesuffix("\\\\end{pmatrix}").removesuffix("\\end{pmatrix}")
  return [row.split("&") if "&" in row else row for row in body.split("\\")]


def sympy_matrix_entries(prediction: str) -> list[int | float] | None:
  """The entries, row by row, of `Matrix([...])` written with number
  literals only (sympy's spelling of a matrix); None for anything else."""
  match = re.fullmatch(r"Matrix\((.*)\)", prediction, re.DOTALL)
  if match is None:
    return None
  try:
    rows = ast.literal_eval(match.group(1))
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return None
  if not isinstance(rows, (list, tuple)):
    return None
  if all(_is_number(r) for r in rows):
    return list(rows)
  if not all(isinstance(r, (list, tuple)) and all(_is_number(x) for x in r)
             for r in rows) or len({len(r) for r in rows}) > 1:
    return None
  return [x for r in rows for x in r]


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def math_equal(prediction: Any, reference: Any, include_percentage: bool = True,
               pi: float = math.pi, depth: int = 0) -> bool:
  """Whether `prediction` answers `reference` (see the module docstring).

  Raises:
    GraderFailure: where verl's grader raises (the response scores 0).
  """
  if depth > MAX_DEPTH:
    raise GraderFailure("nested too deeply")
  prediction, reference = normalize(prediction, pi), normalize(reference, pi)
  if isinstance(prediction, str):
    prediction = prediction[:MAX_PREDICTION_CHARS]
    if isinstance(reference, str) and (
        prediction.strip().lower() == reference.strip().lower()
        or prediction.replace(" ", "") == reference.replace(" ", "")):
      return True
  (pred_is_number, pred_number), (ref_is_number, ref_number) = \
      is_digit(prediction), is_digit(reference)
  if pred_is_number and ref_is_number:
    return _numbers_equal(pred_number, ref_number, include_percentage)
  if not prediction and prediction not in (0, False):
    return False
  reference, prediction = str(reference).strip(), str(prediction).strip()
  prediction = format_intervals(prediction)
  pred_str, ref_str = prediction, reference
  if (prediction.startswith("[") and prediction.endswith("]")
      and not reference.startswith("(")) or (
          prediction.startswith("(") and prediction.endswith(")")
          and not reference.startswith("[")):
    pred_str, ref_str = pred_str.strip("[]()"), ref_str.strip("[]()")
  for bracket in "{}()":
    pred_str, ref_str = pred_str.replace(bracket, ""), \
        ref_str.replace(bracket, "")
  if pred_str == ref_str:
    return True
  if (prediction and reference and prediction[0] in "([" and
      prediction[-1] in ")]" and prediction[0] == reference[0] and
      prediction[-1] == reference[-1] and _parts_equal(
          prediction[1:-1].split(","), reference[1:-1].split(","),
          include_percentage, depth)):
    return True
  if "," in prediction and "," in reference:
    pred_parts = [p.strip() for p in prediction.split(",")]
    ref_parts = [r.strip() for r in reference.split(",")]
    if len(pred_parts) == len(ref_parts):
      return _parts_equal(pred_parts, ref_parts, include_percentage, depth)
  if prediction.startswith("Point"):
    if not reference:
      raise GraderFailure("empty reference")
    if reference[0] == "(" and reference[-1] == ")" and _parts_equal(
        prediction[prediction.find("(") + 1:-1].split(","),
        reference[1:-1].split(","), include_percentage, depth):
      return True
  entries = sympy_matrix_entries(prediction) if _PMATRIX in reference \
      else None
  if entries is not None:
    try:
      if _parts_equal(entries, reference.split()[1:-1:2], include_percentage,
                      depth):
        return True
    except GraderFailure:
      pass
  if _PMATRIX in reference and prediction.startswith("[") and \
      prediction.endswith("]"):
    try:
      matrix = safe_arith.evaluate(prediction, {"pi": pi})
    except safe_arith.NotArithmetic as e:
      raise GraderFailure("unreadable matrix") from e
    if isinstance(matrix, list):
      rows = _matrix_rows(reference)
      try:
        if _parts_equal(matrix, rows, include_percentage, depth):
          return True
      except GraderFailure:
        pass
  return False


def _graded_by_math_equal(answer: str, truth: str) -> bool:
  r"""`math_equal`, tried with pi = 3.14159... and pi = 3.14 when either
  side mentions `\pi`; False where verl's grader raises."""
  pis = (math.pi, 3.14) if "\\pi" in answer or "\\pi" in truth \
      else (math.pi,)
  try:
    results = [math_equal(answer, truth, pi=pi) for pi in pis]
  except GraderFailure:
    return False
  return any(results)


def compute_score(solution_str: str, ground_truth: str) -> float:
  """1.0 when the answer in the response matches `ground_truth`, else 0.0."""
  answer = extract_answer(str(solution_str))
  truth = str(ground_truth)
  if answer_grader.grade_answer(answer, truth, answer_grader.PRIME):
    return 1.0
  return 1.0 if _graded_by_math_equal(answer, truth) else 0.0
