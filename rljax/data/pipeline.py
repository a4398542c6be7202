"""Grain pipelines: a dataset of prompts -> batches for the trainer.

Train batches follow verl's StatefulDataLoader: each epoch visits the prompts
in a fresh order (grain's index shuffle seeded with `data.seed + epoch`, when
`data.shuffle`), cut into `data.train_batch_size` prompts, the last partial
batch of each epoch dropped, for `trainer.total_epochs` epochs.

In a run of `process_count` processes, process `p` reads only rows
`[p * B / n, (p + 1) * B / n)` of every global batch (B the global batch
size), so the processes together see exactly the single-process batches.

The iterator is grain's: `get_state()` returns a small dict and
`set_state(state)` on a fresh iterator resumes at exactly the next batch.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterator

from absl import flags
import grain
import numpy as np

from rljax.data import dataset as dataset_lib
from rljax.data import images
from rljax.data import synthetic
from rljax.data import tokenization

config_get = dataset_lib.config_get


class _GlobalRow(grain.transforms.Map):
  """Element g of process p's stream -> the dataset row it reads."""

  def __init__(self, order: grain.MapDataset, num_rows: int,
               batches_per_epoch: int, batch_size: int, local_batch: int,
               process_index: int):
    self._order = order
    self._num_rows = num_rows
    self._per_epoch = batches_per_epoch * local_batch
    self._batch_size = batch_size
    self._local_batch = local_batch
    self._offset = process_index * local_batch

  def map(self, element: int) -> int:
    epoch, r = divmod(int(element), self._per_epoch)
    k, j = divmod(r, self._local_batch)
    position = k * self._batch_size + self._offset + j
    return int(self._order[epoch * self._num_rows + position]) % self._num_rows


class _Fetch(grain.transforms.Map):
  """Row number -> processed item."""

  def __init__(self, rows: grain.MapDataset):
    self._rows = rows

  def map(self, element: int) -> dict[str, Any]:
    return self._rows[element]


def batch_dataset(source: Any, batch_size: int, *, num_epochs: int = 1,
                  shuffle: bool = True, seed: int = 42, process_index: int = 0,
                  process_count: int = 1, key: str = "data.train_batch_size") -> grain.MapDataset:
  """Training batches over a random-access dataset.

  Args:
    source: N items (`__len__`, `__getitem__`), e.g. `RLHFDataset`.
    batch_size: B, prompts per global batch (`data.train_batch_size`).
    num_epochs: passes over the data (`trainer.total_epochs`).
    shuffle: reshuffle every epoch (`data.shuffle`).
    seed: `data.seed`.
    process_index: this process, in [0, process_count).
    process_count: processes sharing each global batch; must divide B.
    key: the config key B comes from, for messages.

  Returns:
    A MapDataset of num_epochs * (N // B) batches, each `collate`d from
    B / process_count items: arrays [B / process_count, P].
  """
  num_rows = len(source)
  if num_rows == 0:
    raise ValueError("the dataset is empty: no batches to make")
  if batch_size <= 0 or batch_size % process_count:
    raise ValueError(f"{key}={batch_size} must be a positive "
                     f"multiple of the process count {process_count}")
  if batch_size > num_rows:
    raise ValueError(f"{key}={batch_size} is larger than the "
                     f"dataset ({num_rows} prompts): no full batch; lower "
                     f"{key} or add data")
  if num_epochs <= 0:
    raise ValueError(f"trainer.total_epochs={num_epochs} must be positive")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in "
                     f"[0, {process_count})")
  batches_per_epoch = num_rows // batch_size
  local_batch = batch_size // process_count
  order = grain.MapDataset.range(num_rows)
  if shuffle:
    order = order.shuffle(seed=int(seed) % 2**32)
  order = order.repeat(num_epochs)
  rows = grain.MapDataset.source(source)
  total = num_epochs * batches_per_epoch * local_batch
  return (grain.MapDataset.range(total)
          .map(_GlobalRow(order, num_rows, batches_per_epoch, batch_size,
                          local_batch, process_index))
          .map(_Fetch(rows))
          .batch(local_batch, drop_remainder=True,
                 batch_fn=dataset_lib.collate))


