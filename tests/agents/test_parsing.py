"""Tool-call parsing: hermes, llama3_json and mistral, malformed calls included."""

import pytest

from rljax.agents import FORMATS, parse_tool_calls


def test_hermes_several_calls_and_content():
  text = ('Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>\n'
          '<tool_call>\n{"name": "search", "arguments": "{\\"q\\": \\"hi\\"}"}\n</tool_call>')
  content, calls = parse_tool_calls(text, "hermes")
  assert content == "Let me compute.\n\n"
  assert [(c.name, c.arguments, c.error) for c in calls] == [
      ("calc", {"x": 1}, None), ("search", {"q": "hi"}, None)]
  assert calls[0].text.startswith("<tool_call>")


def test_hermes_no_calls_is_content():
  assert parse_tool_calls("The answer is 5.", "hermes") == ("The answer is 5.", [])


@pytest.mark.parametrize("body, error", [
    ("{not json}", "invalid JSON"),
    ('{"arguments": {}}', "missing name"),
    ('{"name": "calc", "arguments": [1, 2]}', "arguments must be a JSON object"),
    ('{"name": "calc", "arguments": "{bad"}', "invalid JSON in the arguments string"),
    ("[1]", "must be a JSON object"),
])
def test_hermes_malformed(body, error):
  content, calls = parse_tool_calls(f"x<tool_call>{body}</tool_call>", "hermes")
  assert content == "x" and len(calls) == 1
  assert error in calls[0].error and calls[0].arguments is None


def test_hermes_unclosed_tag_is_a_malformed_call():
  text = ('a<tool_call>{"name": "calc", "arguments": {}}</tool_call>b'
          '<tool_call>{"name": "calc", "argu')
  content, calls = parse_tool_calls(text, "hermes")
  assert content == "ab"
  assert calls[0].error is None and "unclosed <tool_call>" in calls[1].error


def test_missing_or_null_arguments_are_empty():
  _, calls = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>'
                              '<tool_call>{"name": "now", "arguments": null}</tool_call>', "hermes")
  assert [c.arguments for c in calls] == [{}, {}]


def test_unknown_tool_when_known_names_are_given():
  _, calls = parse_tool_calls('<tool_call>{"name": "rm", "arguments": {"p": 1}}</tool_call>',
                              "hermes", known=["calc", "search"])
  assert calls[0].error == "unknown tool 'rm'; the tools are: calc, search"
  assert calls[0].arguments == {"p": 1}


def test_llama3_json():
  text = ('<|python_tag|>{"name": "calc", "parameters": {"x": 1}}; '
          '{"name": "search", "parameters": "{\\"q\\": \\"a\\"}"}<|eom_id|>')
  content, calls = parse_tool_calls(text, "llama3_json")
  assert content == ""
  assert [(c.name, c.arguments, c.error) for c in calls] == [
      ("calc", {"x": 1}, None), ("search", {"q": "a"}, None)]
  _, calls = parse_tool_calls('{"name": "calc", "parameters": {}}', "llama3_json")
  assert calls[0].name == "calc" and calls[0].error is None
  assert parse_tool_calls("Plain answer {x}", "llama3_json") == ("Plain answer {x}", [])


@pytest.mark.parametrize("text, error", [
    ('{"name": "calc", "parameters": {', "invalid JSON"),
    ('{"name": "calc", "parameters": {}} trailing', "unexpected text after a call"),
    ("<|python_tag|>print(1)", "not a JSON tool call"),
])
def test_llama3_json_malformed(text, error):
  _, calls = parse_tool_calls(text, "llama3_json")
  assert error in calls[-1].error


def test_mistral_list_and_v11_forms():
  text = 'Sure.[TOOL_CALLS][{"name": "calc", "arguments": {"x": 1}}, {"name": "s", "arguments": "{}"}]'
  content, calls = parse_tool_calls(text, "mistral")
  assert content == "Sure."
  assert [(c.name, c.arguments, c.error) for c in calls] == [("calc", {"x": 1}, None), ("s", {}, None)]
  content, calls = parse_tool_calls('[TOOL_CALLS]calc[ARGS]{"x": 2}[TOOL_CALLS]s[ARGS]{}', "mistral")
  assert content == "" and [(c.name, c.arguments) for c in calls] == [("calc", {"x": 2}), ("s", {})]


def test_mistral_malformed():
  _, calls = parse_tool_calls('[TOOL_CALLS][{"name": "calc", "arguments": {', "mistral")
  assert "invalid JSON" in calls[0].error
  _, calls = parse_tool_calls("[TOOL_CALLS]calc[ARGS]{oops", "mistral")
  assert calls[0].name == "calc" and "invalid JSON arguments" in calls[0].error


def test_unknown_format_names_the_key():
  with pytest.raises(ValueError, match=r"multi_turn\.format='xml'.*hermes, llama3_json, mistral"):
    parse_tool_calls("", "xml")
  assert FORMATS == ("hermes", "llama3_json", "mistral")
