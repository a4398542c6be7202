"""verl's RLHFDataset for rljax: parquet rows -> templated, left-padded prompts.

`RLHFDataset(data_files, tokenizer, config)` is a random-access source (it has
`__len__` and `__getitem__`), so grain can wrap it with
`grain.MapDataset.source`. `config` is the `data` node of the config tree; the
keys read are verl's: prompt_key, max_prompt_length, truncation, tool_config_path and function_tool_path
(prompts rendered with those tools' schemas, as the chat template's `tools`),
filter_overlong_prompts, filter_overlong_prompts_workers, return_raw_chat,
return_full_prompt, return_raw_input_ids, shuffle, seed, image_key,
image_patch_size (video_key, audio_key: a column holding videos or audio is refused).

Images (a vision-language model, given its `processor`): the row's
`data.image_key` entries (`{"bytes": ...}`, `{"path": ...}` or paths, as
verl's geometry3k preprocessing writes them) are read and prepared as verl
does (`rljax.data.images.prompt_image`), and the i-th `<image>` of the
messages' text becomes image i's vision-start, image-pad x tokens,
vision-end, as Qwen-VL's chat template and processor make it. Lengths
(max_prompt_length, filter_overlong_prompts) count those tokens; a prompt
with images is never truncated.

Item `i` is a dict (P = data.max_prompt_length):

- input_ids [P] int32, left-padded; attention_mask [P] int32;
  position_ids [P] int32.
- raw_prompt_ids: [L] int32, the unpadded (truncated) prompt ids, as the
  rollout engine wants them (L <= P).
- multi_modal_inputs: with a vision-language model's processor, a row with
  images: {"pixel_values": [N, F] float32, "image_grid_thw": [I, 3] int64}
  (the image column itself is dropped); None for a row without any.
- index: int, `extra_info["index"]` when present, else the row number.
- every other column of the row as read (data_source, ability, reward_model,
  extra_info, ...).
- raw_prompt: the chat messages, with `data.return_raw_chat`.
- full_prompts: the templated prompt text, with `data.return_full_prompt`.
- raw_input_ids: [L'] int32 ids of the message contents joined by newlines,
  with no chat template, with `data.return_raw_input_ids` (for a reward
  model whose template differs from the policy's).

A user dataset class (`data.custom_cls.path` / `.name`) is built as
`cls(data_files=..., tokenizer=..., config=...)` (plus `processor=None` and
`max_samples=...` when its constructor takes them) and must yield items with
the same keys; subclassing `RLHFDataset` is the easy way.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from rljax.agents import function_tools
from rljax.data import images as images_lib
from rljax.data import parquet
from rljax.data import tokenization
from rljax.utils.user_code import load_from_file

logger = logging.getLogger(__name__)

TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")
# where an image goes in a prompt's text (verl's placeholder), and the Qwen-VL tokens it becomes
IMAGE_PLACEHOLDER, VISION_START, IMAGE_PAD, VISION_END = "<image>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"


def config_get(node: Any, key: str, default: Any = None) -> Any:
  """`node[key]` of a ConfigDict or dict; `default` when absent or None."""
  if node is None:
    return default
  try:
    value = node[key]
  except (KeyError, AttributeError, TypeError):
    value = getattr(node, key, None)
  return default if value is None else value


def check_messages(messages: Any, where: str,
                   prompt_key: str) -> list[dict[str, str]]:
  """Checks one prompt is a non-empty list of {"role", "content"} strings.

  `where` names the row in the error (e.g. "train.parquet row 3").
  """
  bad = (f"{where}: column {prompt_key!r} must be a non-empty list of "
         "{'role': str, 'content': str} messages")
  if isinstance(messages, np.ndarray):
    messages = messages.tolist()
  if not isinstance(messages, (list, tuple)) or not messages:
    raise ValueError(f"{bad}; got {messages!r:.200}")
  for m in messages:
    if (not isinstance(m, Mapping) or not isinstance(m.get("role"), str)
        or not isinstance(m.get("content"), str)):
      raise ValueError(f"{bad}; got message {m!r:.200}")
  return [dict(m) for m in messages]


def _index_of(row: Mapping[str, Any], default: int) -> int:
  extra = row.get("extra_info")
  if isinstance(extra, Mapping) and extra.get("index") is not None:
    try:
      return int(extra["index"])
    except (TypeError, ValueError):
      return default
  return default


def select_samples(num_rows: int, max_samples: int, shuffle: bool,
                   seed: int) -> np.ndarray:
  """Rows kept by `train_max_samples` / `val_max_samples` (-1 keeps all).

  With shuffle on, a seeded random subset (kept in file order); otherwise the
  first `max_samples` rows.
  """
  if max_samples is None or max_samples < 0 or max_samples >= num_rows:
    return np.arange(num_rows)
  if shuffle:
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_rows, size=max_samples, replace=False))
  return np.arange(max_samples)


_WORKER_TOKENIZER = _WORKER_TOOLS = None


def _init_length_worker(tokenizer: tokenization.Tokenizer, tools: Sequence[dict] | None) -> None:
  global _WORKER_TOKENIZER, _WORKER_TOOLS
  _WORKER_TOKENIZER, _WORKER_TOOLS = tokenizer, tools


def _lengths_in_worker(prompts: list[Any]) -> list[int]:
  return [_prompt_length(_WORKER_TOKENIZER, p, _WORKER_TOOLS, counts) for p, counts in prompts]


def _prompt_length(tokenizer: tokenization.Tokenizer, messages: Any, tools: Sequence[dict] | None = None,
                   image_counts: Sequence[int] | None = None) -> int:
  """Templated token count (each `<image>` expanded to its image_counts tokens); -1 for a malformed prompt
  (reported later)."""
  try:
    messages = check_messages(messages, "", "prompt")
    if image_counts is not None:
      messages = expand_images(messages, image_counts, "")
  except ValueError:
    return -1
  return len(tokenization.encode_text(
      tokenizer, tokenization.chat_prompt(tokenizer, messages, tools)))


def expand_images(messages: list[dict[str, str]], counts: Sequence[int], where: str) -> list[dict[str, str]]:
  """The messages with their i-th `<image>` placeholder replaced by what Qwen-VL's chat template and processor
  make of image i: vision-start, counts[i] image-pad tokens, vision-end.

  Raises:
    ValueError: the placeholders do not number the images (naming the row `where`).
  """
  found = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
  if found != len(counts):
    raise ValueError(f"{where}: the prompt holds {found} {IMAGE_PLACEHOLDER} placeholder(s) for {len(counts)} "
                     f"image(s); put one {IMAGE_PLACEHOLDER} in a message's text where each image goes, in order")
  pending = iter(counts)
  expand = lambda part: part if part != IMAGE_PLACEHOLDER else VISION_START + IMAGE_PAD * next(pending) + VISION_END
  return [{**m, "content": "".join(expand(part) for part in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})",
                                                                     m["content"]))} for m in messages]


def prompt_lengths(prompts: Sequence[Any], tokenizer: tokenization.Tokenizer,
                   workers: int = 1, tools: Sequence[dict] | None = None,
                   image_counts: Sequence[Sequence[int] | None] | None = None) -> np.ndarray:
  """Templated prompt lengths [N] (rendered with `tools` schemas; image_counts: per prompt, its images' tokens,
  or None), computed in `workers` processes if > 1."""
  prompts = list(zip(prompts, image_counts or [None] * len(prompts)))
  if workers <= 1 or len(prompts) < 2 * workers:
    return np.asarray([_prompt_length(tokenizer, p, tools, c) for p, c in prompts], np.int64)
  chunk = -(-len(prompts) // (4 * workers))
  chunks = [prompts[i:i + chunk] for i in range(0, len(prompts), chunk)]
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(workers, initializer=_init_length_worker,
                initargs=(tokenizer, tools)) as pool:
    parts = pool.map(_lengths_in_worker, chunks)
  return np.asarray([n for part in parts for n in part], np.int64)


class RLHFDataset:
  """Prompts from verl-format parquet files, tokenised on access."""

  def __init__(self, data_files: str | Sequence[str],
               tokenizer: tokenization.Tokenizer, config: Any,
               processor: Any = None, max_samples: int = -1):
    self.processor = processor
    self.image_key = config_get(config, "image_key", "images")
    self.image_patch_size = int(config_get(config, "image_patch_size", 14))
    self.data_files = parquet.as_file_list(data_files)
    self.tokenizer = tokenizer
    self.prompt_key = config_get(config, "prompt_key", "prompt")
    self.max_prompt_length = int(config_get(config, "max_prompt_length", 512))
    self.truncation = config_get(config, "truncation", "error")
    if self.truncation not in tokenization.TRUNCATION_MODES:
      raise ValueError(f"data.truncation={self.truncation!r}; expected one of "
                       f"{tokenization.TRUNCATION_MODES}")
    self.return_raw_chat = bool(config_get(config, "return_raw_chat", False))
    self.return_full_prompt = bool(
        config_get(config, "return_full_prompt", False))
    self.return_raw_input_ids = bool(
        config_get(config, "return_raw_input_ids", False))
    self.pad_token_id = tokenization.pad_token_id(tokenizer)
    self.tool_schemas = function_tools.all_tool_schemas(config_get(config, "tool_config_path"),
                                                    config_get(config, "function_tool_path"))

    table = parquet.read_parquet(self.data_files)
    self._file_ends = np.cumsum([parquet.num_rows(f) for f in self.data_files])
    parquet.check_columns(table, (self.prompt_key, *parquet.REQUIRED_COLUMNS),
                          source=", ".join(self.data_files))
    for key, media, fix in (("video_key", "videos", "give the frames as images"),
                            ("audio_key", "audio", "give the prompts without their <audio> parts")):
      column = config_get(config, key, None)
      row = first_media_row(table, column)
      if row is not None:  # training on the prompts without their media would be a different task
        raise ValueError(f"{self.describe_row(row)}: column {column!r} (data.{key}) holds {media}, which rljax "
                         f"does not read (images only). Fix: drop the column, or {fix}.")
    image = first_media_row(table, self.image_key)
    if image is not None and processor is None:
      raise ValueError(f"{self.describe_row(image)}: column {self.image_key!r} (data.image_key) holds images, and "
                       "the model directory (actor_rollout_ref.model.path) has no preprocessor_config.json: it is a "
                       "text model, or a vision-language one without its image processor's config. Fix: train a "
                       "vision-language model (Qwen2.5-VL) from its full directory, or drop the column.")
    self.has_images = image is not None
    if self.has_images and len(tokenization.encode_text(tokenizer, IMAGE_PAD)) != 1:
      raise ValueError(f"the tokenizer does not encode {IMAGE_PAD} as one token; a Qwen-VL model's tokenizer "
                       "does: load the tokenizer of the model's directory")
    if table.num_rows == 0:
      raise ValueError(f"dataset {self.data_files} has no rows")
    rows = select_samples(table.num_rows, max_samples,
                          bool(config_get(config, "shuffle", True)),
                          int(config_get(config, "seed", 42)))
    self.num_filtered = 0
    if config_get(config, "filter_overlong_prompts", False):
      prompts = table.column(self.prompt_key).take(pa.array(rows)).to_pylist()
      counts = None
      if self.has_images:
        entries = table.column(self.image_key).take(pa.array(rows)).to_pylist()
        counts = [self.image_counts(e, int(r)) for e, r in zip(entries, rows)]
      lengths = prompt_lengths(
          prompts, tokenizer,
          int(config_get(config, "filter_overlong_prompts_workers", 1)), self.tool_schemas, counts)
      keep = lengths <= self.max_prompt_length
      self.num_filtered = int(np.sum(~keep))
      if self.num_filtered:
        logger.warning("filter_overlong_prompts dropped %d of %d prompts longer "
                       "than %d tokens in %s", self.num_filtered, len(rows),
                       self.max_prompt_length, self.data_files)
      rows = rows[keep]
      if not len(rows):
        raise ValueError(
            f"all {len(keep)} prompts in {self.data_files} are longer than "
            f"data.max_prompt_length={self.max_prompt_length} and were "
            "filtered out")
    self._row_numbers = rows
    self._rows = parquet.RowReader(table.take(pa.array(rows, pa.int64())))

  def __len__(self) -> int:
    return len(self._rows)

  def __getitem__(self, i: int) -> dict[str, Any]:
    return self.process_row(dict(self._rows[i]), int(self._row_numbers[i]))

  def describe_row(self, row_number: int) -> str:
    """"FILE row N" for a row of the concatenated files."""
    k = int(np.searchsorted(self._file_ends, row_number, side="right"))
    start = int(self._file_ends[k - 1]) if k else 0
    return f"{self.data_files[k]} row {row_number - start}"

  def image_counts(self, entries: Any, row_number: int) -> list[int]:
    """The image-pad tokens of each of a row's images (its `data.image_key` entries), from their sizes."""
    try:
      return [images_lib.entry_tokens(e, self.processor, self.image_patch_size) for e in media_entries(entries)]
    except ValueError as e:
      raise ValueError(f"{self.describe_row(row_number)}: column {self.image_key!r}: {e}") from e

  def row_images(self, entries: Any, where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(pixel_values [N, F] float32, image_grid_thw [I, 3] int64) of a row's images, or None without any."""
    try:
      return images_lib.prompt_images(media_entries(entries), self.processor, self.image_patch_size)
    except ValueError as e:
      raise ValueError(f"{where}: column {self.image_key!r}: {e}") from e

  def process_row(self, row: dict[str, Any], row_number: int) -> dict[str, Any]:
    """One parquet row -> one padded prompt (the keys listed in the module doc).

    Args:
      row: the row's columns.
      row_number: its position in the concatenated files (the default index).
    """
    where = self.describe_row(row_number)
    messages = check_messages(row.pop(self.prompt_key), where, self.prompt_key)
    images = self.row_images(row.pop(self.image_key, None), where) if self.processor is not None else None
    templated = messages
    if self.processor is not None:  # every row has the key (None without images): a batch's rows agree
      row["multi_modal_inputs"] = None
    if images is not None:
      counts = [images_lib.image_tokens(g, self.processor) for g in images[1]]
      templated = expand_images(messages, counts, where)
      row["multi_modal_inputs"] = {"pixel_values": images[0], "image_grid_thw": images[1]}
    text = tokenization.chat_prompt(self.tokenizer, templated, self.tool_schemas)
    ids = tokenization.encode_text(self.tokenizer, text)
    if images is not None and len(ids) > self.max_prompt_length:
      raise ValueError(f"{where}: prompt is {len(ids)} tokens with its images' {sum(counts)}, longer than "
                       f"data.max_prompt_length={self.max_prompt_length}; a prompt with images is never cut. Raise "
                       "data.max_prompt_length, set data.filter_overlong_prompts=True, or lower the images' "
                       "max_pixels.")
    ids = tokenization.truncate(ids, self.max_prompt_length, self.truncation, where)
    input_ids, mask, positions = tokenization.left_pad(
        ids, self.max_prompt_length, self.pad_token_id)
    row.update(input_ids=input_ids, attention_mask=mask, position_ids=positions,
               raw_prompt_ids=np.asarray(ids, np.int32),
               index=_index_of(row, row_number))
    if self.return_raw_chat:
      row["raw_prompt"] = messages
    if self.return_full_prompt:
      row["full_prompts"] = text
    if self.return_raw_input_ids:
      row["raw_input_ids"] = np.asarray(tokenization.encode_text(
          self.tokenizer, "\n".join(m["content"] for m in messages)), np.int32)
    return row


def image_inputs(value: Any) -> tuple[np.ndarray, np.ndarray] | None:
  """(pixel_values [N, F] float32, image_grid_thw [I, 3] int64) of a row's `multi_modal_inputs` (as
  `RLHFDataset` gives them); None for a row without images."""
  if not value or value.get("pixel_values") is None or not len(value["pixel_values"]):
    return None
  return (np.asarray(value["pixel_values"], np.float32),
          np.asarray(value["image_grid_thw"], np.int64).reshape(-1, 3))


def media_entries(value: Any) -> list[Any]:
  """A row's image column as a list of entries (None and empty: none)."""
  if value is None:
    return []
  if isinstance(value, np.ndarray):
    value = value.tolist()
  return list(value) if isinstance(value, (list, tuple)) else [value]


def first_media_row(table: Any, column: str | None) -> int | None:
  """The first row whose media column `column` (data.image_key / data.video_key) holds anything (None: none
  does, or there is no such column)."""
  if not column or column not in table.column_names:
    return None
  for row, value in enumerate(table.column(column).to_pylist()):
    if value is not None and not (hasattr(value, "__len__") and len(value) == 0):
      return row
  return None


def collate(items: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """Stacks items into a batch.

  Args:
    items: B dicts from a dataset.

  Returns:
    input_ids, attention_mask, position_ids as [B, P] int32 arrays; index
    as a [B] int64 array; every other key as a [B] object array (verl's
    non_tensor_batch), one entry per item (None where an item lacks the key).
  """
  if not items:
    raise ValueError("cannot collate an empty batch")
  batch: dict[str, np.ndarray] = {}
  for key in dict.fromkeys(k for item in items for k in item):  # every item's keys, in order of appearance
    values = [item.get(key) for item in items]
    if key in TENSOR_KEYS:
      batch[key] = np.stack([np.asarray(v, np.int32) for v in values])
    elif key == "index":
      batch[key] = np.asarray(values, np.int64)
    else:
      batch[key] = object_array(values)
  return batch


def object_array(values: Sequence[Any]) -> np.ndarray:
  """A [N] object array holding `values` as they are (lists stay lists)."""
  column = np.empty(len(values), dtype=object)
  for i, v in enumerate(values):
    column[i] = v
  return column


def load_dataset_class(path: str, name: str) -> type:
  """The class `name` from the file at `path` (`data.custom_cls`)."""
  cls = load_from_file(path, name, "data.custom_cls")
  if not isinstance(cls, type):
    raise TypeError(f"data.custom_cls {name!r} in {path} is not a class")
  for method in ("__len__", "__getitem__"):
    if not hasattr(cls, method):
      raise TypeError(f"data.custom_cls {name!r} in {path} has no {method}; a "
                      "dataset class needs __len__ and __getitem__")
  return cls


def _construct(cls: Callable[..., Any], **kwargs: Any) -> Any:
  params = inspect.signature(cls).parameters
  takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
  optional = ("processor", "max_samples")
  return cls(**{k: v for k, v in kwargs.items()
                if k not in optional or takes_any or k in params})


def make_dataset(files: str | Sequence[str], tokenizer: tokenization.Tokenizer,
                 data_config: Any, max_samples: int = -1, processor: Any = None) -> Any:
  """A dataset over `files`: `data.custom_cls` if set, else RLHFDataset.

  Args:
    files: one parquet path or a list (`~` expands).
    tokenizer: see `rljax.data.tokenization`.
    data_config: the `data` config node.
    max_samples: train_max_samples / val_max_samples; -1 keeps every row.
    processor: a vision-language model's `rljax.data.images.ImageProcessing` (None: a text model).

  Returns:
    A random-access dataset of prompt items.
  """
  custom = config_get(data_config, "custom_cls")
  path = config_get(custom, "path")
  cls: Callable[..., Any] = RLHFDataset
  if path:
    name = config_get(custom, "name")
    if not name:
      raise ValueError("data.custom_cls.path is set but data.custom_cls.name "
                       "is not")
    cls = load_dataset_class(path, name)
  dataset = _construct(cls, data_files=files, tokenizer=tokenizer,
                       config=data_config, processor=processor,
                       max_samples=max_samples)
  if len(dataset) == 0:
    raise ValueError(f"dataset over {files} is empty")
  return dataset
