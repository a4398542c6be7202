"""verl 0.9's function tools: the schemas transformers' get_json_schema makes (verl builds them with it), verl's
return values, a file written for verl loading as it is, and the name rules across both tool sources."""

import asyncio
import sys
import enum
import textwrap
from typing import Any, Literal, Optional, Union

import json

import pydantic
import pytest
import transformers.utils

from rljax.agents import function_tools, tools
from rljax.agents.tools import ToolResponse


class Color(enum.Enum):
  RED = "red"
  LEVEL = 2


def scalars(a: int, b: float, c: str, d: bool = False, e: Any = None) -> int:
  """Adds things up.

  A second paragraph of the summary.

  Args:
    a: The first   number, with
      a second line.
    b (float): The second.
    c: A string (choices: ["x", "y"])
    d:
        Described on its own line.
    e: Anything at all.

  Returns:
    The sum, as an integer.

  Raises:
    ValueError: never.
  """
  return a


def containers(xs: list[int], pair: tuple[int, str], table: dict[str, float], bare: list, raw: dict,
               opt: Optional[int] = None, either: Union[int, str] = 1, pipe: int | None = None,
               mixed: Union[list[int], str] = "a", lit: Literal["a", 1] = "a", color: Color = Color.RED):
  """Takes containers.

  Args:
    xs: Integers.
    pair: A pair.
    table: A table.
    bare: A bare list.
    raw: A bare dict.
    opt: Maybe an integer.
    either: An integer or a string.
    pipe: The same, with |.
    mixed: A list or a string.
    lit: One of two literals.
    color: An enum.
  """


def no_summary_args(x: int) -> str:
  """Returns: something early.

  Args:
    x: An x. Returns: inside an argument's text.
  """


def empty_first(a: int, b: int):
  """An argument with no text on its line takes the next line as its text.

  Args:
    a:
    b: B.
  """


class Holder:
  def method(self, x: int):
    """A method.

    Args:
      x: An x.
    """


class VerlProperty(pydantic.BaseModel):
  """verl 0.9.1's OpenAIFunctionPropertySchema, field for field (verl/tools/schemas.py), and the models above it:
  verl renders a tool's schema as the model's dump without unset and None fields."""
  type: str | list[str]
  description: str | None = None
  enum: list[Any] | None = None


class VerlParameters(pydantic.BaseModel):
  type: str
  properties: dict[str, VerlProperty]
  required: list[str] = pydantic.Field(default_factory=list)


class VerlFunction(pydantic.BaseModel):
  name: str
  description: str
  parameters: VerlParameters = pydantic.Field(
      default_factory=lambda: VerlParameters(type="object", properties={}, required=[]))
  strict: bool = False


class VerlTool(pydantic.BaseModel):
  type: str
  function: VerlFunction


def verl_rendered(schema: dict) -> str:
  return json.dumps(VerlTool.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True))


def documented_colors(color: Color, names: list[str], table: dict[str, int], opt: Optional[int] = None) -> int:
  """Uses an enum.

  Args:
    color: A color (choices: ["red", 2])
    names: Names.
    table: A table.
    opt: Maybe.

  Returns:
    A number.
  """


@pytest.mark.parametrize("fn", [scalars, containers, no_summary_args, Holder().method, Holder.method],
                         ids=["scalars", "containers", "early_returns", "bound_method", "method"])
def test_schemas_are_transformers_get_json_schema_s(fn):
  assert function_tools.json_schema(fn) == transformers.utils.get_json_schema(fn)


@pytest.mark.parametrize("fn", [documented_colors, no_summary_args], ids=["colors", "early"])
def test_prompts_read_a_function_s_schema_as_verl_renders_it(fn):
  """verl validates the schema into its pydantic models and renders their dump: a parameter's type, description
  and enum in that order, no items, nullable or return (key order included: the chat template writes it as is)."""
  marked = function_tools.function_tool(fn)
  tool = function_tools._BY_MODULE[fn.__module__][fn.__name__]  # pylint: disable=protected-access
  assert marked is fn and json.dumps(tool.tool_schema) == verl_rendered(transformers.utils.get_json_schema(fn))


def any_typed(x: Any):
  """Any.

  Args:
    x: Anything.
  """


def test_a_parameter_verl_s_schema_cannot_hold_is_an_error_naming_it():
  with pytest.raises(ValueError, match=r"'any_typed'.*properties.x.*needs each parameter's `type`"):
    function_tools.function_tool(any_typed)


