"""Parquet tables for offline generation and evaluation: read, check, write.

Reading is `rljax.data.read_parquet`'s; the helpers here name the config key
behind a missing column and the file and row behind a bad value.
"""

from __future__ import annotations

import os
import tempfile
from typing import Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from rljax.data import parquet
from rljax.data import synthetic

# The column offline generation writes and evaluation reads by default (verl's name).
RESPONSES_COLUMN = "responses"


def read_table(path: str) -> pa.Table:
  """The rows of one parquet file (`~` expands); writes the synthetic task first if `path` is its absent default."""
  synthetic.maybe_generate_default(path)
  return parquet.read_parquet(path)


def require_columns(table: pa.Table, columns: Mapping[str, str], source: str) -> None:
  """Raises a KeyError naming each missing column and the key that names it.

  Args:
    table: the rows read.
    columns: config key -> the column it names (e.g. data.prompt_key -> prompt).
    source: the file, for the message.
  """
  missing = {key: column for key, column in columns.items() if column not in table.column_names}
  if missing:
    named = ", ".join(f"{column!r} ({key})" for key, column in missing.items())
    raise KeyError(f"{source}: column {named} not found; columns present: {table.column_names}. "
                   f"Set {' and '.join(missing)} to the right column.")


def describe_row(source: str, row: int) -> str:
  """'FILE row N' (N counted from 0, as pandas and pyarrow count)."""
  return f"{source} row {row}"


def write_parquet(table: pa.Table, path: str) -> str:
  """Writes `table` to `path` atomically (a temporary file renamed into place); returns the path."""
  path = os.path.abspath(os.path.expanduser(path))
  directory = os.path.dirname(path)
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, suffix=".parquet.tmp")
  os.close(fd)
  try:
    pq.write_table(table, tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


def beside(path: str, suffix: str) -> str:
  """`DIR/NAME.parquet` -> `DIR/NAME{suffix}` (absolute, `~` expanded)."""
  path = os.path.abspath(os.path.expanduser(path))
  stem = path[:-len(".parquet")] if path.endswith(".parquet") else path
  return stem + suffix
