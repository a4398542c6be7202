"""verl's tool interface, and its tool YAML (actor_rollout_ref.rollout.multi_turn.tool_config_path).

A tool file lists tools as verl's does:

    tools:
      - class_name: my_pkg.module.MyTool        # or path/to/file.py:MyTool
        config: {type: native, ...}             # passed to the class as `config`
        tool_schema:                            # the OpenAI function schema the model sees
          type: function
          function:
            name: calculator
            description: Evaluates an arithmetic expression.
            parameters:
              type: object
              properties: {expression: {type: string, description: ...}}
              required: [expression]

Each class is built as `cls(config=..., tool_schema=...)` (one object serves
every conversation; per-conversation state lives under the instance id) and
has the methods of `BaseTool`, sync or `async def`. Subclassing `BaseTool`
is optional: duck-typed classes with the same methods work.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

from rljax.agents.loading import check_methods, import_class, instantiate, read_entries

TOOL_METHODS = ("create", "execute", "calc_reward", "release")
_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")  # OpenAI's rule for function names


@dataclasses.dataclass
class ToolResponse:
  """What a tool returns to the model: text (verl's image / video fields are not supported)."""
  text: str | None = None


class BaseTool:
  """verl's BaseTool: the lifecycle create -> execute* -> calc_reward -> release, per instance.

  Every method may be overridden as sync or `async def`.
  """

  def __init__(self, config: dict, tool_schema: dict | None):
    self.config = dict(config or {})
    self.tool_schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
    if not isinstance(self.tool_schema, dict):
      raise ValueError(f"{type(self).__name__} has no tool schema: give its entry in the tool YAML a "
                       "`tool_schema:` or override get_openai_tool_schema()")
    self._name = self.tool_schema["function"]["name"]

  @property
  def name(self) -> str:
    """tool_schema["function"]["name"]."""
    return self._name

  @name.setter
  def name(self, value: str) -> None:
    self._name = value

  def get_openai_tool_schema(self) -> dict:
    """The OpenAI function schema the model sees ({"type": "function", "function": {...}})."""
    return getattr(self, "tool_schema", None)

  def create(self, instance_id: str | None = None, **kwargs: Any) -> str | tuple[str, ToolResponse]:
    """Starts an instance (one per conversation); returns its id (a new uuid when none is given)."""
    return (instance_id if instance_id is not None else str(uuid.uuid4())), ToolResponse()

  def execute(self, instance_id: str, parameters: dict, **kwargs: Any
              ) -> tuple[ToolResponse | str, float, dict]:
    """Runs one call: (response shown to the model, step reward, metrics)."""
    return ToolResponse(text="Updated the tool state."), 0.0, {}

  def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
    """The instance's reward at the end of the conversation."""
    return 0.0

  def release(self, instance_id: str, **kwargs: Any) -> None:
    """Frees the instance's state."""


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """One entry of a tool YAML file, validated but not imported.

  Attributes:
    class_name: `pkg.module.Class` or `path/to/file.py:Class`.
    config: the entry's config mapping (passed to the class).
    tool_schema: the validated OpenAI function schema, or None when the entry
      has none (the class's get_openai_tool_schema() then supplies it).
    where: "tools[i]", for messages.
    path: the YAML file.
  """
  class_name: str
  config: dict
  tool_schema: dict | None
  where: str
  path: str


def read_tool_specs(path: str) -> list[ToolSpec]:
  """The entries of the tool YAML at `path`, schemas validated, classes not imported.

  Raises:
    FileNotFoundError / ValueError: naming the file, the entry and the key.
  """
  specs = []
  for i, entry in enumerate(read_entries(path, "tools")):
    where = f"tools[{i}]"
    config = dict(entry.get("config") or {})
    tool_type = config.get("type", "native")
    if tool_type != "native":
      raise ValueError(f"{path}: {where}.config.type={tool_type!r}: rljax runs native tools only "
                       "(verl's MCP tools are not supported). Fix: set `type: native` and "
                       "implement the tool as a Python class")
    schema = entry.get("tool_schema")
    if schema is not None:
      check_tool_schema(schema, path, f"{where}.tool_schema")
    specs.append(ToolSpec(entry["class_name"], config, schema, where, path))
  return specs


def check_tool_schema(schema: Any, path: str, where: str) -> str:
  """Validates an OpenAI function schema; returns its function name.

  Raises:
    ValueError: naming `path`, the key under `where` and the bad value.
  """
  def fail(key: str, problem: str) -> None:
    raise ValueError(f"{path}: {where}{key} {problem}")

  if not isinstance(schema, dict):
    fail("", f"must be a mapping (an OpenAI function schema), got {schema!r}")
  if schema.get("type") != "function":
    fail(".type", f"is {schema.get('type')!r}; it must be 'function'")
  function = schema.get("function")
  if not isinstance(function, dict):
    fail(".function", f"must be a mapping with name, description and parameters, got {function!r}")
  name = function.get("name")
  if not isinstance(name, str) or not _NAME.match(name):
    fail(".function.name", f"is {name!r}; it must be 1 to 64 letters, digits, _ or - (e.g. 'calculator')")
  if not isinstance(function.get("description"), str):
    fail(".function.description", f"is {function.get('description')!r}; verl's schema needs a text (it may be '')")
  params = function.get("parameters", {"type": "object", "properties": {}})
  if not isinstance(params, dict) or params.get("type") != "object":
    fail(".function.parameters", f"must be an object schema ({{type: object, properties: ...}}), got {params!r}")
  properties = params.get("properties", {})
  if not isinstance(properties, dict):
    fail(".function.parameters.properties", f"must be a mapping of parameter schemas, got {properties!r}")
  for key, prop in properties.items():
    kind = prop.get("type") if isinstance(prop, dict) else None
    if not (isinstance(kind, str) or (isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind))):
      fail(f".function.parameters.properties.{key}", f"is {prop!r}: verl's schema needs each parameter's `type` "
           "(a JSON type name, or a list of them)")
  required = params.get("required", [])
  if not isinstance(required, list):
    fail(".function.parameters.required", f"must be a list of parameter names, got {required!r}")
  for r in required:
    if r not in properties:
      fail(".function.parameters.required",
           f"names {r!r}, which is not in properties ({', '.join(properties) or 'none'})")
  return name


