"""Tool calls in a model's turn text (actor_rollout_ref.rollout.multi_turn.format).

Formats:
- `hermes` (Qwen2.5 / Qwen3, verl's default): each call is
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; a
  `<tool_call>` never closed is a malformed call.
- `llama3_json` (Llama 3.1 / 3.2 JSON tool calling): a turn that is, after an
  optional `<|python_tag|>`, one or more `{"name": ..., "parameters": {...}}`
  objects separated by `;`. Such a turn has no content; a turn that does not
  start with `{` or `<|python_tag|>` is content only.
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (or
  the v11+ form `[TOOL_CALLS]name[ARGS]{...}`); the text before is content.
- `qwen3_coder` (Qwen3-Coder, Qwen3.5; verl 0.9.1's XML parser):
  `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...
  </function>\n</tool_call>`; a block or function left open at the end of
  the turn still counts. Each VALUE is text, converted by its parameter's
  type in the tool's schema as verl converts it (null, integer, number,
  boolean, object as JSON, others as a Python literal; a value that does not
  convert stays text). The content is the text before the first call.
- `glm` (GLM-4.5 and later): `<tool_call>NAME<arg_key>KEY</arg_key>
  <arg_value>VALUE</arg_value>...</tool_call>`, each VALUE read as JSON where
  it is JSON, else as text; the content is the text before the first call,
  less a leading `<think>...</think>`. GLM ends a calling turn with
  `<|observation|>`, which the engine stops at (`format_stop_tokens`), as
  verl's parser asks vLLM to.

In every format arguments may be an object or a JSON string holding one
(OpenAI style), under "arguments" or "parameters"; missing or null
arguments are `{}`. A malformed call is returned as a `ToolCall` with
`error` set, so the rollout can answer it instead of dropping it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
from typing import Any, Mapping, Sequence

FORMATS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "glm")
FORMAT_KEY = "actor_rollout_ref.rollout.multi_turn.format"

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
_QWEN3_CODER_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*?)$", re.DOTALL)
_QWEN3_CODER_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
_QWEN3_CODER_PARAMETER = re.compile(r"<parameter=(.*?)</parameter>|<parameter=(.*?)$", re.DOTALL)
# what decoding model-written JSON may raise: malformed text, a number past Python's digit limit, nesting past the
# recursion limit (verl's parsers catch any exception there)
_UNDECODABLE = (ValueError, RecursionError)
GLM_OBSERVATION = "<|observation|>"
_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_EOM = "<|eom_id|>"
_MISTRAL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_MISTRAL_CALL_ID = "[CALL_ID]"


@dataclasses.dataclass
class ToolCall:
  """One call the model made.

  Attributes:
    name: the function name ("" when the call has none).
    arguments: the decoded argument object; None when the call could not be
      decoded (kept, with `error` set, when only the name is unknown).
    error: None for a well-formed call; else what is wrong ("invalid JSON ...",
      "missing name", "arguments must be an object ...", "unknown tool ...",
      "unclosed <tool_call>").
    text: the call's raw text in the turn.
  """
  name: str
  arguments: dict | None
  error: str | None = None
  text: str = ""


def parse_tool_calls(text: str, format: str, known: Sequence[str] | Mapping[str, dict] | None = None
                     ) -> tuple[str, list[ToolCall]]:
  """(content without the calls, calls in order) of a model turn.

  Args:
    text: the decoded turn (special tokens kept), without its end-of-turn token.
    format: one of FORMATS.
    known: the tool names the rollout offers, or {name: its OpenAI schema} (qwen3_coder reads the parameters'
      types from it); a call to another name gets an "unknown tool" error. None accepts any name.

  Raises:
    ValueError: for an unknown format, naming FORMAT_KEY and the choices.
  """
  parsers = {"hermes": _parse_hermes, "llama3_json": _parse_llama3_json, "mistral": _parse_mistral,
             "qwen3_coder": functools.partial(_parse_qwen3_coder, schemas=known if isinstance(known, Mapping) else {}),
             "glm": _parse_glm}
  if format not in parsers:
    raise ValueError(f"{FORMAT_KEY}={format!r} is not a tool-call format rljax parses. "
                     f"Fix: use one of {', '.join(FORMATS)}")
  content, calls = parsers[format](text)
  if known is not None:
    calls = [_check_known(call, list(known)) for call in calls]
  return content, calls


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
  """`<tool_call>{json}</tool_call>` blocks; an unclosed one (and what follows) is a malformed call."""
  calls = [_call_from_json(m.group(1), m.group(0)) for m in _HERMES_CALL.finditer(text)]
  content = _HERMES_CALL.sub("", text)
  start = content.find(_HERMES_OPEN)
  if start >= 0:
    calls.append(ToolCall("", None, f"unclosed {_HERMES_OPEN}: the turn ended before </tool_call>",
                          content[start:]))
    content = content[:start]
  return content, calls


def _parse_llama3_json(text: str) -> tuple[str, list[ToolCall]]:
  """A turn of `;`-separated JSON call objects, optionally after <|python_tag|>."""
  body = text.strip()
  if body.endswith(_EOM):
    body = body[:-len(_EOM)].rstrip()
  tagged = body.startswith(_PYTHON_TAG)
  if tagged:
    body = body[len(_PYTHON_TAG):].lstrip()
  if not tagged and not body.startswith("{"):
    return text, []
  if not body.startswith("{"):
    return "", [ToolCall("", None, f"the text after {_PYTHON_TAG} is not a JSON tool call", body)]
  return "", _json_objects(body, separator=";")


def _parse_mistral(text: str) -> tuple[str, list[ToolCall]]:
  """[TOOL_CALLS] followed by a JSON list / object, or by name[ARGS]{json} (one per [TOOL_CALLS])."""
  if _MISTRAL_CALLS not in text:
    return text, []
  content, *blocks = text.split(_MISTRAL_CALLS)
  calls = []
  for block in blocks:
    body = block.strip()
    if body.startswith("["):
      calls.extend(_json_list(body))
    elif body.startswith("{"):
      calls.extend(_json_objects(body, separator=","))
    elif _MISTRAL_ARGS in body:
      name, args = body.split(_MISTRAL_ARGS, 1)
      name = name.split(_MISTRAL_CALL_ID, 1)[0].strip()
      calls.append(_call_from_fields(name, args.strip(), body))
    else:
      calls.append(ToolCall("", None, f"expected a JSON list or name{_MISTRAL_ARGS}{{...}} after "
                            f"{_MISTRAL_CALLS}", body))
  return content, calls


def _parse_qwen3_coder(text: str, schemas: Mapping[str, dict]) -> tuple[str, list[ToolCall]]:
  """`<tool_call>` blocks of `<function=NAME>` with `<parameter=KEY>` values (either may be left open)."""
  start = text.find(_HERMES_OPEN)
  if start < 0:
    return text, []
  blocks = [a or b for a, b in _QWEN3_CODER_CALL.findall(text)]
  functions = [a or b for block in blocks for a, b in _QWEN3_CODER_FUNCTION.findall(block)]
  return text[:start], [_qwen3_coder_call(function, schemas) for function in functions]


def _qwen3_coder_call(function: str, schemas: Mapping[str, dict]) -> ToolCall:
  """One `NAME>...<parameter=...` function body as a call, its values converted by the schema's types."""
  end = function.find(">")
  if end < 0:
    return ToolCall("", None, "malformed <function=...>: no '>' after the name", function)
  name = function[:end]
  properties = ((schemas.get(name) or {}).get("function", {}).get("parameters") or {}).get("properties") or {}
  arguments = {}
  for a, b in _QWEN3_CODER_PARAMETER.findall(function[end + 1:]):
    body = a or b
    split = body.find(">")
    if split < 0:
      return ToolCall(name, None, f"malformed <parameter=...> of {name}: no '>' after the key", function)
    value = body[split + 1:]
    value = value[1:] if value.startswith("\n") else value
    value = value[:-1] if value.endswith("\n") else value
    key = body[:split]
    arguments[key] = _qwen3_coder_value(value, properties.get(key) if properties else None, key in properties)
  return ToolCall(name, arguments, None, function)


