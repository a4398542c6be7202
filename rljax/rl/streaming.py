"""colocate_async: generation streams across updates on the trainer's own devices (verl's trainer.v1).

In sync mode a step decodes its batch until the longest response ends, with
more and more decode slots idle in the tail, then trains. Here the engine's
slots stay full: a slot whose response ends takes the next prompt's
response, from later batches if need be, and an update runs as soon as
`data.train_batch_size` prompts have all n responses. The responses still
decoding continue under the new weights on what their KV cache holds
(partial rollouts); each token records the policy version that sampled it
and its behaviour log-prob (`Rollout.versions`, `rollout_log_probs`), and
the update recomputes the old log-probs under the weights it starts from
(decoupled PPO; `algorithm.rollout_correction` corrects the behaviour
mismatch when configured).

Staleness is bounded by a `staleness.StalenessPolicy` (the module
`rljax.rl.staleness` says how, in verl's terms); where the stream stands
is a checkpoint's `rljax.rl.positions`.

Dynamic sampling (DAPO's `algorithm.filter_groups`) streams too: a group
is judged as its last response ends (`keep`: the trainer scores it, keeps
the scores on the group for the update to train on, and keeps the group
when its filter metric varies); a group it drops leaves its slots
to the next prompts at once, counts as consumed (a resumed run neither
trains nor repeats it) and in `train/filtered_groups`. An update that has
judged more than `most_judged` prompts of this host (verl's
`max_num_gen_batches` rounds of `data.gen_batch_size`) without a batch to
train stops with verl's error.

Multi-turn rollouts with tools stream too (`rljax.rollout.agent_loop`'s
`ConversationStream`): a slot whose turn ends waits for its tools' answer
while the other slots decode, and a conversation continues across updates,
its appended tool turns cached under the weights of the moment (they are
masked out of the losses; the generated tokens record their versions).

Each host streams its own prompts and trains its share of the batch; the
rollout is host-local, so hosts need not decode in step.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager, Iterable, Sequence

import jax
import numpy as np

from rljax.data import dataset
from rljax.rl import dynamic_sampling
from rljax.rl.staleness import StalenessPolicy, spans
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import stream as stream_lib

@dataclasses.dataclass(eq=False)
class Group:
  """One prompt's n responses.

  Attributes:
    id: admission order on this host.
    batch: the data batch it came from (its step in a synchronous run), row: its row there.
    requests: its n responses, in sample order.
    columns: its row of each data column (what the reward function reads).
    ended: responses finished.
    scores: what dynamic sampling's judge scored its responses (the update trains on them), or None.
  """

  id: int
  batch: int
  row: int
  requests: list[stream_lib.Request]
  columns: dict[str, Any]
  ended: int = 0
  scores: Any = None

  @property
  def start(self) -> int | None:
    """The policy version of its first sampled token (None before any)."""
    started = [int(r.versions[0]) for r in self.requests if r.length]
    return min(started) if started else None

  @property
  def finished(self) -> bool:
    return self.ended == len(self.requests)


class AsyncRollout:
  """colocate_async's generation on this host (see the module docstring)."""

  def __init__(self, sampler: sampler_lib.RolloutSampler, policy: StalenessPolicy, n: int, first_request: int,
               batch_key: Callable[[int], jax.Array], read_batch: Callable[[], tuple[dict[str, Any], Any] | None],
               data_position: Callable[[], Any], first_batch: int = 0,
               consumed: Iterable[Sequence[int]] = (), keep: Callable[["Group"], bool] | None = None,
               most_judged: int = 0, stream: stream_lib.DecodeStream | None = None, holds_weights: bool = False):
    """Args:
      sampler: makes the stream's requests and assembles the trained ones (a multi-turn sampler's are conversations).
      policy: the staleness policy.
      n: responses per prompt.
      first_request: the sampling-stream id of this host's first response of a batch (as the sync trainer's).
      batch_key: batch index -> the rollout key of its responses (the sync trainer's key at that step).
      read_batch: (the next data batch, the data position before it), or None when the data has ended.
      data_position: the data position after the last batch read.
      first_batch: the index of the first batch fed or read (a resumed run's oldest untrained batch).
      consumed: [batch, row] of prompts already trained, evicted or filtered there (skipped when their batch
        comes).
      keep: dynamic sampling's judge of a finished group (None: every group trains).
      most_judged: with `keep`, the prompts an update may judge at most before it raises (0: no bound).
      stream: the decode stream kept open across updates (default: a new one of `sampler`'s).
      holds_weights: keep decoding with the weights between calls (separate_async, whose rollout devices are
        its own); colocate_async drops them after each call, so that the update runs without that copy.
    """
    self.sampler, self.policy, self.n = sampler, policy, n
    self.stream = stream if stream is not None else sampler.open_stream()
    self.first_request, self.batch_key, self.read_batch = first_request, batch_key, read_batch
    self.data_position = data_position
    self.batches: list[tuple[int, dict[str, Any]]] = []
    self.states: dict[int, Any] = {}
    self.next_batch, self.next_row = first_batch, 0
    self.consumed = {(int(b), int(r)) for b, r in consumed}
    self.live: dict[int, Group] = {}
    self.admitted = 0
    self.data_ended = False
    self.keep, self.most_judged = keep, most_judged
    self.object_columns: set[str] = set()  # the data columns that are object arrays
    self.filtered = self.judged = 0  # since the last update
    self.holds_weights = holds_weights
    self.stopping = False  # set from another thread: the decoding in progress stops (`Stopped`)
    self.turn: Callable[[], ContextManager[Any]] = contextlib.nullcontext  # held over each chunk's work
    self.positions = {-1: self._position()}  # step -> `_position` after its pick (-1: before any)

  # ----- data ------------------------------------------------------------------------------

  def feed(self, batch: dict[str, Any], before: Any) -> None:
    """Queues a data batch for admission (the training loop's batch of this step; `before`: the data position
    before it)."""
    index = self.next_batch + len(self.batches)
    self.batches.append((index, batch))
    self.object_columns.update(k for k, v in batch.items() if np.asarray(v).dtype == object)
    self.states[index] = before

  def _next_prompt(self) -> tuple[int, int, dict[str, Any]] | None:
    """(batch index, row, batch) of the next prompt to admit, reading a batch when none is queued."""
    while True:
      if not self.batches:
        read = None if self.data_ended else self.read_batch()
        if read is None:
          self.data_ended = True
          return None
        self.feed(*read)
      index, batch = self.batches[0]
      rows = len(batch["input_ids"])
      while self.next_row < rows and (index, self.next_row) in self.consumed:
        self.next_row += 1
      if self.next_row < rows:
        self.next_row += 1
        return index, self.next_row - 1, batch
      self.batches.pop(0)
      self.next_batch, self.next_row = index + 1, 0

  def _admit(self) -> None:
    """Queues prompts' responses on the stream while fewer than the policy's capacity are untrained."""
    while len(self.live) < self.policy.capacity:
      found = self._next_prompt()
      if found is None:
        return
      index, row, batch = found
      mask = np.asarray(batch["attention_mask"][row]).astype(bool)
      prompt = np.asarray(batch["input_ids"][row])[mask]
      if not len(prompt):
        raise ValueError(f"prompt row {row} of batch {index} is empty")
      key, columns = self.batch_key(index), {k: np.asarray(v)[row] for k, v in batch.items()}
      requests = [self.sampler.new_request(self.first_request + row * self.n + j, self.admitted, prompt, key,
                                           len(batch["input_ids"][row]), columns) for j in range(self.n)]
      self.live[self.admitted] = Group(self.admitted, index, row, requests, columns)
      self.admitted += 1
      self.stream.submit(requests)

  # ----- one update's groups ----------------------------------------------------------------

  def _evict(self, version: int) -> list[Group]:
    """Under drop: the live groups that already span more than the threshold, cancelled."""
    if self.policy.strategy != "drop":
      return []
    stale = [g for g in self.live.values()
             if g.start is not None and spans(g.start, version) > self.policy.threshold]
    doomed = {g.id for g in stale}
    self.stream.cancel(lambda r: r.group in doomed)
    for g in stale:
      del self.live[g.id]
      self.consumed.add((g.batch, g.row))
    return stale

  def _pick(self, version: int) -> list[Group] | None:
    """The groups this update trains, in admission order, or None while it must decode on."""
    finished = sorted((g for g in self.live.values() if g.finished), key=lambda g: (g.start, g.id))
    if len(finished) < self.policy.groups:
      return None
    if self.policy.strategy == "wait":
      due = [g for g in self.live.values()
             if g.start is not None and spans(g.start, version) >= self.policy.threshold]
      if any(not g.finished for g in due):
        return None
      if len(due) > self.policy.groups:
        raise RuntimeError(f"{len(due)} groups must train at version {version}, more than a batch of "
                           f"{self.policy.groups}; report this")
    return sorted(finished[:self.policy.groups], key=lambda g: g.id)

  def next_groups(self, params: Any, version: int, trains_at: int | None = None) -> "Picked":
    """Decodes until a batch of groups can train at step `trains_at` (default `version`).

    Args:
      params: the weights of policy `version` (None: go on with those it decodes with, of that version).
      version: their policy version, recorded on the tokens they sample.
      trains_at: the update that trains the groups (staleness is counted to it).

    Returns:
      The groups this host trains at `trains_at` (`Picked`).

    Raises:
      StopIteration: the data ended before a batch of groups finished.
      Stopped: `stopping` was set (by another thread).
    """
    trains_at = version if trains_at is None else trains_at
    if params is not None:
      self.stream.set_params(params, version)
    evicted = self._evict(trains_at)
    steps, busy = self.stream.decode_steps, self.stream.busy_slot_steps
    picked = None
    while picked is None:
      if self.stopping:
        raise Stopped()
      with self.turn():
        picked = self._chunk(trains_at)
    if not self.holds_weights:  # nothing decodes until the next update's weights: the update runs without this copy
      self.stream.params = None
    for g in picked:
      del self.live[g.id]
      self.consumed.add((g.batch, g.row))
    # the trainer has trained every step before the weights' version: it reads no position before that one's
    self.positions = {**{k: p for k, p in self.positions.items() if k >= version - 1}, trains_at: self._position()}
    occupancy = ((self.stream.busy_slot_steps - busy)
                 / max(1, (self.stream.decode_steps - steps) * self.stream.engine.max_concurrent_decodes))
    columns = {k: _column([g.columns[k] for g in picked], k in self.object_columns) for k in picked[0].columns}
    rollout = self.sampler.assemble([r for g in picked for r in g.requests], {"perf/slot_occupancy": occupancy})
    rollout.prompt_index = np.repeat(np.arange(len(picked)), self.n)
    filtered, self.filtered, self.judged = self.filtered, 0, 0
    scores = [g.scores for g in picked]
    return Picked(columns, rollout, np.asarray([spans(g.start, trains_at) for g in picked], np.float32), trains_at,
                  len(evicted), filtered, None if any(s is None for s in scores) else scores)

  def _chunk(self, trains_at: int) -> list[Group] | None:
    """Admits what the policy allows; then the groups step `trains_at` trains, or None after one more decode chunk.

    Raises:
      StopIteration: the data ended before a batch of groups finished.
    """
    self._admit()
    picked = self._pick(trains_at)
    if picked is not None:
      return picked
    if self.stream.idle:
      raise StopIteration(f"the training data ended with {len(self.live)} prompt(s) generating, fewer than a "
                          f"batch of {self.policy.groups}")
    for request in self.stream.step():
      self._ended(self.live[request.group])
    return None

  def _ended(self, group: Group) -> None:
    """One of `group`'s responses ended; a finished group that dynamic sampling does not keep leaves."""
    group.ended += 1
    if not group.finished or self.keep is None:
      return
    self.judged += 1
    if 0 < self.most_judged < self.judged:
      raise ValueError(dynamic_sampling.too_many_prompts(self.judged, self.most_judged))
    if not self.keep(group):
      del self.live[group.id]
      self.consumed.add((group.batch, group.row))
      self.filtered += 1

  def close(self) -> None:
    """Cancels what is queued and generating (a multi-turn stream releases its conversations' tools)."""
    self.stream.close()

  # ----- resuming ---------------------------------------------------------------------------

  def _position(self) -> dict[str, Any]:
    """Where a resumed run starts after the last pick: `data_state`, the data position before the oldest batch
    with an untrained prompt; `batch`, that batch's index; `consumed`, the prompts of it and later batches already
    trained or evicted (responses still generating, conversations included, are generated again after a
    resume)."""
    untrained = [g.batch for g in self.live.values()] + [b for b, _ in self.batches[:1]]
    if not untrained:
      return {"data_state": self.data_position(), "batch": int(self.next_batch), "consumed": []}
    oldest = min(untrained)
    self.states = {b: s for b, s in self.states.items() if b >= oldest}
    self.consumed = {(b, r) for b, r in self.consumed if b >= oldest}
    return {"data_state": self.states[oldest], "batch": int(oldest),
            "consumed": sorted([int(b), int(r)] for b, r in self.consumed)}

  def position(self, trained: int | None = None) -> dict[str, Any]:
    """`_position` as it was when the groups of step `trained - 1` were picked (default: the last pick), so that
    it does not depend on how far another thread has picked ahead since."""
    positions = self.positions
    return dict(positions[max(k for k in positions if trained is None or k < trained)])