def load_tool_config(path: str) -> list[Any]:
  """The tool objects the YAML file at `path` lists, in order.

  Each class is imported and built as `cls(config=..., tool_schema=...)`; its
  schema (`get_openai_tool_schema()` when it has one, else the YAML's) is
  validated; tool names must be unique.

  Raises:
    FileNotFoundError / ValueError / ImportError / TypeError / RuntimeError:
      naming the file, the entry index and the class_name.
  """
  tools, names = [], {}
  for spec in read_tool_specs(path):
    tool = _build_tool(spec)
    schema = raw_schema_of(tool)
    where = (f"{spec.where}.tool_schema" if schema == spec.tool_schema
             else f"{spec.where}: {spec.class_name}.get_openai_tool_schema()")
    name = check_tool_schema(schema, path, where)
    _check_unique(names, name, spec)
    tools.append(tool)
  return tools


def load_tool_schemas(path: str) -> list[dict]:
  """The OpenAI function schemas of the tool YAML at `path` as verl renders them (`verl_rendered`; for prompts'
  `tools=`).

  Reads them from the YAML without importing the classes; an entry without a
  tool_schema is imported and asked for its get_openai_tool_schema().
  """
  specs = read_tool_specs(path)
  if any(spec.tool_schema is None for spec in specs):
    return [tool_schema_of(tool) for tool in load_tool_config(path)]
  names: dict[str, str] = {}
  for spec in specs:
    _check_unique(names, spec.tool_schema["function"]["name"], spec)
  return [verl_rendered(spec.tool_schema) for spec in specs]


def raw_schema_of(tool: Any) -> Any:
  """The tool's OpenAI schema as it gives it (verl's pydantic schemas dumped without unset and None fields)."""
  getter = getattr(tool, "get_openai_tool_schema", None)
  schema = getter() if callable(getter) else getattr(tool, "tool_schema", None)
  if hasattr(schema, "model_dump"):
    schema = schema.model_dump(exclude_unset=True, exclude_none=True)
  return schema


def tool_schema_of(tool: Any) -> dict:
  """The OpenAI schema of a loaded (checked) tool as verl renders it (`verl_rendered`)."""
  return verl_rendered(raw_schema_of(tool))


def verl_rendered(schema: dict) -> dict:
  """A checked schema (`check_tool_schema`) as verl 0.9.1 gives it to the chat template and the tool parsers: its
  OpenAIFunctionToolSchema, dumped without unset and None fields, so only the keys that model holds, in its
  order (tool: type, function; function: name, description, parameters, strict; parameters: type, properties,
  required; a parameter: type, description, enum). A parameter's `items`, `nullable` and other keys are dropped,
  as verl drops them."""
  function = schema["function"]
  out = {"name": function["name"], "description": function["description"]}
  if "parameters" in function:
    params = function["parameters"]
    props = {}
    for key, prop in params.get("properties", {}).items():
      props[key] = {"type": prop["type"], **{k: prop[k] for k in ("description", "enum") if prop.get(k) is not None}}
    out["parameters"] = {"type": params["type"], "properties": props,
                         **({"required": list(params["required"])} if "required" in params else {})}
  if "strict" in function:
    out["strict"] = function["strict"]
  return {"type": schema["type"], "function": out}


def tools_by_name(tools: list[Any]) -> dict[str, Any]:
  """{function name: tool} of loaded tools."""
  return {tool_schema_of(tool)["function"]["name"]: tool for tool in tools}


def _build_tool(spec: ToolSpec) -> Any:
  """Imports and instantiates one entry; checks the lifecycle methods."""
  cls = import_class(spec.class_name, spec.path, spec.where)
  tool = instantiate(cls, {"config": spec.config, "tool_schema": spec.tool_schema}, spec.path, spec.where)
  check_methods(tool, TOOL_METHODS, spec.path, spec.where, spec.class_name)
  return tool


def _check_unique(names: dict[str, str], name: str, spec: ToolSpec) -> None:
  if name in names:
    raise ValueError(f"{spec.path}: {spec.where} ({spec.class_name}) is named {name!r}, like "
                     f"{names[name]}; tool names must be unique. Fix: rename one "
                     "tool_schema.function.name")
  names[name] = spec.where
