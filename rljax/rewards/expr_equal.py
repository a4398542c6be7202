"""Whether two answer expressions are equal, decided without sympy.

verl's PRM800K-style graders call `sympy.simplify((a) - (b)) == 0` on the
text of two answers, after `sympy.parse_expr` with implicit multiplication
(`2x`, `x(x+1)`, `xy` = x*y, `sqrt(2)x`). rljax does not depend on sympy,
and sympy's parser evaluates its input as Python, which a reward must never
do with model output. This module parses the same notation itself and
decides equality by evaluation:

- integers and fractions of them are exact (`6/4` equals `3/2`; so do
  `sqrt(4)` and `2`, and `4^(1/2)` and `2`);
- decimals are binary floats, rounded as sympy's Floats are (`0.5` equals
  `1/2` and `0.3` equals `3/10`, but `0.1+0.2` does not, and `a/b` is `a`
  times the rounded `1/b`, so `3/10.` equals `0.1+0.2`); a decimal of more
  than 15 significant digits, which sympy keeps at a higher precision, is
  not supported;
- anything holding pi, an inexact root or logarithm, or a variable is
  evaluated as a complex number (at three fixed random points for the
  variables) and equal within a relative 1e-9 everywhere. sympy decides
  these symbolically, so rljax also accepts the rare identities sympy's
  `simplify` misses.

Supported: numbers, `+ - * / **` (`^` is read as `**`), parentheses,
implicit multiplication, `sqrt(...)`, `ln(...)`, `pi`, and variables (a
name of several letters is a product of one-letter variables, as sympy
splits it; Greek names such as `mu` and names with `_` stay whole). Any
other notation (other functions, `!`, `%`, relations, brackets, sets,
sympy's special names such as `oo` or `re`), and any expression longer than
`MAX_CHARS` or nested beyond Python's recursion limit, is "not equal". Exact
numbers are kept under `MAX_BITS` bits, so every call finishes in time
linear in the input.
"""

from __future__ import annotations

import cmath
import dataclasses
import fractions
import keyword
import math
import operator
import random
import re
import unicodedata
from typing import Callable, Union

MAX_CHARS = 1000
MAX_BITS = 20_000
MAX_FLOAT_DIGITS = 15
MAX_ROOT_DEGREE = 64
REL_TOL = 1e-9
TRIALS = 3

Number = Union[fractions.Fraction, float, complex]

# Names sympy's parser gives a meaning other than a variable, among those of
# at most two distinct letters (longer ones never pass `should_allow_eval`).
_SPECIAL_NAMES = frozenset((
    "all", "csc", "eye", "ff", "fft", "fu", "gff", "hn1", "hn2", "id", "im",
    "jn", "li", "nan", "ntt", "oo", "re", "rf", "yn", "zoo",
))
_FUNCTIONS = ("sqrt", "ln")

_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_PATTERNS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<float>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?
      |[0-9]+[eE][+-]?[0-9]+)
  | (?P<int>0+|[1-9][0-9]*)
  | (?P<name>[^\W\d]\w*)
  | (?P<op>\*\*|[-+*/()])
