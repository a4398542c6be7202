"""Where a step's rows come from: one `RolloutSource` per rollout mode, chosen once (`make_source`).

    SyncRollout       each step's batch answered under the step's own weights (trainer.v1.trainer_mode=sync)
    DynamicSampling   sync, in generation rounds until enough groups vary (algorithm.filter_groups.enable)
    StreamedRollout   colocate_async's stream (`rljax.rl.streaming`), on a lagged schedule through a
                      `separate.RolloutDriver`; separate_async's on devices of its own (a thread) or on
                      processes of its own (`remote.RemoteRollout`)

Every source gives the trainer the same things: `batches` (what the training loop iterates: the data, or one
ticket per step where the rollout reads the data itself), `rows` (a step's rows, scored), `publish` (the weights
of a new policy version), `positions` (where the data and the stream stand after a step, agreed by the hosts),
`resumed` (the source from a checkpoint's state), `turn` (the trainer's own decodes on the rollout's devices)
and `close`. A new rollout mode is a new source and its config keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
from typing import Any, Callable, ContextManager

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax.algos import advantages as adv_lib
from rljax.rewards import managers
from rljax.rl import cross_host_weights, dynamic_sampling, remote, separate, staleness, streaming
from rljax.rl import positions as checkpoint_positions
from rljax.rl import transport
from rljax.rl.experience import Experience
from rljax.rl.profiling import timed
from rljax.rl.scoring import Scorer, numeric_components
from rljax.rollout import SamplingParams
from rljax.sharding import hosts
from rljax.training import loop as training_loop


class Draw(enum.IntEnum):
  """The run's random draws; a key is (seed, step, draw, indices...)."""

  ROLLOUT = 1
  GREEDY = 2
  SHUFFLE = 3
  CRITIC_UPDATE = 4
  ACTOR_UPDATE = 5
  VALIDATION = 6
  PF_PPO = 7


@dataclasses.dataclass(frozen=True)
class Keys:
  """The run's random keys: each draw folds in the step, the draw and its indices (epoch, mini-batch, round), so
  no two draws share a key."""

  base: jax.Array

  @classmethod
  def of(cls, seed: int) -> "Keys":
    return cls(jax.random.key(seed))

  def at(self, step: int, draw: Draw, *indices: int) -> jax.Array:
    """The key of draw `indices` of `draw` at `step`."""
    key = jax.random.fold_in(jax.random.fold_in(self.base, step), int(draw))
    for index in indices:
      key = jax.random.fold_in(key, index)
    return key


def first_request(prompts: int, n: int) -> int:
  """The id of this host's first response when each host generates n responses to `prompts` prompts."""
  return hosts.index() * prompts * n


@dataclasses.dataclass
class Rollouts:
  """What every source generates and scores with: the sampler, the scorer, the keys and the actor's weights."""

  config: ConfigDict
  sampler: Any
  scorer: Scorer
  keys: Keys
  params: Callable[[], Any]  # the actor's weights now
  n: int  # responses per prompt

  def generate(self, batch: dict[str, Any], n: int, key: jax.Array, sampling: SamplingParams | None = None) -> Any:
    """n responses to each of `batch`'s prompts under the actor's weights now (the sampler's params without
    `sampling`)."""
    options = () if sampling is None else (sampling,)
    return self.sampler.generate(self.params(), batch["input_ids"], batch["attention_mask"], n, key, *options,
                                 rows=batch, first_request=first_request(len(batch["input_ids"]), n))

  def rows(self, batch: dict[str, Any], rollout: Any, step: int, timing: dict[str, float],
           turn: Callable[[], ContextManager], round_index: int = 0,
           scores: managers.RewardResult | None = None) -> Experience:
    """The scored rows of `rollout` (responses to `batch`'s prompts, `scores`: already scored) at `step` (steps
    trained), with what the advantage estimator needs from a rollout (greedy baselines, decoded in `turn`);
    dumped under trainer.rollout_data_dir."""
    timing.update(rollout.metrics)
    rows = self.scorer.scored_rows(batch, rollout, timing, scores)
    if adv_lib.needs_greedy_baselines(self.config.algorithm.adv_estimator):
      rows = rows.replace(reward_baselines=self.greedy_baselines(batch, rollout.prompt_index, step, timing, turn))
    self.scorer.dump_rollout(step + 1, batch, rollout, rows.token_level_scores.sum(-1), append=round_index > 0)
    return rows

  def greedy_baselines(self, batch: dict[str, Any], idx: np.ndarray, step: int, timing: dict[str, float],
                       turn: Callable[[], ContextManager]) -> np.ndarray:
    """[N] the reward of each row's prompt's greedy response (remax's baseline)."""
    with timed(timing, "gen_max"), turn():
      greedy = self.generate(batch, 1, self.keys.at(step, Draw.GREEDY), SamplingParams(greedy=True))
    per_prompt = np.zeros(len(batch["input_ids"]), np.float32)
    per_prompt[greedy.prompt_index] = self.scorer(batch, greedy).reward_tensor.sum(-1)
    return per_prompt[idx]


