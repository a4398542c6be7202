"""Before a run starts: every data file it reads is there, is parquet and holds the columns the run reads.

A problem is a `ConfigError` naming the key behind it (the files' key, or the key naming the missing column), the
file, what is there and the fix, which the command line prints as one line (status 2) as it prints any config
error, instead of a traceback from deep in the data pipeline. Only the files' footers are read.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from rljax.config.errors import ConfigError
from rljax.data import parquet


def file_columns(key: str, files: str | Sequence[str]) -> dict[str, list[str]]:
  """{path: its column names} of each file `key` names.

  Raises:
    ConfigError: naming `key` and the file that is missing or not parquet.
  """
  columns = {}
  for path in parquet.as_file_list(files):
    try:
      columns[path] = pq.read_schema(path).names
    except FileNotFoundError:
      raise ConfigError(key, files, f"{path} does not exist",
                        f"point {key} at parquet files on this machine (verl's format; "
                        "python -m rljax.data.synthetic writes an example)") from None
    except (pa.ArrowInvalid, OSError) as error:
      raise ConfigError(key, files, f"{path} is not a parquet file ({str(error).rstrip('.')})",
                        f"point {key} at parquet files (verl's format)") from None
  return columns


def check_columns(key: str, files: str | Sequence[str], needed: dict[str, str]) -> None:
  """Each file of `key` holds the columns of `needed` ({column: the key naming it, or `key` for a column of
  verl's format}).

  Raises:
    ConfigError: naming the key of the first missing column, the file and the columns it holds.
  """
  for path, names in file_columns(key, files).items():
    for column, named_by in needed.items():
      if column in names:
        continue
      if named_by == key:
        raise ConfigError(key, files, f"{path} has no column {column!r} (verl's format needs it); its columns: "
                          f"{names}", f"add a {column!r} column, or point {key} at files in verl's format")
      raise ConfigError(named_by, column, f"{path} has no such column; its columns: {names}",
                        f"set {named_by} to one of its columns")


def check_rl_data(config) -> None:
  """The RL run's data.train_files and (when set) data.val_files: there, parquet, with data.prompt_key's column,
  data_source and reward_model."""
  for key in ("data.train_files", "data.val_files"):
    files = config.data.get(key.split(".")[1])
    if files:
      check_columns(key, files, {config.data.prompt_key: "data.prompt_key",
                                 **{column: key for column in parquet.REQUIRED_COLUMNS}})


def check_sft_data(config) -> None:
  """The SFT run's data.train_files and (when set) data.val_files: there, parquet, with the columns it reads
  (data.multiturn.messages_key's, or data.prompt_key's and data.response_key's)."""
  data = config.data
  needed = ({data.multiturn.messages_key: "data.multiturn.messages_key"} if data.multiturn.enable else
            {data.prompt_key: "data.prompt_key", data.response_key: "data.response_key"})
  for key in ("data.train_files", "data.val_files"):
    files = data.get(key.split(".")[1])
    if files:
      check_columns(key, files, needed)


__all__ = ["check_columns", "check_rl_data", "check_sft_data", "file_columns"]
