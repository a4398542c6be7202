"""The RL loop: verl's ray_trainer semantics as one JAX program on one mesh.

Each step, for `data.train_batch_size` prompts:

    rollout (n responses each, the engine reading the actor's arrays: in place
    when they are in rollout.dtype, else cast once per rollout)
    -> rewards (reward manager) -> old log-probs (recomputed by the actor;
    skipped on-policy, see below) -> reference log-probs (use_kl_loss or
    use_kl_in_reward) -> critic values (gae) -> KL in reward
    -> advantages -> critic update -> actor update (after critic_warmup)
    -> metrics, validation, checkpoint.

Each step reads as that list (`RLTrainer.train_step`): its rows come from the
run's rollout source (`rljax.rl.sources`: sync, dynamic sampling's rounds, or
colocate_async's and separate_async's stream, chosen once at start-up), scored
by `rljax.rl.scoring`; `rljax.rl.stages` adds the forward passes and
advantages, then runs the updates; the source gets the new weights.

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
score fill it, `stages.experience` adds the forward passes and advantages,
and the updates read their mini-batches from it.

LoRA (actor_rollout_ref.model.lora_rank > 0): the actor's state splits into
`RunState.actor` (adapters and modules_to_save: the only gradients,
optimizer state and checkpointed "actor" arrays) and `RLRun.frozen` (the
base weights, read in place by log-probs and the update, and by rollout when
they are in rollout.dtype). The reference policy is the base model without
adapters over those same frozen arrays. The critic trains in full.
Random draws are named (`sources.Draw`): each key folds in the step, the
draw and its indices (epoch, mini-batch), so no two draws share a key.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import data as data_lib
from rljax.data import preflight
from rljax import models, rewards, sharding
from rljax.rl import assembly, metrics as metrics_lib, profiling, remote, scoring, sources, stages, staleness
from rljax.rl.profiling import timed
from rljax.rl.scoring import Scorer
from rljax.rollout import SamplingParams, factory as rollout_factory
from rljax.sharding import failures, hosts
from rljax.sharding.distributed import is_main_process
from rljax.training import checkpointing, loop as training_loop, metrics as training_metrics, tracking

_LOG = logging.getLogger("rljax.rl")
CONSOLE_KEYS = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "timing_s/step")


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
      and staleness.policy_of(config, 1) is not None):
    raise config_lib.ConfigError(
        "algorithm.filter_groups.enable", True, f"with a reward model under trainer.v1.trainer_mode=colocate_async "
        f"on {processes} processes: each host judges its groups as they finish, and the reward model's forward "
        "pass runs over every host's devices at once", "set trainer.v1.trainer_mode=sync (dynamic sampling by "
        "rounds), or score with a reward function (custom_reward_function.path)")
  data_lib.ensure_config_data(config)
  preflight.check_rl_data(config)
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
    rollout_devices = _rollout_devices(config, self.mesh)
    self.tokenizer = load_tokenizer(config)
    self.data = data_lib.make_train_iterator(config, self.tokenizer, hosts.index(), hosts.count())
    # a rollout process holds no trainer array: the trainer's parts are abstract there
    self.run, self.state = assembly.build_run(config, self.mesh, abstract=self.rollout_process,
                                              tokenizer=self.tokenizer, batches_per_epoch=self.data.batches_per_epoch,
                                              rollout_devices=rollout_devices,
                                              remote_rollout=self.roles is not None and not self.rollout_process)
    self.sampler = rollout_factory.build_sampler(
        self.run.engine, arr.rollout, rollout_factory.pad_id(self.tokenizer, self.run.engine.eos_ids), self.tokenizer)
    self.val_sampling = SamplingParams.from_rollout_config(arr.rollout.val_kwargs)
    self.scorer = Scorer(config, self.tokenizer, self.run.reward_model, self.run.model_config)
    self.checkpointer = None if self.rollout_process else checkpointing.Checkpointer.from_config(config)
    self.run_dir = tracking.local_run_dir(config.trainer.default_local_dir, config.trainer.project_name,
                                          config.trainer.experiment_name)
    self.tracker = tracking.Tracker(config, self.run_dir, self.run.layout.total_steps, console_keys=CONSOLE_KEYS)
    self.keys = sources.Keys.of(config.trainer.seed)
    self.saved_step = -1
    self.parts = stages.StepParts(config, self.run, self.mesh, self.keys)
    self.rollouts = sources.Rollouts(config, self.sampler, self.scorer, self.keys, lambda: self.actor_params,
                                     self.run.layout.n)
    self.stream_parts = sources.StreamParts(self.run.layout.total_steps, list(self.mesh.devices.flat),
                                            rollout_devices, self.roles, self.run.rollout_engine, self.run.engine)
    # a rollout process's stream starts when its trainer says where (`serve_rollout`)
    self.source = None if self.rollout_process else sources.make_source(self.rollouts, self.data, self.stream_parts,
                                                                        self.state)
    self.train_iter = self.data if self.source is None else self.source.batches

  # ----- the state ----------------------------------------------------------------------

  @property
  def step(self) -> int:
    """Steps trained (the state's)."""
    return self.state.step

  def count_step(self) -> None:
    """Counts a step trained, with the positions the data (and the stream) reached, which the hosts agree on
    here: a resumed run starts from them."""
    step = self.step + 1
    self.state = self.state.replace(step=step, **self.source.positions(step))

  @property
  def actor_params(self) -> Any:
    """The actor's whole state: what trains and, under LoRA, the frozen base (one view, no copy)."""
    return self.run.actor_params(self.state)

  # ----- one step -------------------------------------------------------------------

  def train_step(self, batch: dict[str, Any] | None) -> dict[str, float]:
    """One RL step on a batch of prompts (None where the rollout reads the data itself); returns its metrics."""
    timing: dict[str, float] = {}
    step_metrics: dict[str, Any] = {}
    with profiling.step_trace(self.config, self.step + 1), timed(timing, "step"):
      rows = self.source.rows(batch, self.step, timing, step_metrics)
      data = stages.place_step(self.parts, rows)
      rows, self.state = stages.experience(self.parts, self.state, rows, timing, step_metrics, data)
      self.state = stages.update(self.parts, self.state, rows, timing, step_metrics, data)
      self.source.publish(self.step + 1, timing, step_metrics)  # to a rollout that decodes under these weights
    layout = self.run.layout
    step_metrics.update(metrics_lib.data_metrics(rows, layout.response_length, layout.prompt_length))
    step_metrics.update(timing)
    if data.packer is not None and data.packer.real:  # the packed passes' token positions over their real tokens
      step_metrics["perf/packed_compute_ratio"] = data.packer.computed / data.packer.real
    tokens = int(hosts.process_total(rows.attention_mask.sum()))
    step_metrics.update(training_metrics.throughput_metrics(timing, tokens, self.mesh.size))
    step_metrics["training/global_step"] = float(self.step + 1)
    step_metrics.setdefault("training/epoch", float(self.data.epoch))  # batches read: dynamic sampling reads several
    return step_metrics

  # ----- validation ------------------------------------------------------------------

  def validate(self) -> dict[str, float]:
    """Greedy (val_kwargs) responses to data.val_files, scored per data source."""
    val, trainer = self.config.actor_rollout_ref.rollout.val_kwargs, self.config.trainer
    scores, data_sources, samples, records = [], [], [], []
    for i, batch in enumerate(data_lib.make_val_batches(self.config, self.tokenizer, hosts.index(), hosts.count())):
      with self.source.turn():
        rollout = self.rollouts.generate(batch, val.n, self.keys.at(self.step, sources.Draw.VALIDATION, i),
                                         self.val_sampling)
      idx = rollout.prompt_index
      row_scores = self.scorer(batch, rollout, use_model=False).reward_tensor.sum(-1)
      scores.append(row_scores)
      data_sources.append(np.asarray(batch["data_source"])[idx])
      if trainer.validation_data_dir:
        records += self.scorer.records(batch, idx, rollout.responses, rollout.attention_mask, row_scores)
      samples += validation_samples(self.tokenizer, batch, rollout, row_scores,
                                    trainer.log_val_generations - len(samples))
    out = metrics_lib.validation_metrics(np.concatenate(data_sources), np.concatenate(scores), val.n)
    if samples:
      self.tracker.log_generations(samples, self.step)
    if records:
      scoring.dump_generations(trainer.validation_data_dir, self.step, records)
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
    """The state of the checkpoint step `path`, placed as this run's; the data (and the stream) resume where they
    were."""
    target, _ = assembly.checkpoint_items(assembly.abstract_like(self.state), self.config.trainer.seed)
    self.state = assembly.restored(self.state, *checkpointing.restore_from_path(path, target))
    self.source = self.source.resumed(self.state, path)

  # ----- the run -------------------------------------------------------------------------

  def serve_rollout(self) -> None:
    """A rollout process's run: the stream its trainer processes train from (`sources.serve_rollout`)."""
    sources.serve_rollout(self.rollouts, self.data, self.stream_parts)

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

  def close(self) -> None:
    """Ends the rollout and closes what the run holds, its trackers last (a failed run's never reached the end)."""
    if self.source is not None:
      self.source.close()
    self.sampler.close()
    self.data.close()
    if self.checkpointer is not None:
      self.checkpointer.close()
    self.scorer.close()
    self.tracker.close()


def load_tokenizer(config: ConfigDict) -> models.Tokenizer:
  """The run's tokenizer (`config_lib.tokenizer_key`: data.tokenizer, else actor_rollout_ref.model.tokenizer_path,
  else the actor model's), its chat template (actor_rollout_ref.model's custom_chat_template where set, as verl's
  agent loop sets it) rendering every prompt and turn with data.apply_chat_template_kwargs."""
  kwargs = config.data.apply_chat_template_kwargs
  kwargs = kwargs.to_dict() if isinstance(kwargs, ConfigDict) else dict(kwargs)
  key = config_lib.tokenizer_key(config)
  path = config_lib.get_node(config, key)
  try:
    tokenizer = models.load_tokenizer(path)
  except (FileNotFoundError, ValueError) as error:
    raise config_lib.ConfigError(key, path, f"its tokenizer does not load: {str(error).rstrip('.')}",
                                 "point it at a Hugging Face model directory with tokenizer.json (a fast "
                                 "tokenizer), or a .gguf file") from None
  template = config.actor_rollout_ref.model.custom_chat_template
  if template is not None:
    tokenizer = tokenizer.with_chat_template(template)
  return tokenizer.with_template_kwargs(kwargs)


def validation_samples(tokenizer: Any, batch: dict[str, Any], rollout: Any, scores: np.ndarray,
                       most: int) -> list[dict[str, Any]]:
  """Up to `most` of a validation rollout's rows as trainer.log_val_generations logs them: prompt, response,
  score."""
  idx = rollout.prompt_index
  return [{"prompt": tokenizer.decode(batch["input_ids"][idx[row]][batch["attention_mask"][idx[row]] > 0]),
           "response": tokenizer.decode(rollout.responses[row][:rollout.response_lengths[row]]),
           "score": float(scores[row])}
          for row in range(min(len(idx), max(most, 0)))]


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


__all__ = ["RLTrainer", "run"]