class SyncRollout:
  """trainer.v1.trainer_mode=sync: each step answers its batch under the step's own weights."""

  def __init__(self, rollouts: Rollouts, data: Any):
    self.rollouts = rollouts
    self.data = data
    self.batches = data

  def round(self, batch: dict[str, Any], step: int, timing: dict[str, float], round_index: int = 0) -> Experience:
    """Responses to `batch`, scored: the rows of one generation round (the step's first unless dynamic sampling
    needs more)."""
    rollouts = self.rollouts
    with timed(timing, "gen"):
      key = rollouts.keys.at(step, Draw.ROLLOUT, *([round_index] if round_index else []))
      rollout = rollouts.generate(batch, rollouts.n, key)
    return rollouts.rows(batch, rollout, step, timing, self.turn, round_index)

  def rows(self, batch: dict[str, Any], step: int, timing: dict[str, float], step_metrics: dict) -> Experience:
    """The rows step `step` + 1 trains."""
    return self.round(batch, step, timing)

  def publish(self, version: int, timing: dict[str, float], step_metrics: dict) -> None:
    """Nothing: the next step's rollout reads the actor's weights in place."""

  def positions(self, step: int) -> dict[str, Any]:
    """The state's positions after `step` steps: the data's."""
    return {"data_position": self.data.get_state()}

  def resumed(self, state: Any, path: str) -> "SyncRollout":
    """This source from checkpoint `path`'s `state`: the data where it was."""
    checkpoint_positions.check_resumable(state.stream_position, False, path)
    self.data.set_state(state.data_position)
    return self

  def turn(self) -> ContextManager:
    """The trainer's turn on the rollout's devices: always its own."""
    return contextlib.nullcontext()

  def close(self) -> None:
    """Nothing runs between steps."""


class DynamicSampling(SyncRollout):
  """DAPO's dynamic sampling (`rljax.rl.dynamic_sampling`), sync: generation rounds, each on the next
  data.gen_batch_size prompts, until data.train_batch_size groups whose filter metric varies are kept."""

  def rows(self, batch: dict[str, Any], step: int, timing: dict[str, float], step_metrics: dict) -> Experience:
    """The kept groups' rows step `step` + 1 trains, from `batch` and the data's next batches."""
    config = self.rollouts.config
    groups = config.algorithm.filter_groups
    wanted, n = config.data.train_batch_size, self.rollouts.n
    generated, keeps, kept, dropped = [], [], 0, 0
    while kept < wanted:
      if generated:
        if 0 < groups.max_num_gen_batches <= len(generated):
          raise ValueError(dynamic_sampling.too_many_rounds(len(generated), groups.max_num_gen_batches))
        try:
          batch = next(self.data)
        except StopIteration:
          raise training_loop.DataExhausted() from None
      rows = self.round(batch, step, timing, len(generated))
      keep = dynamic_sampling.kept_rows(dynamic_sampling.metric_values(rows, groups.metric), rows.group)
      generated.append(rows)
      keeps.append(keep)
      kept_now = int(hosts.process_total(keep.sum())) // n
      kept, dropped = kept + kept_now, dropped + len(keep) * hosts.count() // n - kept_now
    step_metrics.update({"train/num_gen_batches": float(len(generated)), "train/kept_groups": float(kept),
                         "train/filtered_groups": float(dropped)})
    return dynamic_sampling.join_rounds(generated, keeps, wanted, n)


@dataclasses.dataclass
class StreamParts:
  """What a stream is built from beyond the rollouts and the data: the run's steps, the trainer's and rollout's
  devices, the processes' roles (separate_async on several processes) and the engine's weight conversion."""

  total_steps: int
  mesh_devices: list[jax.Device]
  rollout_devices: list[jax.Device]
  roles: tuple[list[int], list[int]] | None
  rollout_engine: Any  # the engine the weights go to (`RLRun.rollout_engine`)
  engine: Any  # this process's engine (`RLRun.engine`): its weight conversion for a lagged schedule, and on a
  #   rollout process the engine its weights arrive in


