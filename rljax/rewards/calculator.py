"""Reward for the synthetic calculator task (data_source "rljax/calculator").

The response text holds every turn after the prompt: the assistant's turns,
the rendered tool turns and the final answer. Decoded with special tokens
skipped (the reward managers' and verl's way), ChatML's
`<|im_end|>\\n<|im_start|>tool\\n777777<|im_end|>\\n<|im_start|>assistant\\n`
reads `\\ntool\\n777777\\nassistant\\n`; both forms are understood, and so
are Qwen2.5's `<tool_response>...</tool_response>` user turns.

The final answer is the text after the last tool turn. A response without a
`</tool_call>` is its own final answer (the model answered directly); one
whose last call has no tool turn after it (the rollout stopped there) has
no final answer.

Scheme (`compute_score` returns {"score", "acc", "pred", "tool_call"}):

* score 1.0 when the final answer's last number equals the ground truth
  (as a number: "777,777" and "777777.0" match "777777"), with or without
  a tool call (the answer is what counts; a 135M model cannot do these sums
  in its head, so in practice it needs the tool);
* else `FORMAT_SCORE` (0.2) when the response holds at least one
  well-formed call: `<tool_call>` ... `</tool_call>` around a JSON object
  {"name": "calculator", "arguments": {"expression": <string>}} (arguments
  may also be a JSON string holding that object, as some models write);
* else 0.0 (no number right and no well-formed call, e.g. a malformed
  call's bad JSON, another tool's name, or no call at all).

"acc" is whether the answer is right, "pred" the final answer's last number
as text ("" when none), "tool_call" 1.0 when a well-formed call was made.
`extra_info` may hold verl's "rollout_reward_scores" / "num_turns"; they are
not needed and not used.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rljax.rewards.arithmetic import last_number

TOOL_NAME = "calculator"
FORMAT_SCORE = 0.2
CORRECT_SCORE = 1.0

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# A rendered tool turn, with ChatML's special tokens kept or skipped; group 1 is the tool's text.
_TOOL_TURN = re.compile(
    r"(?:<\|im_end\|>)?\s*(?:<\|im_start\|>)?tool\n(.*?)(?:<\|im_end\|>)?\s*\n(?:<\|im_start\|>)?assistant\n",
    re.DOTALL)
# Qwen2.5's template renders tool results inside a user turn: <tool_response>\n...\n</tool_response>.
_TOOL_RESPONSE = re.compile(
    r"<tool_response>(.*?)</tool_response>(?:<\|im_end\|>)?\s*\n(?:<\|im_start\|>)?assistant\n", re.DOTALL)


def parse_call(body: str) -> dict[str, Any] | None:
  """The arguments of a well-formed calculator call's JSON body, or None."""
  try:
    call = json.loads(body.strip())
  except (json.JSONDecodeError, ValueError):
    return None
  if not isinstance(call, dict) or call.get("name") != TOOL_NAME:
    return None
  arguments = call.get("arguments")
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except (json.JSONDecodeError, ValueError):
      return None
  if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
    return None
  return arguments


def tool_calls(text: str) -> list[dict[str, Any] | None]:
  """Each `<tool_call>` block's arguments, None for a malformed one."""
  return [parse_call(body) for body in _CALL.findall(text)]


def has_well_formed_call(text: str) -> bool:
  return any(args is not None for args in tool_calls(text))


def final_answer(text: str) -> str:
  """The text after the last tool turn; the whole text when there is none; "" after an unanswered call."""
  last_call = text.rfind("</tool_call>")
  if last_call < 0:
    return text
  turns = list(_TOOL_TURN.finditer(text, last_call)) + list(_TOOL_RESPONSE.finditer(text, last_call))
  if not turns:
    return ""
  return text[max(t.end() for t in turns):]


def strip_end(text: str) -> str:
  return text.replace("<|im_end|>", "").replace("<|endoftext|>", "")


def compute_score(solution_str: str, ground_truth: str, extra_info: Any = None,
                  format_score: float = FORMAT_SCORE, score: float = CORRECT_SCORE) -> dict[str, Any]:
  """The score of one multi-turn response (module docstring)."""
  del extra_info
  answer = strip_end(final_answer(solution_str))
  value = last_number(answer)
  try:
    correct = value is not None and value == float(str(ground_truth).replace(",", ""))
  except ValueError:
    correct = False
  called = has_well_formed_call(solution_str)
  if correct:
    reward = score
  elif called:
    reward = format_score
  else:
    reward = 0.0
  pred = "" if value is None else (str(int(value)) if value == int(value) else str(value))
  return {"score": float(reward), "acc": bool(correct), "pred": pred, "tool_call": 1.0 if called else 0.0}
