"""verl's tool YAML: loading classes from files and modules, and errors that name the file."""

import subprocess
import sys
import textwrap

import pytest

from rljax.agents import BaseTool, load_tool_config, load_tool_schemas, tools_by_name

TOOL_FILE = '''
from rljax.agents import BaseTool, ToolResponse


class Calculator(BaseTool):
  async def execute(self, instance_id, parameters, **kwargs):
    return ToolResponse(text=str(eval(parameters["expression"]))), 0.1, {}


class DuckTool:
  def __init__(self, config, tool_schema):
    self.config, self.tool_schema = config, tool_schema

  def create(self, instance_id=None, **kwargs):
    return instance_id

  def execute(self, instance_id, parameters, **kwargs):
    return "ok", 0.0, {}

  def calc_reward(self, instance_id, **kwargs):
    return 1.0

  def release(self, instance_id, **kwargs):
    pass


class SelfDescribed(BaseTool):
  def get_openai_tool_schema(self):
    return {"type": "function", "function": {"name": "described", "description": "", "parameters": {"type": "object"}}}


class NoRelease:
  def __init__(self, config, tool_schema):
    pass

  def create(self, instance_id=None):
    return instance_id

  def execute(self, instance_id, parameters):
    return "", 0.0, {}

  def calc_reward(self, instance_id):
    return 0.0
'''


def schema(name, properties="{a: {type: string}, b: {type: integer}}", required="[a]"):
  return textwrap.indent(textwrap.dedent(f"""\
      tool_schema:
        type: function
        function:
          name: {name}
          description: does {name}
          parameters: {{type: object, properties: {properties}, required: {required}}}
      """), "    ")


def write(tmp_path, entries, name="tools.yaml"):
  (tmp_path / "my_tools.py").write_text(TOOL_FILE)
  path = tmp_path / name
  path.write_text("tools:\n" + "".join(entries))
  return str(path)


def entry(class_name, tool_name, **kw):
  return f"  - class_name: {class_name}\n    config: {{type: native, k: 1}}\n" + schema(tool_name, **kw)


def test_load_from_file_and_module(tmp_path):
  path = write(tmp_path, [entry("my_tools.py:Calculator", "calculator"),
                          entry(f"{tmp_path}/my_tools.py:DuckTool", "duck"),
                          entry("rljax.agents.tools.BaseTool", "base")])
  tools = load_tool_config(path)
  assert [type(t).__name__ for t in tools] == ["Calculator", "DuckTool", "BaseTool"]
  assert tools[0].name == "calculator" and tools[0].config == {"type": "native", "k": 1}
  assert list(tools_by_name(tools)) == ["calculator", "duck", "base"]
  schemas = load_tool_schemas(path)
  assert [s["function"]["name"] for s in schemas] == ["calculator", "duck", "base"]
  assert schemas[0]["function"]["parameters"]["required"] == ["a"]


def test_base_tool_defaults():
  tool = BaseTool({}, {"type": "function", "function": {"name": "t"}})
  instance_id, response = tool.create()
  assert isinstance(instance_id, str) and response.text is None
  assert tool.create("i")[0] == "i" and tool.calc_reward("i") == 0.0
  assert tool.get_openai_tool_schema()["function"]["name"] == "t"


@pytest.mark.parametrize("class_name, message", [
    ("my_tools.py:Missing", r"tools\[0\]\.class_name='my_tools.py:Missing': cannot import it.*'Missing' not found"),
    ("nowhere.py:Tool", r"tools\[0\]\.class_name='nowhere.py:Tool': cannot import it.*nowhere.py is neither"),
    ("no_such_pkg.mod.Tool", r"tools\[0\]\.class_name='no_such_pkg.mod.Tool': cannot import it.*No module"),
    ("my_tools.py:NoRelease", r"tools\[0\]\.class_name='my_tools.py:NoRelease' lacks method\(s\) release"),
])
def test_class_errors_name_the_file(tmp_path, class_name, message):
  path = write(tmp_path, [entry(class_name, "t")])
  with pytest.raises((ImportError, TypeError), match=message) as info:
    load_tool_config(path)
  assert str(info.value).startswith(f"{path}: ")


@pytest.mark.parametrize("kw, message", [
    (dict(required="[a, x]"), r"tools\[0\]\.tool_schema\.function\.parameters\.required names 'x', "
                              r"which is not in properties \(a, b\)"),
    (dict(properties="[a]"), r"tools\[0\]\.tool_schema\.function\.parameters\.properties must be a mapping"),
    (dict(required="a"), r"required must be a list"),
    # what verl 0.9.1's pydantic schema refuses: a parameter without a type
    (dict(properties="{a: {description: anything}}", required="[]"),
     r"tools\[0\]\.tool_schema\.function\.parameters\.properties\.a is .*needs each parameter's `type`"),
])
def test_schema_errors_name_the_file_and_key(tmp_path, kw, message):
  path = write(tmp_path, [entry("my_tools.py:Calculator", "ok"), entry("my_tools.py:Calculator", "t", **kw)])
  for load in (load_tool_config, load_tool_schemas):
    with pytest.raises(ValueError, match=message.replace(r"tools\[0\]", r"tools\[1\]")) as info:
      load(path)
    assert str(info.value).startswith(f"{path}: ")


def test_bad_name_type_and_duplicates(tmp_path):
  path = write(tmp_path, [entry("my_tools.py:Calculator", "'two words'")])
  with pytest.raises(ValueError, match=r"tools\[0\]\.tool_schema\.function\.name is 'two words'"):
    load_tool_schemas(path)
  path = write(tmp_path, [entry("my_tools.py:Calculator", "calc"), entry("my_tools.py:DuckTool", "calc")])
  with pytest.raises(ValueError, match=r"tools\[1\] \(my_tools.py:DuckTool\) is named 'calc', like tools\[0\]"):
    load_tool_config(path)
  with pytest.raises(ValueError, match="must be unique"):
    load_tool_schemas(path)
  path = write(tmp_path, ["  - class_name: my_tools.py:Calculator\n    config: {type: mcp}\n"])
  with pytest.raises(ValueError, match=r"tools\[0\]\.config\.type='mcp'.*native tools only"):
    load_tool_config(path)


def test_file_level_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.yaml"):
    load_tool_config(str(tmp_path / "missing.yaml"))
  bad = tmp_path / "bad.yaml"
  bad.write_text("tools: [\n")
  with pytest.raises(ValueError, match="bad.yaml: not valid YAML"):
    load_tool_config(str(bad))
  bad.write_text("tool: []\n")
  with pytest.raises(ValueError, match=r"bad.yaml: expected a top-level `tools:` list; found \['tool'\]"):
    load_tool_config(str(bad))
  bad.write_text("tools:\n  - config: {}\n")
  with pytest.raises(ValueError, match=r"bad.yaml: tools\[0\] has no class_name"):
    load_tool_schemas(str(bad))


def test_schema_from_the_class_when_the_yaml_has_none(tmp_path):
  path = write(tmp_path, ["  - class_name: my_tools.py:SelfDescribed\n"])
  (tool,) = load_tool_config(path)
  assert tool.name == "described"
  assert load_tool_schemas(path)[0]["function"]["name"] == "described"


def test_agents_import_no_jax_trainer_or_rollout():
  code = ("import sys, rljax.agents; "
          "print([m for m in ('jax', 'rljax.rl', 'rljax.rollout') if m in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
