"""Tool-call parsing: hermes, llama3_json, mistral, qwen3_coder and glm, malformed calls included."""

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
  with pytest.raises(ValueError, match=r"multi_turn\.format='xml'.*hermes, llama3_json, mistral, qwen3_coder, glm"):
    parse_tool_calls("", "xml")
  assert FORMATS == ("hermes", "llama3_json", "mistral", "qwen3_coder", "glm")


def _schema(name: str, properties: dict) -> dict:
  """An OpenAI function schema of `name` with these parameter properties."""
  return {"type": "function", "function": {"name": name, "description": "d",
                                           "parameters": {"type": "object", "properties": properties, "required": []}}}


# (format, turn text, the tools' schemas or None, verl 0.9.1's own parser's (content, [(name, arguments)]):
# verl/experimental/agent_loop/tool_parser.py of its wheel, run on each text; its values converted by the
# schemas' types, calls left open at the end of the turn, text kept where it does not convert)
VERL_091_PARSED = [
    ('qwen3_coder',
     'I will call.<tool_call>\n<function=add>\n<parameter=a>\n3\n</parameter>\n<parameter=b>\n2.0\n'
     '</parameter>\n<parameter=c>\n2.5\n</parameter>\n<parameter=opts>\n{"x": 1}\n</parameter>\n'
     "<parameter=flag>\nTrue\n</parameter>\n<parameter=items>\n[1, 'a']\n</parameter>\n"
     '<parameter=note>\nnull\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n'
     '</tool_call>',
     {"add": _schema("add", {"a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "number"},
                             "opts": {"type": "object"}, "flag": {"type": "boolean"}, "items": {"type": "array"},
                             "note": {"type": "string"}})},
     ("I will call.", [("add", {"a": 3, "b": 2, "c": 2.5, "opts": {"x": 1}, "flag": True, "items": [1, "a"],
                                "note": None, "extra": "7"})])),
    ('qwen3_coder',
     '<tool_call>\n<function=search>\n<parameter=q>\nhello world\n</parameter>\n</function>\n'
     '</tool_call>\n<tool_call>\n<function=search>\n<parameter=q>\nsecond',
     None,
     ('', [('search', {'q': 'hello world'}), ('search', {'q': 'second'})])),
    ('qwen3_coder',
     'no calls here',
     None,
     ('no calls here', [])),
    ('qwen3_coder',
     '<tool_call>\n<function=count>\n<parameter=n>\nfive\n</parameter>\n<parameter=m>\n{bad json\n'
     '</parameter>\n</function>\n</tool_call>',
     {"count": _schema("count", {"n": {"type": "integer"}, "m": {"type": "object"}})},
     ('', [('count', {'n': 'five', 'm': '{bad json'})])),
    ('glm',
     '<think>hmm</think>Sure<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>'
     '<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>',
     None,
     ('Sure', [('get_weather', {'city': 'Paris', 'days': 3})])),
    ('glm',
     '</think>\nDone.<tool_call>ping</tool_call><tool_call>set<arg_key>cfg</arg_key>\n'
     '<arg_value>{"a": [1, 2]}</arg_value></tool_call>',
     None,
     ('\nDone.', [('ping', {}), ('set', {'cfg': {'a': [1, 2]}})])),
    ('glm',
     'just text <tool_call> unclosed',
     None,
     ('just text <tool_call> unclosed', [])),
]


@pytest.mark.parametrize("format, text, schemas, parsed", VERL_091_PARSED)
def test_qwen3_coder_and_glm_calls_are_verl_091s(format, text, schemas, parsed):
  content, calls = parse_tool_calls(text, format, schemas)
  assert (content, [(c.name, c.arguments) for c in calls]) == parsed
  assert all(c.error is None for c in calls)


def test_malformed_qwen3_coder_and_glm_calls_are_answered_not_dropped():
  calls = parse_tool_calls("<tool_call><function=add</function></tool_call>", "qwen3_coder")[1]
  assert calls[0].error.startswith("malformed <function=...>")  # verl drops it; rljax answers it
  calls = parse_tool_calls("<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "glm")[1]
  assert calls[0].error == "missing name before <arg_key>"
  assert parse_tool_calls("<tool_call>\n<function=f>\n</function>\n</tool_call>", "qwen3_coder", ["g"]
                          )[1][0].error.startswith("unknown tool 'f'")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_a_qwen3_coder_number_python_cannot_make_an_integer_of_stays_text(value):
  schemas = {"f": _schema("f", {"x": {"type": "number"}})}
  text = f"<tool_call>\n<function=f>\n<parameter=x>\n{value}\n</parameter>\n</function>\n</tool_call>"
  assert parse_tool_calls(text, "qwen3_coder", schemas)[1][0].arguments == {"x": value}  # verl keeps the text


def test_json_no_decoder_can_hold_is_text_or_an_error_never_a_crash():
  deep, huge = "[" * 100_000 + "]" * 100_000, "9" * 5000
  schemas = {"f": _schema("f", {"x": {"type": "object"}})}
  text = f"<tool_call>\n<function=f>\n<parameter=x>\n{deep}\n</parameter>\n</function>\n</tool_call>"
  assert parse_tool_calls(text, "qwen3_coder", schemas)[1][0].arguments == {"x": deep}
  glm = f"<tool_call>f<arg_key>x</arg_key><arg_value>{huge}</arg_value></tool_call>"
  assert parse_tool_calls(glm, "glm")[1][0].arguments == {"x": huge}
  calls = parse_tool_calls(f'<tool_call>{{"name": "f", "arguments": {{"x": {huge}}}}}</tool_call>', "hermes")[1]
  assert calls[0].error.startswith("invalid JSON")
