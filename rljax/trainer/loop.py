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
mode, LoRA dropout), the old log-probs equal the current ones at the update;
the update uses `stop_gradient(log_prob)` instead of a separate forward
pass, which is the same number a recomputation gives.

LoRA (actor_rollout_ref.model.lora_rank > 0): the actor's state splits into
`actor_trainable` (adapters and modules_to_save: the only gradients,
optimizer state and checkpointed "actor" arrays) and `actor_frozen` (the base
weights, read in place by rollout, log-probs and the update). The reference
policy is the base model without adapters over those same frozen arrays.
The critic trains in full.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
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
from rljax.rollout import RolloutSampler, SamplingParams, make_engine
from rljax.trainer import checkpointing, faults, metrics as metrics_lib, tracking
from rljax.trainer.optim import make_optimizer, make_schedule
from rljax.trainer.reward_model import ModelReward
from rljax.trainer.sequences import (as_micro_batches, make_sequences, map_micro_batches, merge_micro_batches,
                                     prompts_shared)
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


def largest_divisor(n: int, cap: int) -> int:
  """The largest divisor of n that is at most cap (at least 1)."""
  return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(1, cap))


def micro_batch_count(config: ConfigDict, mini_rows: int, data_parallel: int, row_tokens: int) -> int:
  """Micro-batches per mini-batch from the per-device micro size or token budget.

  With use_dynamic_bsz, rows are padded to P + R tokens (static shapes), so
  the per-device budget `ppo_max_token_len_per_gpu` buys
  budget // (P + R) rows per device.
  """
  actor = config.actor_rollout_ref.actor
  per_device = mini_rows // data_parallel
  if actor.use_dynamic_bsz:
    micro = largest_divisor(per_device, actor.ppo_max_token_len_per_gpu // row_tokens)
  else:
    micro = actor.ppo_micro_batch_size_per_gpu
  return per_device // micro


def forward_micro_batches(rows: int, data_parallel: int, row_tokens: int, micro_per_device: int | None,
                          use_dynamic_bsz: bool, max_token_len: int | None) -> int:
  """Micro-batches a forward pass (old/ref log-probs, values, rewards) over `rows` takes.

  Each device holds at most `micro_per_device` rows at once (None: all its
  rows), or with use_dynamic_bsz `max_token_len // row_tokens` rows; the
  count is rounded so the micro-batches are equal (results do not depend on
  it, only peak memory does).
  """
  per_device = rows // data_parallel
  cap = (max_token_len // row_tokens) if use_dynamic_bsz and max_token_len else (micro_per_device or per_device)
  return per_device // largest_divisor(per_device, cap)


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


def balance_order(lengths: np.ndarray, parts: int, group: int = 1) -> np.ndarray:
  """A permutation giving each of `parts` equal row blocks similar token totals.

  Groups of `group` consecutive rows (one prompt's responses) move together:
  groups sorted by their token total are dealt snake-wise (0..k-1, k-1..0,
  ...) to the blocks, then the blocks are laid out one after another.
  """
  totals = lengths.reshape(-1, group).sum(-1)
  order = np.argsort(-totals, kind="stable")
  blocks = [[] for _ in range(parts)]
  for i, g in enumerate(order):
    lap, pos = divmod(i, parts)
    blocks[pos if lap % 2 == 0 else parts - 1 - pos].append(g)
  groups = np.concatenate([np.asarray(b, np.int64) for b in blocks])
  return (groups[:, None] * group + np.arange(group)).reshape(-1)


def prompt_group_size(config: ConfigDict, layout: Layout, data_parallel: int) -> int:
  """Rows per shared prompt in the trainer's forward and update passes (1: no sharing).

  Rollout rows come in verl's groups (row p * n + j answers prompt p), and
  stay grouped unless balance_batch has to split groups to give every
  data-parallel device equal rows.
  """
  n = layout.n
  if not config.actor_rollout_ref.model.share_prompt_forward or n == 1:
    return 1
  if config.trainer.balance_batch and data_parallel > 1 and (layout.rows // n) % data_parallel:
    return 1
  return n


def pass_group_size(group: int, rows: int, micro_batches: int) -> int:
  """`group` when every micro-batch of rows // micro_batches rows holds whole groups, else 1."""
  return group if (rows // micro_batches) % group == 0 else 1


COMPONENT_PREFIX = "reward_extra/"


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


def dump_generations(directory: str, step: int, records: list[dict[str, Any]]) -> str:
  """verl's trainer.rollout_data_dir / validation_data_dir dump, one record per row.

  Every process writes the rows it holds: DIR/<step>.jsonl in a one-process
  job, DIR/<step>.process<k>.jsonl in a multi-host one.
  """
  directory = os.path.expanduser(directory)
  os.makedirs(directory, exist_ok=True)
  suffix = f".process{jax.process_index()}" if jax.process_count() > 1 else ""
  path = os.path.join(directory, f"{step}{suffix}.jsonl")
  with open(path, "w", encoding="utf-8") as f:
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
    self.data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    arr = config.actor_rollout_ref
    self.temperature = float(arr.rollout.temperature) or 1.0
    self.run_dir = tracking.local_run_dir(config.trainer.default_local_dir, config.trainer.project_name,
                                          config.trainer.experiment_name)
    self.base_key = jax.random.key(config.trainer.seed)

    model = self._load_model(arr.model.path)
    self.lora = lora_lib.LoRAConfig.from_model_config(arr.model) if arr.model.lora_rank > 0 else None
    if self.lora is not None:
      lora_lib.apply_lora(model, self.lora, jax.random.fold_in(self.base_key, 7), self.mesh, self.rules)
    self.cfg = model.cfg
    sharding.check_model_fits(self.mesh, self.cfg.num_heads, self.cfg.num_kv_heads)
    self.tokenizer = models.load_tokenizer(config.data.tokenizer or arr.model.path)
    self.graphdef, self.actor_trainable, self.actor_frozen = lora_lib.split_trainable(model)
    self.param_sh = jax.tree.map(lambda x: x.sharding, self.actor_trainable)
    self.row_axes = sharding.batch_sharding(self.mesh, self.rules, ndim=1).spec[0]

    self.train_iter = data_lib.make_train_iterator(config, self.tokenizer, jax.process_index(), jax.process_count())
    if not (config.reward_model.enable or config.custom_reward_function.path):
      rewards.check_data_sources(data_lib.as_file_list(config.data.train_files)
                                 + data_lib.as_file_list(config.data.val_files))
    self.layout = make_layout(config, self.train_iter.batches_per_epoch, self.data_parallel)
    updates_per_step = arr.actor.ppo_epochs * self.layout.minis
    actor_tx = make_optimizer(arr.actor.optim, arr.actor.grad_clip, self.layout.total_steps, updates_per_step)
    self.actor_lr = make_schedule(arr.actor.optim, self.layout.total_steps, updates_per_step)
    self.actor_opt, self.actor_opt_sh = sharding.init_optimizer(actor_tx, self.actor_trainable, self.param_sh, self.mesh)
    self.group = prompt_group_size(config, self.layout, self.data_parallel)
    lora_dropout = self.lora is not None and self.lora.dropout > 0
    self.actor_update = make_actor_update(self.graphdef, arr.actor, actor_tx, self.temperature,
                                          (self.param_sh, self.actor_opt_sh),
                                          group_size=self._update_group(per_row=lora_dropout))
    self.forward_micros = self._forward_micro_batches()
    self.log_prob_fn = map_micro_batches(make_log_prob_fn(self.graphdef, self.temperature, with_entropy=False,
                                                          group_size=self._forward_group("old_log_prob")))

    alg = config.algorithm
    self.need_ref = bool(arr.actor.use_kl_loss or alg.use_kl_in_reward)
    ref_graphdef, self.ref_params = self._reference(model) if self.need_ref else (self.graphdef, None)
    self.ref_log_prob_fn = map_micro_batches(make_log_prob_fn(ref_graphdef, self.temperature, with_entropy=False,
                                                              group_size=self._forward_group("ref")))
    corr = alg.rollout_correction
    self.rollout_correction = bool(corr.rollout_is or corr.rollout_rs)
    self.on_policy = (arr.actor.ppo_epochs == 1 and self.layout.minis == 1 and not alg.use_kl_in_reward
                      and not self.rollout_correction and not corr.bypass_mode
                      and not (self.lora is not None and self.lora.dropout > 0))
    self.kl_ctrl = kl_lib.get_kl_controller(alg.kl_ctrl)

    self.use_critic = config.critic.enable if config.critic.enable is not None else alg.adv_estimator == "gae"
    if self.use_critic:
      self._build_critic(updates_per_step)

    eos = self._eos_ids()
    buckets = sorted({b for b in arr.rollout.prefill_length_buckets if b < config.data.max_prompt_length}
                     | {config.data.max_prompt_length})
    engine = make_engine(model, compute_dtype=_DTYPES[arr.rollout.dtype],
                         max_concurrent_decodes=min(arr.rollout.max_num_seqs, self.layout.rows),
                         prefill_buckets=buckets, max_decode_length=arr.rollout.response_length,
                         sampling_params=SamplingParams.from_rollout_config(arr.rollout), eos_ids=eos,
                         ignore_eos=arr.rollout.ignore_eos, mesh=self.mesh, rules=self.rules,
                         cpu_dot_library=arr.rollout.cpu_dot_library)
    self.sampler = RolloutSampler(engine, pad_id=self._pad_id(), free_cache=arr.rollout.free_cache_engine)
    self.val_sampling = SamplingParams.from_rollout_config(arr.rollout.val_kwargs)
    self.reward_manager = managers.make_reward_manager(config, self.tokenizer)
    self.model_reward = (ModelReward(config, self.tokenizer, self.mesh, self.rules,
                                     _DTYPES[arr.actor.fsdp_config.model_dtype], self._place,
                                     self.forward_micros["reward_model"])
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

  def _reference(self, model: models.CausalLM) -> tuple[nnx.GraphDef, nnx.State]:
    """The reference policy: a copy of the initial actor, or under LoRA the base model
    without adapters over the actor's own frozen arrays (only modules_to_save are copied)."""
    if self.lora is not None:
      return lora_lib.reference_split(model)
    return self.graphdef, jax.tree.map(jnp.copy, self.actor_params)

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
    self.critic_update = make_critic_update(self.critic_graphdef, critic, tx, (critic_sh, opt_sh),
                                            group_size=self._update_group())
    self.value_fn = map_micro_batches(make_value_fn(self.critic_graphdef, self._forward_group("values")))

  def _forward_micro_batches(self) -> dict[str, int]:
    """Micro-batch counts of the forward passes, from their verl keys."""
    config, arr = self.config, self.config.actor_rollout_ref
    fwd = functools.partial(forward_micro_batches, self.layout.rows, self.data_parallel,
                            config.data.max_prompt_length + arr.rollout.response_length)
    critic, rm = config.critic, config.reward_model
    return {
        "old_log_prob": fwd(arr.rollout.log_prob_micro_batch_size_per_gpu, arr.rollout.log_prob_use_dynamic_bsz,
                            arr.rollout.log_prob_max_token_len_per_gpu),
        "ref": fwd(arr.ref.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_use_dynamic_bsz,
                   arr.ref.log_prob_max_token_len_per_gpu),
        "values": fwd(critic.forward_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
                      critic.forward_max_token_len_per_gpu),
        "reward_model": fwd(rm.micro_batch_size_per_gpu, rm.use_dynamic_bsz, rm.forward_max_token_len_per_gpu),
    }

  def _update_group(self, per_row: bool = False) -> int:
    """Rows per shared prompt in the actor and critic updates: 1 when mini-batches are shuffled
    (groups split) or per_row (LoRA dropout draws a mask per row's prompt)."""
    if per_row or self.config.actor_rollout_ref.actor.shuffle:
      return 1
    return pass_group_size(self.group, self.layout.mini_rows, self.layout.micro_batches)

  def _forward_group(self, phase: str) -> int:
    """Rows per shared prompt in a forward pass (see prompt_group_size)."""
    return pass_group_size(self.group, self.layout.rows, self.forward_micros[phase])

  def _forward(self, fn: Any, params: Any, rows: dict[str, np.ndarray], phase: str) -> Any:
    """fn(params, micro-batch) over `rows` in forward_micros[phase] micro-batches, merged on the host."""
    micro = self.forward_micros[phase]
    return jax.tree.map(merge_micro_batches, fn(params, self._place(as_micro_batches(rows, micro), micro=True)))

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

  def _score(self, batch: dict[str, Any], rollout: Any, use_model: bool = True) -> managers.RewardResult:
    """Token-level scores [N, R] of a rollout: the reward model's (when enabled and use_model), else the
    reward manager's."""
    idx = rollout.prompt_index
    if self.model_reward is not None and use_model:
      rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                            rollout.response_mask)
      raw = np.asarray(batch["raw_prompt"])[idx] if "raw_prompt" in batch else None
      return managers.RewardResult(self.model_reward(rows, raw), {}, {})
    return self.reward_manager({"responses": rollout.responses, "response_mask": rollout.response_mask,
                                **{k: np.asarray(batch[k])[idx] for k in _ROW_KEYS if k in batch}})

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
                                     self._key(1), SamplingParams(greedy=True))
    per_prompt = np.zeros(len(batch["input_ids"]), np.float32)
    per_prompt[greedy.prompt_index] = self._score(batch, greedy).reward_tensor.sum(-1)
    return per_prompt[idx]

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
      result = self._score(batch, rollout)
    rows["token_level_scores"] = np.asarray(result.reward_tensor, np.float32)
    rows.update(reward_components(result.reward_extra_info, len(idx)))
    timing.update({k: float(v) for k, v in result.metrics.items()})
    if self.config.algorithm.adv_estimator == "remax":
      rows["reward_baselines"] = self._greedy_baselines(batch, idx, timing)
    if self.config.trainer.rollout_data_dir:
      dump_generations(self.config.trainer.rollout_data_dir, self.step + 1, self._records(
          batch, idx, rollout.responses, rollout.response_mask, rows["token_level_scores"].sum(-1)))
    return rows

  def _experience(self, rows: dict[str, np.ndarray], timing: dict[str, float], step_metrics: dict) -> None:
    """Adds old/ref log-probs, values, rewards, advantages and returns to `rows`."""
    model_keys = ("input_ids", "attention_mask", "positions", "responses", "response_mask")
    model_rows = {k: rows[k] for k in model_keys}
    if not prompts_shared(model_rows, self.group):
      raise RuntimeError(f"rows are not in groups of {self.group} sharing a prompt; set "
                         "actor_rollout_ref.model.share_prompt_forward=false and report this")
    if not self.on_policy:
      with timed(timing, "old_log_prob"):
        rows["old_log_probs"] = self._forward(self.log_prob_fn, self.actor_params, model_rows, "old_log_prob")[0]
    if self.need_ref:
      with timed(timing, "ref"):
        rows["ref_log_prob"] = self._forward(self.ref_log_prob_fn, self.ref_params, model_rows, "ref")[0]
    if self.use_critic:
      with timed(timing, "values"):
        rows["values"] = self._forward(self.value_fn, self.critic_params, model_rows, "values")
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
            self.actor_trainable, self.actor_opt, m = self.actor_update(
                self.actor_trainable, self.actor_opt, mini, self._key(300 + epoch * 1000 + i), self.actor_frozen)
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
    with timed(timing, "step"):
      rows = self._rollout(batch, timing)
      if self.config.trainer.balance_batch and self.data_parallel > 1:
        order = balance_order(rows["attention_mask"].sum(-1), self.data_parallel, self.group)
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
                                      jax.random.fold_in(self._key(400), i), self.val_sampling)
      idx = rollout.prompt_index
      result = self._score(batch, rollout, use_model=False)
      row_scores = result.reward_tensor.sum(-1)
      scores.append(row_scores)
      sources.append(np.asarray(batch["data_source"])[idx])
      if self.config.trainer.validation_data_dir:
        records += self._records(batch, idx, rollout.responses, rollout.response_mask, row_scores)
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
    if is_main_process() and os.path.exists(metrics_file):
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


__all__ = ["RLTrainer", "run", "balance_order", "make_layout", "micro_batch_count"]