def eval_batch_dataset(source: Any, batch_size: int | None = None, *,
                       shuffle: bool = False, seed: int = 42,
                       process_index: int = 0,
                       process_count: int = 1) -> grain.MapDataset:
  """Validation batches: every item once, the last batch may be short.

  Process p reads items p, p + n, p + 2n, ... (n = process_count).

  Args:
    source: N items.
    batch_size: global prompts per batch; None takes the whole set at once
      (verl's `data.val_batch_size: null`).
    shuffle: `data.validation_shuffle`.
    seed: `data.seed`.
    process_index: this process.
    process_count: number of processes.

  Returns:
    A MapDataset of ceil(N_p / b) batches of b = ceil(B / n) items.
  """
  num_rows = len(source)
  if num_rows == 0:
    raise ValueError("the validation dataset is empty")
  rows = grain.MapDataset.source(source)
  if shuffle:
    rows = rows.shuffle(seed=int(seed) % 2**32)
  rows = rows[process_index::process_count]
  if len(rows) == 0:
    raise ValueError(f"process {process_index} of {process_count} gets no "
                     f"validation rows from {num_rows}")
  local = len(rows) if batch_size is None else math.ceil(batch_size /
                                                         process_count)
  return rows.batch(max(local, 1), batch_fn=dataset_lib.collate)


class BatchIterator:
  """Training batches with a checkpointable position.

  Attributes:
    dataset: the prompt dataset (`num_filtered` counts overlong prompts
      dropped by `data.filter_overlong_prompts`).
    batches_per_epoch: N // B.
    total_batches: batches_per_epoch * trainer.total_epochs.
    batches_read: batches taken so far (a resumed iterator counts those before it was saved).
  """

  def __init__(self, batches: grain.MapDataset, dataset: Any,
               batches_per_epoch: int, num_workers: int = 0,
               prefetch_batches: int = 2):
    """Starts reading.

    Args:
      batches: from `batch_dataset`.
      dataset: the prompt dataset behind `batches`.
      batches_per_epoch: N // B.
      num_workers: 0 prepares batches in a background thread of this
        process; n > 0 in n worker processes (the tokenizer must pickle).
      prefetch_batches: batches prepared ahead, per thread or process.
    """
    self.dataset = dataset
    self.batches_per_epoch = batches_per_epoch
    self.total_batches = len(batches)
    stream = batches.to_iter_dataset(grain.ReadOptions(
        num_threads=1, prefetch_buffer_size=prefetch_batches))
    if num_workers > 0:
      if not flags.FLAGS.is_parsed():
        # Grain's worker processes read absl flags; outside absl.app.run
        # (scripts, notebooks) use their defaults.
        flags.FLAGS.mark_as_parsed()
      stream = stream.mp_prefetch(
          grain.MultiprocessingOptions(num_workers=num_workers))
    self._iterator = iter(stream)
    self.batches_read = 0

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._iterator)
    self.batches_read += 1
    return batch

  @property
  def epoch(self) -> int:
    """The epoch of the last batch read (0 before any)."""
    return max(self.batches_read - 1, 0) // max(1, self.batches_per_epoch)

  def __len__(self) -> int:
    return self.total_batches

  def close(self) -> None:
    """Stops grain's worker processes, if any."""
    self._iterator.close()

  def __enter__(self) -> "BatchIterator":
    return self

  def __exit__(self, *exc_info: Any) -> None:
    self.close()

  def get_state(self) -> dict[str, Any]:
    """The position: save it with the checkpoint."""
    return {"iterator": self._iterator.get_state(), "batches_read": self.batches_read}

  def set_state(self, state: dict[str, Any] | None) -> None:
    """Resumes at the batch after the one `state` was taken after (None: at the start; a state saved before
    `batches_read` was recorded, grain's own, resumes its position and counts from 0)."""
    if state is None:  # saved before any batch was read
      return
    if "iterator" in state and "batches_read" in state:
      self._iterator.set_state(state["iterator"])
      self.batches_read = int(state["batches_read"])
    else:
      self._iterator.set_state(state)


