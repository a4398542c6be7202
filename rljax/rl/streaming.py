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

Staleness, in verl's terms: a group *spans* `version - start + 1` policy
versions when the update at `version` trains on it, `start` being the
version its first token was sampled under; `trainer.v1.sampler` bounds it:

* `max_off_policy_threshold` T: no trained group spans more than T versions.
* `max_off_policy_strategy`:
  - `drop`: at an update, groups that already span more than T versions are
    evicted (counted in `off_policy/evicted_samples`) and fresh prompts take
    their slots.
  - `wait`: nothing is dropped: an update waits for every group that would
    otherwise span more than T versions at the next one, and admission
    stops at T batches of groups not yet trained (which bounds those to one
    batch).
* `trainer.v1.colocate_async.num_warmup_batches` W: prompts are admitted
  while fewer than (1 + W) batches of groups are untrained (at most T of
  them under `wait`).

T = 1 or W = 0 trains every group on the policy that generated all of it:
with `wait` that is today's synchronous trainer, step for step. An update
picks the oldest finished groups first (by start version, then admission),
and trains them in admission order.

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
import math
from typing import Any, Callable, ContextManager, Iterable, Sequence

import jax
import numpy as np

from rljax.algos import advantages as adv_lib
from rljax.config import errors as config_errors
from rljax.config import trainer as config_trainer
from rljax.data import dataset
from rljax.rl import dynamic_sampling
from rljax.rollout import sampler as sampler_lib
from rljax.rollout import stream as stream_lib
from rljax.sharding import hosts

STRATEGIES = ("drop", "wait")


