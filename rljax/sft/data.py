"""SFT examples: parquet rows -> token ids and the mask of the tokens trained on.

Two row formats, as verl's SFT datasets read them:

* single-turn (`data.multiturn.enable=false`): the prompt is
  `row[data.prompt_key]` and the response `row[data.response_key]`, each
  looked up further through `data.prompt_dict_keys` / `response_dict_keys`
  (nested keys, e.g. `prompt_key=extra_info`, `prompt_dict_keys=[question]`).
  A prompt string becomes one user message; a prompt that is already a list
  of `{"role", "content"}` messages (verl's RL schema) is used as it is. The
  example is `chat_template(prompt, add_generation_prompt=True)` followed by
  the response text and the EOS id, tokenised separately as verl does; the
  response and EOS are trained on.
* multi-turn (`data.multiturn.enable=true`): `row[data.multiturn.messages_key]`
  is a list of messages; only assistant turns are trained on. The mask comes
  from rendering the chat template turn by turn: for assistant turn k, the
  tokens between `render(messages[:k], add_generation_prompt=True)` and
  `render(messages[:k+1])` are trained (the turn's content and its end
  tokens), everything else is not. Each rendering must extend the previous
  one token for token; a template that rewrites earlier turns (for example
  one that drops past reasoning) is not prefix-stable and raises an error
  naming the row and turn.

An example is `(token_ids [n], loss_mask [n])`: `loss_mask[i] = 1` when token
i is a response token, so the loss of predicting token i from tokens < i
counts. `data.truncation` cuts examples longer than `data.max_length`:
error (raise, naming the file and row), left (keep the last max_length
tokens) or right (keep the first). verl's single-turn dataset trains the
last prompt token and not the EOS (its mask is shifted by one); rljax
trains exactly the response tokens and the EOS.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from rljax.data import dataset as rl_dataset
from rljax.data import images as images_lib
from rljax.data import parquet
from rljax.data import tokenization
from rljax.data.synthetic import arithmetic as synthetic_arithmetic
from rljax.models.tokenizer import Tokenizer as ChatTokenizer
from rljax.sft.packing import Example


def lookup(row: Mapping[str, Any], key: str, dict_keys: Sequence[str] | None, where: str, what: str) -> Any:
  """`row[key]`, then one level down per entry of `dict_keys`.

  Raises:
    KeyError: naming `where` (file and row), the missing key and the keys present
      (and how to rewrite a synthetic-task file older than the key).
  """
  if key not in row:
    raise KeyError(f"{where}: no column {key!r} (data.{what}_key); columns: {sorted(row)}")
  value, path = row[key], key
  for sub in dict_keys or ():
    if not isinstance(value, Mapping) or sub not in value:
      present = sorted(value) if isinstance(value, Mapping) else type(value).__name__
      hint = synthetic_arithmetic.regenerate_hint(sub)
      raise KeyError(f"{where}: {path} has no key {sub!r} (data.{what}_dict_keys); it holds {present}"
                     + (f". Fix: {hint}" if hint else ""))
    value, path = value[sub], f"{path}.{sub}"
  return value


def as_messages(prompt: Any, where: str, key: str) -> list[dict[str, str]]:
  """A prompt string -> one user message; a list of messages -> checked as is."""
  if isinstance(prompt, str):
    return [{"role": "user", "content": prompt}]
  return rl_dataset.check_messages(prompt, where, key)


def render_ids(tokenizer: tokenization.Tokenizer, messages: Sequence[Mapping[str, str]],
               add_generation_prompt: bool) -> list[int]:
  """Token ids of the chat template applied to `messages` (no special tokens added)."""
  text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
  return tokenization.encode_text(tokenizer, text)


def eos_id(tokenizer: tokenization.Tokenizer) -> int:
  """The id appended to single-turn responses; errors when the tokenizer has none."""
  ids = tokenization.eos_token_ids(tokenizer)
  if not ids:
    raise ValueError("the tokenizer declares no EOS token; single-turn SFT appends one to every response")
  return ids[0]


def single_turn_example(tokenizer: tokenization.Tokenizer, prompt: list[dict[str, str]], response: str) -> Example:
  """(ids [P + R + 1], mask [P + R + 1]): templated prompt (0), response and EOS (1)."""
  prompt_ids = render_ids(tokenizer, prompt, add_generation_prompt=True)
  response_ids = tokenization.encode_text(tokenizer, response) + [eos_id(tokenizer)]
  ids = np.asarray(prompt_ids + response_ids, np.int32)
  mask = np.concatenate([np.zeros(len(prompt_ids), np.int32), np.ones(len(response_ids), np.int32)])
  return ids, mask


def _extend(ids: list[int], rendered: list[int], where: str, turn: int, messages: Sequence[Mapping[str, str]],
            tokenizer: tokenization.Tokenizer) -> list[int]:
  """The tokens `rendered` adds after `ids`; raises if `ids` is not its prefix."""
  if rendered[:len(ids)] != ids:
    first = next((i for i, (a, b) in enumerate(zip(ids, rendered)) if a != b), min(len(ids), len(rendered)))
    before = tokenization.decode_ids(tokenizer, ids[first:first + 8])
    after = tokenization.decode_ids(tokenizer, rendered[first:first + 8])
    raise ValueError(
        f"{where}: the chat template is not prefix-stable at turn {turn} ({messages[turn]['role']}): rendering "
        f"turns 0..{turn} changes the tokens of the earlier turns from token {first} on ({before!r} became "
        f"{after!r}), so the assistant tokens cannot be told apart. Fix: give data.chat_template a template that "
        "only appends each message (for example one that keeps past reasoning), or train single-turn rows.")
  return rendered[len(ids):]


def multi_turn_example(tokenizer: tokenization.Tokenizer, messages: Sequence[Mapping[str, str]], where: str) -> Example:
  """(ids [n], mask [n]) of a conversation; mask 1 exactly on assistant turns' tokens.

  Raises:
    ValueError: the template is not prefix-stable, or no turn is an assistant's.
  """
  if not any(m["role"] == "assistant" for m in messages):
    raise ValueError(f"{where}: the conversation has no assistant turn, so nothing would be trained on")
  ids: list[int] = []
  mask: list[int] = []
  for turn, message in enumerate(messages):
    if message["role"] == "assistant":
      head = _extend(ids, render_ids(tokenizer, messages[:turn], add_generation_prompt=True), where, turn,
                     messages, tokenizer)
      ids += head
      mask += [0] * len(head)
      body = _extend(ids, render_ids(tokenizer, messages[:turn + 1], add_generation_prompt=False), where, turn,
                     messages, tokenizer)
      ids += body
      mask += [1] * len(body)
    else:
      part = _extend(ids, render_ids(tokenizer, messages[:turn + 1], add_generation_prompt=False), where, turn,
                     messages, tokenizer)
      ids += part
      mask += [0] * len(part)
  return np.asarray(ids, np.int32), np.asarray(mask, np.int32)


def truncate_example(example: Example, max_length: int, mode: str, where: str) -> Example:
  """Cuts an example to `max_length` tokens as `data.truncation` says.

  Raises:
    ValueError: mode "error" and the example is longer (names the row and the
      fix), or no trained token is left after truncation.
  """
  ids, mask = example
  if len(ids) > max_length:
    if mode == "error":
      raise ValueError(
          f"{where}: the example is {len(ids)} tokens ({int((mask == 0).sum())} prompt + "
          f"{int(mask.sum())} response), longer than data.max_length={max_length}. Fix: raise data.max_length "
          "or set data.truncation=left or right.")
    if mode not in ("left", "right"):
      raise ValueError(f"data.truncation={mode!r}: expected error, left or right")
    keep = slice(len(ids) - max_length, None) if mode == "left" else slice(0, max_length)
    ids, mask = ids[keep], mask[keep]
  if not mask.any():
    raise ValueError(
        f"{where}: no response token is left after data.truncation={mode} to data.max_length={max_length}. "
        "Fix: raise data.max_length or use data.truncation=left.")
  return ids, mask


def read_template(value: str) -> str:
  """`data.chat_template`: jinja2 text, or a path to a file holding it."""
  path = os.path.expanduser(value)
  if len(value) < 4096 and "{" not in value and os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  return value


def with_chat_template(tokenizer: ChatTokenizer, template: str | None) -> ChatTokenizer:
  """`tokenizer`, or a copy rendering `data.chat_template` instead of its own."""
  if template is None:
    return tokenizer
  if not isinstance(tokenizer, ChatTokenizer):
    raise TypeError("data.chat_template needs an rljax tokenizer (rljax.models.load_tokenizer)")
  return tokenizer.with_chat_template(read_template(template))


class SFTDataset:
  """Examples from verl-format SFT parquet files, tokenised on access.

  Item i: {"token_ids": [n] int32, "loss_mask": [n] int32, "index": row
  number in the concatenated files}; n <= data.max_length.
  """

  def __init__(self, data_files: str | Sequence[str], tokenizer: tokenization.Tokenizer, config: Any,
               max_samples: int = -1, seed: int = 1, processor: Any = None):
    self.data_files = parquet.as_file_list(data_files)
    self.tokenizer = tokenizer
    self.config = config
    self.processor = processor
    table = parquet.read_parquet(self.data_files)
    self._file_ends = np.cumsum([parquet.num_rows(f) for f in self.data_files])
    columns = ([config.multiturn.messages_key] if config.multiturn.enable
               else sorted({config.prompt_key, config.response_key}))
    parquet.check_columns(table, columns, source=", ".join(self.data_files))
    image_key = config.get("image_key")
    image_row = rl_dataset.first_media_row(table, image_key)
    if image_row is not None and processor is None:
      raise ValueError(f"{self.describe_row(image_row)}: column {image_key!r} (data.image_key) holds images, and "
                       "model.partial_pretrain has no preprocessor_config.json: it is a text model. Fix: train a "
                       "vision-language model (Qwen2.5-VL, Qwen3-VL) from its full directory, or drop the column.")
    if image_row is not None:
      columns = [*columns, image_key]
    if table.num_rows == 0:
      raise ValueError(f"dataset {self.data_files} has no rows")
    self._row_numbers = rl_dataset.select_samples(table.num_rows, max_samples, True, seed)
    self._rows = parquet.RowReader(table.select(columns).take(pa.array(self._row_numbers, pa.int64())))

  def __len__(self) -> int:
    return len(self._rows)

  def describe_row(self, row_number: int) -> str:
    """"FILE row N" for a row of the concatenated files."""
    k = int(np.searchsorted(self._file_ends, row_number, side="right"))
    start = int(self._file_ends[k - 1]) if k else 0
    return f"{self.data_files[k]} row {row_number - start}"

  def example(self, row: Mapping[str, Any], where: str, images: Sequence[int] | None = None) -> Example:
    """One row -> (ids, mask) before truncation; `images`: its images' token counts (each <image> of the
    messages expanded to its vision tokens)."""
    data = self.config
    expand = (lambda messages: messages) if images is None else (  # noqa: E731
        lambda messages: rl_dataset.expand_images(messages, images, where))
    if data.multiturn.enable:
      key = data.multiturn.messages_key
      return multi_turn_example(self.tokenizer, expand(rl_dataset.check_messages(row[key], where, key)), where)
    prompt = lookup(row, data.prompt_key, data.prompt_dict_keys, where, "prompt")
    response = lookup(row, data.response_key, data.response_dict_keys, where, "response")
    if not isinstance(response, str):
      raise TypeError(f"{where}: the response ({data.response_key}) is a {type(response).__name__}, not a string")
    return single_turn_example(self.tokenizer, expand(as_messages(prompt, where, data.prompt_key)), response)

  def row_images(self, row: Mapping[str, Any], where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(pixel_values [N, F], image_grid_thw [I, 3]) of a row's images, as the RL data prepares them; None without
    any."""
    entries = rl_dataset.media_entries(row.get(self.config.get("image_key"))) if self.processor is not None else []
    try:
      return images_lib.prompt_images(entries, self.processor, int(self.config.image_patch_size))
    except ValueError as e:
      raise ValueError(f"{where}: column {self.config.image_key!r}: {e}") from e

  def __getitem__(self, i: int) -> dict[str, Any]:
    number = int(self._row_numbers[i])
    where = self.describe_row(number)
    row = self._rows[i]
    images = self.row_images(row, where)
    counts = None if images is None else [images_lib.image_tokens(g, self.processor) for g in images[1]]
    ids, mask = self.example(row, where, counts)
    if images is not None and len(ids) > int(self.config.max_length):
      raise ValueError(f"{where}: the example is {len(ids)} tokens with its images' {sum(counts)}, longer than "
                       f"data.max_length={self.config.max_length}; an example with images is never cut. Fix: raise "
                       "data.max_length or lower the images' max_pixels.")
    ids, mask = truncate_example((ids, mask), int(self.config.max_length), self.config.truncation, where)
    return {"token_ids": ids, "loss_mask": mask, "index": number, "images": images}


__all__ = [
    "Example", "SFTDataset", "as_messages", "lookup", "multi_turn_example", "single_turn_example",
    "truncate_example", "with_chat_template",
]