class StreamedRollout:
  """colocate_async and separate_async: the step's rows are the first batch of groups the stream picks at the
  step's policy version (`rljax.rl.streaming`), generated ahead of the updates."""

  def __init__(self, rollouts: Rollouts, data: Any, parts: StreamParts, state: Any,
               position: dict[str, Any] | None = None, stream: Any = None):
    """From `position` (a checkpoint's stream position, this host's) or the data's start, on `stream` (an idle
    `DecodeStream` whose KV cache it reuses) or a new one; `state`: the run's (its step and data position)."""
    self.rollouts, self.data, self.parts = rollouts, data, parts
    config = rollouts.config
    self.schedule = staleness.schedule_of(config)
    self.separate = bool(parts.rollout_devices)
    self.batches = separate.StepTickets() if self.separate else data  # separate_async's rollout reads the data
    self._batch_state = data.get_state()
    if parts.roles is not None:  # a trainer process: the stream is its rollout processes'
      send = cross_host_weights.CrossHostSend(parts.rollout_engine, rollouts.params(), parts.mesh_devices,
                                              parts.rollout_devices)
      served, part, count = remote.served(*map(len, parts.roles))
      rollouts_count = len(parts.roles[1])
      starts = {j: checkpoint_positions.host_position(position, state.data_position, j, rollouts_count)
                for j in served}
      self.stream = self.driver = remote.RemoteRollout(send, self.schedule, state.step, parts.total_steps, starts,
                                                       part, count)
      return
    self.stream = local_stream(rollouts, data, state.step, position, stream, self.lags)
    self.driver = (separate.RolloutDriver(self.stream, self.schedule, state.step, parts.total_steps,
                                          parts.engine.compute_params, threaded=self.separate,
                                          epoch=lambda: data.epoch)
                   if self.lags else None)

  @property
  def lags(self) -> bool:
    """Whether the rollout decodes under weights other than each update's own (separate_async, or a lagged
    schedule): a driver then runs it."""
    return self.separate or not self.schedule.every_update

  def rows(self, batch: dict[str, Any] | None, step: int, timing: dict[str, float], step_metrics: dict) -> Experience:
    """The step's batch joins the stream, which decodes until a batch of prompts can train at this step's policy
    version (separate_async: the rollout thread's pick for this step); their rows, scored."""
    if batch is not None:  # separate_async's rollout reads the data itself
      self.stream.feed(batch, self._batch_state)
    if self.driver is not None and not self.driver.primed:
      self.publish(step, timing, step_metrics)
    with timed(timing, "gen"):
      try:
        picked = (self.driver.next() if self.driver is not None
                  else self.stream.next_groups(self.rollouts.params(), step))
        ended = 0.0
      except StopIteration:
        picked, ended = None, 1.0
    if hosts.process_total(ended):  # every host stops where one's data ends (none waits for the others)
      raise training_loop.DataExhausted()
    config = self.rollouts.config
    step_metrics.update(staleness.off_policy_metrics(picked, int(config.trainer.v1.sampler.max_off_policy_threshold)))
    if picked.epoch is not None:  # the rollout thread's, when it picked them
      step_metrics["training/epoch"] = float(picked.epoch)
    if config.algorithm.filter_groups.enable:
      step_metrics.update({"train/kept_groups": float(config.data.train_batch_size),
                           "train/filtered_groups": hosts.process_total(float(picked.filtered))})
    if batch is not None:
      self._batch_state = self.data.get_state()
    judged = None if picked.scores is None else managers.concat_results(picked.scores)
    return self.rollouts.rows(picked.columns, picked.rollout, step, timing, self.turn, scores=judged)

  def publish(self, version: int, timing: dict[str, float], step_metrics: dict) -> None:
    """Sends the actor's weights, of policy `version`, to the rollout when its schedule decodes under them."""
    if self.driver is None:
      return
    with timed(timing, "weight_sync"):
      if self.driver.publish(version, self.rollouts.params()):
        step_metrics["perf/weight_sync_bytes"] = float(self.driver.sent_bytes)

  def positions(self, step: int) -> dict[str, Any]:
    """The state's positions after `step` steps: every host's stream and data positions, gathered (the data's
    position is where a resumed run finds its first untrained prompt)."""
    mine = self.stream.position(step)  # this host's, or (on a trainer process) the rollout processes' it leads'
    every = [p for host in hosts.process_objects(mine if isinstance(mine, list) else [mine]) for p in host]
    data_position, stream_position = checkpoint_positions.stored_position(every)
    return {"data_position": data_position, "stream_position": stream_position}

  def resumed(self, state: Any, path: str) -> "StreamedRollout":
    """The stream from checkpoint `path`'s `state`: what this one generated is cancelled and generated again
    from the checkpoint's position."""
    checkpoint_positions.check_resumable(state.stream_position, True, path)
    self._stop()
    if self.parts.roles is not None:
      self.data.set_state(state.data_position)
      return StreamedRollout(self.rollouts, self.data, self.parts, state, state.stream_position)
    position = checkpoint_positions.host_position(state.stream_position, state.data_position, hosts.index(),
                                                  hosts.count())
    self.data.set_state(position["data_state"] if position else state.data_position)
    return StreamedRollout(self.rollouts, self.data, self.parts, state, position, self.stream.stream)

  def turn(self) -> ContextManager:
    """The trainer's turn on the rollout's devices (validation, greedy baselines): between its decode chunks."""
    return self.driver.turns.exclusive() if self.driver is not None else contextlib.nullcontext()

  def _stop(self) -> None:
    """Stops the rollout (its thread under separate_async) and cancels what it generates."""
    (self.driver or self.stream).close()

  def close(self) -> None:
    """Ends the rollout (its processes' too)."""
    if isinstance(self.driver, remote.RemoteRollout):
      self.driver.end()
    self._stop()