def _qwen3_coder_value(value: str, schema: dict | None, declared: bool) -> Any:
  """A parameter's text as verl 0.9.1's Qwen3-Coder parser converts it by the schema's type (no schema: text)."""
  if value.lower() == "null":
    return None
  if not declared:
    return value
  kind = str(schema.get("type", "string")).strip().lower() if isinstance(schema, dict) else "string"
  if kind in ("string", "str", "text", "varchar", "char", "enum"):
    return value
  if kind.startswith(("int", "uint", "long", "short", "unsigned")):
    try:
      return int(value)
    except ValueError:
      return value
  if kind.startswith(("num", "float")):
    try:
      number = float(value)
      return number if number - int(number) != 0 else int(number)
    except (ValueError, OverflowError):  # not a number, or inf / nan / 1e400: text, as verl keeps it
      return value
  if kind in ("boolean", "bool", "binary"):
    return value.lower() == "true"
  if kind == "object" or kind.startswith("dict"):
    try:
      return json.loads(value)
    except _UNDECODABLE:
      pass
  try:
    return ast.literal_eval(value)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return value


def _parse_glm(text: str) -> tuple[str, list[ToolCall]]:
  """`<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>` blocks."""
  if _HERMES_OPEN not in text or _HERMES_CLOSE not in text:
    return text, []
  calls = []
  for block in _HERMES_CALL.findall(text):
    first = block.find("<arg_key>")
    name = (block if first < 0 else block[:first]).strip()
    pairs = [] if first < 0 else _GLM_ARGUMENT.findall(block[first:])
    call = ToolCall(name, {key.strip(): _json_or_text(value) for key, value in pairs}, None, block)
    calls.append(call if name else dataclasses.replace(call, arguments=None, error="missing name before <arg_key>"))
  content = text[:text.find(_HERMES_OPEN)]
  content = re.sub(r"^\s*</think>", "", re.sub(r"^\s*<think>.*?</think>", "", content, flags=re.DOTALL))
  return content, calls


