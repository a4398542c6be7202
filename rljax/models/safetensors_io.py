"""Safetensors files read as memory maps (so a slice reads only its bytes) and written.

Format: an 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensor bytes (offsets relative to the end of the header).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable, Mapping

import ml_dtypes
import numpy as np

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}

SHARD_BYTES = 5 * 1000**3
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class SafetensorsError(ValueError):
  """A safetensors file or index that cannot be read."""


def _header(path: str) -> tuple[dict, int]:
  """(header dict, byte offset of the data) of one file; raises SafetensorsError."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) < 8:
      raise SafetensorsError(f"{path}: corrupt safetensors header (file shorter than 8 bytes).")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
      raise SafetensorsError(
          f"{path}: corrupt safetensors header (header length {n} exceeds file size {size})."
      )
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise SafetensorsError(f"{path}: corrupt safetensors header (invalid JSON: {e}).") from e
  if not isinstance(header, dict):
    raise SafetensorsError(f"{path}: corrupt safetensors header (not a JSON object).")
  data_size = size - 8 - n
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype = _DTYPES[info["dtype"]]
      begin, end = info["data_offsets"]
      expected = int(np.prod(info["shape"], dtype=np.int64)) * dtype.itemsize
    except (KeyError, TypeError, ValueError) as e:
      raise SafetensorsError(
          f"{path}: corrupt safetensors header entry for {name!r}: {info}") from e
    if end - begin != expected or not 0 <= begin <= end <= data_size:
      raise SafetensorsError(
          f"{path}: corrupt safetensors header: tensor {name!r} has offsets "
          f"[{begin}, {end}] for shape {info['shape']} {info['dtype']} "
          f"(data section is {data_size} bytes)."
      )
  return header, 8 + n


class SafetensorsReader:
  """Read-only view of one checkpoint: a file, or a directory (single or indexed).

  ``tensor(name)`` is a numpy memory map: indexing it reads only those bytes.
  """

  def __init__(self, path: str):
    if os.path.isdir(path):
      index = os.path.join(path, INDEX_FILE)
      if os.path.exists(index):
        try:
          with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
          raise SafetensorsError(f"{index}: not a valid safetensors index ({e}).") from e
        files = sorted(set(weight_map.values()))
      elif os.path.exists(os.path.join(path, SINGLE_FILE)):
        files = [SINGLE_FILE]
      else:
        raise FileNotFoundError(f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}.")
      files = [os.path.join(path, f) for f in files]
    else:
      files = [path]
    self._tensors: dict[str, np.ndarray] = {}
    for file in files:
      if not os.path.exists(file):
        raise FileNotFoundError(f"{file} (named in {INDEX_FILE}) does not exist.")
      header, start = _header(file)
      mm = np.memmap(file, dtype=np.uint8, mode="r")
      for name, info in header.items():
        if name == "__metadata__":
          continue
        begin, _ = info["data_offsets"]
        self._tensors[name] = np.ndarray(
            shape=tuple(info["shape"]), dtype=_DTYPES[info["dtype"]], buffer=mm,
            offset=start + begin,
        )

  def names(self) -> list[str]:
    return list(self._tensors)

  def tensor(self, name: str) -> np.ndarray:
    return self._tensors[name]


def _serialise(tensors: Mapping[str, np.ndarray]) -> tuple[bytes, list[np.ndarray]]:
  header, offset, arrays = {"__metadata__": {"format": "pt"}}, 0, []
  for name, t in tensors.items():
    t = np.ascontiguousarray(t)
    if t.dtype not in _NAMES:
      raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot be written to safetensors.")
    header[name] = {
        "dtype": _NAMES[t.dtype], "shape": list(t.shape),
        "data_offsets": [offset, offset + t.nbytes],
    }
    offset += t.nbytes
    arrays.append(t)
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  return struct.pack("<Q", len(raw)) + raw, arrays


def write_file(path: str, tensors: Mapping[str, np.ndarray]) -> None:
  """Writes one safetensors file (atomically: a temporary file, then rename)."""
  head, arrays = _serialise(tensors)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(head)
    for t in arrays:
      f.write(memoryview(t.reshape(-1).view(np.uint8)))
  os.replace(tmp, path)


def plan_shards(sizes: Iterable[tuple[str, int]], max_bytes: int = SHARD_BYTES) -> list[list[str]]:
  """Groups (name, nbytes) in order into shards of at most max_bytes (one tensor may exceed)."""
  shards: list[list[str]] = [[]]
  used = 0
  for name, nbytes in sizes:
    if shards[-1] and used + nbytes > max_bytes:
      shards.append([])
      used = 0
    shards[-1].append(name)
    used += nbytes
  return shards


def shard_file_names(n: int) -> list[str]:
  if n == 1:
    return [SINGLE_FILE]
  return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def write_index(path: str, weight_map: Mapping[str, str], total_size: int) -> None:
  with open(os.path.join(path, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total_size}, "weight_map": dict(weight_map)}, f,
              indent=2, sort_keys=True)
