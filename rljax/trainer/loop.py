"""The RL loop: verl's ray_trainer semantics as one JAX program on one mesh.

Each step, for `data.train_batch_size` prompts:

    rollout (n responses each, the engine reading the actor's arrays: in place
    when they are in rollout.dtype, else cast once per rollout)
    -> rewards (reward manager) -> old log-probs (recomputed by the actor;
    skipped on-policy, see below) -> reference log-probs (use_kl_loss or
    use_kl_in_reward) -> critic values (gae) -> KL in reward
    -> advantages -> critic update -> actor update (after critic_warmup)
    -> metrics, validation, checkpoint.

On-policy shortcut: with one PPO epoch over a single mini-batch and nothing
that needs them before the update (KL in reward, rollout correction, bypass
mode, LoRA dropout), the old log-probs equal the current ones at the update;
the update uses `stop_gradient(log_prob)` instead of a separate forward
pass, which is the same number a recomputation gives.

LoRA (actor_rollout_ref.model.lora_rank > 0): the actor's state splits into
`actor_trainable` (adapters and modules_to_save: the only gradients,
optimizer state and checkpointed "actor" arrays) and `actor_frozen` (the base
weights, read in place by log-probs and the update, and by rollout when they
are in rollout.dtype). The reference
policy is the base model without adapters over those same frozen arrays.
The critic trains in full.

The jitted steps come from `rljax.trainer.steps` and the engine from
`rljax.rollout.factory`, the same code `rljax.compile` lowers for a TPU.
Random streams are named (`Stream`): each draw folds in the step, the
stream and its indices (epoch, mini-batch), so no two draws share a key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import os
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from rljax.sharding.distributed import is_main_process
from rljax import config as config_lib
from rljax import data as data_lib
from rljax import models, rewards, sharding
from rljax.algos import advantages as adv_lib
from rljax.algos import kl as kl_lib
from rljax.algos import rollout_corr
from rljax.models import lora as lora_lib
from rljax.rewards import managers
from rljax.rollout import SamplingParams, factory as rollout_factory
from rljax.trainer import checkpointing, dynamic_sampling, faults, metrics as metrics_lib, policy, profiling
from rljax.trainer import steps as steps_lib, tracking
from rljax.trainer.dynamic_sampling import COMPONENT_PREFIX
from rljax.trainer.layout import balance_order, make_layout
from rljax.trainer.optim import make_optimizer, make_schedule
from rljax.trainer.reward_model import ModelReward
from rljax.trainer.sequences import as_micro_batches, make_sequences, merge_micro_batches, prompts_shared

_LOG = logging.getLogger("rljax.trainer")
_ROW_KEYS = ("data_source", "reward_model", "extra_info")


class Stream(enum.IntEnum):
  """The trainer's random streams; a key is (seed, step, stream, indices...)."""

  ROLLOUT = 1
  GREEDY = 2
  SHUFFLE = 3
  CRITIC_UPDATE = 4
  ACTOR_UPDATE = 5
  VALIDATION = 6