def base_tool_yaml(tmp_path, function: str) -> str:
  """A tool YAML of one BaseTool whose tool_schema is `type: function` and the YAML text `function`."""
  yaml = tmp_path / "tools.yaml"
  yaml.write_text("tools:\n  - class_name: rljax.agents.tools.BaseTool\n    config: {type: native}\n"
                  "    tool_schema:\n      type: function\n" + textwrap.indent(textwrap.dedent(function), " " * 6))
  return yaml


def test_a_yaml_tool_s_schema_is_rendered_as_verl_renders_it(tmp_path):
  yaml = base_tool_yaml(tmp_path, """\
      function:
        description: Looks up.
        name: lookup
        parameters:
          properties:
            keys: {items: {type: string}, description: Keys., type: array}
            mode: {enum: [a, b], type: string, nullable: true}
          type: object
      """)
  schema = tools.load_tool_schemas(str(yaml))[0]
  raw = tools.read_tool_specs(str(yaml))[0].tool_schema
  assert json.dumps(schema) == verl_rendered(raw)
  assert json.dumps(tools.tool_schema_of(tools.load_tool_config(str(yaml))[0])) == verl_rendered(raw)


def undocumented(x: int):
  """No Args block."""


def unhinted(x):
  """Has no hint.

  Args:
    x: An x.
  """


def variadic(*xs: int):
  """Variadic.

  Args:
    xs: Some.
  """


class Custom:
  pass


def custom(x: Custom):
  """A class of the program's.

  Args:
    x: A custom.
  """


@pytest.mark.parametrize("fn, match", [
    (undocumented, r"undocumented in .*: the docstring does not describe 'x'"),
    (empty_first, r"empty_first in .*: the docstring does not describe 'b'"),  # as transformers refuses it
    (unhinted, r"unhinted in .*: parameter 'x' has no type hint"),
    (variadic, r"variadic parameters \['xs'\]"),
    (custom, r"parameter 'x': the type hint .*Custom.* has no JSON schema"),
])
def test_a_function_without_a_schema_is_an_error_naming_it(fn, match):
  with pytest.raises(ValueError, match=match):
    function_tools.json_schema(fn)


def test_return_values_are_read_as_verl_reads_them():
  response = ToolResponse(text="t")
  assert function_tools.normalize_return(response) == (response, 0.0, {})
  assert function_tools.normalize_return("hi")[0].text == "hi"
  assert function_tools.normalize_return({"é": 1})[0].text == '{"é": 1}'
  assert function_tools.normalize_return(7)[0].text == "7"
  text, reward, metrics = function_tools.normalize_return(({"a": 1}, 0, None))
  assert (text.text, reward, metrics) == ('{"a": 1}', 0.0, {})
  assert function_tools.normalize_return(("x", None, {"m": 2}))[1:] == (0.0, {"m": 2})
  assert function_tools.normalize_return((3,))[0].text == "3"
  for bad in ((), (1, 2, 3, 4)):
    with pytest.raises(TypeError, match="must be \\(response,\\)"):
      function_tools.normalize_return(bad)


VERL_FILE = '''
import asyncio
import sys

from verl.tools.function_tool import function_tool
from verl.tools.schemas import ToolResponse


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiplies two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return (ToolResponse(text=str(a * b)), 0.5, {"calls": 1})


@function_tool("web_search")
async def search(query: str) -> dict:
    """Searches.

    Args:
        query: What to look for.
    """
    await asyncio.sleep(0)
    return {"hits": [query]}


@function_tool(schema={"type": "function", "function": {"name": "by_hand", "description": "Given.",
                                                       "parameters": {"type": "object", "properties": {}}}})
def anything(**kwargs):
    return "done"
'''


def test_a_file_written_for_verl_loads_and_its_tools_run(tmp_path):
  path = tmp_path / f"tools_{tmp_path.name}.py"
  path.write_text(VERL_FILE)
  loaded = function_tools.load_function_tools(str(path))
  # verl lists them by name, the one given a schema by its function's (the model sees the schema's)
  assert [t.name for t in loaded] == ["anything", "multiply", "web_search"]
  assert loaded[0].tool_schema["function"]["name"] == "by_hand"
  assert function_tools.load_function_tools(str(path)) is loaded  # run once
  multiply, search = loaded[1], loaded[2]
  assert multiply.tool_schema["function"]["parameters"]["required"] == ["a", "b"]
  assert search.tool_schema["function"]["name"] == "web_search"
  instance, _ = multiply.create()
  response, reward, metrics = multiply.execute(instance, {"a": 6, "b": 7})
  assert (response.text, reward, metrics) == ("42", 0.5, {"calls": 1})
  response, reward, _ = asyncio.run(search.execute("i", {"query": "q"}))
  assert (response.text, reward) == ('{"hits": ["q"]}', 0.0)
  assert multiply.calc_reward(instance) == 0.0 and multiply.release(instance) is None
  # the prompts' tools: the YAML's (none here), then these
  assert function_tools.all_tool_schemas(None, str(path)) == [t.tool_schema for t in loaded]
  assert function_tools.all_tool_schemas(None, None) is None


