"""Python arithmetic on literals, evaluated without `eval`.

verl's numina grader calls Python's `eval` on answer text in two places
(to compute `2*3.141592653589793` after replacing `\\pi`, and to read a
matrix written as a list). rljax never evaluates model output as code:
`evaluate` parses the text with `ast` and computes it only when it is made
of number literals, the few names the caller binds, `+ - * / // % ** ^ &
| << >> ~`, unary signs, parentheses, tuples and lists, with Python's own
semantics for those, so its results equal `eval`'s. Anything else (other
names, calls, attribute access, strings, comprehensions...) raises
`NotArithmetic`, where `eval` would either fail too or run code. Integer
results are capped at `MAX_BITS` bits and the text at `MAX_CHARS`
characters, so evaluation is always quick.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Mapping

MAX_CHARS = 1000
MAX_BITS = 14_000  # under Python's 4300-digit int-to-str limit

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Pow: operator.pow, ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg,
          ast.Invert: operator.invert}
_NUMBER_TYPES = (int, float, complex)


class NotArithmetic(Exception):
  """Text that `evaluate` does not compute."""


def _number(value: Any) -> Any:
  """`value` if it is a (not boolean) number of bounded size."""
  if isinstance(value, bool) or not isinstance(value, _NUMBER_TYPES):
    raise NotArithmetic(f"not a number: {type(value).__name__}")
  if isinstance(value, int) and value.bit_length() > MAX_BITS:
    raise NotArithmetic("integer too large")
  return value


def _check_size(op: type, left: Any, right: Any) -> None:
  """Refuses powers and shifts whose integer result would be too large."""
  if op is ast.Pow and isinstance(left, int) and isinstance(right, int):
    if abs(left) > 1 and right > 0 and \
        left.bit_length() * right > MAX_BITS:
      raise NotArithmetic("power too large")
  if op is ast.LShift and isinstance(right, int) and right > MAX_BITS:
    raise NotArithmetic("shift too large")


def _evaluate(node: ast.AST, names: Mapping[str, Any]) -> Any:
  if isinstance(node, ast.Constant):
    return _number(node.value)
  if isinstance(node, ast.Name) and node.id in names:
    return names[node.id]
  if isinstance(node, (ast.Tuple, ast.List)):
    items = [_evaluate(e, names) for e in node.elts]
    return tuple(items) if isinstance(node, ast.Tuple) else items
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    operand = _number(_evaluate(node.operand, names))
    return _number(_UNARY[type(node.op)](operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    left = _number(_evaluate(node.left, names))
    right = _number(_evaluate(node.right, names))
    _check_size(type(node.op), left, right)
    try:
      return _number(_BINARY[type(node.op)](left, right))
    except (ArithmeticError, TypeError, ValueError) as e:
      raise NotArithmetic(str(e)) from e
  raise NotArithmetic(f"unsupported syntax: {type(node).__name__}")


def evaluate(text: str, names: Mapping[str, Any] | None = None) -> Any:
  """The value `eval(text)` would have, for arithmetic on literals.

  Args:
    text: the expression.
    names: values of the names it may use (verl's `eval` sees the calling
      function's variables, such as `pi`).

  Raises:
    NotArithmetic: for any other text.
  """
  if len(text) > MAX_CHARS:
    raise NotArithmetic("text too long")
  try:
    tree = ast.parse(text.lstrip(" \t"), mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise NotArithmetic(str(e)) from e
  try:
    return _evaluate(tree.body, names or {})
  except RecursionError as e:
    raise NotArithmetic("nested too deeply") from e
