"""Where a streamed rollout stands, as a checkpoint records it and a resumed run (on each host) reads it back.

A stream's position (`AsyncRollout.position`) is the data position of its next unread batch and the prompts it
trained past it; `stored_position` folds every host's into what a checkpoint holds, `host_position` gives a host
its own back, `check_resumable` refuses a sync resume that would train prompts again.
"""

from __future__ import annotations

from typing import Any, Sequence

from rljax.config import errors as config_errors


def check_resumable(position: dict[str, Any] | None, streamed: bool, path: str) -> None:
  """Refuses to resume in sync mode from a colocate_async checkpoint that trained prompts past its data position.

  Args:
    position: the checkpoint's stream position (`AsyncRollout.position`; None from a sync run).
    streamed: whether this run streams (colocate_async).
    path: the checkpoint, for the message.

  Raises:
    ConfigError: naming trainer.v1.trainer_mode, where a sync run would train those prompts again.
  """
  every = (position or {}).get("hosts") or [position or {}]
  consumed = [c for p in every for c in p.get("consumed") or []]
  if streamed or not (consumed or len(every) > 1):
    return
  raise config_errors.ConfigError(
      "trainer.v1.trainer_mode", "sync", f"the checkpoint {path} was written under colocate_async, which had trained "
      f"{len(consumed)} prompt(s) past its data position, its hosts each at a position of its own; a sync run "
      "resumes every host at the first host's data position and would train prompts again",
      "resume it with trainer.v1.trainer_mode=colocate_async (as it was written)")


def stored_position(positions: Sequence[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
  """(data position, stream position) a checkpoint holds of every host's stream position (`AsyncRollout.position`,
  in host order): one where it holds for any number of hosts (all alike, with no prompt trained past it), else
  the data position of the first and each host's whole position under "hosts" (a prompt trained past it is a
  row of its host's share of a batch: each host resumes from its own, on as many hosts)."""
  first = dict(positions[0])
  data = first.pop("data_state")
  if all(p == positions[0] for p in positions[1:]) and not first.get("consumed"):
    return data, first
  return data, {"hosts": [dict(p) for p in positions]}


def host_position(stream: dict[str, Any] | None, data: Any, index: int, count: int) -> dict[str, Any] | None:
  """Host `index`'s (of `count`) stream position, its data position under "data_state", from a checkpoint's
  (`stored_position`'s; a sync run's has its data position alone); None from the data's start.

  Raises:
    ValueError: the checkpoint holds each host's position, for another number of hosts.
  """
  if stream is None:
    return None if data is None else {"data_state": data}
  if "hosts" not in stream:
    return {**stream, "data_state": data}
  if len(stream["hosts"]) != count:
    raise ValueError(f"the checkpoint's rollout was {len(stream['hosts'])} hosts, each at a position of its own in "
                     f"its share of the data; this run's is {count}: resume it on {len(stream['hosts'])} (each host's "
                     "prompts already trained are told apart by its share)")
  return dict(stream["hosts"][index])


__all__ = ["check_resumable", "host_position", "stored_position"]
