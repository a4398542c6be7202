"""The RL loop: verl's ray_trainer semantics as one JAX program on one mesh.

Each step, for `data.train_batch_size` prompts:

    rollout (n responses each, the engine reading the actor's arrays: in place
    when they are in rollout.dtype, else cast once per rollout)
    -> rewards (reward manager) -> old log-probs (recomputed by the actor;
    skipped on-policy, see below) -> reference log-probs (use_kl_loss or
    use_kl_in_reward) -> critic values (gae) -> KL in reward
    -> advantages -> critic update -> actor update (after critic_warmup)
    -> metrics, validation, checkpoint.

Under trainer.v1.trainer_mode=colocate_async the rollout streams across
steps instead (`rljax.rl.streaming`): a step trains the first batch of
prompts whose responses are all done, some begun under older weights.
Under separate_async the same stream runs on devices of its own, on a
thread of its own, while the trainer updates (`rljax.rl.separate`); on
several processes, on processes of its own (`rljax.rl.remote`).

On-policy shortcut: with one PPO epoch over a single mini-batch and nothing
that needs them before the update (KL in reward, rollout correction, bypass
mode, LoRA dropout), the old log-probs equal the current ones at the update;
the update uses `stop_gradient(log_prob)` instead of a separate forward
pass, which is the same number a recomputation gives (not under
colocate_async, unless its threshold or read-ahead keeps it on-policy).

The run is assembled once by `rljax.rl.assembly.build_run` (the same call
`rljax.compile` makes, abstractly, to lower the steps for a TPU): its fixed
parts (`RLRun`: layout, models, steps, engine) and its state (`RunState`:
the trained arrays, step, KL controller and data position). A step's rows
travel in one `Experience` record (`rljax.rl.experience`): rollout and
score fill it, `_experience` adds the forward passes and advantages, and
the updates read their mini-batches from it.

LoRA (actor_rollout_ref.model.lora_rank > 0): the actor's state splits into
`RunState.actor` (adapters and modules_to_save: the only gradients,
optimizer state and checkpointed "actor" arrays) and `RLRun.frozen` (the
base weights, read in place by log-probs and the update, and by rollout when
they are in rollout.dtype). The reference policy is the base model without
adapters over those same frozen arrays. The critic trains in full.
Random streams are named (`Stream`): each draw folds in the step, the
stream and its indices (epoch, mini-batch), so no two draws share a key.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import data as data_lib
from rljax import models, rewards, sharding
from rljax.algos import advantages as adv_lib
from rljax.rewards import managers
from rljax.rl import advantage_stage, assembly, dynamic_sampling, experience as experience_lib, metrics as metrics_lib, profiling
from rljax.rl import packing, remote, separate, streaming
from rljax.rl import steps as steps_lib
from rljax.rl.experience import Experience
from rljax.rl.layout import balance_order
from rljax.rl.reward_model import ModelReward
from rljax.rl.sequences import make_sequences, merge_micro_batches, prompts_shared
from rljax.rollout import SamplingParams, factory as rollout_factory, stream as stream_lib
from rljax.sharding import failures, hosts
from rljax.sharding.distributed import is_main_process
from rljax.sharding.placement import Step
from rljax.training import checkpointing, loop as training_loop, metrics as training_metrics, tracking

_LOG = logging.getLogger("rljax.rl")
_REWARD_COLUMNS = ("data_source", "reward_model", "extra_info")
CONSOLE_KEYS = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "timing_s/step")


class Stream(enum.IntEnum):
  """The trainer's random streams; a key is (seed, step, stream, indices...)."""

  ROLLOUT = 1
  GREEDY = 2
  SHUFFLE = 3
  CRITIC_UPDATE = 4
  ACTOR_UPDATE = 5
  VALIDATION = 6


