"""The tokenizer protocol the data pipeline needs, and pure prompt helpers.

rljax never imports `transformers`. Anything with these members works (a
`transformers.PreTrainedTokenizerFast`, or `rljax.models.load_tokenizer`'s
object):

- `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`
  -> str: the prompt text a chat model sees.
- `encode(text, add_special_tokens=False)` -> list[int]. A tokenizer whose
  `encode` has no `add_special_tokens` argument is called as `encode(text)`
  and must then add no special tokens itself (the chat template already
  holds them).
- `decode(ids, skip_special_tokens=True)` -> str (or `decode(ids)`).
- `pad_token_id`: int or None (None falls back to the first EOS id, then 0).
- `eos_token_ids` (a list) or `eos_token_id` (an int).

The helpers below turn one prompt's token ids into the fixed-width, left-padded
rows verl's RLHFDataset yields: `P` is `data.max_prompt_length`.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

TRUNCATION_MODES = ("error", "left", "right", "middle")


class Tokenizer(Protocol):
  """The members of a tokenizer the data and reward code call."""

  pad_token_id: int | None

  def apply_chat_template(self, messages: Sequence[dict[str, str]],
                          **kwargs) -> Any:
    ...

  def encode(self, text: str, **kwargs) -> list[int]:
    ...

  def decode(self, ids: Sequence[int], **kwargs) -> str:
    ...


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
  """Token ids of `text` with no special tokens added."""
  try:
    ids = tokenizer.encode(text, add_special_tokens=False)
  except TypeError:
    ids = tokenizer.encode(text)
  return list(ids)


def decode_ids(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
  """Text of `ids`, special tokens skipped where the tokenizer can."""
  ids = [int(i) for i in ids]
  try:
    return tokenizer.decode(ids, skip_special_tokens=True)
  except TypeError:
    return tokenizer.decode(ids)


def chat_prompt(tokenizer: Tokenizer,
                messages: Sequence[dict[str, str]],
                tools: Sequence[dict[str, Any]] | None = None) -> str:
  """The templated prompt text, ending with the assistant turn's opening (with `tools`: OpenAI function
  schemas the chat template describes)."""
  kwargs = {"tools": list(tools)} if tools else {}
  text = tokenizer.apply_chat_template(
      list(messages), tokenize=False, add_generation_prompt=True, **kwargs)
  if not isinstance(text, str):
    raise TypeError(
        "tokenizer.apply_chat_template(..., tokenize=False) returned "
        f"{type(text).__name__}, expected str")
  return text


def pad_token_id(tokenizer: Tokenizer) -> int:
  """The id used for left padding: pad, else the first EOS, else 0."""
  pad = getattr(tokenizer, "pad_token_id", None)
  if pad is not None:
    return int(pad)
  eos = eos_token_ids(tokenizer)
  return eos[0] if eos else 0


def eos_token_ids(tokenizer: Tokenizer) -> list[int]:
  """All end-of-sequence ids the tokenizer declares."""
  ids = getattr(tokenizer, "eos_token_ids", None)
  if ids is None:
    ids = getattr(tokenizer, "eos_token_id", None)
  if ids is None:
    return []
  if isinstance(ids, (int, np.integer)):
    return [int(ids)]
  return [int(i) for i in ids]


def truncate(ids: Sequence[int], max_length: int, mode: str,
             where: str = "") -> list[int]:
  """Cuts `ids` to at most `max_length` tokens as `data.truncation` says.

  Args:
    ids: one prompt's token ids, length L.
    max_length: P, `data.max_prompt_length`.
    mode: "error" (raise), "left" (keep the last P), "right" (keep the first
      P), "middle" (keep the first P // 2 and the last P - P // 2).
    where: names the row in the error (e.g. "train.parquet row 3").

  Returns:
    The ids, unchanged when L <= P.
  """
  if mode not in TRUNCATION_MODES:
    raise ValueError(
        f"data.truncation={mode!r}; expected one of {TRUNCATION_MODES}")
  ids = list(ids)
  if len(ids) <= max_length:
    return ids
  if mode == "error":
    prefix = f"{where}: " if where else ""
    raise ValueError(
        f"{prefix}prompt is {len(ids)} tokens, longer than "
        f"data.max_prompt_length={max_length}. Raise data.max_prompt_length, "
        "set data.filter_overlong_prompts=True, or set data.truncation to "
        "left, right or middle.")
  if mode == "left":
    return ids[len(ids) - max_length:]
  if mode == "right":
    return ids[:max_length]
  head = max_length // 2
  tail = max_length - head
  return ids[:head] + (ids[len(ids) - tail:] if tail else [])


def left_pad(ids: Sequence[int], length: int,
             pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Left-pads one prompt to `length`.

  Args:
    ids: L <= length token ids.
    length: P.
    pad_id: the padding token id.

  Returns:
    input_ids [P] int32, attention_mask [P] int32 (1 on real tokens),
    position_ids [P] int32 (0 on padding, then 0, 1, ..., L-1).
  """
  n = len(ids)
  if n > length:
    raise ValueError(f"{n} ids do not fit in {length}; truncate first")
  input_ids = np.full((length,), pad_id, dtype=np.int32)
  mask = np.zeros((length,), dtype=np.int32)
  if n:
    input_ids[length - n:] = np.asarray(ids, dtype=np.int32)
    mask[length - n:] = 1
  return input_ids, mask, position_ids_from_mask(mask)


def position_ids_from_mask(mask: np.ndarray) -> np.ndarray:
  """Positions counted over real tokens: cumsum(mask) - 1, floored at 0.

  Args:
    mask: [..., P] attention mask.

  Returns:
    [..., P] int32 position ids.
  """
  return np.maximum(np.cumsum(mask, axis=-1) - 1, 0).astype(np.int32)