@dataclasses.dataclass(frozen=True)
class StalenessPolicy:
  """How far generation runs ahead of training, and what happens to samples that fall too far behind.

  Attributes:
    groups: prompts (groups of n responses) each update trains on this host.
    threshold: trainer.v1.sampler.max_off_policy_threshold (>= 1).
    strategy: trainer.v1.sampler.max_off_policy_strategy, drop or wait.
    ahead: batches generation runs ahead of training (>= 0): trainer.v1.colocate_async.num_warmup_batches, or
      under verl's fully-async recipe async_training.staleness_threshold (a share of a batch).
  """

  groups: int
  threshold: int
  strategy: str
  ahead: float

  @property
  def capacity(self) -> int:
    """Groups admitted and not yet trained or evicted, at most."""
    batches = 1 + self.ahead
    return math.floor((min(batches, self.threshold) if self.strategy == "wait" else batches) * self.groups)

  @property
  def on_policy(self) -> bool:
    """Every trained group was generated whole by the policy the update starts from."""
    return self.threshold == 1 or self.ahead == 0


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which weights decode the groups each update trains: the update at step b trains groups picked under the
  weights of version `weights_for(b)` (the trainer's state after that many updates).

  colocate_async's is every update's own (sync_every 1, lag 0). separate_async's sends the weights after every
  `sync_every`-th update (trainer.v1.separate_async.parameter_sync_step) and lets the rollout run `lag` batches
  ahead (its num_warmup_batches), so batch b decodes under version sync_every * floor((b - lag) / sync_every):
  a deterministic schedule, whatever the two sides' speeds.
  """

  sync_every: int = 1
  lag: int = 0

  def weights_for(self, step: int) -> int:
    return self.sync_every * (max(0, step - self.lag) // self.sync_every)

  def publishes(self, version: int) -> bool:
    """Whether the weights of `version` are sent to the rollout (some step decodes under them)."""
    return version % self.sync_every == 0

  @property
  def weight_versions(self) -> int:
    """Weight versions the rollout holds at most: the one it decodes under, those sent since up to the update
    that trains its batch, and one arriving before it lets go of the oldest."""
    return (self.lag + self.sync_every - 1) // self.sync_every + 2

  @property
  def every_update(self) -> bool:
    """Each update decodes under its own weights (colocate_async's schedule)."""
    return self.sync_every == 1 and self.lag == 0


def schedule_of(config: Any) -> Schedule:
  """The weight schedule of `config`'s asynchronous mode (`Schedule`)."""
  v1 = config.trainer.v1
  if v1.trainer_mode != "separate_async":
    return Schedule()
  return Schedule(int(v1.separate_async.parameter_sync_step), int(v1.separate_async.num_warmup_batches))


def policy_of(config: Any, groups: int) -> StalenessPolicy | None:
  """The asynchronous modes' policy under `config` for `groups` prompts per update on this host (None in sync
  mode)."""
  v1 = config.trainer.v1
  if v1.trainer_mode == "sync":
    return None
  if config_trainer.fully_async_recipe(config):
    ahead = float(config_trainer.recipe_setting(config, "staleness_threshold"))
  else:
    ahead = int(v1[v1.trainer_mode].num_warmup_batches)
  return StalenessPolicy(groups=groups, threshold=int(v1.sampler.max_off_policy_threshold),
                strategy=v1.sampler.max_off_policy_strategy, ahead=ahead)


def rows_in_flight(config: Any, rows: int, n: int) -> int:
  """Responses admitted and not yet trained, at most: a step's `rows` in sync mode, the policy's capacity of
  groups of `n` under colocate_async (the engine's decode slots need no more)."""
  policy = policy_of(config, rows // n)
  return rows if policy is None else policy.capacity * n


def streams_off_policy(config: Any) -> bool:
  """Whether `config`'s trainer may train on groups generated partly by older weights (the policy off-policy, or
  a schedule that decodes under older weights than the update's: the update must then recompute the old
  log-probs)."""
  policy = policy_of(config, 1)
  return policy is not None and (not policy.on_policy or not schedule_of(config).every_update)


def decodes_beside_the_stream(config: Any) -> bool:
  """Whether a colocate_async run of `config` also decodes while its stream's KV cache is allocated, in a cache of
  its own: validation (data.val_files, with trainer.test_freq > 0 or val_before_train) or an estimator's greedy
  baselines (remax's)."""
  validates = bool(config.data.val_files) and (config.trainer.test_freq > 0 or config.trainer.val_before_train)
  return validates or adv_lib.needs_greedy_baselines(config.algorithm.adv_estimator)


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


def spans(start: int, version: int) -> int:
  """Policy versions a group first sampled under `start` spans when the update at `version` trains on it."""
  return version - start + 1


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


def merged(picks: Sequence[Picked]) -> Picked:
  """The groups of several `picks` (several rollout processes', for one trainer process) as one, in order:
  columns, rows and spans concatenated, each row's group offset by the groups before it, the counts summed, the
  samplers' measurements averaged, the latest epoch."""
  if len(picks) == 1:
    return picks[0]
  first = picks[0]
  offsets = np.cumsum([0] + [len(p.spans) for p in picks[:-1]])
  columns = {k: _joined([p.columns[k] for p in picks]) for k in first.columns}
  fields = {f.name: _joined([getattr(p.rollout, f.name) for p in picks]) for f in dataclasses.fields(first.rollout)}
  fields["prompt_index"] = np.concatenate([p.rollout.prompt_index + o for p, o in zip(picks, offsets)])
  rollout = dataclasses.replace(first.rollout, **fields)
  epochs = [p.epoch for p in picks if p.epoch is not None]
  return Picked(columns, rollout, np.concatenate([p.spans for p in picks]), first.version,
                sum(p.evicted for p in picks), sum(p.filtered for p in picks),
                None if any(p.scores is None for p in picks) else [s for p in picks for s in p.scores],
                max(epochs) if epochs else None)


def split(picked: Picked, parts: int) -> list[Picked]:
  """`picked` (one rollout process's groups) as `parts` runs of as many groups, in order (one per trainer process
  it serves; `merged` undoes it): columns, rows, spans and scores sliced, each row's group counted from its
  run's first, the counts on the first run (each is summed over the hosts), the samplers' measurements on each.

  Raises:
    ValueError: its groups do not split into `parts` runs of as many.
  """
  groups = len(picked.spans)
  if groups % parts:
    raise ValueError(f"{groups} groups do not split into {parts} equal parts")
  size, rows = groups // parts, len(picked.rollout.prompt_index) // max(groups, 1)
  return [_part(picked, range(p * size, (p + 1) * size), rows, first=p == 0) for p in range(parts)]


def _part(picked: Picked, groups: range, rows: int, first: bool) -> Picked:
  """The groups `groups` of `picked` (each of `rows` rows) as a Picked of their own; `first`: it keeps the
  counts."""
  rollout = picked.rollout
  fields = {f.name: _sliced(getattr(rollout, f.name), slice(groups.start * rows, groups.stop * rows))
            for f in dataclasses.fields(rollout)}
  fields["prompt_index"] = fields["prompt_index"] - groups.start
  at = slice(groups.start, groups.stop)
  return Picked({k: _sliced(v, at) for k, v in picked.columns.items()}, dataclasses.replace(rollout, **fields),
                picked.spans[at], picked.version, picked.evicted if first else 0,
                picked.filtered if first else 0, None if picked.scores is None else picked.scores[at], picked.epoch)


def _sliced(value: Any, at: slice) -> Any:
  """Rows `at` of one host's field (arrays and lists sliced; measurements and None kept)."""
  return value if value is None or isinstance(value, dict) else value[at]


def _joined(values: list[Any]) -> Any:
  """Several hosts' values of one field, as one host's: arrays and lists concatenated (object arrays kept object
  arrays), measurements (dicts of numbers) averaged, None kept."""
  if values[0] is None:
    return None
  if isinstance(values[0], dict):
    return {k: float(np.mean([v[k] for v in values])) for k in values[0]}
  if isinstance(values[0], list):
    return [x for v in values for x in v]
  if values[0].dtype == object:
    return dataset.object_array([x for v in values for x in v])
  return np.concatenate(values)


# off_policy/staleness/frac_s is logged for s = 1 to the threshold, at most this many (the last: frac_8_or_more)
STALENESS_BUCKETS = 8


def staleness_histogram(span: np.ndarray, threshold: int) -> dict[str, float]:
  """The share of trained groups ([G] `span`: the policy versions each spans) at each span: frac_s for s = 1 to
  min(threshold, STALENESS_BUCKETS) - 1, and the rest, frac_{last}_or_more (the shares sum to 1)."""
  last = min(threshold, STALENESS_BUCKETS)
  shares = {f"off_policy/staleness/frac_{s}": float((span == s).mean()) for s in range(1, last)}
  shares[f"off_policy/staleness/frac_{last}_or_more"] = float((span >= last).mean())
  return shares


def off_policy_metrics(picked: Picked, threshold: int) -> dict[str, float]:
  """off_policy/* over every host's trained groups (every host calls it): versions spanned (verl's staleness: 1 is
  on-policy; mean, max and their histogram up to `threshold`, trainer.v1.sampler.max_off_policy_threshold), the
  share of responses sampled by more than one policy version, the mean lag of a trained token, the groups
  evicted."""
  rollout, version = picked.rollout, picked.version
  span = hosts.process_concat(picked.spans)
  mask = rollout.response_mask > 0
  versions = np.where(mask, rollout.versions, version)
  mixed = hosts.process_concat((versions.min(-1) != versions.max(-1)).astype(np.float32))
  lag = hosts.process_sum([float((version - versions)[mask].sum()), float(mask.sum())])
  return {"off_policy/staleness/mean": float(span.mean()), "off_policy/staleness/max": float(span.max()),
          **staleness_histogram(span, threshold), "off_policy/mixed_version_frac": float(mixed.mean()),
          "off_policy/token_lag/mean": float(lag[0] / max(lag[1], 1.0)),
          "off_policy/evicted_samples": hosts.process_total(float(picked.evicted))}


__all__ = ["AsyncRollout", "Group", "Picked", "STRATEGIES", "Schedule", "StalenessPolicy", "Stopped",
           "decodes_beside_the_stream", "host_position", "merged", "off_policy_metrics", "policy_of", "schedule_of",
           "spans", "split", "staleness_histogram", "stored_position", "streams_off_policy"]