""", re.VERBOSE)


class Unsupported(Exception):
  """An expression outside the supported notation (or too large)."""


def count_unknown_letters(expr: str) -> int:
  """Distinct letters in `expr` once "sqrt" and "frac" are removed."""
  expr = expr.replace("sqrt", "").replace("frac", "")
  return len({ch for ch in expr if ch.isalpha()})


def should_allow_eval(expr: str) -> bool:
  """verl's guard before sympy: at most two letters, no `^{`, `^(` or big
  exponents such as `^12` or `2^3^4`."""
  if count_unknown_letters(expr) > 2:
    return False
  if any(bad in expr for bad in _BAD_SUBSTRINGS):
    return False
  return not any(p.search(expr) for p in _BAD_PATTERNS)


@dataclasses.dataclass(frozen=True)
class Value:
  """A number, and whether it is only known approximately (pi, a root, a
  variable): those are compared with a tolerance; whether it involves an
  irrational constant (pi, an inexact root or logarithm) and a decimal
  literal, which sympy never cancels against each other."""
  number: Number
  approximate: bool = False
  irrational: bool = False
  decimal: bool = False


def _is_greek_name(name: str) -> bool:
  try:
    unicodedata.lookup("GREEK SMALL LETTER " + name)
  except KeyError:
    return False
  return True


def tokenize(expr: str) -> list[tuple[str, str]]:
  """(kind, text) tokens: float, int, name, op. Raises Unsupported."""
  tokens = []
  pos = 0
  while pos < len(expr):
    match = _TOKEN.match(expr, pos)
    if match is None:
      raise Unsupported(f"character {expr[pos]!r}")
    kind, text = match.lastgroup, match.group()
    pos = match.end()
    if kind == "space":
      continue
    if kind in ("float", "int") and pos < len(expr) and (
        expr[pos] in "jJ_" or (text == "0" and expr[pos] in "xXoObB")):
      raise Unsupported(f"number literal {text}{expr[pos]}")
    tokens.append((kind, text))
  return tokens


def float_literal(literal: str) -> float:
  """A decimal literal as sympy's Float holds it: a double, for at most 15
  significant digits (sympy keeps longer ones at a higher precision, which
  is unsupported)."""
  digits = re.sub(r"[eE].*", "", literal).replace(".", "").lstrip("0")
  if len(digits) > MAX_FLOAT_DIGITS:
    raise Unsupported(f"decimal {literal} beyond double precision")
  return float(literal)


def _split_name(name: str) -> list[tuple[str, str]]:
  """A name as sympy reads it: kept whole, or split into one-letter
  variables and digit runs (`x2y` -> x, 2, y)."""
  if name in _FUNCTIONS or name == "pi" or "_" in name or len(name) == 1 \
      or _is_greek_name(name):
    return [("name", name)]
  if name in _SPECIAL_NAMES or keyword.iskeyword(name):
    raise Unsupported(f"name {name!r}")
  parts = re.findall(r"\d+|\D", name)
  if any(p.isdigit() and not p.isascii() for p in parts):
    raise Unsupported(f"name {name!r}")
  return [("int", str(int(p))) if p.isdigit() else ("name", p) for p in parts]


def _checked(number: Number) -> Number:
  """`number`, or Unsupported when it is too big or not finite."""
  if isinstance(number, fractions.Fraction):
    if max(number.numerator.bit_length(),
           number.denominator.bit_length()) > MAX_BITS:
      raise Unsupported("number too large")
    return number
  if not cmath.isfinite(number):
    raise Unsupported("overflow")
  return number


def _apply(op: Callable[[Number, Number], Number], a: Value, b: Value,
           approximate: bool = False, irrational: bool = False) -> Value:
  """`op` on two values with Python's numeric tower: exact on two
  Fractions, else on floats (a Fraction correctly rounded first, as sympy
  rounds a Rational next to a Float) or complex numbers."""
  try:
    result = op(a.number, b.number)
  except (ZeroDivisionError, OverflowError, ValueError) as e:
    raise Unsupported(str(e)) from e
  return Value(_checked(result),
               approximate or a.approximate or b.approximate,
               irrational or a.irrational or b.irrational,
               a.decimal or b.decimal)


def reciprocal(v: Value) -> Value:
  """1 / v: exact for a Fraction, rounded for a float, as sympy's Pow(v, -1)."""
  return _apply(operator.truediv, Value(fractions.Fraction(1)), v)


def _integer_root(k: int, n: int) -> int | None:
  """The integer n-th root of k >= 0 when k is a perfect n-th power."""
  if n == 2:
    guess = math.isqrt(k)
  elif k.bit_length() > 1000 or n > MAX_ROOT_DEGREE:
    return None
  else:
    guess = round(k ** (1.0 / n))
  for root in (guess - 1, guess, guess + 1):
    if root >= 0 and root ** n == k:
      return root
  return None


def _exact_root(q: fractions.Fraction, n: int) -> fractions.Fraction | None:
  """The rational n-th root of q >= 0 when there is one, else None."""
  if q < 0:
    return None
  num, den = _integer_root(q.numerator, n), _integer_root(q.denominator, n)
  if num is None or den is None:
    return None
  return fractions.Fraction(num, den)


def power(base: Value, exponent: Value) -> Value:
  """base ** exponent: exact for rationals where the result is rational,
  the principal complex value where a real power has none. sympy leaves a
  decimal power of a symbolic base (`(x+1)^2.`) unsimplified, so that is
  unsupported."""
  b, e = base.number, exponent.number
  if base.approximate and isinstance(e, float) and not exponent.approximate:
    raise Unsupported("a decimal power of pi, a root or a variable")
  exact = isinstance(b, fractions.Fraction) and \
      isinstance(e, fractions.Fraction)
  if exact and e.denominator == 1:
    if b == 0 and e < 0:
      raise Unsupported("zero to a negative power")
    bits = max(b.numerator.bit_length(), b.denominator.bit_length())
    if abs(b) != 1 and bits * abs(e.numerator) > MAX_BITS:
      raise Unsupported("power too large")
    return _apply(operator.pow, base, exponent)
  if exact:
    root = _exact_root(b, e.denominator)
    if root is not None:
      return power(Value(root), Value(fractions.Fraction(e.numerator)))
  return _apply(operator.pow, base, exponent, approximate=exact, irrational=exact)


def square_root(v: Value) -> Value:
  """sqrt: exact for perfect squares, principal complex root otherwise."""
  if isinstance(v.number, fractions.Fraction):
    root = _exact_root(v.number, 2)
    if root is not None:
      return Value(root)
    return Value(cmath.sqrt(v.number), True, True)
  if isinstance(v.number, float) and v.number >= 0:
    return Value(math.sqrt(v.number), v.approximate, v.irrational, v.decimal)
  return Value(cmath.sqrt(v.number), v.approximate, v.irrational, v.decimal)


def natural_log(v: Value) -> Value:
  """ln, principal branch; ln(1) is exactly 0."""
  if v.number == 0:
    raise Unsupported("log of zero")
  if v.number == 1 and isinstance(v.number, fractions.Fraction):
    return Value(fractions.Fraction(0))
  return Value(cmath.log(v.number), True, True, v.decimal)


