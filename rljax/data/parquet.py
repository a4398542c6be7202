"""Reading verl-format parquet files with pyarrow.

verl's RL schema, one row per prompt:

| column        | type                                         |
|---------------|----------------------------------------------|
| data_source   | str (selects the reward function)            |
| prompt        | list of {"role": str, "content": str}        |
| ability       | str                                          |
| reward_model  | {"style": str, "ground_truth": str}          |
| extra_info    | dict (free form; "index" is used if present) |

The prompt column's name is `data.prompt_key`. `data.train_files` and
`data.val_files` take one path or a list; `~` expands.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

REQUIRED_COLUMNS = ("data_source", "reward_model")


def as_file_list(files: str | os.PathLike | Iterable[str] | None) -> list[str]:
  """One path or several -> a list of user-expanded paths."""
  if files is None:
    raise ValueError("no data files given (data.train_files / data.val_files)")
  if isinstance(files, (str, os.PathLike)):
    files = [files]
  paths = [os.path.expanduser(os.fspath(f)) for f in files]
  if not paths:
    raise ValueError(
        "empty list of data files (data.train_files / data.val_files)")
  return paths


def read_parquet(files: str | Sequence[str]) -> pa.Table:
  """Reads and concatenates parquet files, memory-mapped.

  Args:
    files: one path or a list; `~` expands.

  Returns:
    One table with the rows of every file, in order.

  Raises:
    FileNotFoundError: naming the first missing path.
  """
  tables = []
  for path in as_file_list(files):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"data file not found: {path}")
    try:
      tables.append(pq.read_table(path, memory_map=True))
    except (pa.ArrowInvalid, OSError) as e:
      raise ValueError(f"cannot read parquet file {path}: {e}") from e
  if len(tables) == 1:
    return tables[0]
  try:
    return pa.concat_tables(tables, promote_options="permissive")
  except pa.ArrowInvalid as e:
    raise ValueError(f"data files {as_file_list(files)} have incompatible "
                     f"schemas: {e}") from e


def num_rows(path: str) -> int:
  """Rows in one parquet file, from its footer."""
  return pq.ParquetFile(os.path.expanduser(path)).metadata.num_rows


def check_columns(table: pa.Table, required: Iterable[str],
                  source: str = "") -> None:
  """Raises a KeyError naming each missing column and listing those present."""
  missing = [c for c in required if c not in table.column_names]
  if missing:
    where = f" in {source}" if source else ""
    raise KeyError(
        f"column(s) {missing} not found{where}; columns present: "
        f"{table.column_names}")


class RowReader:
  """Random access to a table's rows as Python dicts (one scalar per column)."""

  def __init__(self, table: pa.Table):
    self._table = table.combine_chunks()
    self._columns = [(name, self._table.column(name))
                     for name in self._table.column_names]

  def __len__(self) -> int:
    return self._table.num_rows

  @property
  def column_names(self) -> list[str]:
    return self._table.column_names

  def __getitem__(self, i: int) -> dict[str, Any]:
    n = self._table.num_rows
    if not -n <= i < n:
      raise IndexError(f"row {i} out of range for {n} rows")
    return {name: column[i].as_py() for name, column in self._columns}

  def __getstate__(self) -> dict[str, Any]:
    return {"_table": self._table}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__init__(state["_table"])
