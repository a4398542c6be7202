"""The calculator tool of the synthetic calculator task, in verl's `BaseTool` shape.

    tools:
      - class_name: rljax.data.synthetic.calculator_tool.CalculatorTool
        config: {type: native}
        tool_schema: {type: function, function: {name: calculator, ...}}

(`configs/tools/calculator.yaml`). The methods are verl's, plain (not async):

* `create(instance_id=None, ground_truth=None, **kwargs) -> instance_id`:
  one instance per trajectory; `ground_truth` comes from the row's
  `extra_info.tools_kwargs.calculator.create_kwargs`.
* `execute(instance_id, parameters, **kwargs) -> (text, step_reward, metrics)`:
  evaluates `parameters["expression"]`: numbers (integers or decimals), + - *
  /, unary signs and parentheses, nothing else (parsed with `ast` by
  `rljax.utils.safe_arith`, never `eval`). The text is the value ("777777",
  "2.5"); a bad expression (other characters, `**`, `//`, division by zero,
  a result over `MAX_RESULT_DIGITS` digits, a missing or non-string
  `expression`) gives "Error: ..." instead of raising. The step reward is
  always 0.0: the task's reward is the final answer's
  (`rljax.rewards.calculator`); metrics are {"valid": 1.0 or 0.0}.
* `calc_reward(instance_id, **kwargs) -> float`: 1.0 if any call's result
  equalled the ground truth, else 0.0 (0.0 without a ground truth).
* `release(instance_id, **kwargs)`: forgets the instance.

`get_openai_tool_schema()` returns the `tool_schema` it was built with.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any, Mapping

from rljax.utils import safe_arith

MAX_EXPRESSION_CHARS = 200
MAX_RESULT_DIGITS = 60
_ALLOWED = re.compile(r"[0-9.+\-*/()\s]+")


class CalculatorError(ValueError):
  """An expression the calculator refuses; its message is shown to the model."""


def _format(value: int | float) -> str:
  if isinstance(value, float):
    if not math.isfinite(value):
      raise CalculatorError("the result is not a finite number")
    if value == int(value) and abs(value) < 1e15:
      value = int(value)
    else:
      text = f"{value:.10g}"
      if "e" in text:
        raise CalculatorError("the result is too large or too small")
      return text
  text = str(value)
  if len(text.lstrip("-")) > MAX_RESULT_DIGITS:
    raise CalculatorError("the result is too large")
  return text


def calculate(expression: Any) -> str:
  """The value of `expression` as text ("777777", "2.5", "-3").

  Raises:
    CalculatorError: not a string, characters other than digits, ".", + - * /,
      parentheses and spaces, `**` or `//`, bad syntax, division by zero, or a
      too large result.
  """
  if not isinstance(expression, str):
    raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
  text = expression.strip()
  if not text:
    raise CalculatorError("empty expression")
  if len(text) > MAX_EXPRESSION_CHARS:
    raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  if not _ALLOWED.fullmatch(text):
    raise CalculatorError("only numbers, + - * /, parentheses and spaces are allowed")
  if "**" in text or "//" in text:
    raise CalculatorError("only + - * / are allowed")
  try:
    value = safe_arith.evaluate(text)
  except safe_arith.NotArithmetic as e:
    raise CalculatorError(f"cannot evaluate {text!r}: {e}") from e
  if isinstance(value, (tuple, list)) or isinstance(value, complex):
    raise CalculatorError(f"cannot evaluate {text!r}")
  return _format(value)


def same_number(a: str, b: Any) -> bool:
  """Whether two number texts have the same value ("1,000" == "1000.0")."""
  try:
    return float(str(a).replace(",", "")) == float(str(b).replace(",", ""))
  except ValueError:
    return False


class CalculatorTool:
  """verl's BaseTool interface for the calculator (module docstring)."""

  def __init__(self, config: Mapping[str, Any] | None = None, tool_schema: Any = None):
    self.config = dict(config or {})
    self.tool_schema = tool_schema
    self.name = _schema_name(tool_schema) or "calculator"
    self._instances: dict[str, dict[str, Any]] = {}

  def get_openai_tool_schema(self) -> Any:
    return self.tool_schema

  def create(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any) -> str:
    del kwargs
    if instance_id is None:
      instance_id = str(uuid.uuid4())
    self._instances[instance_id] = {"ground_truth": ground_truth, "results": []}
    return instance_id

  def execute(self, instance_id: str, parameters: Any, **kwargs: Any) -> tuple[str, float, dict[str, Any]]:
    del kwargs
    state = self._instances.setdefault(instance_id, {"ground_truth": None, "results": []})
    try:
      if isinstance(parameters, str):
        try:
          parameters = json.loads(parameters)
        except json.JSONDecodeError as e:
          raise CalculatorError("the arguments are not valid JSON") from e
      if not isinstance(parameters, Mapping) or "expression" not in parameters:
        raise CalculatorError('the arguments must be {"expression": "..."}')
      result = calculate(parameters["expression"])
    except CalculatorError as e:
      return f"Error: {e}", 0.0, {"valid": 0.0}
    state["results"].append(result)
    return result, 0.0, {"valid": 1.0}

  def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
    del kwargs
    state = self._instances.get(instance_id)
    if not state or state["ground_truth"] is None:
      return 0.0
    return 1.0 if any(same_number(r, state["ground_truth"]) for r in state["results"]) else 0.0

  def release(self, instance_id: str, **kwargs: Any) -> None:
    del kwargs
    self._instances.pop(instance_id, None)


def _schema_name(tool_schema: Any) -> str | None:
  """function.name of an OpenAI tool schema (a mapping or an object with attributes)."""
  if tool_schema is None:
    return None
  function = tool_schema.get("function") if isinstance(tool_schema, Mapping) else getattr(tool_schema, "function", None)
  if function is None:
    return None
  return function.get("name") if isinstance(function, Mapping) else getattr(function, "name", None)