def format_stop_tokens(format: str) -> tuple[str, ...]:
  """Tokens that end a calling turn in `format` beside the model's EOS (verl's parser stop_token_ids): GLM's
  `<|observation|>`."""
  return (GLM_OBSERVATION,) if format == "glm" else ()


def _json_or_text(raw: str) -> Any:
  """A GLM argument value: its JSON value where it is JSON, else its text (stripped)."""
  try:
    return json.loads(raw.strip())
  except _UNDECODABLE:
    return raw.strip()


def _json_list(body: str) -> list[ToolCall]:
  """A JSON list of call objects; anything after the list is a malformed call."""
  try:
    items, end = json.JSONDecoder().raw_decode(body)
  except _UNDECODABLE as e:
    return [ToolCall("", None, f"invalid JSON: {e}", body)]
  calls = [_call_from_value(item, json.dumps(item, ensure_ascii=False)) for item in items]
  rest = body[end:].strip()
  if rest:
    calls.append(ToolCall("", None, "unexpected text after the JSON list of calls", rest))
  return calls


def _json_objects(body: str, separator: str) -> list[ToolCall]:
  """Consecutive JSON objects separated by `separator` (and whitespace)."""
  decoder, calls, pos = json.JSONDecoder(), [], 0
  while pos < len(body):
    try:
      value, end = decoder.raw_decode(body, pos)
    except _UNDECODABLE as e:
      calls.append(ToolCall("", None, f"invalid JSON: {e}", body[pos:]))
      break
    calls.append(_call_from_value(value, body[pos:end]))
    pos = _skip(body, end, separator)
    if pos is None:
      calls.append(ToolCall("", None, f"unexpected text after a call (calls are separated by "
                            f"{separator!r})", body[end:].strip()))
      break
  return calls


def _skip(body: str, pos: int, separator: str) -> int | None:
  """The index after whitespace, one separator and whitespace; len(body) at the end; None for other text."""
  rest = body[pos:].lstrip()
  if not rest:
    return len(body)
  if not rest.startswith(separator):
    return None
  return len(body) - len(rest[len(separator):].lstrip())


def _call_from_json(raw: str, text: str) -> ToolCall:
  """A call from the JSON text of one object."""
  try:
    value = json.loads(raw)
  except _UNDECODABLE as e:
    return ToolCall("", None, f"invalid JSON: {e}", text)
  return _call_from_value(value, text)


def _call_from_value(value: Any, text: str) -> ToolCall:
  """A call from a decoded {"name", "arguments" | "parameters"} object."""
  if not isinstance(value, dict):
    return ToolCall("", None, f"a call must be a JSON object, got {type(value).__name__}", text)
  name = value.get("name")
  if not isinstance(name, str) or not name:
    return ToolCall("", None, "missing name: a call needs a non-empty string \"name\"", text)
  args = value.get("arguments", value.get("parameters"))
  return _with_arguments(name, args, text)


def _call_from_fields(name: str, raw_args: str, text: str) -> ToolCall:
  """A call from a name and the JSON text of its arguments (mistral's [ARGS] form)."""
  if not name:
    return ToolCall("", None, f"missing name before {_MISTRAL_ARGS}", text)
  try:
    args = json.loads(raw_args)
  except _UNDECODABLE as e:
    return ToolCall(name, None, f"invalid JSON arguments: {e}", text)
  return _with_arguments(name, args, text)


def _with_arguments(name: str, args: Any, text: str) -> ToolCall:
  """The call with `args` decoded: an object, a JSON string holding one, or null/missing (= {})."""
  if args is None:
    return ToolCall(name, {}, None, text)
  if isinstance(args, str):
    try:
      args = json.loads(args) if args.strip() else {}
    except _UNDECODABLE as e:
      return ToolCall(name, None, f"invalid JSON in the arguments string: {e}", text)
  if not isinstance(args, dict):
    return ToolCall(name, None, f"arguments must be a JSON object, got {type(args).__name__}", text)
  return ToolCall(name, args, None, text)


def _check_known(call: ToolCall, known: Sequence[str]) -> ToolCall:
  """The call with an "unknown tool" error when its name is not offered."""
  if call.error is None and call.name not in known:
    offered = ", ".join(known) or "none"
    return dataclasses.replace(call, error=f"unknown tool {call.name!r}; the tools are: {offered}")
  return call