RolloutSource = SyncRollout | DynamicSampling | StreamedRollout


def local_stream(rollouts: Rollouts, data: Any, step: int, position: dict[str, Any] | None = None,
                 stream: Any = None, holds_weights: bool = False) -> streaming.AsyncRollout:
  """This host's stream from `position` (or the data's start) at `step` steps trained, on `stream` or a new one;
  `holds_weights`: it decodes under weights a driver gives it."""
  config, position = rollouts.config, position or {}
  groups = config.data.train_batch_size // hosts.count()
  filtering = config.algorithm.filter_groups
  most_judged = filtering.max_num_gen_batches * config.data.gen_batch_size // hosts.count()

  def read_batch() -> tuple[dict[str, Any], Any] | None:
    before = data.get_state()
    try:
      return next(data), before
    except StopIteration:
      return None

  return streaming.AsyncRollout(
      rollouts.sampler, staleness.policy_of(config, groups), rollouts.n, first_request(groups, rollouts.n),
      batch_key=lambda index: rollouts.keys.at(index, Draw.ROLLOUT), read_batch=read_batch,
      data_position=data.get_state, first_batch=position.get("batch", step), consumed=position.get("consumed", ()),
      keep=functools.partial(keeps, rollouts) if filtering.enable else None, most_judged=max(most_judged, 0),
      stream=stream, holds_weights=holds_weights)


def keeps(rollouts: Rollouts, group: streaming.Group) -> bool:
  """Dynamic sampling's judgement of a finished group under colocate_async: whether its filter metric varies
  across its responses (scored by this host alone: the hosts judge their own groups at their own times). The
  scores stay on the group: the update that trains it reads them instead of scoring it again."""
  rollout = rollouts.sampler.assemble(group.requests)
  rollout.prompt_index = np.zeros(len(group.requests), np.int64)
  result = group.scores = rollouts.scorer({k: np.asarray(v)[None] for k, v in group.columns.items()}, rollout)
  rows = Experience(token_level_scores=np.asarray(result.reward_tensor, np.float32),
                    reward_components=numeric_components(result.reward_extra_info, len(group.requests)))
  values = dynamic_sampling.metric_values(rows, rollouts.config.algorithm.filter_groups.metric)
  return bool(dynamic_sampling.kept_rows(values, rollout.prompt_index).all())


def make_source(rollouts: Rollouts, data: Any, parts: StreamParts, state: Any) -> RolloutSource:
  """The config's rollout mode's source: streamed under colocate_async and separate_async, else sync (in rounds
  under dynamic sampling)."""
  config = rollouts.config
  if staleness.policy_of(config, config.data.train_batch_size // hosts.count()) is not None:
    rollouts.sampler.free_cache = True  # the stream holds the engine's cache; validation and remax free theirs
    return StreamedRollout(rollouts, data, parts, state)
  if config.algorithm.filter_groups.enable:
    return DynamicSampling(rollouts, data)
  return SyncRollout(rollouts, data)


def serve_rollout(rollouts: Rollouts, data: Any, parts: StreamParts) -> None:
  """A rollout process's run (`remote.serve`): the stream from where its (first) trainer process starts it, its
  picks sent to its trainer processes (its weights arriving in `parts.engine`), until the trainer ends it."""
  start = transport.take("start")
  if start is None:  # the trainer trains no step
    return
  position = start["position"]  # this process's own (its data position under "data_state")
  if position is not None and position["data_state"] is not None:
    data.set_state(position["data_state"])
  step = start["first_step"]
  schedule = staleness.schedule_of(rollouts.config)
  stream = local_stream(rollouts, data, step, position, holds_weights=True)
  driver = separate.RolloutDriver(stream, schedule, step, parts.total_steps, None, threaded=False,
                                  epoch=lambda: data.epoch)
  receive = cross_host_weights.CrossHostReceive(parts.engine, rollouts.params(), parts.mesh_devices,
                                                parts.rollout_devices)
  with training_loop.PreemptionGuard():  # preempted, the trainer saves after its step, then ends the rollout
    remote.serve(start, driver, stream.position, receive)


__all__ = ["Draw", "DynamicSampling", "Keys", "RolloutSource", "Rollouts", "StreamParts", "StreamedRollout",
           "SyncRollout", "make_source", "serve_rollout"]
