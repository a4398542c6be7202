"""Token ids of the turns a multi-turn rollout appends, and verl's tokenization sanity check.

The rollout trains on the ids it decoded, not on a re-tokenization of the
conversation. After the model's assistant turn (which ends with its
end-of-turn token, e.g. ChatML's `<|im_end|>`) it appends the ids of the
tool / user turns and the next generation prompt, as the chat template
renders them. `sanity_check` then compares the whole trained sequence with
a fresh rendering of the conversation
(actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode).

The tokenizer is rljax's (rljax.models.Tokenizer) or anything with
`apply_chat_template(messages, add_generation_prompt=, tokenize=False, tools=)`,
`encode(text, add_special_tokens=False)`, `decode(ids, skip_special_tokens=)`,
`eos_token` and optionally `eos_token_ids`.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

SANITY_MODES = ("disable", "strict", "ignore_strippable")
SANITY_KEY = "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode"


def render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool,
           tools: list[dict] | None) -> str:
  """The chat template's text of `messages` (with the tools' schemas when given)."""
  text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                       tokenize=False, tools=tools or None)
  if not isinstance(text, str):
    raise TypeError(f"apply_chat_template(..., tokenize=False) returned {type(text).__name__}, "
                    "expected str")
  return text


def end_of_turn_strings(tokenizer: Any) -> list[str]:
  """The texts of the tokens that end a turn: eos_token and every id in eos_token_ids."""
  strings = [tokenizer.eos_token] if getattr(tokenizer, "eos_token", None) else []
  for i in getattr(tokenizer, "eos_token_ids", None) or []:
    strings.append(tokenizer.decode([i], skip_special_tokens=False))
  return [s for s in dict.fromkeys(strings) if s]


def split_after_last_end(tokenizer: Any, text: str) -> tuple[str, str]:
  """(text up to and including its last end-of-turn token, the rest).

  Raises:
    ValueError: the text holds no end-of-turn token.
  """
  ends = end_of_turn_strings(tokenizer)
  cut = max((text.rfind(s) + len(s) for s in ends if s in text), default=-1)
  if cut < 0:
    shown = ", ".join(ends) or "the tokenizer has no eos_token"
    raise ValueError(f"the rendered conversation holds no end-of-turn token ({shown}), so the end "
                     f"of the assistant turn cannot be found; it ends {text[-80:]!r}")
  return text[:cut], text[cut:]


def appended_ids(tokenizer: Any, messages: list[dict], new_messages: list[dict],
                 tools: list[dict] | None) -> list[int]:
  """Ids [n] to append after the model's assistant turn (ids ending with its end-of-turn token).

  With them the trained sequence continues as the template renders
  `messages + new_messages` with add_generation_prompt=True: what the template
  writes after the assistant turn's end-of-turn token (e.g. "\\n" in ChatML),
  the new turns, and the generation prompt.

  Args:
    tokenizer: see the module docstring.
    messages: the conversation so far, ending with the assistant message whose
      content is the model's decoded turn (without its end-of-turn token).
    new_messages: the tool / user messages to add.
    tools: the OpenAI schemas the prompt was rendered with (None for none).

  Raises:
    ValueError: messages does not end with an assistant message, or the
      template is not prefix-stable (rendering the new turns changes the text of
      the earlier ones), naming the roles.
  """
  if not messages or messages[-1].get("role") != "assistant":
    last = messages[-1].get("role") if messages else "nothing"
    raise ValueError(f"appended_ids needs messages ending with the assistant turn; they end with {last}")
  prev = render(tokenizer, messages, False, tools)
  full = render(tokenizer, list(messages) + list(new_messages), True, tools)
  if not full.startswith(prev):
    at = next((i for i, (a, b) in enumerate(zip(prev, full)) if a != b), min(len(prev), len(full)))
    raise ValueError(
        "the chat template is not prefix-stable: rendering roles "
        f"[{_roles(messages)}] + [{_roles(new_messages)}] changes the text of [{_roles(messages)}] "
        f"at character {at}: {prev[max(0, at - 20):at + 40]!r} becomes {full[max(0, at - 20):at + 40]!r}. "
        "Multi-turn rollouts need a template that renders earlier turns the same whatever follows")
  _, tail = split_after_last_end(tokenizer, prev)
  return list(tokenizer.encode(tail + full[len(prev):], add_special_tokens=False))


def _roles(messages: list[dict]) -> str:
  return ", ".join(str(m.get("role")) for m in messages)


def sanity_check(tokenizer: Any, messages: list[dict], tools: list[dict] | None,
                 token_ids: Sequence[int], mode: str) -> str | None:
  """None when the trained ids match the template's rendering of `messages`; else the first difference.

  Args:
    tokenizer: see the module docstring.
    messages: the whole conversation (prompt and every turn).
    tools: the OpenAI schemas the prompt was rendered with.
    token_ids: [n] the prompt + all turns as trained.
    mode: "disable" (always None); "strict" (every token must match);
      "ignore_strippable" (differences where both sides decode to whitespace
      only are ignored, as verl's mode).

  What counts: the rendering of `messages` with add_generation_prompt=False,
  up to and including its last end-of-turn token (the template's text after
  it, e.g. ChatML's trailing "\\n", is never generated). When the trained ids
  do not end with an end-of-turn token (the last turn was cut at the length
  limit), the rendering's last end-of-turn token is dropped too.

  Raises:
    ValueError: an unknown mode, naming SANITY_KEY and the choices.
  """
  if mode not in SANITY_MODES:
    raise ValueError(f"{SANITY_KEY}={mode!r} is not a sanity check mode. "
                     f"Fix: use one of {', '.join(SANITY_MODES)}")
  if mode == "disable":
    return None
  head, _ = split_after_last_end(tokenizer, render(tokenizer, messages, False, tools))
  expected = list(tokenizer.encode(head, add_special_tokens=False))
  trained = [int(i) for i in token_ids]
  if trained and expected and not _ends_turn(tokenizer, trained[-1]):
    expected = expected[:-1]
  if expected == trained:
    return None
  for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, expected, trained, autojunk=False).get_opcodes():
    if tag == "equal":
      continue
    want, got = _decode(tokenizer, expected[i1:i2]), _decode(tokenizer, trained[j1:j2])
    if mode == "ignore_strippable" and not want.strip() and not got.strip():
      continue
    return (f"trained token {j1} (of {len(trained)}; rendering token {i1} of {len(expected)}): "
            f"the chat template renders {want!r} as ids {expected[i1:i2]} where the rollout has {got!r} as ids "
            f"{trained[j1:j2]}; context "
            f"{_decode(tokenizer, trained[max(0, j1 - 5):j1])!r}")
  return None


def _ends_turn(tokenizer: Any, token_id: int) -> bool:
  """Whether `token_id` decodes to an end-of-turn token."""
  return _decode(tokenizer, [token_id]) in end_of_turn_strings(tokenizer)


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
  return tokenizer.decode(list(ids), skip_special_tokens=False)
