"""The RL loop: verl's ray_trainer semantics as one JAX program on one mesh.

Each step, for `data.train_batch_size` prompts:

    rollout (n responses each, the engine reading the actor's arrays in place)
    -> rewards (reward manager) -> old log-probs (recomputed by the actor;
    skipped on-policy, see below) -> reference log-probs (use_kl_loss or
    use_kl_in_reward) -> critic values (gae) -> KL in reward
    -> advantages -> critic update -> actor update (after critic_warmup)
    -> metrics, validation, checkpoint.

On-policy shortcut: with one PPO epoch over a single mini-batch and nothing
that needs them before the update (KL in reward, rollout correction, bypass
mode), the old log-probs equal the current ones at the update; the update
uses `stop_gradient(log_prob)` instead of a separate forward pass, which is
the same number a recomputation gives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from ml_collections import ConfigDict

from rljax.sharding.distributed import is_main_process
from rljax import config as config_lib
from rljax import data as data_lib
from rljax import models, sharding
from rljax.algos import advantages as adv_lib
from rljax.algos import kl as kl_lib
from rljax.algos import rollout_corr
from rljax.rewards import managers
from rljax.rollout import RolloutSampler, SamplingParams, make_engine
from rljax.trainer import checkpointing, faults, metrics as metrics_lib, tracking
from rljax.trainer.optim import make_optimizer, make_schedule
from rljax.trainer.sequences import as_micro_batches, make_sequences
from rljax.trainer.updates import (
    ValueModel, make_actor_update, make_critic_update, make_log_prob_fn, make_value_fn,
)

_LOG = logging.getLogger("rljax.trainer")
_DTYPES = {"fp32": jnp.float32, "float32": jnp.float32, "bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16,
           "fp16": jnp.float16, "float16": jnp.float16}
_ROW_KEYS = ("data_source", "reward_model", "extra_info")


@dataclasses.dataclass
class Layout:
  """Batch geometry derived from the config.

  Attributes:
    n: responses per prompt.
    rows: rows per step (train_batch_size * n).
    mini_rows: rows per mini-batch.
    micro_batches: micro-batches per mini-batch.
    total_steps: training steps of the run.
  """

  n: int
  rows: int
  mini_rows: int
  micro_batches: int
  total_steps: int

  @property
  def minis(self) -> int:
    return self.rows // self.mini_rows


def micro_batch_count(config: ConfigDict, mini_rows: int, data_parallel: int, row_tokens: int) -> int:
  """Micro-batches per mini-batch from the per-device micro size or token budget.

  With use_dynamic_bsz, rows are padded to P + R tokens (static shapes), so
  the per-device budget `ppo_max_token_len_per_gpu` buys
  budget // (P + R) rows per device.
  """
  actor = config.actor_rollout_ref.actor
  per_device = mini_rows // data_parallel
  if actor.use_dynamic_bsz:
    budget = max(1, actor.ppo_max_token_len_per_gpu // row_tokens)
    micro = max(d for d in range(1, per_device + 1) if per_device % d == 0 and d <= budget)
  else:
    micro = actor.ppo_micro_batch_size_per_gpu
  return per_device // micro


def make_layout(config: ConfigDict, batches_per_epoch: int, data_parallel: int) -> Layout:
  data, arr = config.data, config.actor_rollout_ref
  n = arr.rollout.n
  rows = data.train_batch_size * n
  mini_rows = arr.actor.ppo_mini_batch_size * n
  total = config.trainer.total_training_steps or batches_per_epoch * config.trainer.total_epochs
  row_tokens = data.max_prompt_length + arr.rollout.response_length
  return Layout(n=n, rows=rows, mini_rows=mini_rows,
                micro_batches=micro_batch_count(config, mini_rows, data_parallel, row_tokens),
                total_steps=int(total))


def balance_order(lengths: np.ndarray, parts: int) -> np.ndarray:
  """A permutation giving each of `parts` equal row blocks similar token totals.

  Rows sorted by length are dealt snake-wise (0..k-1, k-1..0, ...) to the
  blocks, then the blocks are laid out one after another.
  """
  order = np.argsort(-lengths, kind="stable")
  blocks = [[] for _ in range(parts)]
  for i, row in enumerate(order):
    lap, pos = divmod(i, parts)
    blocks[pos if lap % 2 == 0 else parts - 1 - pos].append(row)
  return np.concatenate([np.asarray(b, np.int64) for b in blocks])


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
    self.data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    arr = config.actor_rollout_ref
    self.temperature = float(arr.rollout.temperature) or 1.0
    self.run_dir = os.path.expanduser(config.trainer.default_local_dir)
    self.base_key = jax.random.key(config.trainer.seed)

    model = self._load_model(arr.model.path)
    self.cfg = model.cfg
    sharding.check_model_fits(self.mesh, self.cfg.num_heads, self.cfg.num_kv_heads)
    self.tokenizer = models.load_tokenizer(config.data.tokenizer or arr.model.path)
    self.graphdef, self.actor_params = nnx.split(model)
    self.param_sh = jax.tree.map(lambda x: x.sharding, self.actor_params)
    self.row_axes = sharding.batch_sharding(self.mesh, self.rules, ndim=1).spec[0]

    self.train_iter = data_lib.make_train_iterator(config, self.tokenizer, jax.process_index(), jax.process_count())
    self.layout = make_layout(config, self.train_iter.batches_per_epoch, self.data_parallel)
    updates_per_step = arr.actor.ppo_epochs * self.layout.minis
    actor_tx = make_optimizer(arr.actor.optim, arr.actor.grad_clip, self.layout.total_steps, updates_per_step)
    self.actor_lr = make_schedule(arr.actor.optim, self.layout.total_steps, updates_per_step)
    self.actor_opt, self.actor_opt_sh = sharding.init_optimizer(actor_tx, self.actor_params, self.param_sh, self.mesh)
    self.actor_update = make_actor_update(self.graphdef, arr.actor, actor_tx, self.temperature,
                                          (self.param_sh, self.actor_opt_sh))
    self.log_prob_fn = make_log_prob_fn(self.graphdef, self.temperature, with_entropy=False)

    alg = config.algorithm
    self.need_ref = bool(arr.actor.use_kl_loss or alg.use_kl_in_reward)
    self.ref_params = jax.tree.map(jnp.copy, self.actor_params) if self.need_ref else None
    corr = alg.rollout_correction
    self.rollout_correction = bool(corr.rollout_is or corr.rollout_rs)
    self.on_policy = (arr.actor.ppo_epochs == 1 and self.layout.minis == 1 and not alg.use_kl_in_reward
                      and not self.rollout_correction and not corr.bypass_mode)
    self.kl_ctrl = kl_lib.get_kl_controller(alg.kl_ctrl)

    self.use_critic = config.critic.enable if config.critic.enable is not None else alg.adv_estimator == "gae"
    if self.use_critic:
      self._build_critic(updates_per_step)

    eos = self._eos_ids()
    buckets = sorted({b for b in arr.rollout.prefill_length_buckets if b < config.data.max_prompt_length}
                     | {config.data.max_prompt_length})
    engine = make_engine(model, max_concurrent_decodes=min(arr.rollout.max_num_seqs, self.layout.rows),
                         prefill_buckets=buckets, max_decode_length=arr.rollout.response_length,
                         sampling_params=SamplingParams.from_rollout_config(arr.rollout), eos_ids=eos,
                         ignore_eos=arr.rollout.ignore_eos, mesh=self.mesh, rules=self.rules)
    self.sampler = RolloutSampler(engine, pad_id=self._pad_id(), free_cache=arr.rollout.free_cache_engine)
    self.val_sampling = SamplingParams.from_rollout_config(arr.rollout.val_kwargs)
    self.reward_manager = managers.make_reward_manager(config, self.tokenizer)
    self.checkpointer = checkpointing.Checkpointer.from_config(config)
    self.tracker = tracking.Tracker(config, self.run_dir, self.layout.total_steps)
    self.step = 0
    self.saved_step = -1

  # ----- construction -----------------------------------------------------------

  def _load_model(self, path: str) -> models.CausalLM:
    arr = self.config.actor_rollout_ref
    return models.from_pretrained(
        path, dtype=_DTYPES[arr.actor.fsdp_config.model_dtype], mesh=self.mesh, rules=self.rules,
        override_config=arr.model.override_config.model_config.to_dict(), scan_layers=arr.model.scan_layers,
        remat=arr.model.enable_gradient_checkpointing)

  def _build_critic(self, updates_per_step: int) -> None:
    critic = self.config.critic
    backbone = self._load_model(critic.model.path)
    value_model = ValueModel(backbone, nnx.Rngs(self.config.trainer.seed + 1))
    self.critic_graphdef, critic_params = nnx.split(value_model)
    critic_sh = sharding.param_shardings(critic_params, self.mesh, self.rules)
    self.critic_params = sharding.shard_like(critic_params, critic_sh)
    tx = make_optimizer(critic.optim, critic.grad_clip, self.layout.total_steps, critic.ppo_epochs * self.layout.minis)
    self.critic_opt, opt_sh = sharding.init_optimizer(tx, self.critic_params, critic_sh, self.mesh)
    self.critic_update = make_critic_update(self.critic_graphdef, critic, tx, (critic_sh, opt_sh))
    self.value_fn = make_value_fn(self.critic_graphdef)

  def _eos_ids(self) -> tuple[int, ...]:
    ids = list(getattr(self.tokenizer, "eos_token_ids", None) or [])
    eos = self.cfg.eos_token_id
    ids += eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    return tuple(sorted(set(int(i) for i in ids)))

  def _pad_id(self) -> int:
    pad = getattr(self.tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else (self._eos_ids() or (0,))[0]

  # ----- placement ----------------------------------------------------------------

  def _rows(self, x: np.ndarray, micro: bool = False) -> jax.Array:
    """Places a host array: rows over the batch axes (dim 1 for micro-batched arrays)."""
    axes = (None, self.row_axes) if micro else (self.row_axes,)
    return jax.device_put(x, NamedSharding(self.mesh, PartitionSpec(*axes)))

  def _place(self, batch: dict[str, np.ndarray], micro: bool = False) -> dict[str, jax.Array]:
    return {k: self._rows(v, micro) for k, v in batch.items()}

  # ----- one step -------------------------------------------------------------------

  def _key(self, purpose: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(self.base_key, self.step), purpose)

  def _rollout(self, batch: dict[str, Any], timing: dict[str, float]) -> dict[str, np.ndarray]:
    with timed(timing, "gen"):
      rollout = self.sampler.generate(self.actor_params, batch["input_ids"], batch["attention_mask"],
                                      self.layout.n, self._key(0))
    idx = rollout.prompt_index
    rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                          rollout.response_mask)
    rows["prompt_mask"] = batch["attention_mask"][idx].astype(np.int32)
    rows["rollout_log_probs"] = rollout.log_probs
    rows["group"] = idx.astype(np.int32)
    with timed(timing, "reward"):
      result = self.reward_manager({"responses": rollout.responses, "response_mask": rollout.response_mask,
                                    **{k: np.asarray(batch[k])[idx] for k in _ROW_KEYS if k in batch}})
    rows["token_level_scores"] = result.reward_tensor.astype(np.float32)
    timing.update({k: float(v) for k, v in result.metrics.items()})
    return rows

  def _experience(self, rows: dict[str, np.ndarray], timing: dict[str, float], step_metrics: dict) -> None:
    """Adds old/ref log-probs, values, rewards, advantages and returns to `rows`."""
    model_keys = ("input_ids", "attention_mask", "positions", "responses", "response_mask")
    placed = self._place({k: rows[k] for k in model_keys})
    if not self.on_policy:
      with timed(timing, "old_log_prob"):
        rows["old_log_probs"] = np.asarray(self.log_prob_fn(self.actor_params, placed)[0])
    if self.need_ref:
      with timed(timing, "ref"):
        rows["ref_log_prob"] = np.asarray(self.log_prob_fn(self.ref_params, placed)[0])
    if self.use_critic:
      with timed(timing, "values"):
        rows["values"] = np.asarray(self.value_fn(self.critic_params, placed))
    alg = self.config.algorithm
    with timed(timing, "adv"):
      rewards = rows["token_level_scores"]
      if alg.use_kl_in_reward:
        rewards, self.kl_ctrl, kl_metrics = kl_lib.apply_kl_penalty(
            rewards, rows["old_log_probs"], rows["ref_log_prob"], rows["response_mask"], self.kl_ctrl, alg.kl_penalty)
        step_metrics.update({k: float(v) for k, v in kl_metrics.items()})
      rows["token_level_rewards"] = np.asarray(rewards, np.float32)
      if self.rollout_correction:
        self._rollout_correction(rows, step_metrics)
      adv, ret = adv_lib.compute_advantage(
          alg.adv_estimator, rows["token_level_rewards"], rows["response_mask"], index=rows["group"], config=alg,
          values=rows.get("values"), old_log_probs=rows.get("old_log_probs"), gamma=alg.gamma, lam=alg.lam,
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

  def _minibatches(self, rows: dict[str, np.ndarray], keys: tuple[str, ...], epoch: int) -> Iterator[dict]:
    order = np.arange(self.layout.rows)
    if self.config.actor_rollout_ref.actor.shuffle:
      order = np.asarray(jax.random.permutation(self._key(100 + epoch), self.layout.rows))
    for m in range(self.layout.minis):
      take = order[m * self.layout.mini_rows:(m + 1) * self.layout.mini_rows]
      yield self._place(as_micro_batches({k: rows[k][take] for k in keys if k in rows}, self.layout.micro_batches),
                        micro=True)

  def _update(self, rows: dict[str, np.ndarray], timing: dict[str, float], step_metrics: dict) -> None:
    model_keys = ("input_ids", "attention_mask", "positions", "responses", "response_mask")
    actor, critic_cfg = self.config.actor_rollout_ref.actor, self.config.critic
    collected: list[dict] = []
    if self.use_critic:
      with timed(timing, "update_critic"):
        for epoch in range(critic_cfg.ppo_epochs):
          for i, mini in enumerate(self._minibatches(rows, model_keys + ("values", "returns"), epoch)):
            self.critic_params, self.critic_opt, m = self.critic_update(
                self.critic_params, self.critic_opt, mini, self._key(200 + epoch * 1000 + i))
            collected.append(m)
        jax.block_until_ready(self.critic_params)
    if self.step >= self.config.trainer.critic_warmup:
      if actor.positive_nll_coef:
        rows["positive"] = (rows["token_level_scores"].sum(-1) > 0)
      keys = model_keys + ("advantages", "old_log_probs", "ref_log_prob", "rollout_is_weights", "positive")
      with timed(timing, "update_actor"):
        for epoch in range(actor.ppo_epochs):
          for i, mini in enumerate(self._minibatches(rows, keys, epoch)):
            self.actor_params, self.actor_opt, m = self.actor_update(
                self.actor_params, self.actor_opt, mini, self._key(300 + epoch * 1000 + i))
            collected.append(m)
        jax.block_until_ready(self.actor_params)
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
    with timed(timing, "step"):
      rows = self._rollout(batch, timing)
      if self.config.trainer.balance_batch and self.data_parallel > 1:
        order = balance_order(rows["attention_mask"].sum(-1), self.data_parallel)
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
    scores, sources, samples = [], [], []
    for i, batch in enumerate(data_lib.make_val_batches(self.config, self.tokenizer, jax.process_index(),
                                                        jax.process_count())):
      rollout = self.sampler.generate(self.actor_params, batch["input_ids"], batch["attention_mask"], val.n,
                                      jax.random.fold_in(self._key(400), i), self.val_sampling)
      idx = rollout.prompt_index
      result = self.reward_manager({"responses": rollout.responses, "response_mask": rollout.response_mask,
                                    **{k: np.asarray(batch[k])[idx] for k in _ROW_KEYS if k in batch}})
      row_scores = result.reward_tensor.sum(-1)
      scores.append(row_scores)
      sources.append(np.asarray(batch["data_source"])[idx])
      if len(samples) < self.config.trainer.log_val_generations:
        for row in range(min(len(idx), self.config.trainer.log_val_generations - len(samples))):
          samples.append({"prompt": self.tokenizer.decode(batch["input_ids"][idx[row]][batch["attention_mask"][idx[row]] > 0]),
                          "response": self.tokenizer.decode(rollout.responses[row][:rollout.response_lengths[row]]),
                          "score": float(row_scores[row])})
    out = metrics_lib.validation_metrics(np.concatenate(sources), np.concatenate(scores), val.n)
    if samples:
      self.tracker.log_generations(samples, self.step)
    return out

  # ----- checkpoints -----------------------------------------------------------------

  def _arrays(self) -> dict[str, Any]:
    arrays = {"actor": self.actor_params, "actor_opt": self.actor_opt}
    if self.use_critic:
      arrays.update(critic=self.critic_params, critic_opt=self.critic_opt)
    return arrays

  def save(self) -> None:
    extras = {"step": self.step, "data_state": self.train_iter.get_state(), "seed": self.config.trainer.seed,
              "kl_coef": float(self.kl_ctrl.value)}
    self.checkpointer.save(self.step, self._arrays(), extras)
    self.saved_step = self.step
    tracking.plot_curves(os.path.join(self.run_dir, "metrics.jsonl"), os.path.join(self.run_dir, "curves.png"))

  def restore(self, path: str) -> None:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self._arrays())
    arrays, extras = checkpointing.restore_from_path(path, abstract)
    self.actor_params, self.actor_opt = arrays["actor"], arrays["actor_opt"]
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
    with faults.PreemptionGuard() as guard:
      while self.step < self.layout.total_steps:
        try:
          batch = next(self.train_iter)
        except StopIteration:
          break
        metrics = self.train_step(batch)
        faults.check_finite(metrics, self.step + 1)
        self.step += 1
        if trainer.test_freq > 0 and self.step % trainer.test_freq == 0 and self.config.data.val_files:
          metrics.update(self.validate())
        self.tracker.log(metrics, self.step)
        last = metrics
        if guard.should_stop or (trainer.save_freq > 0 and self.step % trainer.save_freq == 0):
          self.save()
        if guard.should_stop:
          _LOG.warning("SIGTERM: saved step %d, stopping", self.step)
          break
    if self.saved_step != self.step:
      self.save()
    self.checkpointer.wait()
    self.tracker.close()
    return last

  def close(self) -> None:
    self.train_iter.close()
    self.checkpointer.close()
    self.reward_manager.close()


def run(config: ConfigDict) -> dict[str, float]:
  """Trains with a finalized, validated config; prints where the outputs are."""
  trainer = RLTrainer(config)
  try:
    metrics = trainer.fit()
  finally:
    trainer.close()
  if is_main_process():
    print(f"rljax: run directory {trainer.run_dir} (metrics.jsonl, curves.png, checkpoints)")
  return metrics


__all__ = ["RLTrainer", "run", "balance_order", "make_layout", "micro_batch_count"]