def test_names_are_unique_across_the_tool_file_and_the_function_file(tmp_path):
  path = tmp_path / f"tools_{tmp_path.name}.py"
  path.write_text(VERL_FILE.replace('"web_search"', '"lookup"').replace('"by_hand"', '"by_hand_2"'))
  yaml = base_tool_yaml(tmp_path, """\
      function: {name: lookup, description: Looks up., parameters: {type: object, properties: {}}}
      """)
  with pytest.raises(ValueError, match=r"'lookup' .* both .*tools.yaml.* and .*function_tool_path"):
    function_tools.load_all_tools(str(yaml), str(path))
  with pytest.raises(ValueError, match=r"'lookup' .* both"):
    function_tools.all_tool_schemas(str(yaml), str(path))


def test_a_name_marked_twice_is_an_error_naming_both(tmp_path):
  path = tmp_path / f"twice_{tmp_path.name}.py"
  path.write_text(VERL_FILE.replace('def anything(**kwargs):\n    return "done"',
                                    'def anything(**kwargs):\n    return "done"\n\n\nmultiply_again = '
                                    'function_tool("multiply", schema=dict(type="function", function=dict('
                                    'name="multiply", description="", parameters=dict(type="object"))))(lambda a: a)'))
  with pytest.raises(ValueError, match=r"@function_tool 'multiply' .* is already .*multiply"):
    function_tools.load_function_tools(str(path))


def test_a_missing_file_names_the_key(tmp_path):
  with pytest.raises(FileNotFoundError, match="multi_turn.function_tool_path=.*nope.py: is not a file"):
    function_tools.load_function_tools(str(tmp_path / "nope.py"))


SHARED_FILE = '''
import verl.tools.function_tool
from verl.tools.schemas import OpenAIFunctionToolSchema


class Lookup:
    def __init__(self, config, tool_schema):
        self.tool_schema = tool_schema
    def create(self, instance_id=None, **kwargs):
        return instance_id
    def execute(self, instance_id, parameters, **kwargs):
        return "7", 0.0, {}
    def calc_reward(self, instance_id, **kwargs):
        return 0.0
    def release(self, instance_id, **kwargs):
        pass


@verl.tools.function_tool.function_tool
def add(a: int, b: int) -> int:
    """Adds.

    Args:
        a: One.
        b: Two.
    """
    return a + b


@verl.tools.function_tool.function_tool("given", schema=OpenAIFunctionToolSchema(type="function", function={
    "name": "given", "description": "Given.", "parameters": {"type": "object", "properties": {}}}))
def given():
    return "given"
'''


def test_an_installed_verl_is_left_as_it_was_and_a_file_is_both_a_yaml_class_and_function_tools(
    tmp_path, monkeypatch):
  """A verl installed and imported keeps its modules (the file reads rljax's while it runs); the attribute form
  `import verl.tools.function_tool` works; a file whose class the tool YAML names gives its function tools too."""
  package = tmp_path / "site" / "verl"
  (package / "tools").mkdir(parents=True)
  (package / "__init__.py").write_text("INSTALLED = True\n")
  (package / "tools" / "__init__.py").write_text("")
  (package / "tools" / "function_tool.py").write_text("raise ImportError('needs torch and ray')\n")
  monkeypatch.syspath_prepend(str(tmp_path / "site"))
  for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
    monkeypatch.delitem(sys.modules, name)
  import verl  # pylint: disable=import-outside-toplevel
  path = tmp_path / f"shared_{tmp_path.name}.py"
  path.write_text(SHARED_FILE)
  yaml = tmp_path / "tools.yaml"
  yaml.write_text(f"tools:\n  - class_name: {path}:Lookup\n    config: {{type: native}}\n    tool_schema:\n"
                  "      type: function\n      function: {name: lookup, description: Looks up., "
                  "parameters: {type: object, properties: {}}}\n")
  loaded = function_tools.load_all_tools(str(yaml), str(path))
  assert [tools.tool_schema_of(t)["function"]["name"] for t in loaded] == ["lookup", "add", "given"]
  assert sys.modules["verl"] is verl and verl.INSTALLED and "verl.tools.function_tool" not in sys.modules
