"""appended_ids reproduces the chat template's rendering; sanity_check finds injected differences."""

import pytest

from rljax.agents import appended_ids, sanity_check
from rljax.agents.render import render
from tests.agents.conftest import make_chatml_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def rollout(tok):
  """(messages, ids) of prompt -> tool call -> tool response -> answer, ids built as the rollout does."""
  eos = tok.encode("<|im_end|>", add_special_tokens=False)
  messages = [{"role": "user", "content": "What is 2 + 3?"}]
  ids = tok.encode(render(tok, messages, True, TOOLS), add_special_tokens=False)
  ids += tok.encode(CALL, add_special_tokens=False) + eos
  messages.append({"role": "assistant", "content": CALL})
  new = [{"role": "tool", "content": "5"}]
  ids += appended_ids(tok, messages, new, TOOLS)
  assert ids == tok.encode(render(tok, messages + new, True, TOOLS), add_special_tokens=False)
  messages += new
  ids += tok.encode("The answer is 5.", add_special_tokens=False) + eos
  messages.append({"role": "assistant", "content": "The answer is 5."})
  return messages, ids


def test_appended_ids_continue_the_template(chatml):
  messages, _ = rollout(chatml)
  new = [{"role": "user", "content": "And 3 + 4?"}]
  text = chatml.decode(appended_ids(chatml, messages, new, TOOLS))
  assert text == "\n<|im_start|>user\nAnd 3 + 4?<|im_end|>\n<|im_start|>assistant\n"


def test_appended_ids_errors(chatml):
  with pytest.raises(ValueError, match="ending with the assistant turn; they end with user"):
    appended_ids(chatml, [{"role": "user", "content": "x"}], [], None)
  unstable = make_chatml_tokenizer(
      "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{% if loop.last %}(last) "
      "{% endif %}{{ m['content'] + '<|im_end|>\\n' }}{% endfor %}")
  with pytest.raises(ValueError, match=r"not prefix-stable: rendering roles \[user, assistant\] \+ \[tool\]"):
    appended_ids(unstable, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                 [{"role": "tool", "content": "z"}], None)


def test_sanity_check_modes(chatml):
  messages, ids = rollout(chatml)
  for mode in ("strict", "ignore_strippable", "disable"):
    assert sanity_check(chatml, messages, TOOLS, ids, mode) is None
  assert sanity_check(chatml, messages, TOOLS, ids[:-1], "strict") is None  # last turn cut before its eos
  right = chatml.encode("The answer is 5.", add_special_tokens=False)
  wrong = chatml.encode("The answer is 6.", add_special_tokens=False)
  bad = ids[:-len(right) - 1] + wrong + ids[-1:]
  report = sanity_check(chatml, messages, TOOLS, bad, "strict")
  at = len(ids) - len(right) - 1 + next(i for i, (a, b) in enumerate(zip(right, wrong)) if a != b)
  assert report.startswith(f"trained token {at} (of {len(bad)}; rendering token {at} of {len(ids)})")
  five, six = (chatml.encode(x, add_special_tokens=False) for x in (" 5", " 6"))
  assert f"renders ' 5' as ids {five} where the rollout has ' 6' as ids {six}; context 'nt\\nThe answer is'" in report
  assert sanity_check(chatml, messages, TOOLS, bad, "disable") is None
  newline = chatml.encode("\n", add_special_tokens=False)
  spaced = ids[:-len(right) - 1] + newline + ids[-len(right) - 1:]
  assert "where the rollout has '\\n'" in sanity_check(chatml, messages, TOOLS, spaced, "strict")
  assert sanity_check(chatml, messages, TOOLS, spaced, "ignore_strippable") is None
  with pytest.raises(ValueError, match=r"tokenization_sanity_check_mode='loose'.*disable, strict"):
    sanity_check(chatml, messages, TOOLS, ids, "loose")