def numeric_components(extra_info: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
  """The numeric per-row entries of a reward manager's extra info, as float32 [rows] arrays (this host's)."""
  out = {}
  for key, values in extra_info.items():
    array = np.asarray(values)
    if array.shape == (rows,) and array.dtype.kind in "biuf":
      out[key] = array.astype(np.float32)
  return out


def reward_components(extra_info: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
  """`numeric_components`; on several hosts, every name any host has (NaN on the rows of a host without it, as
  one process fills a row without it)."""
  out = numeric_components(extra_info, rows)
  names = hosts.process_union(out) if hosts.count() > 1 else sorted(out)
  return {k: out[k] if k in out else np.full(rows, np.nan, np.float32) for k in names}


def dump_generations(directory: str, step: int, records: list[dict[str, Any]], append: bool = False) -> str:
  """verl's trainer.rollout_data_dir / validation_data_dir dump, one record per row.

  Every process writes the rows it holds: DIR/<step>.jsonl in a one-process
  job, DIR/<step>.process<k>.jsonl in a multi-host one; `append` adds to
  the file (a step's later generation rounds under dynamic sampling).
  """
  directory = os.path.expanduser(directory)
  os.makedirs(directory, exist_ok=True)
  suffix = f".process{hosts.index()}" if hosts.count() > 1 else ""
  path = os.path.join(directory, f"{step}{suffix}.jsonl")
  with open(path, "a" if append else "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps({**record, "step": step}, ensure_ascii=False) + "\n")
  return path


@contextlib.contextmanager
def timed(timing: dict[str, float], name: str):
  start = time.perf_counter()
  yield
  timing[f"timing_s/{name}"] = timing.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start



def check_job(config: ConfigDict) -> None:
  """What the trainer cannot run as configured, beyond `config.validate`'s checks: processes separate_async
  cannot split into a trainer and a rollout (`remote.roles`), kept groups that do not deal evenly to the
  processes, a data source no scorer knows (before any model loads). Writes the synthetic
  task first where a data file is its absent default path, so a fresh machine's default job finds its data."""
  remote.roles(config)
  processes, wanted = hosts.count(), config.data.train_batch_size
  if config.algorithm.filter_groups.enable and wanted % processes:
    raise config_lib.ConfigError("data.train_batch_size", wanted, f"does not split over the {processes} processes "
                                 "(dynamic sampling deals the kept groups to them equally)",
                                 f"make it a multiple of {processes}")
  if (config.trainer.v1.trainer_mode == "separate_async" and config.algorithm.filter_groups.enable
      and config.reward_model.enable):
    raise config_lib.ConfigError(
        "algorithm.filter_groups.enable", True, "with a reward model under trainer.v1.trainer_mode=separate_async: "
        "the rollout thread judges each group as it ends, and the reward model's forward pass would run on the "
        "trainer's devices beside its update", "set trainer.v1.trainer_mode=colocate_async, or score with a reward "
        "function (custom_reward_function.path)")
  if (processes > 1 and config.algorithm.filter_groups.enable and config.reward_model.enable
      and streaming.policy_of(config, 1) is not None):
    raise config_lib.ConfigError(
        "algorithm.filter_groups.enable", True, f"with a reward model under trainer.v1.trainer_mode=colocate_async "
        f"on {processes} processes: each host judges its groups as they finish, and the reward model's forward "
        "pass runs over every host's devices at once", "set trainer.v1.trainer_mode=sync (dynamic sampling by "
        "rounds), or score with a reward function (custom_reward_function.path)")
  data_lib.ensure_config_data(config)
  if not (config.reward_model.enable or config.custom_reward_function.path):
    rewards.check_data_sources(data_lib.as_file_list(config.data.train_files)
                               + data_lib.as_file_list(config.data.val_files))


class RLTrainer:
  """Runs an assembled RL run (`rljax.rl.assembly`) over the training data."""

  def __init__(self, config: ConfigDict, mesh: jax.sharding.Mesh | None = None):
    self.config = config
    self.mesh = mesh if mesh is not None else sharding.make_mesh(config)
    config_lib.validate(config, self.mesh.size)
    self.roles = remote.roles(config)  # separate_async on several processes: (the trainer's, the rollout's)
    self.rollout_process = self.roles is not None and jax.process_index() in self.roles[1]
    if self.roles is not None:
      hosts.set_group(self.roles[1] if self.rollout_process else self.roles[0])
    check_job(config)
    arr = config.actor_rollout_ref
    self.rollout_devices = rollout_devices = _rollout_devices(config, self.mesh)
    self.tokenizer = models.load_tokenizer(config.data.tokenizer or arr.model.path)
    self.data = data_lib.make_train_iterator(config, self.tokenizer, hosts.index(), hosts.count())
    self.separate = bool(rollout_devices)  # the rollout thread reads the data: the loop's batches are tickets
    self.train_iter = separate.StepTickets() if self.separate else self.data
    # a rollout process holds no trainer array: the trainer's parts are abstract there
    self.run, self.state = assembly.build_run(config, self.mesh, abstract=self.rollout_process,
                                              tokenizer=self.tokenizer, batches_per_epoch=self.data.batches_per_epoch,
                                              rollout_devices=rollout_devices,
                                              remote_rollout=self.roles is not None and not self.rollout_process)
    self.sampler = rollout_factory.build_sampler(
        self.run.engine, arr.rollout, rollout_factory.pad_id(self.tokenizer, self.run.engine.eos_ids), self.tokenizer)
    self.val_sampling = SamplingParams.from_rollout_config(arr.rollout.val_kwargs)
    self.reward_manager = managers.make_reward_manager(config, self.tokenizer)
    self.model_reward = (ModelReward(config, self.tokenizer, self.run.reward_model.params, self.run.reward_model.step)
                         if self.run.reward_model is not None else None)
    self.checkpointer = None if self.rollout_process else checkpointing.Checkpointer.from_config(config)
    self.run_dir = tracking.local_run_dir(config.trainer.default_local_dir, config.trainer.project_name,
                                          config.trainer.experiment_name)
    self.tracker = tracking.Tracker(config, self.run_dir, self.run.layout.total_steps, console_keys=CONSOLE_KEYS)
    self.base_key = jax.random.key(config.trainer.seed)
    self.saved_step = -1
    self._row_gathers: dict[str, Any] = {}
    self._scoring = threading.Lock()  # separate_async's rollout thread judges groups (dynamic sampling) meanwhile
    self.streaming = None if self.rollout_process else self._async_rollout()  # `serve` starts it there
    self.driver = self._driver()
    if self.streaming is not None:  # the stream holds the engine's cache; validation and remax free theirs
      self.sampler.free_cache = True

  # ----- the state ----------------------------------------------------------------------

  @property
  def step(self) -> int:
    """Steps trained (the state's)."""
    return self.state.step

  @step.setter
  def step(self, value: int) -> None:
    """Counts a step trained, with the data position its batches reached (under colocate_async, where a resumed
    run finds its first untrained prompt)."""
    if self.streaming is None:
      self.state = self.state.replace(step=value, data_position=self.data.get_state())
      return
    mine = self.streaming.position(value)  # this host's, or (on a trainer process) the rollout processes' it leads'
    every = [p for host in hosts.process_objects(mine if isinstance(mine, list) else [mine]) for p in host]
    data_position, stream_position = streaming.stored_position(every)
    self.state = self.state.replace(step=value, data_position=data_position, stream_position=stream_position)

  def _async_rollout(self, position: dict[str, Any] | None = None, stream: stream_lib.DecodeStream | None = None
                     ) -> streaming.AsyncRollout | remote.RemoteRollout | None:
    """colocate_async's generation (None in sync mode), from `position` (a checkpoint's) or the data's start, on
    `stream` (an idle one, whose KV cache it reuses) or a new one; on a trainer process of a separate_async
    job on several processes, its rollout processes' (`remote.RemoteRollout`)."""
    groups = self.config.data.train_batch_size // hosts.count()
    policy = streaming.policy_of(self.config, groups)
    if policy is None:
      return None
    if self.roles is not None and not self.rollout_process:
      send = remote.CrossHostSend(self.run.rollout_engine, self.actor_params, list(self.mesh.devices.flat),
                                  self.rollout_devices)
      served, part, parts = remote.served(*map(len, self.roles))
      starts = {j: streaming.host_position(position, self.state.data_position, j, len(self.roles[1])) for j in served}
      return remote.RemoteRollout(send, streaming.schedule_of(self.config), self.step, self.run.layout.total_steps,
                                  starts, part, parts)
    position = position or {}
    self._batch_state = self.data.get_state()
    filtering = self.config.algorithm.filter_groups
    most_judged = filtering.max_num_gen_batches * self.config.data.gen_batch_size // hosts.count()
    return streaming.AsyncRollout(
        self.sampler, policy, self.run.layout.n, self._first_request(groups, self.run.layout.n),
        batch_key=lambda index: self._key_at(index, Stream.ROLLOUT), read_batch=self._read_batch,
        data_position=self.data.get_state, first_batch=position.get("batch", self.step),
        consumed=position.get("consumed", ()), keep=self._keeps if filtering.enable else None,
        most_judged=max(most_judged, 0), stream=stream, holds_weights=self._schedule_lags())

  def _schedule_lags(self) -> bool:
    """Whether the rollout decodes under weights other than each update's own (separate_async, or a lagged
    schedule): a `separate.RolloutDriver` then runs it."""
    return self.separate or not streaming.schedule_of(self.config).every_update

  def _driver(self) -> separate.RolloutDriver | None:
    """The driver of the stream on its schedule (threaded on separate_async's own devices), or None."""
    if self.streaming is None or not self._schedule_lags():
      return None
    if isinstance(self.streaming, remote.RemoteRollout):
      return self.streaming
    return separate.RolloutDriver(self.streaming, streaming.schedule_of(self.config), self.step,
                                  self.run.layout.total_steps,
                                  None if self.rollout_process else self.run.engine.compute_params,
                                  threaded=self.separate and not self.rollout_process,
                                  epoch=lambda: self.data.epoch)

  def _generate(self, *args, **kwargs) -> Any:
    """`sampler.generate` (validation, remax's baselines) in its turn on the rollout's devices."""
    with self.driver.turns.exclusive() if self.driver is not None else contextlib.nullcontext():
      return self.sampler.generate(*args, **kwargs)

  def _publish(self, version: int, timing: dict[str, float], step_metrics: dict) -> None:
    """Sends the actor's weights, of policy `version`, to the rollout when its schedule decodes under them."""
    with timed(timing, "weight_sync"):
      if self.driver.publish(version, self.actor_params):
        step_metrics["perf/weight_sync_bytes"] = float(self.driver.sent_bytes)

  def _keeps(self, group: streaming.Group) -> bool:
    """Dynamic sampling's judgement of a finished group under colocate_async: whether its filter metric varies
    across its responses (scored by this host alone: the hosts judge their own groups at their own times). The
    scores stay on the group: the update that trains it reads them instead of scoring it again."""
    rollout = self.sampler.assemble(group.requests)
    rollout.prompt_index = np.zeros(len(group.requests), np.int64)
    result = group.scores = self._score({k: np.asarray(v)[None] for k, v in group.columns.items()}, rollout)
    rows = Experience(token_level_scores=np.asarray(result.reward_tensor, np.float32),
                      reward_components=numeric_components(result.reward_extra_info, len(group.requests)))
    values = dynamic_sampling.metric_values(rows, self.config.algorithm.filter_groups.metric)
    return bool(dynamic_sampling.kept_rows(values, rollout.prompt_index).all())

  def _read_batch(self) -> tuple[dict[str, Any], Any] | None:
    """(the next training batch, the data position before it), or None when the data has ended."""
    before = self.data.get_state()
    try:
      return next(self.data), before
    except StopIteration:
      return None

  @property
  def actor_params(self) -> Any:
    """The actor's whole state: what trains and, under LoRA, the frozen base (one view, no copy)."""
    return self.run.actor_params(self.state)

  def forward(self, step: Step, params: Any, rows: Experience, packer: packing.Packer | None = None) -> Any:
    """A forward Step over this host's `rows` in its micro-batches, this host's rows of it merged on the host
    (a packed Step's tokens from `packer`)."""
    abstract = step.args[1]
    batch = experience_lib.place(rows, abstract.replace(packed=None))
    budget, local = None, len(rows.response_mask)
    if abstract.packed is not None:
      packer = packer or self._packer(rows)
      budget = self.run.layout.token_budgets.get({"ref_log_prob": "ref"}.get(step.name, step.name))
      if budget is None:
        arrangement = packing.forward_arrangement(local, hosts.count(), abstract.packed.out_index.shape[0])
      else:
        arrangement = packer.arrangement(abstract.packed, np.arange(local * hosts.count()), budget)
      plan = packer.plan(abstract.packed, arrangement)
      if self._padded_pays(step, plan, abstract.packed, arrangement.size):
        return self.forward(getattr(self.run.steps.padded, step.name), params, rows)
      batch = batch.replace(packed=packer.pack(plan, abstract.packed))
    out = step(params, batch)
    if budget is None:
      return jax.tree.map(lambda x: merge_micro_batches(hosts.process_rows(x, axis=1)), out)
    columns = arrangement[:, hosts.index() * (local // len(arrangement)):][:, :local // len(arrangement)]
    return jax.tree.map(lambda x: packing.rows_in_place(hosts.process_rows(x, axis=1), columns,
                                                        hosts.index() * local), out)

  def _packer(self, rows: Experience) -> packing.Packer | None:
    """The step's packer when any of its passes is packed: this host's tokens placed once, every row's span
    (the hosts exchange [N, 2] integers)."""
    if not any(packing_of(step) for step in self.run.steps.all()):
      return None
    layout = self.run.layout
    spans = hosts.process_concat(np.stack(packing.row_spans(rows.attention_mask), axis=1))
    tokens = experience_lib.spec(packing.TOKEN_FIELDS, 1, layout.rows, layout.prompt_length, layout.response_length,
                                 self.mesh, sharding.rules_from_config(self.config))
    return packing.Packer.of(rows, (spans[:, 0], spans[:, 1]), tokens, layout.prompt_length, layout.response_length)

  @staticmethod
  def _first_request(prompts: int, n: int) -> int:
    """The id of this host's first response when each host generates n responses to `prompts` prompts."""
    return hosts.index() * prompts * n

  # ----- one step -------------------------------------------------------------------

  def _key(self, stream: Stream, *indices: int) -> jax.Array:
    """The key of draw `indices` of `stream` at this step."""
    return self._key_at(self.step, stream, *indices)

  def _key_at(self, step: int, stream: Stream, *indices: int) -> jax.Array:
    """The key of draw `indices` of `stream` at `step`."""
    key = jax.random.fold_in(jax.random.fold_in(self.base_key, step), int(stream))
    for index in indices:
      key = jax.random.fold_in(key, index)
    return key

  def _score(self, batch: dict[str, Any], rollout: Any, use_model: bool = True) -> managers.RewardResult:
    """Token-level scores [N, R] of a rollout: the reward model's (when enabled and use_model), else the
    reward manager's."""
    with self._scoring:
      return self._scored_by(batch, rollout, use_model)

  def _scored_by(self, batch: dict[str, Any], rollout: Any, use_model: bool) -> managers.RewardResult:
    """`_score`'s scores, from the reward model (when enabled and use_model) or the reward manager."""
    idx = rollout.prompt_index
    if self.model_reward is not None and use_model:
      rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                            rollout.attention_mask)
      raw = np.asarray(batch["raw_prompt"])[idx] if "raw_prompt" in batch else None
      return managers.RewardResult(self.model_reward(rows, raw), {}, {})
    columns = {k: np.asarray(batch[k])[idx] for k in _REWARD_COLUMNS if k in batch}
    infos = rollout.extra_info(columns.get("extra_info"))
    if infos is not None:
      columns["extra_info"] = np.array(list(infos), dtype=object)
    return self.reward_manager({"responses": rollout.responses, "response_mask": rollout.attention_mask, **columns})

  def _records(self, batch: dict[str, Any], idx: np.ndarray, responses: np.ndarray, response_mask: np.ndarray,
               scores: np.ndarray) -> list[dict[str, Any]]:
    """Decoded input, output, ground truth and score of each row (for the generation dumps)."""
    truths = np.asarray(batch["reward_model"])[idx] if "reward_model" in batch else [None] * len(idx)
    return [{"input": self.tokenizer.decode(batch["input_ids"][p][batch["attention_mask"][p] > 0],
                                            skip_special_tokens=True),
             "output": self.tokenizer.decode(r[m > 0], skip_special_tokens=True),
             "gts": (t or {}).get("ground_truth") if isinstance(t, dict) else None, "score": float(sc)}
            for p, r, m, t, sc in zip(idx, responses, response_mask, truths, scores)]

  def _greedy_baselines(self, batch: dict[str, Any], idx: np.ndarray, timing: dict[str, float]) -> np.ndarray:
    """remax: [N] the reward of each row's prompt's greedy response."""
    with timed(timing, "gen_max"):
      greedy = self._generate(self.actor_params, batch["input_ids"], batch["attention_mask"], 1,
                              self._key(Stream.GREEDY), SamplingParams(greedy=True), rows=batch,
                              first_request=self._first_request(len(batch["input_ids"]), 1))
    per_prompt = np.zeros(len(batch["input_ids"]), np.float32)
    per_prompt[greedy.prompt_index] = self._score(batch, greedy).reward_tensor.sum(-1)
    return per_prompt[idx]

  def _rollout(self, batch: dict[str, Any], timing: dict[str, float], round_index: int = 0) -> Experience:
    """Responses to `batch`, scored: the rows of one generation round (the step's first unless dynamic
    sampling needs more), with what the advantage estimator needs from the rollout (remax's baselines)."""
    with timed(timing, "gen"):
      rollout = self.sampler.generate(self.actor_params, batch["input_ids"], batch["attention_mask"],
                                      self.run.layout.n,
                                      self._key(Stream.ROLLOUT, *([round_index] if round_index else [])), rows=batch,
                                      first_request=self._first_request(len(batch["input_ids"]), self.run.layout.n))
    return self._scored(batch, rollout, timing, round_index)

  def _streamed(self, batch: dict[str, Any], timing: dict[str, float], step_metrics: dict) -> Experience:
    """colocate_async: the step's batch joins the stream (`rljax.rl.streaming`), which decodes until a batch of
    prompts can train at this step's policy version (separate_async: the rollout thread's pick for this step,
    `rljax.rl.separate`); their rows, scored."""
    if batch is not None:  # separate_async's rollout reads the data itself
      self.streaming.feed(batch, self._batch_state)
    if self.driver is not None and not self.driver.primed:
      self._publish(self.step, timing, step_metrics)
    with timed(timing, "gen"):
      try:
        picked = (self.driver.next() if self.driver is not None
                  else self.streaming.next_groups(self.actor_params, self.step))
        ended = 0.0
      except StopIteration:
        picked, ended = None, 1.0
    if hosts.process_total(ended):  # every host stops where one's data ends (none waits for the others)
      raise training_loop.DataExhausted()
    threshold = int(self.config.trainer.v1.sampler.max_off_policy_threshold)
    step_metrics.update(streaming.off_policy_metrics(picked, threshold))
    if picked.epoch is not None:  # the rollout thread's, when it picked them
      step_metrics["training/epoch"] = float(picked.epoch)
    if self.config.algorithm.filter_groups.enable:
      step_metrics.update({"train/kept_groups": float(self.config.data.train_batch_size),
                           "train/filtered_groups": hosts.process_total(float(picked.filtered))})
    if batch is not None:
      self._batch_state = self.data.get_state()
    judged = None if picked.scores is None else managers.concat_results(picked.scores)
    return self._scored(picked.columns, picked.rollout, timing, scores=judged)

  def _scored(self, batch: dict[str, Any], rollout: Any, timing: dict[str, float], round_index: int = 0,
              scores: managers.RewardResult | None = None) -> Experience:
    """The rows of `rollout` (responses to `batch`'s prompts), scored (`scores`: already), with what the advantage
    estimator needs from the rollout (remax's baselines); dumped under trainer.rollout_data_dir."""
    timing.update(rollout.metrics)
    idx = rollout.prompt_index
    rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                          rollout.response_mask, rollout.attention_mask).replace(
        prompt_mask=batch["attention_mask"][idx].astype(np.int32), rollout_log_probs=rollout.log_probs,
        routed_experts=rollout.routed_experts, group=idx.astype(np.int32))
    with timed(timing, "reward"):
      result = self._score(batch, rollout) if scores is None else scores
    rows = rows.replace(token_level_scores=np.asarray(result.reward_tensor, np.float32),
                        reward_components=reward_components(result.reward_extra_info, len(idx)))
    timing.update({k: hosts.process_total(float(v)) for k, v in result.metrics.items()})  # counts
    if "reward_baselines" in adv_lib.estimator_inputs(self.config.algorithm.adv_estimator).needs:
      rows = rows.replace(reward_baselines=self._greedy_baselines(batch, idx, timing))
    if self.config.trainer.rollout_data_dir:
      dump_generations(self.config.trainer.rollout_data_dir, self.step + 1, self._records(
          batch, idx, rollout.responses, rollout.attention_mask, rows.token_level_scores.sum(-1)),
          append=round_index > 0)
    return rows

  def _kept_groups(self, batch: dict[str, Any], timing: dict[str, float], step_metrics: dict) -> Experience:
    """DAPO's dynamic sampling (`rljax.rl.dynamic_sampling`): generation rounds, each on the next
    data.gen_batch_size prompts, until data.train_batch_size groups whose filter metric varies are kept."""
    groups = self.config.algorithm.filter_groups
    wanted, n = self.config.data.train_batch_size, self.run.layout.n
    generated, keeps, kept, dropped = [], [], 0, 0
    while kept < wanted:
      if generated:
        if 0 < groups.max_num_gen_batches <= len(generated):
          raise ValueError(dynamic_sampling.too_many_rounds(len(generated), groups.max_num_gen_batches))
        try:
          batch = next(self.data)
        except StopIteration:
          raise training_loop.DataExhausted() from None
      rows = self._rollout(batch, timing, len(generated))
      keep = dynamic_sampling.kept_rows(dynamic_sampling.metric_values(rows, groups.metric), rows.group)
      generated.append(rows)
      keeps.append(keep)
      kept_now = int(hosts.process_total(keep.sum())) // n
      kept, dropped = kept + kept_now, dropped + len(keep) * hosts.count() // n - kept_now
    step_metrics.update({"train/num_gen_batches": float(len(generated)), "train/kept_groups": float(kept),
                         "train/filtered_groups": float(dropped)})
    return dynamic_sampling.join_rounds(generated, keeps, wanted, n)

  def _experience(self, rows: Experience, timing: dict[str, float], step_metrics: dict,
                  packer: packing.Packer | None = None) -> Experience:
    """`rows` with the old and reference log-probs, values, rewards, advantages and returns the run uses
    (`packer`: the step's, for its packed passes)."""
    steps, group = self.run.steps, self.run.layout.group
    if not prompts_shared(rows, group):
      raise RuntimeError(f"rows are not in groups of {group} sharing a prompt; set "
                         "actor_rollout_ref.model.share_prompt_forward=false and report this")
    if not self.run.on_policy:
      with timed(timing, "old_log_prob"):
        old = self.forward(steps.old_log_prob, self.actor_params, rows, packer)
        rows = rows.replace(old_log_probs=old[0])
        if steps_lib.replays_routing(self.config, self.run.on_policy):
          rows = rows.replace(routed_experts=old[2])
    if steps.ref_log_prob is not None:
      with timed(timing, "ref"):
        rows = rows.replace(ref_log_prob=self.forward(steps.ref_log_prob, self.run.reference.params, rows, packer)[0])
    if steps.values is not None:
      with timed(timing, "values"):
        rows = rows.replace(values=self.forward(steps.values, self.state.critic, rows, packer))
    with timed(timing, "adv"):
      return self._advantages(rows, step_metrics)

  def _advantages(self, rows: Experience, step_metrics: dict) -> Experience:
    """`rows` with the token-level rewards (KL in the reward), rollout correction, advantages and returns
    (`advantage_stage`: each host's own rows, or every host's where a statistic is over the whole batch)."""
    inputs = rows.select(advantage_stage.inputs(self.config))
    if advantage_stage.reads_every_row(self.config):
      inputs = inputs.replace(group=inputs.group + hosts.index() * (len(inputs.group) // self.run.layout.n))
      out, (kl_ctrl, metrics) = hosts.gathered_rows(self._stage, inputs, self.state.kl_ctrl)
    else:
      out, (kl_ctrl, metrics) = self._stage(inputs, self.state.kl_ctrl)
    self.state = self.state.replace(kl_ctrl=kl_ctrl)
    step_metrics.update({k: float(v) for k, v in metrics.items()})
    rows = rows.replace(**{k: np.asarray(getattr(out, k), experience_lib.FIELDS[k][1]) for k in out.present()})
    if self.config.actor_rollout_ref.actor.positive_nll_coef:
      rows = rows.replace(positive=rows.token_level_scores.sum(-1) > 0)
    return rows

  def _stage(self, rows: Experience, kl_ctrl: Any) -> tuple[Experience, tuple[Any, dict[str, Any]]]:
    """`advantage_stage.stage` under this run's config."""
    return advantage_stage.stage(self.config, rows, kl_ctrl)

  def _minibatches(self, rows: Experience, step: Step, epochs: int, order: np.ndarray,
                   packer: packing.Packer | None) -> Iterator[tuple[int, int, Experience]]:
    """(epoch, index, mini-batch) over `epochs` epochs of `rows`, each mini-batch as `step` takes it (its batch
    argument's fields and shardings).

    The step's rows (this host's) are placed once; each mini-batch is gathered on device from the global row
    numbers of `order` (permuted per epoch under actor.shuffle), so it holds the same rows whatever the number
    of hosts; a packed step's tokens are packed from those rows by `packer`.
    """
    layout, spec = self.run.layout, step.args[2].replace(packed=None)
    cached = (step.name, step.args[2].packed is None)
    if cached not in self._row_gathers:
      self._row_gathers[cached] = experience_lib.row_gather(spec)
    gather, size = self._row_gathers[cached], layout.mini_rows
    whole = experience_lib.place(rows, experience_lib.regrouped(spec, 1, layout.rows))
    for epoch in range(epochs):
      epoch_order = order
      if self.config.actor_rollout_ref.actor.shuffle:
        epoch_order = order[np.asarray(jax.random.permutation(self._key(Stream.SHUFFLE, epoch), layout.rows))]
      for m in range(layout.minis):
        index = epoch_order[m * size:(m + 1) * size]
        abstract = step.args[2].packed
        if abstract is None:
          yield epoch, m, gather(whole, index)
          continue
        arrangement = packer.arrangement(abstract, index, layout.token_budgets.get(step.name))
        yield epoch, m, gather(whole, arrangement).replace(packed=packer.pack(packer.plan(abstract, arrangement),
                                                                                 abstract))

  def _update_step(self, step: Step, order: np.ndarray, packer: packing.Packer | None) -> Step:
    """`step`, or its padded twin when the step's first mini-batch costs less padded (`packing.padded_pays`)."""
    abstract = step.args[2].packed
    if abstract is None:
      return step
    index = order[:self.run.layout.mini_rows]
    plan = packer.plan(abstract, packer.arrangement(abstract, index, self.run.layout.token_budgets.get(step.name)))
    return getattr(self.run.steps.padded, step.name) if self._padded_pays(step, plan, abstract, len(index)) else step

  def _padded_pays(self, step: Step, plan: packing.PackPlan, abstract: packing.PackedRows, rows: int) -> bool:
    """Whether `step`'s padded twin computes less than its packed pass of `plan` over `rows` rows."""
    layout = self.run.layout
    return packing.padded_pays(packing.plan_tokens(plan, abstract), rows, layout.prompt_length,
                               layout.response_length, self.run.steps.padded.groups[step.name])

  def _balanced_order(self, rows: Experience) -> np.ndarray:
    """The step's global row numbers in update order: trainer.balance_batch deals the prompts' groups to the
    data-parallel ranks by token totals (the hosts exchange their rows' lengths, [N] integers)."""
    data_parallel = sharding.data_parallel_size(self.mesh)
    if not (self.config.trainer.balance_batch and data_parallel > 1):
      return np.arange(self.run.layout.rows)
    lengths = hosts.process_concat(rows.attention_mask.sum(-1).astype(np.int32))
    return balance_order(lengths, data_parallel, self.run.layout.group)

  def _update(self, rows: Experience, timing: dict[str, float], step_metrics: dict,
              packer: packing.Packer | None = None) -> None:
    """The critic's and then the actor's epochs over the mini-batches of `rows` (the state moves on; `packer`
    for the packed ones)."""
    actor, steps, layout = self.config.actor_rollout_ref.actor, self.run.steps, self.run.layout
    collected: list[dict] = []
    order = self._balanced_order(rows)
    if steps.critic_update is not None:
      with timed(timing, "update_critic"):
        update = self._update_step(steps.critic_update, order, packer)
        for epoch, i, mini in self._minibatches(rows, update, self.config.critic.ppo_epochs, order, packer):
          critic, critic_opt, m = update(self.state.critic, self.state.critic_opt, mini,
                                         self._key(Stream.CRITIC_UPDATE, epoch, i))
          self.state = self.state.replace(critic=critic, critic_opt=critic_opt)
          collected.append(m)
        jax.block_until_ready(self.state.critic)
    if self.step >= self.config.trainer.critic_warmup:
      with timed(timing, "update_actor"):
        update = self._update_step(steps.actor_update, order, packer)
        for epoch, i, mini in self._minibatches(rows, update, actor.ppo_epochs, order, packer):
          trained, actor_opt, m = update(self.state.actor, self.state.actor_opt, mini,
                                         self._key(Stream.ACTOR_UPDATE, epoch, i), self.run.frozen)
          self.state = self.state.replace(actor=trained, actor_opt=actor_opt)
          collected.append(m)
        jax.block_until_ready(self.state.actor)
      step_metrics["actor/lr"] = float(self.run.actor_lr(self.step * actor.ppo_epochs * layout.minis))
    for m in jax.device_get(collected):
      for k, v in m.items():
        step_metrics.setdefault(k, []).append(float(v))
    for k, v in list(step_metrics.items()):
      if isinstance(v, list):
        step_metrics[k] = float(np.mean(v))

  def train_step(self, batch: dict[str, Any]) -> dict[str, float]:
    """One RL step on a batch of prompts; returns its metrics."""
    timing: dict[str, float] = {}
    step_metrics: dict[str, Any] = {}
    with profiling.step_trace(self.config, self.step + 1), timed(timing, "step"):
      if self.streaming is not None:
        rows = self._streamed(batch, timing, step_metrics)
      elif self.config.algorithm.filter_groups.enable:
        rows = self._kept_groups(batch, timing, step_metrics)
      else:
        rows = self._rollout(batch, timing)
      packer = self._packer(rows)
      rows = self._experience(rows, timing, step_metrics, packer)
      self._update(rows, timing, step_metrics, packer)
      if self.driver is not None:  # the weights this update made, to the rollout if it decodes under them
        self._publish(self.step + 1, timing, step_metrics)
    step_metrics.update(metrics_lib.data_metrics(rows, self.run.layout.response_length, self.run.layout.prompt_length))
    step_metrics.update(timing)
    if packer is not None and packer.real:  # the packed passes' token positions over their real tokens
      step_metrics["perf/packed_compute_ratio"] = packer.computed / packer.real
    tokens = int(hosts.process_total(rows.attention_mask.sum()))
    step_metrics.update(training_metrics.throughput_metrics(timing, tokens, self.mesh.size))
    step_metrics["training/global_step"] = float(self.step + 1)
    step_metrics.setdefault("training/epoch", float(self.data.epoch))  # batches read: dynamic sampling reads several
    return step_metrics

  # ----- validation ------------------------------------------------------------------

  def validate(self) -> dict[str, float]:
    """Greedy (val_kwargs) responses to data.val_files, scored per data source."""
    val = self.config.actor_rollout_ref.rollout.val_kwargs
    scores, sources, samples, records = [], [], [], []
    for i, batch in enumerate(data_lib.make_val_batches(self.config, self.tokenizer, hosts.index(),
                                                        hosts.count())):
      rollout = self._generate(self.actor_params, batch["input_ids"], batch["attention_mask"], val.n,
                               self._key(Stream.VALIDATION, i), self.val_sampling, rows=batch,
                               first_request=self._first_request(len(batch["input_ids"]), val.n))
      idx = rollout.prompt_index
      result = self._score(batch, rollout, use_model=False)
      row_scores = result.reward_tensor.sum(-1)
      scores.append(row_scores)
      sources.append(np.asarray(batch["data_source"])[idx])
      if self.config.trainer.validation_data_dir:
        records += self._records(batch, idx, rollout.responses, rollout.attention_mask, row_scores)
      if len(samples) < self.config.trainer.log_val_generations:
        for row in range(min(len(idx), self.config.trainer.log_val_generations - len(samples))):
          samples.append({"prompt": self.tokenizer.decode(batch["input_ids"][idx[row]][batch["attention_mask"][idx[row]] > 0]),
                          "response": self.tokenizer.decode(rollout.responses[row][:rollout.response_lengths[row]]),
                          "score": float(row_scores[row])})
    out = metrics_lib.validation_metrics(np.concatenate(sources), np.concatenate(scores), val.n)
    if samples:
      self.tracker.log_generations(samples, self.step)
    if records:
      dump_generations(self.config.trainer.validation_data_dir, self.step, records)
    return out

  # ----- checkpoints -----------------------------------------------------------------

  def save(self) -> None:
    """Checkpoints the state and redraws the curves."""
    self.checkpointer.save(self.step, *assembly.checkpoint_items(self.state, self.config.trainer.seed))
    self.saved_step = self.step
    metrics_file = os.path.join(self.run_dir, tracking.METRICS_FILE)
    if is_main_process() and self.step > 0 and os.path.exists(metrics_file):  # no curve before a step
      tracking.plot_curves(metrics_file, os.path.join(self.run_dir, "curves.png"))

  def restore(self, path: str) -> None:
    """The state of the checkpoint step `path`, placed as this run's; the data resumes where it was."""
    target, _ = assembly.checkpoint_items(assembly.abstract_like(self.state), self.config.trainer.seed)
    self.state = assembly.restored(self.state, *checkpointing.restore_from_path(path, target))
    streaming.check_resumable(self.state.stream_position, self.streaming is not None, path)
    self._close_rollout()  # what it generated is generated again from the checkpoint's position
    if self.streaming is None or isinstance(self.streaming, remote.RemoteRollout):
      self.data.set_state(self.state.data_position)
      position = self.state.stream_position
    else:  # this host's own
      position = streaming.host_position(self.state.stream_position, self.state.data_position, hosts.index(),
                                         hosts.count())
      self.data.set_state(position["data_state"] if position else self.state.data_position)
    if self.streaming is not None:
      self.streaming = self._async_rollout(position, self.streaming.stream)
      self.driver = self._driver()

  # ----- the run -------------------------------------------------------------------------

  def serve_rollout(self) -> None:
    """A rollout process's run (`remote.serve`): the stream from where its (first) trainer process starts it,
    its picks sent to its trainer processes, until the trainer ends it."""
    start = remote.take("start")
    if start is None:  # the trainer trains no step
      return
    position = start["position"]  # this process's own (its data position under "data_state")
    if position is not None and position["data_state"] is not None:
      self.data.set_state(position["data_state"])
    self.state = self.state.replace(step=start["first_step"])
    self.streaming = self._async_rollout(position)
    self.driver = self._driver()
    receive = remote.CrossHostReceive(self.run.engine, self.actor_params, list(self.mesh.devices.flat),
                                      self.rollout_devices)
    with training_loop.PreemptionGuard():  # preempted, the trainer saves after its step, then ends the rollout
      remote.serve(start, self.driver, self.streaming.position, receive)

  def fit(self) -> dict[str, float]:
    """Trains until trainer.total_training_steps / total_epochs; returns the last metrics."""
    trainer = self.config.trainer
    resume = checkpointing.resolve_resume(trainer)
    if resume is not None:
      self.restore(resume)
      _LOG.info("resumed from %s at step %d", resume, self.step)
    last: dict[str, float] = {}
    if trainer.val_before_train and self.step == 0 and self.config.data.val_files:
      last = self.validate()
      self.tracker.log(last, self.step)
      if trainer.val_only:
        return last
    test_freq = trainer.test_freq if self.config.data.val_files else 0
    # verl: save_freq > 0 saves every save_freq steps and the last one; -1 (its default) saves none (a SIGTERM
    # still saves: a preempted VM resumes)
    return training_loop.train_loop(self, self.run.layout.total_steps, _every(test_freq), _every(trainer.save_freq),
                                    save_last=trainer.save_freq > 0) or last

  def _close_rollout(self) -> None:
    """Stops the rollout (its thread under separate_async) and cancels what it generates."""
    if self.driver is not None:
      self.driver.close()
    elif self.streaming is not None:
      self.streaming.close()

  def close(self) -> None:
    """Ends the rollout and closes what the run holds, its trackers last (a failed run's never reached the end)."""
    if isinstance(self.driver, remote.RemoteRollout):
      self.driver.end()
    self._close_rollout()
    self.sampler.close()
    self.data.close()
    if self.checkpointer is not None:
      self.checkpointer.close()
    self.reward_manager.close()
    self.tracker.close()


def packing_of(step: Step) -> Any:
  """A pass's abstract PackedRows (None when it runs padded rows): its batch argument's `packed`."""
  batch = step.args[2] if step.name.endswith("update") else step.args[1]
  return batch.packed


def _rollout_devices(config: ConfigDict, mesh: jax.sharding.Mesh) -> list[jax.Device]:
  """separate_async's own devices: the last `sharding.rollout_device_count` of those JAX sees outside the training
  mesh (none in the other modes).

  Raises:
    ConfigError: too few devices are left beside the mesh.
  """
  count = sharding.rollout_device_count(config)
  if not count:
    return []
  free = [d for d in jax.devices() if d not in set(mesh.devices.flat)]
  if len(free) < count:
    raise config_lib.ConfigError(
        "actor_rollout_ref.rollout.n_gpus_per_node", config.actor_rollout_ref.rollout.n_gpus_per_node,
        f"separate_async's rollout needs actor_rollout_ref.rollout.nnodes x n_gpus_per_node = {count} devices beside "
        f"the training mesh's {mesh.size}, and JAX sees {len(jax.devices())}",
        "train on fewer devices (trainer.n_gpus_per_node) or give the rollout fewer")
  return free[-count:]


def _every(freq: int) -> Callable[[int], bool]:
  """step -> whether it is a multiple of `freq` (never when freq <= 0, verl's "off")."""
  return lambda step: freq > 0 and step % freq == 0


def _serve_or_fit(trainer: RLTrainer) -> dict[str, float]:
  """A rollout process's run (no metrics), or the trainer's last metrics."""
  if trainer.rollout_process:
    trainer.serve_rollout()
    return {}
  return trainer.fit()


def run(config: ConfigDict) -> dict[str, float]:
  """Trains with a finalized, validated config; prints where the outputs are. A process of a job on several
  processes that fails stops the others and exits (`rljax.sharding.failures`)."""
  trainer, metrics = failures.run_together(functools.partial(RLTrainer, config), _serve_or_fit, RLTrainer.close)
  if is_main_process():
    print(f"rljax: logs and curves in {trainer.run_dir}, checkpoints in {config.trainer.default_local_dir}")
  return metrics


__all__ = ["RLTrainer", "Stream", "run"]