class _Parser:
  """Recursive descent over sympy's reading of the notation.

    sum     := term (("+" | "-") term)*
    term    := factor (("*" | "/") factor | factor)*   juxtaposition = "*"
    factor  := ("+" | "-") factor | power
    power   := atom ("**" factor)?
    atom    := number | name | function "(" sum ")" | "(" sum ")"
  """

  def __init__(self, tokens: list[tuple[str, str]],
               variables: dict[str, complex]):
    self.tokens = tokens
    self.pos = 0
    self.variables = variables

  def peek(self) -> tuple[str, str] | None:
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def take(self) -> tuple[str, str]:
    token = self.peek()
    if token is None:
      raise Unsupported("unexpected end")
    self.pos += 1
    return token

  def expect(self, text: str) -> None:
    if self.take() != ("op", text):
      raise Unsupported(f"expected {text!r}")

  def parse(self) -> Value:
    value = self.sum()
    if self.peek() is not None:
      raise Unsupported(f"unexpected {self.peek()[1]!r}")
    return value

  def sum(self) -> Value:
    value = self.term()
    while self.peek() in (("op", "+"), ("op", "-")):
      op = operator.add if self.take()[1] == "+" else operator.sub
      value = _apply(op, value, self.term())
    return value

  def starts_atom(self) -> bool:
    token = self.peek()
    return token is not None and (token[0] != "op" or token[1] == "(")

  def term(self) -> Value:
    value = self.factor()
    while True:
      token = self.peek()
      if token == ("op", "/"):
        self.take()
        value = _apply(operator.mul, value, reciprocal(self.factor()))
      elif token == ("op", "*"):
        self.take()
        value = _apply(operator.mul, value, self.factor())
      elif self.starts_atom():
        value = _apply(operator.mul, value, self.factor())
      else:
        return value

  def factor(self) -> Value:
    token = self.peek()
    if token == ("op", "-"):
      self.take()
      return _apply(operator.mul, Value(fractions.Fraction(-1)), self.factor())
    if token == ("op", "+"):
      self.take()
      return self.factor()
    return self.power()

  def power(self) -> Value:
    base = self.atom()
    if self.peek() == ("op", "**"):
      self.take()
      return power(base, self.factor())
    return base

  def atom(self) -> Value:
    kind, text = self.take()
    if kind == "int":
      return Value(fractions.Fraction(int(text)))
    if kind == "float":
      return Value(float_literal(text), decimal=True)
    if kind == "op":
      if text != "(":
        raise Unsupported(f"unexpected {text!r}")
      value = self.sum()
      self.expect(")")
      return value
    if text in _FUNCTIONS:
      self.expect("(")
      argument = self.sum()
      self.expect(")")
      return square_root(argument) if text == "sqrt" else natural_log(argument)
    if text == "pi":
      return Value(math.pi, True, True)
    return Value(self.variables[text], True)


def _names(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
  """The tokens with every name split as sympy splits it."""
  out = []
  for kind, text in tokens:
    out.extend(_split_name(text) if kind == "name" else [(kind, text)])
  return out


def _variables(tokens: list[tuple[str, str]]) -> list[str]:
  return sorted({text for kind, text in tokens if kind == "name"
                 and text not in _FUNCTIONS and text != "pi"})


def _close(a: Value, b: Value) -> bool:
  """Equal: exactly for numbers known exactly (two Fractions, or floats as
  sympy's Floats compare), within REL_TOL when either is approximate; never
  a decimal against an irrational constant only one side holds
  (`1.41421356237` is not `sqrt(2)` to sympy)."""
  if a.irrational != b.irrational and (a.decimal or b.decimal):
    return False
  if not (a.approximate or b.approximate):
    return a.number == b.number if isinstance(a.number, fractions.Fraction) \
        and isinstance(b.number, fractions.Fraction) \
        else complex(a.number) == complex(b.number)
  x, y = complex(a.number), complex(b.number)
  return abs(x - y) <= REL_TOL * max(1.0, abs(x), abs(y))


def equal(truth: str, given: str) -> bool:
  """Whether the expressions `truth` and `given` are equal (see the module
  docstring); False when either is outside the supported notation."""
  if len(truth) + len(given) > MAX_CHARS:
    return False
  try:
    sides = [_names(tokenize(s.replace("^", "**"))) for s in (truth, given)]
    names = _variables(sides[0] + sides[1])
    for trial in range(TRIALS if names else 1):
      rng = random.Random(trial)
      point = {name: complex(rng.uniform(-2.0, 2.0)) for name in names}
      a, b = (_Parser(tokens, point).parse() for tokens in sides)
      if not _close(a, b):
        return False
  except (Unsupported, RecursionError):
    return False
  return True


def are_equal_under_sympy(truth: str, given: str) -> bool:
  """verl's check: `should_allow_eval` on "(truth)-(given)", then `equal`."""
  return should_allow_eval(f"({truth})-({given})") and equal(truth, given)
