"""Messages between a separate_async job's trainer and rollout processes, through JAX's coordination service: a
few MB of tokens and scores per step, pickled, in pieces (`put`, `take`).
"""

from __future__ import annotations

import pickle
from typing import Any

from rljax.sharding import failures, hosts

_PREFIX = "rljax/separate"
_CHUNK_BYTES = 16 << 20


def _blocking_get(key: str) -> bytes:
  """The value of `key` once set (waits as long as it takes: a lost process stops the job through JAX's
  heartbeats, a failed one through `abort`).

  Raises:
    failures.PeerFailed: another process aborted.
  """
  while True:
    try:
      return failures.client().blocking_key_value_get_bytes(key, failures.WAIT_MS)
    except Exception as error:  # pylint: disable=broad-except
      if "DEADLINE_EXCEEDED" not in str(error):
        raise
    failed = failures.aborted()
    if failed is not None:
      raise failures.PeerFailed(failed)


def _key(name: str, rollout: int | None) -> str:
  """Message `name`'s key: a rollout process's (its place in its role; None: this process's own) and its
  trainer process's."""
  return f"{_PREFIX}/{hosts.index() if rollout is None else rollout}/{name}"


def put(name: str, value: Any, rollout: int | None = None) -> None:
  """Sends `value` (picklable) as message `name` between rollout process `rollout` (None: this one) and its
  trainer process."""
  data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
  pieces = [data[i:i + _CHUNK_BYTES] for i in range(0, len(data), _CHUNK_BYTES)] or [b""]
  for i, piece in enumerate(pieces):
    failures.client().key_value_set_bytes(f"{_key(name, rollout)}/{i}", piece)
  failures.client().key_value_set_bytes(f"{_key(name, rollout)}/pieces", str(len(pieces)).encode())


def take(name: str, rollout: int | None = None) -> Any:
  """Message `name` between rollout process `rollout` (None: this one) and its trainer process, once the other
  side sent it (and removes it)."""
  pieces = int(_blocking_get(f"{_key(name, rollout)}/pieces").decode())
  data = b"".join(_blocking_get(f"{_key(name, rollout)}/{i}") for i in range(pieces))
  failures.client().key_value_delete(_key(name, rollout))  # and the keys under it
  return pickle.loads(data)


__all__ = ["put", "take"]
