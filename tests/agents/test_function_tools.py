"""verl 0.9's function tools: the schemas transformers' get_json_schema makes (verl builds them with it), verl's
return values, a file written for verl loading as it is, and the name rules across both tool sources."""

import asyncio
import enum
import textwrap
from typing import Any, Literal, Optional, Union

import pytest
import transformers.utils

from rljax.agents import function_tools
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


class Holder:
  def method(self, x: int):
    """A method.

    Args:
      x: An x.
    """


@pytest.mark.parametrize("fn", [scalars, containers, no_summary_args, Holder().method, Holder.method],
                         ids=["scalars", "containers", "early_returns", "bound_method", "method"])
def test_schemas_are_transformers_get_json_schema_s(fn):
  assert function_tools.json_schema(fn) == transformers.utils.get_json_schema(fn)


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
  yaml = tmp_path / "tools.yaml"
  yaml.write_text(textwrap.dedent("""\
      tools:
        - class_name: rljax.agents.tools.BaseTool
          config: {type: native}
          tool_schema:
            type: function
            function: {name: lookup, description: Looks up., parameters: {type: object, properties: {}}}
      """))
  with pytest.raises(ValueError, match=r"'lookup' .* both .*tools.yaml.* and .*function_tool_path"):
    function_tools.load_all_tools(str(yaml), str(path))
  with pytest.raises(ValueError, match=r"'lookup' .* both"):
    function_tools.all_tool_schemas(str(yaml), str(path))


def test_a_name_marked_twice_is_an_error_naming_both(tmp_path):
  path = tmp_path / f"twice_{tmp_path.name}.py"
  path.write_text(VERL_FILE.replace('def anything(**kwargs):\n    return "done"',
                                    'def anything(**kwargs):\n    return "done"\n\n\nmultiply_again = '
                                    'function_tool("multiply", schema=dict(type="function", function=dict('
                                    'name="multiply", parameters=dict(type="object"))))(lambda a: a)'))
  with pytest.raises(ValueError, match=r"@function_tool 'multiply' .* is already .*multiply"):
    function_tools.load_function_tools(str(path))


def test_a_missing_file_names_the_key(tmp_path):
  with pytest.raises(FileNotFoundError, match="multi_turn.function_tool_path=.*nope.py: is not a file"):
    function_tools.load_function_tools(str(tmp_path / "nope.py"))