def ensure_config_data(config: Any) -> None:
  """Writes the synthetic task if a data file is its absent default path."""
  data = config.data
  for key in ("train_files", "val_files"):
    files = config_get(data, key)
    if files is None:
      continue
    for path in ([files] if isinstance(files, (str, os.PathLike)) else files):
      synthetic.maybe_generate_default(path)


def batch_key(config: Any) -> str:
  """The key giving the prompts per training-data batch: data.gen_batch_size (one generation round) under
  DAPO's dynamic sampling (algorithm.filter_groups.enable), else data.train_batch_size."""
  groups = config_get(config_get(config, "algorithm", {}), "filter_groups", {})
  return "data.gen_batch_size" if config_get(groups, "enable", False) else "data.train_batch_size"


def prompts_per_batch(config: Any) -> int:
  """Prompts per training-data batch (`batch_key`'s value)."""
  return int(config_get(config.data, batch_key(config).split(".")[1]))


def image_processing(config: Any) -> images.ImageProcessing | None:
  """The actor's image processing (its directory's preprocessor_config.json: a vision-language model), or None."""
  return images.ImageProcessing.of_model(config_get(config_get(config_get(config, "actor_rollout_ref"), "model"), "path"))


def make_train_iterator(config: Any, tokenizer: tokenization.Tokenizer,
                        process_index: int = 0,
                        process_count: int = 1) -> BatchIterator:
  """Training batches from `config.data` for `config.trainer.total_epochs`.

  Args:
    config: the full config tree; reads data.* and trainer.total_epochs.
    tokenizer: see `rljax.data.tokenization`.
    process_index: `jax.process_index()`.
    process_count: `jax.process_count()`.

  Returns:
    A BatchIterator of dicts (B = `prompts_per_batch(config)`): input_ids,
    attention_mask, position_ids [B / process_count, P] int32 and [B / process_count] object arrays for
    the other keys (data_source, reward_model, extra_info, index,
    raw_prompt_ids, ...).
  """
  ensure_config_data(config)
  data = config.data
  dataset = dataset_lib.make_dataset(
      data.train_files, tokenizer, data,
      max_samples=int(config_get(data, "train_max_samples", -1)), processor=image_processing(config))
  batch_size = prompts_per_batch(config)
  batches = batch_dataset(
      dataset, batch_size,
      num_epochs=int(config_get(config.trainer, "total_epochs", 1)),
      shuffle=bool(config_get(data, "shuffle", True)),
      seed=int(config_get(data, "seed", 42)),
      process_index=process_index, process_count=process_count, key=batch_key(config))
  return BatchIterator(batches, dataset, len(dataset) // batch_size,
                       num_workers=int(config_get(data,
                                                  "dataloader_num_workers", 0)))


def make_val_batches(config: Any, tokenizer: tokenization.Tokenizer,
                     process_index: int = 0,
                     process_count: int = 1) -> grain.MapDataset:
  """Validation batches from data.val_files (iterate it once per validation).

  Reads data.val_files, data.val_batch_size (None: one batch),
  data.val_max_samples and data.validation_shuffle.
  """
  ensure_config_data(config)
  data = config.data
  dataset = dataset_lib.make_dataset(
      data.val_files, tokenizer, data,
      max_samples=int(config_get(data, "val_max_samples", -1)), processor=image_processing(config))
  batch_size = config_get(data, "val_batch_size")
  return eval_batch_dataset(
      dataset, None if batch_size is None else int(batch_size),
      shuffle=bool(config_get(data, "validation_shuffle", False)),
      seed=int(config_get(data, "seed", 42)),
      process_index=process_index, process_count=process_count)

