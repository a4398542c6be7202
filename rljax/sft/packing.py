"""Examples -> fixed-width rows, one example per row or several packed together.

A batch of examples becomes R rows of L = `data.max_length` tokens:

  input_ids [R, L]    the examples' tokens, padding after them
  positions [R, L]    0, 1, ... restarting at each example (RoPE positions)
  segment_ids [R, L]  1, 2, ... one id per example in the row, 0 on padding;
                      attention stays inside a segment
  targets [R, L]      the next token of the same example (0 where none)
  loss_mask [R, L]    1.0 where that next token is a response token

Unpacked (`use_remove_padding=false`) every example gets its own row, so
segment_ids is the attention mask. Packed, examples are placed first-fit in
decreasing length order, so rows fill up and fewer padding tokens are
computed. Either way each example sees exactly its own tokens at the same
positions, so its per-token losses are the same, and the loss (a sum over
trained tokens divided by their count in the whole batch) does not depend on
the layout.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from rljax.models import vision
from rljax.training.packing import first_fit_decreasing

ROW_KEYS = ("input_ids", "positions", "segment_ids", "targets", "loss_mask")
# a vision-language model's rows: each row's images (its examples' one after another, `rljax.models.vision`)
IMAGE_KEYS = ("pixels", "patch_order", "patch_rotary", "patch_windows", "patch_frames", "merge_restore")
# (token_ids [n], loss_mask [n]), or with a third item: its images (pixel_values [N, F], image_grid_thw [I, 3])
Example = tuple


def one_per_row(lengths: Sequence[int]) -> list[list[int]]:
  """[[0], [1], ...]: example i alone in row i."""
  return [[i] for i in range(len(lengths))]


def group_examples(lengths: Sequence[int], row_length: int, packed: bool) -> list[list[int]]:
  """The rows' example indices: packed (first-fit decreasing) or one per row."""
  return first_fit_decreasing(lengths, row_length) if packed else one_per_row(lengths)


def padded_row_count(groups: int, multiple: int) -> int:
  """Rows rounded up to a whole number of micro-batches (at least one)."""
  return max(1, math.ceil(groups / multiple)) * multiple


def build_rows(examples: Sequence[Example], groups: Sequence[Sequence[int]], row_length: int, num_rows: int,
               pad_id: int, model_config: Any = None, patches: int | None = None) -> dict[str, np.ndarray]:
  """Lays `examples` out as `num_rows` rows (the module docstring's arrays).

  Args:
    examples: N (token_ids [n_i], loss_mask [n_i][, images]).
    groups: example indices per row (len <= num_rows); rows past them are
      all padding.
    row_length: L.
    num_rows: R.
    pad_id: token id of padding.
    model_config: a vision-language model's ModelConfig: positions are then each example's M-RoPE positions
      [R, L, 3], and each row holds its examples' images one after another (IMAGE_KEYS, `patches` patches per
      row, default the bucket of the fullest row; `rljax.models.vision.row_images`).

  Returns:
    input_ids, positions, segment_ids, targets: [R, L] int32;
    loss_mask: [R, L] float32.
  """
  if len(groups) > num_rows:
    raise ValueError(f"{len(groups)} rows of examples do not fit in {num_rows} rows")
  shape = (num_rows, row_length)
  rows = {"input_ids": np.full(shape, pad_id, np.int32), "positions": np.zeros(shape, np.int32),
          "segment_ids": np.zeros(shape, np.int32), "targets": np.zeros(shape, np.int32),
          "loss_mask": np.zeros(shape, np.float32)}
  for r, group in enumerate(groups):
    start = 0
    for segment, k in enumerate(group, start=1):
      ids, mask = examples[k][:2]
      n = len(ids)
      end = start + n
      if end > row_length:
        raise ValueError(f"row {r} overflows: its examples hold more than {row_length} tokens")
      rows["input_ids"][r, start:end] = ids
      rows["positions"][r, start:end] = np.arange(n, dtype=np.int32)
      rows["segment_ids"][r, start:end] = segment
      rows["targets"][r, start:end - 1] = ids[1:]
      rows["loss_mask"][r, start:end - 1] = mask[1:]
      start = end
  if model_config is None or model_config.vision is None:
    return rows
  return with_row_images(rows, examples, groups, model_config, patches)


def row_patches(examples: Sequence[Example], groups: Sequence[Sequence[int]]) -> int:
  """The most image patches any row of `groups` holds."""
  return max((sum(len(examples[k][2][0]) for k in group if len(examples[k]) > 2 and examples[k][2] is not None)
              for group in groups), default=0)


def with_row_images(rows: dict[str, np.ndarray], examples: Sequence[Example], groups: Sequence[Sequence[int]],
                    cfg: Any, patches: int | None) -> dict[str, np.ndarray]:
  """`rows` with M-RoPE positions [R, L, 3] (each example's own, from 0) and each row's images."""
  num_rows, row_length = rows["input_ids"].shape
  positions = np.zeros((num_rows, row_length, 3), np.int32)
  pixels, grids = [None] * num_rows, [None] * num_rows
  for r, group in enumerate(groups):
    start, held = 0, []
    for k in group:
      ids, images = examples[k][0], examples[k][2] if len(examples[k]) > 2 else None
      example_positions, _ = vision.rope_index(np.asarray(ids)[None], np.ones((1, len(ids)), np.int32),
                                               vision.joined_grids([None if images is None else images[1]]),
                                               cfg.image_token_id, cfg.vision.spatial_merge_size,
                                               cfg.hf_top.get("video_token_id"))
      positions[r, start:start + len(ids)] = example_positions[:, 0].T
      start += len(ids)
      if images is not None:
        held.append(images)
    if held:
      pixels[r] = np.concatenate([np.asarray(p, np.float32) for p, _ in held])
      grids[r] = np.concatenate([np.asarray(g).reshape(-1, 3) for _, g in held])
  images = vision.row_images(pixels, grids, cfg.vision, patches)
  layout = images.layout
  return {**rows, "positions": positions, "pixels": images.pixels, "patch_order": layout.order,
          "patch_rotary": layout.rotary, "patch_windows": layout.windows, "patch_frames": layout.frames,
          "merge_restore": layout.restore}


def micro_batches(rows: Mapping[str, np.ndarray], micro_rows: int) -> Iterator[dict[str, np.ndarray]]:
  """Consecutive blocks of `micro_rows` rows ([micro_rows, L] each)."""
  total = len(rows["input_ids"])
  if total % micro_rows:
    raise ValueError(f"{total} rows do not split into micro-batches of {micro_rows}")
  for start in range(0, total, micro_rows):
    yield {k: v[start:start + micro_rows] for k, v in rows.items()}


def trained_tokens(rows: Mapping[str, np.ndarray]) -> int:
  """Response tokens the loss counts (sum of loss_mask)."""
  return int(rows["loss_mask"].sum())


def real_tokens(rows: Mapping[str, np.ndarray]) -> int:
  """Non-padding tokens (segment_ids > 0)."""
  return int((rows["segment_ids"] > 0).sum())


__all__ = [
    "ROW_KEYS", "build_rows", "first_fit_decreasing", "group_examples", "micro_batches", "one_per_row",
    "padded_row_count", "real_tokens", "trained_tokens",
]