class Stopped(Exception):
  """A rollout's decoding was stopped from another thread (`AsyncRollout.stopping`)."""


def _column(values: list[Any], objects: bool) -> np.ndarray:
  """A batch column of G per-prompt values: [G] objects as the data's batches hold them (`objects`: the column is
  an object array there; a row's value may be a list or an array of its own length), else [G, ...] stacked."""
  return dataset.object_array(values) if objects else np.stack([np.asarray(v) for v in values])


@dataclasses.dataclass
class Picked:
  """The groups an update trains on one host.

  Attributes:
    columns: their data columns ([G] per prompt).
    rollout: their G * n responses (row g * n + j: response j of group g), with each token's policy version.
    spans: [G] the policy versions each spans.
    version: the version that trains them.
    evicted: groups this host evicted at this update.
    filtered: groups this host's dynamic sampling dropped since the last update.
    scores: [G] each group's judged scores (`Group.scores`), or None where they were not judged.
    epoch: the data's epoch when they were picked (set by `rljax.rl.separate`, whose thread reads the data).
  """

  columns: dict[str, Any]
  rollout: sampler_lib.Rollout
  spans: np.ndarray
  version: int
  evicted: int
  filtered: int = 0
  scores: list[Any] | None = None
  epoch: int | None = None


__all__ = ["AsyncRollout", "Group", "Picked", "Stopped"]
