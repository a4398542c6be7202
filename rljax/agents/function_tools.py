"""verl 0.9's function tools (actor_rollout_ref.rollout.multi_turn.function_tool_path): Python functions, marked
`@function_tool`, whose OpenAI schemas come from their type hints and Google-style docstrings.

A tool file written for verl runs as it is:

    from verl.tools.function_tool import function_tool   # or: from rljax.agents.function_tools import ...

    @function_tool
    def add(a: int, b: int) -> int:
      \"\"\"Adds two integers.

      Args:
        a: The first.
        b: The second.
      \"\"\"
      return a + b

Loading the file (`load_function_tools`) collects each marked function under its name (or the decorator's:
`@function_tool("name")`; `schema=` gives the schema by hand); while the file runs, verl's modules
`verl.tools.function_tool` and `verl.tools.schemas` are this module and one of ToolResponse and the schema classes
(`_verl_modules`), whether verl is installed or not: import them at the file's top. A function may be
`async def`; it returns a ToolResponse, a str, a dict (sent as JSON), or a tuple (response[, reward[, metrics]])
(`normalize_return`). The schema is what `transformers.utils.get_json_schema` makes of the function (`json_schema`),
as verl builds it, and the prompts and parsers read it as verl renders it (`tools.verl_rendered`: a parameter's
type, description and enum). Function tools keep no state: a row's tools_kwargs do not reach them, as in verl.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import json
import logging
import os
import re
import sys
import types
import typing
import uuid
from typing import Any, Callable

from rljax.agents import tools as tools_lib
from rljax.agents.tools import ToolResponse, check_tool_schema
from rljax.utils.user_code import load_module

log = logging.getLogger(__name__)

# the functions marked so far, by the module defining them: {module name: {tool name: FunctionTool}}
_BY_MODULE: dict[str, dict[str, "FunctionTool"]] = {}
_COLLECTING: list[dict[str, "FunctionTool"]] = []  # what each file being loaded marks (helper modules included)
_LOADED: dict[str, list["FunctionTool"]] = {}  # {absolute path: its tools}
_JSON_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_PLAIN_TYPES = {**_JSON_SCALARS, list: "array", tuple: "array", dict: "object"}
_ENTRY = re.compile(r"^([ \t]*)(\w+)(?:[ \t]*\([^()\n]*\))?:[ \t]*(.*)$")
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.I)


class FunctionTool:
  """A marked function as a tool of verl's lifecycle (`rljax.agents.tools.BaseTool`): create and release do
  nothing, execute calls the function, calc_reward is 0.

  Attributes:
    name: the tool's name; fn: the function; tool_schema: its OpenAI function schema.
  """

  def __init__(self, name: str, fn: Callable[..., Any], tool_schema: dict):
    self.name, self.fn, self.tool_schema = name, fn, tool_schema

  def get_openai_tool_schema(self) -> dict:
    return self.tool_schema

  def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
    del kwargs
    return (instance_id if instance_id is not None else uuid.uuid4().hex), ToolResponse()

  def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> Any:
    """(response, reward, metrics) of fn(**parameters), or an awaitable of them for an `async def` function."""
    del instance_id, kwargs
    result = self.fn(**parameters)
    if inspect.isawaitable(result):
      return _normalized(result)
    return normalize_return(result)

  def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
    del instance_id, kwargs
    return 0.0

  def release(self, instance_id: str, **kwargs: Any) -> None:
    del instance_id, kwargs


async def _normalized(result: Any) -> tuple[ToolResponse, float, dict]:
  return normalize_return(await result)


def _as_response(value: Any) -> ToolResponse:
  if isinstance(value, ToolResponse):
    return value
  if isinstance(value, dict):
    return ToolResponse(text=json.dumps(value, ensure_ascii=False))
  return ToolResponse(text=value if isinstance(value, str) else str(value))


def normalize_return(value: Any) -> tuple[ToolResponse, float, dict]:
  """A function's return value as (response, reward, metrics), as verl 0.9.1 reads it: a ToolResponse, str or
  dict (as JSON) with reward 0 and no metrics; a tuple (response,), (response, reward) or (response, reward,
  metrics), a None reward 0 and None metrics none; anything else as its str().

  Raises:
    TypeError: a tuple of another length (an authoring mistake, not a response).
  """
  if isinstance(value, tuple):
    if not 1 <= len(value) <= 3:
      raise TypeError(f"a function tool's tuple must be (response,), (response, reward) or (response, reward, "
                      f"metrics); got {len(value)} items: {value!r:.200}")
    reward = 0.0 if len(value) < 2 or value[1] is None else float(value[1])
    metrics = {} if len(value) < 3 or value[2] is None else dict(value[2])
    return _as_response(value[0]), reward, metrics
  return _as_response(value), 0.0, {}


def function_tool(name: str | Callable[..., Any] | None = None, *, schema: dict | None = None) -> Any:
  """Marks a function as a tool: bare (`@function_tool`, named after the function) or called
  (`@function_tool("name")`, `@function_tool(schema={...})`: the OpenAI schema given, not inferred).

  Raises:
    ValueError: another function already holds the name; the schema cannot be inferred (`json_schema`) or the
      given one is not an OpenAI function schema.
  """
  def mark(fn: Callable[..., Any], tool_name: str | None) -> Callable[..., Any]:
    tool_name = tool_name or fn.__name__
    if schema is None:
      built = json_schema(fn)
      built["function"]["name"] = tool_name
    else:
      built = schema.model_dump(exclude_unset=True, exclude_none=True) if hasattr(schema, "model_dump") else schema
    check_tool_schema(built, _where(fn), f"@function_tool {tool_name!r}: its schema")
    tool = FunctionTool(tool_name, fn, tools_lib.verl_rendered(built))
    for marks in (_BY_MODULE.setdefault(fn.__module__, {}), *_COLLECTING):
      held = marks.get(tool_name)
      if held is not None and held.fn is not fn:
        raise ValueError(f"@function_tool {tool_name!r} ({_where(fn)}) is already {_where(held.fn)}'s; tool names "
                         "must be unique. Fix: rename one (@function_tool(\"other_name\"))")
      marks[tool_name] = tool
    return fn

  if callable(name) and schema is None:
    return mark(name, None)
  return lambda fn: mark(fn, name)


def _where(fn: Callable[..., Any]) -> str:
  source = inspect.getsourcefile(fn) if inspect.isfunction(fn) else None
  return f"{fn.__qualname__} in {source}" if source else f"{fn.__module__}.{fn.__qualname__}"


def load_function_tools(path: str) -> list[FunctionTool]:
  """The tools the Python file at `path` marks (`function_tool`), in name order, as verl lists them; the file is
  run once per process.

  Raises:
    FileNotFoundError: naming the path; what the file raises (its schemas' errors name the function).
  """
  path = os.path.abspath(os.path.expanduser(path))
  if path in _LOADED:
    return _LOADED[path]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"actor_rollout_ref.rollout.multi_turn.function_tool_path={path}: is not a file. Fix: "
                            "point it at a Python file of @function_tool functions")
  marked: dict[str, FunctionTool] = {}
  _COLLECTING.append(marked)
  try:
    with _verl_modules():
      module = load_module(path, "actor_rollout_ref.rollout.multi_turn.function_tool_path")
  finally:
    _COLLECTING.pop()
  marked = marked or _BY_MODULE.get(module.__name__, {})  # run before (a tool YAML's class): its own marks
  if not marked:
    log.warning("actor_rollout_ref.rollout.multi_turn.function_tool_path=%s marks no function with @function_tool: "
                "the agent gets no tools from it", path)
  _LOADED[path] = [marked[n] for n in sorted(marked)]
  return _LOADED[path]


def load_all_tools(tool_config_path: str | None, function_tool_path: str | None) -> list[Any]:
  """The tools of the tool YAML (`rljax.agents.tools`), then the function tools of the Python file (in name
  order), as verl 0.9.1 lists them (the file is run first: a file holding a YAML tool class too runs under
  `_verl_modules`).

  Raises:
    ValueError: a name both define (and what `tools.load_tool_config` and `load_function_tools` raise).
  """
  functions = load_function_tools(function_tool_path) if function_tool_path else []
  native = tools_lib.load_tool_config(tool_config_path) if tool_config_path else []
  _check_disjoint([tools_lib.tool_schema_of(t)["function"]["name"] for t in native],
                  [t.tool_schema["function"]["name"] for t in functions], tool_config_path, function_tool_path)
  return native + functions


def all_tool_schemas(tool_config_path: str | None, function_tool_path: str | None) -> list[dict] | None:
  """The OpenAI schemas of `load_all_tools`'s tools as verl renders them, in its order (the YAML's read without
  importing its classes where it gives them), or None when there are none."""
  functions = load_function_tools(function_tool_path) if function_tool_path else []
  native = tools_lib.load_tool_schemas(tool_config_path) if tool_config_path else []
  _check_disjoint([s["function"]["name"] for s in native], [t.tool_schema["function"]["name"] for t in functions],
                  tool_config_path, function_tool_path)
  return [*native, *(t.tool_schema for t in functions)] or None


def _check_disjoint(native: list[str], functions: list[str], tool_config_path: str | None,
                    function_tool_path: str | None) -> None:
  both = sorted(set(native) & set(functions))
  if both:
    raise ValueError(f"tool name(s) {', '.join(map(repr, both))} are defined both in {tool_config_path} "
                     f"(actor_rollout_ref.rollout.multi_turn.tool_config_path) and in {function_tool_path} "
                     "(actor_rollout_ref.rollout.multi_turn.function_tool_path); every tool's name must be unique. "
                     "Fix: rename one")


class _Model:
  """verl's pydantic schema classes as far as a tool file uses them: built from fields (or `model_validate` of a
  mapping), dumped back (`model_dump`)."""

  def __init__(self, **fields: Any):
    self._fields = fields

  @classmethod
  def model_validate(cls, value: dict) -> "_Model":
    return cls(**value)

  def model_dump(self, **options: Any) -> dict:
    del options
    return json.loads(json.dumps(self._fields, default=lambda v: v.model_dump()))


class OpenAIFunctionToolSchema(_Model):
  """verl.tools.schemas.OpenAIFunctionToolSchema (type, function)."""


class OpenAIFunctionSchema(_Model):
  """verl.tools.schemas.OpenAIFunctionSchema (name, description, parameters, strict)."""


class OpenAIFunctionParametersSchema(_Model):
  """verl.tools.schemas.OpenAIFunctionParametersSchema (type, properties, required)."""


class OpenAIFunctionPropertySchema(_Model):
  """verl.tools.schemas.OpenAIFunctionPropertySchema (type, description, enum)."""


@contextlib.contextmanager
def _verl_modules():
  """While a tool file runs, `verl`, `verl.tools`, `verl.tools.function_tool` (this module) and `verl.tools.schemas`
  (ToolResponse and the schema classes) are rljax's, so a file written for verl imports them, installed or not;
  the modules there before (an imported verl) are put back after."""
  schemas = types.ModuleType("verl.tools.schemas")
  for cls in (ToolResponse, OpenAIFunctionToolSchema, OpenAIFunctionSchema, OpenAIFunctionParametersSchema,
              OpenAIFunctionPropertySchema):
    setattr(schemas, cls.__name__, cls)
  verl, tools = types.ModuleType("verl"), types.ModuleType("verl.tools")
  verl.__path__, tools.__path__ = [], []
  verl.tools, tools.function_tool, tools.schemas = tools, sys.modules[__name__], schemas
  shims = {"verl": verl, "verl.tools": tools, "verl.tools.function_tool": sys.modules[__name__],
           "verl.tools.schemas": schemas}
  before = {name: sys.modules.get(name) for name in shims}
  sys.modules.update(shims)
  try:
    yield
  finally:
    for name, module in before.items():
      if module is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = module


# ----- the schema of a function, as transformers.utils.get_json_schema makes it -------------------------------------


def json_schema(fn: Callable[..., Any]) -> dict:
  """{"type": "function", "function": {name, description, parameters[, return]}} of `fn`: its docstring's summary
  and each argument's description (Google style, an `Args:` block; a trailing `(choices: [...])` becomes an enum),
  every parameter's type hint as JSON schema, the parameters without a default required.

  Raises:
    ValueError: naming the function: no docstring, a parameter without a type hint or a description, a variadic
      parameter, or a hint JSON cannot express.
  """
  where = _where(fn)
  signature = inspect.signature(fn)
  variadic = [n for n, p in signature.parameters.items() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  if variadic:
    raise ValueError(f"@function_tool {where}: variadic parameters {variadic} have no OpenAI schema. Fix: name "
                     "each parameter")
  doc = inspect.getdoc(fn)
  if not doc:
    raise ValueError(f"@function_tool {where}: no docstring. Fix: describe the tool, and each parameter under "
                     "`Args:`")
  summary, described, returns = _docstring_parts(doc.strip())
  parameters, returned = _parameters(fn, signature, where)
  for arg, schema in parameters["properties"].items():
    if arg not in described:
      raise ValueError(f"@function_tool {where}: the docstring does not describe {arg!r}. Fix: add `{arg}: ...` "
                       "under `Args:`")
    text = described[arg]
    choices = _CHOICES.search(text)
    if choices:
      schema["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))]
      text = text[:choices.start()].strip()
    schema["description"] = text
  out = {"name": getattr(fn, "__name__", "operation"), "description": summary, "parameters": parameters}
  if returned is not None:
    if returns is not None:
      returned["description"] = returns
    out["return"] = returned
  return {"type": "function", "function": out}


def _docstring_parts(doc: str) -> tuple[str, dict[str, str], str | None]:
  """(the summary: the text before the first `Args:`, `Returns:` or `Raises:`; {argument: description} of an
  `Args:` line's block, up to the next `Returns:` or `Raises:`; the text of a `Returns:` line's block, up to a
  `Raises:`, or None)."""
  summary = re.split(r"Args:|Returns:|Raises:", doc, maxsplit=1)[0].strip()
  args = re.search(r"\n\s*Args:\n(.*?)\s*(?:Returns:|Raises:|\Z)", doc, re.S)
  returns = re.search(r"\n\s*Returns:\n\s*(.*?)\s*(?:Raises:|\Z)", doc, re.S)
  return summary, _arguments(args.group(1) if args else ""), returns.group(1).strip() if returns else None


def _arguments(block: str) -> dict[str, str]:
  """{name: description} of an `Args:` block: an entry is a line `name: text` or `name (type): text`, continued
  by the lines up to the next entry line indented no deeper (an entry with no text on its line takes the next
  line, whatever it holds); the line breaks of its text (and the spaces around them) become single spaces."""
  entries: list[tuple[str, str, list[str]]] = []  # (indentation, name, lines)
  for line in (line for line in block.split("\n") if line.strip()):
    match = _ENTRY.match(line)
    opens = entries and entries[-1][2] == [""]  # `name:` alone: its text starts on the next line, whatever it is
    if match and not opens and (not entries or not line.startswith(entries[-1][0]) or
                                line[len(entries[-1][0]):][:1] not in (" ", "\t")):
      entries.append((match.group(1), match.group(2), [match.group(3)]))
    elif entries:
      entries[-1][2].append(line)
  return {name: re.sub(r"\s*\n+\s*", " ", "\n".join(lines).strip()) for _, name, lines in entries}


def _parameters(fn: Callable[..., Any], signature: inspect.Signature, where: str) -> tuple[dict, dict | None]:
  """(the parameters' object schema, the return hint's schema or None)."""
  hints = typing.get_type_hints(fn)
  names = list(signature.parameters)
  receiver = names[0] if names and names[0] in ("self", "cls") and (
      signature.parameters[names[0]].annotation is inspect.Parameter.empty) else None
  required = []
  for name, parameter in signature.parameters.items():
    if name == receiver:
      continue
    if parameter.annotation is inspect.Parameter.empty:
      raise ValueError(f"@function_tool {where}: parameter {name!r} has no type hint. Fix: annotate it "
                       "(int, float, str, bool, list[...], dict[str, ...], Literal[...], an Enum)")
    if parameter.default is inspect.Parameter.empty:
      required.append(name)
  properties, returned = {}, None
  for name, hint in hints.items():
    if name == "return":
      try:
        returned = _hint_schema(hint)
      except ValueError:
        returned = None  # the model never writes the return value
    elif name in signature.parameters and name != receiver:
      try:
        properties[name] = _hint_schema(hint)
      except ValueError as e:
        raise ValueError(f"@function_tool {where}: parameter {name!r}: {e}") from None
  schema = {"type": "object", "properties": properties}
  if required:
    schema["required"] = required
  return schema, returned


def _enum_schema(values: list) -> dict:
  kinds = list(dict.fromkeys(_JSON_SCALARS[type(v)] for v in values))
  return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _hint_schema(hint: Any) -> dict:
  """The JSON schema of one type hint.

  Raises:
    ValueError: a hint JSON cannot express (a class of the program's, a one-item or open tuple, ...).
  """
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is None and isinstance(hint, type) and issubclass(hint, enum.Enum):
    values = [member.value for member in hint]
    if not values or any(type(v) not in _JSON_SCALARS for v in values):
      raise ValueError(f"the Enum {hint.__name__} needs members whose values are int, float, str, bool or None")
    return _enum_schema(values)
  if origin is None:
    if hint is Any:
      return {}
    if hint in _PLAIN_TYPES:
      return {"type": _PLAIN_TYPES[hint]}
    raise ValueError(f"the type hint {hint!r} has no JSON schema (int, float, str, bool, Enum, Literal, and list, "
                     "tuple, dict and unions of them do). Fix: use one, or give @function_tool(schema=...)")
  if origin is typing.Union or origin is types.UnionType:
    inner = [_hint_schema(a) for a in args if a is not type(None)]
    if len(inner) == 1:
      out = inner[0]
    elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in inner):
      kinds = sorted({s["type"] for s in inner})
      out = {"type": kinds[0] if len(kinds) == 1 else kinds}
    else:
      out = {"anyOf": inner}
    if type(None) in args:
      out["nullable"] = True
    return out
  if origin is typing.Literal and args:
    if any(type(a) not in _JSON_SCALARS for a in args):
      raise ValueError("typing.Literal may list only int, float, str, bool and None values")
    return _enum_schema(list(args))
  if origin is list:
    return {"type": "array", "items": _hint_schema(args[0])} if args else {"type": "array"}
  if origin is tuple:
    if not args:
      return {"type": "array"}
    if len(args) == 1 or ... in args:
      raise ValueError(f"the tuple hint {hint!r} has one item or an open length. Fix: use list[...] (or the "
                       "item alone)")
    return {"type": "array", "prefixItems": [_hint_schema(a) for a in args]}
  if origin is dict:
    return {"type": "object", **({"additionalProperties": _hint_schema(args[1])} if len(args) == 2 else {})}
  raise ValueError(f"the type hint {hint!r} has no JSON schema")
