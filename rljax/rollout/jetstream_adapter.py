"""JetStream's side of the rollout engine: the types and hooks `jetstream.engine.engine_api` expects of an engine
(google-jetstream 0.2.2), without importing JetStream (`rljax.rollout.engine`'s docstring says why).

`ResultTokens` is a decode step's output in JetStream's layout, `JetStreamTokenizer` its tokenizer API over an
rljax tokenizer; `serving.make_driver` registers them as (virtual) subclasses of JetStream's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, NamedTuple, Sequence

import numpy as np
from flax import struct

from rljax.rollout import jetstream_compat
from rljax.rollout.decode_state import pad_to_bucket

# Whether google-jetstream is installed (found, not imported: see the module docstring).
HAS_JETSTREAM = importlib.util.find_spec("jetstream") is not None


class SlotData(NamedTuple):
  """One slot's rows of a ResultTokens (JetStream's `SlotData`)."""

  tokens: Any
  valid: Any
  lengths: Any


@struct.dataclass
class ResultTokens:
  """JetStream's ResultTokens layout: data [slots, 3] = token | valid | length.

  The same fields and methods as `jetstream.engine.engine_api.ResultTokens`;
  `serving.make_driver` registers it as a subclass of that class.
  """

  data: Any
  tokens_idx: tuple[int, int] = struct.field(pytree_node=False)
  valid_idx: tuple[int, int] = struct.field(pytree_node=False)
  length_idx: tuple[int, int] = struct.field(pytree_node=False)
  samples_per_slot: int = struct.field(pytree_node=False)

  def copy_to_host_async(self) -> None:
    if not isinstance(self.data, np.ndarray):
      self.data.copy_to_host_async()

  def convert_to_numpy(self) -> "ResultTokens":
    return dataclasses.replace(self, data=np.asarray(self.data))

  def get_result_at_slot(self, slot: int) -> SlotData:
    """The `samples_per_slot` rows of one slot (lengths 1-D), as JetStream's."""
    rows = self.data[slot * self.samples_per_slot:(slot + 1) * self.samples_per_slot]
    return SlotData(tokens=rows[:, self.tokens_idx[0]:self.tokens_idx[1]],
                    valid=rows[:, self.valid_idx[0]:self.valid_idx[1]],
                    lengths=rows[:, self.length_idx[0]:self.length_idx[1]][:, 0])


def tokenizer_metadata() -> Any:
  """JetStream's TokenizerParameters naming rljax's tokenizer (a dict without JetStream)."""
  tokenizer_pb2 = jetstream_compat.import_quietly("jetstream.engine.tokenizer_pb2") if HAS_JETSTREAM else None
  return {"path": "rljax"} if tokenizer_pb2 is None else tokenizer_pb2.TokenizerParameters(path="rljax")


class JetStreamTokenizer:
  """JetStream's tokenizer API over an rljax tokenizer (encode pads to a bucket)."""

  def __init__(self, tokenizer: Any, buckets: Sequence[int], eos_ids: Sequence[int]):
    self.tokenizer, self.buckets, self.eos_ids = tokenizer, tuple(buckets), tuple(eos_ids)

  def encode(self, s: str, **kwargs) -> tuple[np.ndarray, int]:
    """Token ids right-padded to the nearest bucket, and the true length."""
    del kwargs
    ids = list(self.tokenizer.encode(s))
    return pad_to_bucket(ids, self.buckets, self.pad_id), len(ids)

  def decode(self, token_ids: list[int], **kwargs) -> str:
    del kwargs
    return self.tokenizer.decode(token_ids)

  @property
  def pad_id(self) -> int:
    pad = getattr(self.tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else self.eos_id)

  @property
  def eos_id(self) -> int:
    return int(self.eos_ids[0]) if self.eos_ids else 0

  @property
  def bos_id(self) -> int:
    bos = getattr(self.tokenizer, "bos_token_id", None)
    return int(bos if bos is not None else self.pad_id)

  @property
  def stop_tokens(self) -> set[int]:
    return set(self.eos_ids)


__all__ = ["HAS_JETSTREAM", "JetStreamTokenizer", "ResultTokens", "SlotData", "tokenizer_metadata"]
