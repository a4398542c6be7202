r"""PRM800K's answer grader, as verl's numina and geometry3k scorers use it.

`grade_answer(given, truth)` accepts an answer when

1. both are equal after the MATH normalisation (`mathd.normalize_answer`),
2. or both are equal after PRM800K's own normalisation (`normalize`: units
   and `\text{}` dropped, LaTeX turned into text, e.g. `\frac{1}{2}` ->
   `1/2`, lower case, `7 3/4` -> `7+3/4`, `1,000` -> `1000`),
3. or, element by element for tuples and intervals (`(1, 2)`, `[a, b)`,
   same brackets required), each pair is equal: fractions `a/b` only as
   written, integers only when both are integers, anything else when
   `expr_equal.are_equal_under_sympy` finds the two expressions equal.

Two flavours exist: verl's own copy (`prime_math`, for the numina sources)
and the `mathruler` package's (for geometry3k), which also drops a bare
`%`, does not treat "liter" as a unit, and removes spaces and braces
before comparing. `Flavour` holds the differences.
"""

from __future__ import annotations

import dataclasses
import re

from rljax.rewards import expr_equal
from rljax.rewards import latex_text
from rljax.rewards import mathd

_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute",
          "hour", "day", "week", "month", "year", "foot", "feet", "inch",
          "yard")
_TUPLE_CHARS = "()[]"
MAX_ANSWER_CHARS = 2000
_FORMATTED_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_ENCLOSING_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")

# What pylatexenc's output is rewritten to before sympy reads it.
_TEXT_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"),
                 ("·", "*"), ("×", "*"))


@dataclasses.dataclass(frozen=True)
class Flavour:
  """The differences between the grader's two copies."""
  drop_plain_percent: bool
  units: tuple[str, ...]
  squeeze: bool


PRIME = Flavour(drop_plain_percent=False, units=_UNITS + ("liter",),
                squeeze=False)
MATHRULER = Flavour(drop_plain_percent=True, units=_UNITS, squeeze=True)


def strip_formatted_commas(expr: str) -> str:
  """Removes thousands separators (`1,234,567` -> `1234567`), not tuple
  commas (`1,2`)."""
  while True:
    stripped = _FORMATTED_COMMA.sub(r"\1\3\4", expr)
    if stripped == expr:
      return expr
    expr = stripped


def _float(text: str) -> float | None:
  try:
    return float(text)
  except ValueError:
    return None


def _is_int(x: float) -> bool:
  try:
    return abs(x - int(round(x))) <= 1e-7
  except (OverflowError, ValueError):
    return False


def str_is_int(text: str) -> bool:
  """Whether `text` (thousands separators allowed) is an integer."""
  x = _float(strip_formatted_commas(text))
  return x is not None and _is_int(x)


def is_fraction(text: str) -> bool:
  """`a/b` of integers, as PRM800K's regex sees it."""
  return _FRACTION.search(text) is not None


def latex_to_text(expr: str) -> str | None:
  """pylatexenc's reading of `expr`, with the symbols sympy needs spelled
  out; None when `latex_text` cannot convert it."""
  expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
  text = latex_text.to_text(expr.replace("\\frac", " \\frac"))
  if text is None:
    return None
  for symbol, word in _TEXT_SYMBOLS:
    text = text.replace(symbol, word)
  return text.strip()


def normalize(expr: str, flavour: Flavour) -> str:
  """PRM800K's normalisation of an answer (see the module docstring)."""
  enclosed = _ENCLOSING_TEXT.search(expr)
  if enclosed is not None:
    expr = enclosed.group("text")
  for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""),
                   (" or ", " , "), (" and ", " , "), ("million", "*10^6"),
                   ("billion", "*10^9"), ("trillion", "*10^12")):
    expr = expr.replace(old, new)
  for unit in flavour.units:
    expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
  expr = re.sub(r"\^ *\\circ", "", expr)
  if expr and expr[0] == "{" and expr[-1] == "}":
    expr = expr[1:-1]
  expr = re.sub(",\\\\! *", "", expr)
  number = _float(expr)
  if number is not None and _is_int(number):
    expr = str(int(round(number)))
  text = latex_to_text(expr) if "\\" in expr else None
  if text is not None:
    expr = text
  expr = _MIXED_NUMBER.sub(r"\1+\2", re.sub("- *", "-", expr))
  if flavour.squeeze:
    for mark in (" ", "{", "}"):
      expr = expr.replace(mark, "")
  expr = expr.lower()
  if str_is_int(expr):
    expr = str(int(float(expr.replace(",", ""))))
  return expr


def split_tuple(expr: str) -> list[str]:
  """The elements of a tuple or interval, or [expr]; [] for ""."""
  expr = strip_formatted_commas(expr)
  if not expr:
    return []
  inner = expr[1:-1]
  if (len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS
      and not any(ch in inner for ch in _TUPLE_CHARS)):
    return [elem.strip() for elem in inner.split(",")]
  return [expr]


def elements_equal(truth: str, given: str) -> bool:
  """One tuple element: fractions as written, integers only with integers,
  else expression equality."""
  if is_fraction(truth) and is_fraction(given):
    return truth == given
  if str_is_int(truth) != str_is_int(given):
    return False
  return expr_equal.are_equal_under_sympy(truth, given)


def grade_answer(given: str, truth: str, flavour: Flavour) -> bool:
  """Whether `given` is a correct answer for `truth` (module docstring).

  A `given` longer than MAX_ANSWER_CHARS counts only when it equals `truth`
  verbatim: normalising it (a LaTeX matrix's cells are padded to one width)
  can take time and memory quadratic in its length.
  """
  if len(given) > MAX_ANSWER_CHARS:
    return given.strip() == truth.strip()
  percent = flavour.drop_plain_percent
  if mathd.normalize_answer(truth, percent) == \
      mathd.normalize_answer(given, percent):
    return True
  truth_n, given_n = normalize(truth, flavour), normalize(given, flavour)
  if truth_n == given_n:
    return True
  if not given_n:
    return False
  truth_elems, given_elems = split_tuple(truth_n), split_tuple(given_n)
  if len(truth_elems) > 1 and (truth_n[0] != given_n[0]
                               or truth_n[-1] != given_n[-1]):
    return False
  if len(truth_elems) != len(given_elems):
    return False
  return all(elements_equal(t, g) for t, g in zip(truth_elems, given_elems))