def reward_components(extra_info: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
  """The numeric per-row entries of a reward manager's extra info, as float32 [rows] row arrays."""
  out = {}
  for key, values in extra_info.items():
    array = np.asarray(values)
    if array.shape == (rows,) and array.dtype.kind in "biuf":
      out[COMPONENT_PREFIX + key] = array.astype(np.float32)
  return out


def gdpo_components(rows: dict[str, np.ndarray], alg: ConfigDict) -> dict[str, np.ndarray]:
  """gdpo's reward components by key; a clear error when the reward function did not return them."""
  components = {k[len(COMPONENT_PREFIX):]: v for k, v in rows.items() if k.startswith(COMPONENT_PREFIX)}
  missing = [k for k in alg.gdpo_reward_keys if k not in components]
  if missing:
    raise ValueError(f"algorithm.gdpo_reward_keys names {missing}, but the reward function returned "
                     f"{sorted(components) or 'no numeric components'}; return a dict with a number for each "
                     "key (custom_reward_function) or change algorithm.gdpo_reward_keys.")
  return components


def dump_generations(directory: str, step: int, records: list[dict[str, Any]], append: bool = False) -> str:
  """verl's trainer.rollout_data_dir / validation_data_dir dump, one record per row.

  Every process writes the rows it holds: DIR/<step>.jsonl in a one-process
  job, DIR/<step>.process<k>.jsonl in a multi-host one; `append` adds to
  the file (a step's later generation rounds under dynamic sampling).
  """
  directory = os.path.expanduser(directory)
  os.makedirs(directory, exist_ok=True)
  suffix = f".process{jax.process_index()}" if jax.process_count() > 1 else ""
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


class RLTrainer:
  """Builds the models, engine, data and updates from a validated config and runs them."""

  def __init__(self, config: ConfigDict, mesh: jax.sharding.Mesh | None = None):
    self.config = config
    self.mesh = mesh if mesh is not None else sharding.make_mesh(config)
    config_lib.validate(config, self.mesh.size)
    self.rules = sharding.rules_from_config(config)
    self.data_parallel = sharding.data_parallel_size(self.mesh)
    arr = config.actor_rollout_ref
    self.run_dir = tracking.local_run_dir(config.trainer.default_local_dir, config.trainer.project_name,
                                          config.trainer.experiment_name)
    self.base_key = jax.random.key(config.trainer.seed)

    model = policy.load_actor(config, self.mesh, self.rules, self.base_key)
    self.lora = policy.lora_config(config)
    self.cfg = model.cfg
    sharding.check_model_fits(self.mesh, self.cfg.num_heads, self.cfg.num_kv_heads, num_experts=self.cfg.num_experts)
    if arr.actor.router_replay.mode != "disabled" and not self.cfg.num_experts:
      raise config_lib.ConfigError("actor_rollout_ref.actor.router_replay.mode", arr.actor.router_replay.mode,
                                   f"router replay needs a mixture-of-experts model; {arr.model.path} is a dense "
                                   f"{self.cfg.model_type}", "set it to disabled")
    self.tokenizer = models.load_tokenizer(config.data.tokenizer or arr.model.path)
    self.graphdef, self.actor_trainable, self.actor_frozen = lora_lib.split_trainable(model)

    if config.algorithm.filter_groups.enable and jax.process_count() > 1:
      raise config_lib.ConfigError(
          "algorithm.filter_groups.enable", True, f"dynamic sampling runs on one process; this job has "
          f"{jax.process_count()} (each would keep different groups and run a different number of rounds)",
          "set algorithm.filter_groups.enable=false on a multi-host job")
    self.train_iter = data_lib.make_train_iterator(config, self.tokenizer, jax.process_index(), jax.process_count())
    if not (config.reward_model.enable or config.custom_reward_function.path):
      rewards.check_data_sources(data_lib.as_file_list(config.data.train_files)
                                 + data_lib.as_file_list(config.data.val_files))
    self.layout = make_layout(config, self.train_iter.batches_per_epoch, self.data_parallel)
    self.need_ref = steps_lib.needs_reference(config)
    self.ref_graphdef, self.ref_params = (policy.reference(model, self.graphdef, self.actor_params, self.lora)
                                          if self.need_ref else (None, None))
    lora_dropout = self.lora is not None and self.lora.dropout > 0
    self.on_policy = steps_lib.on_policy(config, self.layout, lora_dropout)
    self.use_critic = steps_lib.uses_critic(config)
    updates_per_step = arr.actor.ppo_epochs * self.layout.minis
    actor_tx = make_optimizer(arr.actor.optim, arr.actor.grad_clip, self.layout.total_steps, updates_per_step)
    self.actor_lr = make_schedule(arr.actor.optim, self.layout.total_steps, updates_per_step)
    param_sh = steps_lib.shardings_of(self.actor_trainable)
    self.actor_opt, actor_opt_sh = sharding.init_optimizer(actor_tx, self.actor_trainable, param_sh, self.mesh)
    critic = None
    if self.use_critic:
      critic_graphdef, self.critic_params = nnx.split(policy.load_critic(config, self.mesh, self.rules))
      critic_tx = make_optimizer(config.critic.optim, config.critic.grad_clip, self.layout.total_steps,
                                 config.critic.ppo_epochs * self.layout.minis)
      self.critic_opt, critic_opt_sh = sharding.init_optimizer(
          critic_tx, self.critic_params, steps_lib.shardings_of(self.critic_params), self.mesh)
      critic = (critic_graphdef, self.critic_params, critic_tx, critic_opt_sh)
    self.steps = steps_lib.build_rl_steps(
        config, self.layout, self.mesh, self.rules, graphdef=self.graphdef, trainable=self.actor_trainable,
        frozen=self.actor_frozen, actor_tx=actor_tx, actor_opt_sh=actor_opt_sh, lora_dropout=lora_dropout,
        reference=(self.ref_graphdef, self.ref_params) if self.need_ref else None, critic=critic,
        routing=self.cfg.routing_shape)
    self.replay_routing = steps_lib.replays_routing(config, self.on_policy)
    alg = config.algorithm
    corr = alg.rollout_correction
    self.rollout_correction = bool(corr.rollout_is or corr.rollout_rs)
    self.kl_ctrl = kl_lib.get_kl_controller(alg.kl_ctrl)

    stop = rollout_factory.stop_ids(self.tokenizer, self.cfg)
    rollout_mesh = rollout_factory.rollout_mesh(self.mesh, arr.rollout.tensor_model_parallel_size)
    sharding.check_model_fits(rollout_mesh, self.cfg.num_heads, self.cfg.num_kv_heads,
                              "actor_rollout_ref.rollout.tensor_model_parallel_size", self.cfg.num_experts)
    engine = rollout_factory.build_engine(model, arr.rollout, prompt_length=config.data.max_prompt_length,
                                          slots=min(arr.rollout.max_num_seqs, self.layout.rows), mesh=rollout_mesh,
                                          rules=self.rules, stop=stop,
                                          record_routing=steps_lib.replays_rollout_routing(config),
                                          multi_turn=arr.rollout.multi_turn.enable)
    self.sampler = rollout_factory.build_sampler(engine, arr.rollout, rollout_factory.pad_id(self.tokenizer, stop),
                                                 self.tokenizer)
    self.val_sampling = SamplingParams.from_rollout_config(arr.rollout.val_kwargs)
    self.reward_manager = managers.make_reward_manager(config, self.tokenizer)
    self.model_reward = (ModelReward(config, self.tokenizer, self.mesh, self.rules,
                                     rollout_factory.dtype_of(arr.actor.fsdp_config.model_dtype), self._place_micro,
                                     self.layout.forward_micros["reward_model"])
                         if config.reward_model.enable else None)
    self.checkpointer = checkpointing.Checkpointer.from_config(config)
    self.tracker = tracking.Tracker(config, self.run_dir, self.layout.total_steps)
    self.step = 0
    self.saved_step = -1

  # ----- construction -----------------------------------------------------------

  @property
  def actor_params(self) -> nnx.State:
    """The actor's whole state: what trains and, under LoRA, the frozen base (one view, no copy)."""
    return nnx.merge_state(self.actor_trainable, self.actor_frozen)

  @property
  def group(self) -> int:
    """Rows per shared prompt in the trainer's passes (1: no sharing)."""
    return self.layout.group

  def forward(self, step: steps_lib.Step, params: Any, rows: dict[str, np.ndarray]) -> Any:
    """A forward Step over `rows` in its micro-batches, merged on the host."""
    spec = step.args[1]
    micro = next(iter(spec.values())).shape[0]
    return jax.tree.map(merge_micro_batches, step(params, steps_lib.place(as_micro_batches(rows, micro), spec)))

  def _place_micro(self, batch: dict[str, np.ndarray], micro: bool = True) -> dict[str, jax.Array]:
    """[M, rows, ...] host arrays with rows over the batch rule (the reward model's inputs)."""
    del micro
    shardings = {k: jax.sharding.NamedSharding(self.mesh, sharding.logical_to_spec(
        (None, "batch") + (None,) * (np.ndim(v) - 2), np.shape(v), self.mesh, self.rules)) for k, v in batch.items()}
    return {k: jax.device_put(v, shardings[k]) for k, v in batch.items()}

  # ----- one step -------------------------------------------------------------------

  def _key(self, stream: Stream, *indices: int) -> jax.Array:
    """The key of draw `indices` of `stream` at this step."""
    key = jax.random.fold_in(jax.random.fold_in(self.base_key, self.step), int(stream))
    for index in indices:
      key = jax.random.fold_in(key, index)
    return key

  def _score(self, batch: dict[str, Any], rollout: Any, use_model: bool = True) -> managers.RewardResult:
    """Token-level scores [N, R] of a rollout: the reward model's (when enabled and use_model), else the
    reward manager's."""
    idx = rollout.prompt_index
    if self.model_reward is not None and use_model:
      rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                            rollout.attention_mask)
      raw = np.asarray(batch["raw_prompt"])[idx] if "raw_prompt" in batch else None
      return managers.RewardResult(self.model_reward(rows, raw), {}, {})
    columns = {k: np.asarray(batch[k])[idx] for k in _ROW_KEYS if k in batch}
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
      greedy = self.sampler.generate(self.actor_params, batch["input_ids"], batch["attention_mask"], 1,
                                     self._key(Stream.GREEDY), SamplingParams(greedy=True), rows=batch)
    per_prompt = np.zeros(len(batch["input_ids"]), np.float32)
    per_prompt[greedy.prompt_index] = self._score(batch, greedy).reward_tensor.sum(-1)
    return per_prompt[idx]

  def _rollout(self, batch: dict[str, Any], timing: dict[str, float], round_index: int = 0) -> dict[str, np.ndarray]:
    """Responses to `batch`, scored: the rows of one generation round (the step's first unless dynamic
    sampling needs more)."""
    with timed(timing, "gen"):
      rollout = self.sampler.generate(self.actor_params, batch["input_ids"], batch["attention_mask"],
                                      self.layout.n, self._key(Stream.ROLLOUT, *([round_index] if round_index else [])),
                                      rows=batch)
    timing.update(rollout.metrics)
    idx = rollout.prompt_index
    rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                          rollout.response_mask, rollout.attention_mask)
    rows["prompt_mask"] = batch["attention_mask"][idx].astype(np.int32)
    rows["rollout_log_probs"] = rollout.log_probs
    if rollout.routed_experts is not None:
      rows["routed_experts"] = rollout.routed_experts
    rows["group"] = idx.astype(np.int32)
    with timed(timing, "reward"):
      result = self._score(batch, rollout)
    rows["token_level_scores"] = np.asarray(result.reward_tensor, np.float32)
    rows.update(reward_components(result.reward_extra_info, len(idx)))
    timing.update({k: float(v) for k, v in result.metrics.items()})
    if self.config.algorithm.adv_estimator == "remax":
      rows["reward_baselines"] = self._greedy_baselines(batch, idx, timing)
    if self.config.trainer.rollout_data_dir:
      dump_generations(self.config.trainer.rollout_data_dir, self.step + 1, self._records(
          batch, idx, rollout.responses, rollout.attention_mask, rows["token_level_scores"].sum(-1)),
          append=round_index > 0)
    return rows

  def _kept_groups(self, batch: dict[str, Any], timing: dict[str, float], step_metrics: dict) -> dict[str, np.ndarray]:
    """DAPO's dynamic sampling (`rljax.trainer.dynamic_sampling`): generation rounds, each on the next
    data.gen_batch_size prompts, until data.train_batch_size groups whose filter metric varies are kept."""
    groups = self.config.algorithm.filter_groups
    wanted = self.config.data.train_batch_size
    kept_rounds, kept, dropped, rounds = [], 0, 0, 0
    while kept < wanted:
      if rounds:
        if 0 < groups.max_num_gen_batches <= rounds:
          raise ValueError(dynamic_sampling.too_many_rounds(rounds, groups.max_num_gen_batches))
        try:
          batch = next(self.train_iter)
        except StopIteration:
          raise faults.DataExhausted() from None
      rows = self._rollout(batch, timing, rounds)
      rounds += 1
      keep = dynamic_sampling.kept_rows(dynamic_sampling.metric_values(rows, groups.metric), rows["group"])
      kept_rounds.append({k: v[keep] for k, v in rows.items()})
      kept += int(keep.sum()) // self.layout.n
      dropped += int((~keep).sum()) // self.layout.n
    step_metrics.update({"train/num_gen_batches": float(rounds), "train/kept_groups": float(kept),
                         "train/filtered_groups": float(dropped)})
    return dynamic_sampling.join_rounds(kept_rounds, wanted, self.layout.n)

  def _experience(self, rows: dict[str, np.ndarray], timing: dict[str, float], step_metrics: dict) -> None:
    """Adds old/ref log-probs, values, rewards, advantages and returns to `rows`."""
    model_keys = steps_lib.MODEL_KEYS + (("routed_experts",) if "routed_experts" in rows else ())
    model_rows = {k: rows[k] for k in model_keys}
    if not prompts_shared(model_rows, self.layout.group):
      raise RuntimeError(f"rows are not in groups of {self.group} sharing a prompt; set "
                         "actor_rollout_ref.model.share_prompt_forward=false and report this")
    if not self.on_policy:
      with timed(timing, "old_log_prob"):
        old = self.forward(self.steps.old_log_prob, self.actor_params, model_rows)
        rows["old_log_probs"] = old[0]
        if self.replay_routing:
          rows["routed_experts"] = old[2]
    if self.need_ref:
      with timed(timing, "ref"):
        rows["ref_log_prob"] = self.forward(self.steps.ref_log_prob, self.ref_params, model_rows)[0]
    if self.use_critic:
      with timed(timing, "values"):
        rows["values"] = self.forward(self.steps.values, self.critic_params, model_rows)
    alg = self.config.algorithm
    with timed(timing, "adv"):
      token_rewards = rows["token_level_scores"]
      if alg.use_kl_in_reward:
        token_rewards, self.kl_ctrl, kl_metrics = kl_lib.apply_kl_penalty(
            token_rewards, rows["old_log_probs"], rows["ref_log_prob"], rows["response_mask"], self.kl_ctrl, alg.kl_penalty)
        step_metrics.update({k: float(v) for k, v in kl_metrics.items()})
      rows["token_level_rewards"] = np.asarray(token_rewards, np.float32)
      if self.rollout_correction:
        self._rollout_correction(rows, step_metrics)
      components = gdpo_components(rows, alg) if alg.adv_estimator == "gdpo" else None
      adv, ret = adv_lib.compute_advantage(
          alg.adv_estimator, rows["token_level_rewards"], rows["response_mask"], index=rows["group"], config=alg,
          values=rows.get("values"), old_log_probs=rows.get("old_log_probs"), gamma=alg.gamma, lam=alg.lam,
          reward_baselines=rows.get("reward_baselines"), non_tensor_batch=components,
          batch=rows if components is not None else None,
          norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo, num_groups=self.config.data.train_batch_size)
      rows["advantages"], rows["returns"] = np.asarray(adv, np.float32), np.asarray(ret, np.float32)

  def _rollout_correction(self, rows: dict[str, np.ndarray], step_metrics: dict) -> None:
    corr = self.config.algorithm.rollout_correction
    weights, mask, corr_metrics = rollout_corr.compute_rollout_correction_and_rejection_mask(
        rows["old_log_probs"], rows["rollout_log_probs"], rows["response_mask"], rollout_is=corr.rollout_is,
        rollout_is_threshold=corr.rollout_is_threshold, rollout_is_batch_normalize=corr.rollout_is_batch_normalize,
        rollout_rs=corr.rollout_rs, rollout_rs_threshold=corr.rollout_rs_threshold)
    rows["response_mask"] = np.asarray(mask, np.int32)
    if weights is not None:
      rows["rollout_is_weights"] = np.asarray(weights, np.float32)
    step_metrics.update({k: float(v) for k, v in corr_metrics.items()})

  def _minibatches(self, rows: dict[str, np.ndarray], step: steps_lib.Step, epoch: int) -> Iterator[dict]:
    """The mini-batches of one epoch, placed as `step` takes them (its batch argument's keys and shardings)."""
    spec = step.args[2]
    order = np.arange(self.layout.rows)
    if self.config.actor_rollout_ref.actor.shuffle:
      order = np.asarray(jax.random.permutation(self._key(Stream.SHUFFLE, epoch), self.layout.rows))
    for m in range(self.layout.minis):
      take = order[m * self.layout.mini_rows:(m + 1) * self.layout.mini_rows]
      yield steps_lib.place(as_micro_batches({k: rows[k][take] for k in spec}, self.layout.micro_batches), spec)

  def _update(self, rows: dict[str, np.ndarray], timing: dict[str, float], step_metrics: dict) -> None:
    actor, critic_cfg = self.config.actor_rollout_ref.actor, self.config.critic
    collected: list[dict] = []
    if self.use_critic:
      with timed(timing, "update_critic"):
        for epoch in range(critic_cfg.ppo_epochs):
          for i, mini in enumerate(self._minibatches(rows, self.steps.critic_update, epoch)):
            self.critic_params, self.critic_opt, m = self.steps.critic_update(
                self.critic_params, self.critic_opt, mini, self._key(Stream.CRITIC_UPDATE, epoch, i))
            collected.append(m)
        jax.block_until_ready(self.critic_params)
    if self.step >= self.config.trainer.critic_warmup:
      if actor.positive_nll_coef:
        rows["positive"] = (rows["token_level_scores"].sum(-1) > 0)
      with timed(timing, "update_actor"):
        for epoch in range(actor.ppo_epochs):
          for i, mini in enumerate(self._minibatches(rows, self.steps.actor_update, epoch)):
            self.actor_trainable, self.actor_opt, m = self.steps.actor_update(
                self.actor_trainable, self.actor_opt, mini, self._key(Stream.ACTOR_UPDATE, epoch, i),
                self.actor_frozen)
            collected.append(m)
        jax.block_until_ready(self.actor_trainable)
      step_metrics["actor/lr"] = float(self.actor_lr(self.step * actor.ppo_epochs * self.layout.minis))
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
      if self.config.algorithm.filter_groups.enable:
        rows = self._kept_groups(batch, timing, step_metrics)
      else:
        rows = self._rollout(batch, timing)
      if self.config.trainer.balance_batch and self.data_parallel > 1:
        order = balance_order(rows["attention_mask"].sum(-1), self.data_parallel, self.layout.group)
        rows = {k: v[order] for k, v in rows.items()}
      self._experience(rows, timing, step_metrics)
      self._update(rows, timing, step_metrics)
    step_metrics.update(metrics_lib.data_metrics(rows, rows["responses"].shape[1], rows["prompt_mask"].shape[1]))
    step_metrics.update(timing)
    tokens = int(rows["attention_mask"].sum())
    step_metrics.update(metrics_lib.throughput_metrics(timing, tokens, self.mesh.size))
    step_metrics["training/global_step"] = float(self.step + 1)
    step_metrics["training/epoch"] = float(self.step // max(1, self.train_iter.batches_per_epoch))
    return step_metrics

  # ----- validation ------------------------------------------------------------------

  def validate(self) -> dict[str, float]:
    """Greedy (val_kwargs) responses to data.val_files, scored per data source."""
    val = self.config.actor_rollout_ref.rollout.val_kwargs
    scores, sources, samples, records = [], [], [], []
    for i, batch in enumerate(data_lib.make_val_batches(self.config, self.tokenizer, jax.process_index(),
                                                        jax.process_count())):
      rollout = self.sampler.generate(self.actor_params, batch["input_ids"], batch["attention_mask"], val.n,
                                      self._key(Stream.VALIDATION, i), self.val_sampling, rows=batch)
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

  def _arrays(self) -> dict[str, Any]:
    arrays = {"actor": self.actor_trainable, "actor_opt": self.actor_opt}
    if self.use_critic:
      arrays.update(critic=self.critic_params, critic_opt=self.critic_opt)
    return arrays

  def save(self) -> None:
    extras = {"step": self.step, "data_state": self.train_iter.get_state(), "seed": self.config.trainer.seed,
              "kl_coef": float(self.kl_ctrl.value)}
    self.checkpointer.save(self.step, self._arrays(), extras)
    self.saved_step = self.step
    metrics_file = os.path.join(self.run_dir, tracking.METRICS_FILE)
    if is_main_process() and self.step > 0 and os.path.exists(metrics_file):  # no curve before a step
      tracking.plot_curves(metrics_file, os.path.join(self.run_dir, "curves.png"))

  def restore(self, path: str) -> None:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self._arrays())
    arrays, extras = checkpointing.restore_from_path(path, abstract)
    self.actor_trainable, self.actor_opt = arrays["actor"], arrays["actor_opt"]
    if self.use_critic:
      self.critic_params, self.critic_opt = arrays["critic"], arrays["critic_opt"]
    self.step = int(extras["step"])
    self.train_iter.set_state(extras["data_state"])
    self.kl_ctrl = dataclasses.replace(self.kl_ctrl, value=float(extras["kl_coef"]))

  # ----- the run -------------------------------------------------------------------------

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
    return faults.run_steps(self, self.layout.total_steps, _every(test_freq), _every(trainer.save_freq)) or last

  def close(self) -> None:
    self.sampler.close()
    self.train_iter.close()
    self.checkpointer.close()
    self.reward_manager.close()


def _every(freq: int) -> Callable[[int], bool]:
  """step -> whether it is a multiple of `freq` (never when freq <= 0, verl's "off")."""
  return lambda step: freq > 0 and step % freq == 0


def run(config: ConfigDict) -> dict[str, float]:
  """Trains with a finalized, validated config; prints where the outputs are."""
  trainer = RLTrainer(config)
  try:
    metrics = trainer.fit()
  finally:
    trainer.close()
  if is_main_process():
    print(f"rljax: logs and curves in {trainer.run_dir}, checkpoints in {config.trainer.default_local_dir}")
  return metrics


__all__ = ["RLTrainer", "Stream", "run"]
