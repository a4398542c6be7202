"""Placing token runs into fixed-length buffers: what SFT's packed rows and RL's packed passes share."""

from __future__ import annotations

from typing import Sequence


def first_fit_decreasing(lengths: Sequence[int], row_length: int) -> list[list[int]]:
  """Example indices per row: longest first, each into the first row with room.

  Args:
    lengths: N example lengths, each <= row_length.
    row_length: L.

  Returns:
    Rows of example indices whose lengths sum to <= L; every index once.
  """
  rows: list[list[int]] = []
  room: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
    n = int(lengths[i])
    if n > row_length:
      raise ValueError(f"example {i} has {n} tokens, more than the row length {row_length}")
    slot = next((r for r, free in enumerate(room) if free >= n), None)
    if slot is None:
      rows.append([i])
      room.append(row_length - n)
    else:
      rows[slot].append(i)
      room[slot] -= n
  return rows
