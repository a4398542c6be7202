"""The SFT loop: verl's fsdp_sft_trainer semantics as one JAX program on one mesh.

Each step takes `data.train_batch_size` examples, lays them out as rows
(one per row, or packed with `use_remove_padding`), runs the micro-batches
of `micro_batch_size_per_gpu` rows per data-parallel device, accumulating
the gradient of the token-mean loss (`rljax.sft.step`), and applies AdamW
once with verl's SFT schedule (`optim.lr_scheduler`: cosine or wsd, warm-up
`int(warmup_steps_ratio * total_steps)`). With `model.lora_rank > 0` the
model gets the RL trainer's LoRA adapters (`rljax.models.lora`): only they
(and modules_to_save) train and sit in the optimizer state and checkpoints.

Every `trainer.test_freq` steps and after the last one, the loss over
`data.val_files` is logged as `val/loss`. Checkpoints, resume, logging,
curves and faults are the shared training code's (`rljax.training`):

  default_local_dir/
    config.yaml          an RL-tree view naming the model (`rljax.sft.config.export_view`),
                         so `python -m rljax.export --checkpoint DIR` works on SFT runs
    sft_config.yaml      the run's resolved SFT config
    global_step_N/       orbax steps: arrays {"actor": trainable parameters (the adapters under
                         LoRA), "actor_opt"},
                         extras {step, data_state, seed}
    metrics.jsonl, curves.png (train/loss, val/loss), tensorboard/, wandb/
                         (under ~/rljax_runs/PROJECT/EXPERIMENT when default_local_dir is a gs:// URI)

Checkpoints are saved every `trainer.save_freq` steps, after the last step
and on SIGTERM; `trainer.resume_mode` auto / disable / resume_path picks the
step to resume from (model, optimizer and data position).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import models, sharding
from rljax.models import lora
from rljax.data import images as images_lib
from rljax.data import pipeline, preflight, tokenization
from rljax.models import vision
from rljax.sft import config as sft_config
from rljax.sft import packing
from rljax.sft import step as step_lib
from rljax.sft.data import SFTDataset, with_chat_template
from rljax.sharding import failures, hosts
from rljax.sharding.distributed import is_main_process
from rljax.training import checkpointing, loop as training_loop, metrics as training_metrics, tracking
from rljax.training.optim import make_optimizer, make_schedule

_LOG = logging.getLogger("rljax.sft")
_DTYPES = {"fp32": jnp.float32, "float32": jnp.float32, "bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16,
           "fp16": jnp.float16, "float16": jnp.float16}
SFT_CONFIG_FILE = "sft_config.yaml"
CONSOLE_KEYS = ("train/loss", "val/loss", "train/lr", "timing_s/step")
CURVES = ("train/loss", "val/loss")


def make_mesh(config: ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The job's mesh: `ulysses_sequence_parallel_size` on the sequence axis, fsdp over the rest.

  Raises:
    ConfigError: the configured device count differs from the devices given.
  """
  devices = sharding.job_devices(config, devices)
  sft_config.validate(config, len(devices))
  sequence = config.ulysses_sequence_parallel_size
  return sharding.build_mesh({"data": 1, "fsdp": len(devices) // sequence, "tensor": 1, "sequence": sequence},
                             devices)


def import_external_lib(name: str | None) -> None:
  """Imports `model.external_lib` (verl imports it to register model classes); errors name the key."""
  if not name:
    return
  try:
    importlib.import_module(name)
  except ImportError as error:
    raise config_lib.ConfigError("model.external_lib", name, f"cannot be imported ({error})",
                                 "install the module, put it on PYTHONPATH, or set model.external_lib=null") from error


def make_train_iterator(config: ConfigDict, tokenizer: tokenization.Tokenizer, process_index: int = 0,
                        process_count: int = 1) -> pipeline.BatchIterator:
  """Batches of `data.train_batch_size` examples, reshuffled every epoch (seed `trainer.seed`).

  Each batch: token_ids and loss_mask as [B / process_count] object arrays of
  [n] int32 arrays, index [B / process_count] int64.
  """
  pipeline.ensure_config_data(config)
  preflight.check_sft_data(config)
  data, trainer = config.data, config.trainer
  dataset = SFTDataset(data.train_files, tokenizer, data, max_samples=data.train_max_samples, seed=trainer.seed,
                       processor=image_processing(config))
  batches = pipeline.batch_dataset(dataset, data.train_batch_size, num_epochs=trainer.total_epochs, shuffle=True,
                                   seed=trainer.seed, process_index=process_index, process_count=process_count)
  return pipeline.BatchIterator(batches, dataset, len(dataset) // data.train_batch_size)


def load_val_examples(config: ConfigDict, tokenizer: tokenization.Tokenizer, process_index: int = 0,
                      process_count: int = 1) -> list[packing.Example]:
  """This process's share (every process_count-th row) of `data.val_files`, tokenised."""
  data = config.data
  dataset = SFTDataset(data.val_files, tokenizer, data, max_samples=data.val_max_samples, seed=config.trainer.seed,
                       processor=image_processing(config))
  return [(item["token_ids"], item["loss_mask"], item["images"])
          for item in (dataset[i] for i in range(process_index, len(dataset), process_count))]


def image_processing(config: ConfigDict) -> Any:
  """The model's image processing (model.partial_pretrain's preprocessor_config.json: a vision-language model),
  or None."""
  return images_lib.ImageProcessing.of_model(config.model.partial_pretrain)


class SFTTrainer:
  """Builds the model, optimizer and data from a finalized SFT config and runs them."""

  def __init__(self, config: ConfigDict, mesh: Mesh | None = None):
    self.config = config
    self.mesh = mesh if mesh is not None else make_mesh(config)
    sft_config.validate(config, self.mesh.size)
    data, model_cfg = config.data, config.model
    self.rules = sharding.rules_from_config(config)
    self.local_micro_rows = data.micro_batch_size_per_gpu * sharding.data_parallel_size(self.mesh)
    if self.local_micro_rows % jax.process_count():
      raise config_lib.ConfigError(
          "data.micro_batch_size_per_gpu", data.micro_batch_size_per_gpu,
          f"micro-batches of {self.local_micro_rows} rows do not split over {jax.process_count()} processes",
          "make micro_batch_size_per_gpu x data-parallel devices a multiple of the process count")
    self.local_micro_rows //= jax.process_count()
    trainer = config.trainer
    self.run_dir = tracking.local_run_dir(trainer.default_local_dir, trainer.project_name, trainer.experiment_name)

    import_external_lib(model_cfg.external_lib)
    path = os.path.expanduser(model_cfg.partial_pretrain)
    model = models.from_pretrained(path, dtype=_DTYPES[model_cfg.fsdp_config.model_dtype], mesh=self.mesh,
                                   rules=self.rules, scan_layers=model_cfg.scan_layers,
                                   remat=model_cfg.enable_gradient_checkpointing,
                                   mtp=False)  # MiMo's MTP layers: verl's SFT trains and saves the trunk only
    if model.cfg.router_aux_loss_coef:
      raise config_lib.ConfigError(
          "model.partial_pretrain", model_cfg.partial_pretrain,
          "its config.json sets output_router_logits=true, but the SFT trainer does not add the mixture-of-experts "
          "load-balancing loss", "set output_router_logits to false in its config.json (the RL trainer adds the loss)")
    self.tokenizer = with_chat_template(models.load_tokenizer(path), data.chat_template)
    self.pad_id = tokenization.pad_token_id(self.tokenizer)
    self.key = jax.random.key(config.trainer.seed)
    if model_cfg.lora_rank > 0:
      lora.apply_lora(model, lora.LoRAConfig.from_model_config(model_cfg, "model"), jax.random.fold_in(self.key, 7),
                      self.mesh, self.rules)
    self.graphdef, self.trainable, self.frozen = lora.split_trainable(model)
    trainable_sh = jax.tree.map(lambda x: x.sharding, self.trainable)
    frozen_sh = jax.tree.map(lambda x: x.sharding, self.frozen)
    self.model_config = model.cfg
    self.rows_sh = {k: sharding.batch_sharding(self.mesh, self.rules, ndim=2) for k in packing.ROW_KEYS}
    if model.cfg.vision is not None:
      self.rows_sh.update({k: sharding.batch_sharding(self.mesh, self.rules, ndim=2 + (k in ("pixels", "patch_rotary")))
                           for k in packing.IMAGE_KEYS})
      self.rows_sh["positions"] = sharding.batch_sharding(self.mesh, self.rules, ndim=3)

    self.train_iter = make_train_iterator(config, self.tokenizer, jax.process_index(), jax.process_count())
    try:
      self.total_steps = sft_config.total_steps(config, self.train_iter.batches_per_epoch)
    except config_lib.ConfigError:
      self.train_iter.close()
      raise
    optim = sft_config.optim_view(config.optim)
    tx = make_optimizer(optim, config.optim.clip_grad, self.total_steps, 1)
    self.lr = make_schedule(optim, self.total_steps, 1)
    self.opt_state, opt_sh = sharding.init_optimizer(tx, self.trainable, trainable_sh, self.mesh)
    self.zeros = step_lib.make_zeros(trainable_sh)
    self.grad_step = step_lib.make_grad_step(self.graphdef, self.mesh, self.rules, trainable_sh, frozen_sh,
                                             self.rows_sh)
    self.apply_step = step_lib.make_apply_step(tx, self.mesh, trainable_sh, opt_sh)
    self.eval_step = step_lib.make_eval_step(self.graphdef, self.mesh, self.rules, trainable_sh, frozen_sh,
                                             self.rows_sh)

    self.val_rows = None
    if data.val_files:
      self.val_rows = self.rows(load_val_examples(config, self.tokenizer, jax.process_index(), jax.process_count()))

    self.checkpointer = checkpointing.Checkpointer(config.trainer.default_local_dir, config.trainer.max_ckpt_to_keep)
    self.checkpointer.save_config(sft_config.export_view(config))
    self.checkpointer.save_config(config, SFT_CONFIG_FILE)
    self.tracker = tracking.Tracker(config, self.run_dir, self.total_steps, console_keys=CONSOLE_KEYS)
    self.step = 0
    self.saved_step = -1

  def count_step(self) -> None:
    """Counts a step trained."""
    self.step += 1

  # ----- batches -----------------------------------------------------------------------

  def rows(self, examples: Sequence[packing.Example]) -> dict[str, np.ndarray]:
    """This process's examples as rows, padded to the job-wide number of micro-batches."""
    lengths = [len(example[0]) for example in examples]
    groups = packing.group_examples(lengths, self.config.data.max_length, self.config.use_remove_padding)
    count, patches = (int(v) for v in hosts.process_extrema(
        [packing.padded_row_count(len(groups), self.local_micro_rows), packing.row_patches(examples, groups)])[0])
    if self.model_config.vision is None:
      return packing.build_rows(examples, groups, self.config.data.max_length, count, self.pad_id)
    unit = self.model_config.vision.merge_unit
    return packing.build_rows(examples, groups, self.config.data.max_length, count, self.pad_id, self.model_config,
                              vision.patch_bucket(patches, unit))

  def _place(self, micro: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return sharding.global_batch(micro, self.rows_sh)

  # ----- one step ------------------------------------------------------------------------

  def train_step(self, batch: dict[str, Any]) -> dict[str, float]:
    """One optimizer step on a batch of examples; returns its metrics."""
    start = time.perf_counter()
    rows = self.rows(list(zip(batch["token_ids"], batch["loss_mask"], batch["images"])))
    normaliser = jnp.float32(max(1.0, hosts.process_total(packing.trained_tokens(rows))))
    grads = self.zeros(self.trainable)
    losses = []
    step_key = jax.random.fold_in(self.key, self.step)
    for i, micro in enumerate(packing.micro_batches(rows, self.local_micro_rows)):
      grads, loss = self.grad_step(self.trainable, self.frozen, self._place(micro), grads, normaliser,
                                   jax.random.fold_in(step_key, i))
      losses.append(loss)
    self.trainable, self.opt_state, grad_norm = self.apply_step(self.trainable, self.opt_state, grads)
    loss, grad_norm = float(sum(jax.device_get(losses))), float(grad_norm)
    timing = {"timing_s/step": time.perf_counter() - start}
    tokens = hosts.process_total(packing.real_tokens(rows))
    slots = hosts.process_total(rows["segment_ids"].size)
    out = {"train/loss": loss, "train/lr": float(self.lr(self.step)), "train/grad_norm": grad_norm,
           "train/tokens": tokens, "train/pad_ratio": 1.0 - tokens / slots,
           "training/global_step": float(self.step + 1),
           "training/epoch": float(self.step // max(1, self.train_iter.batches_per_epoch))}
    out.update(timing)
    out.update(training_metrics.throughput_metrics(timing, int(tokens), self.mesh.size))
    return out

  def validate(self) -> dict[str, float]:
    """`val/loss`: the token-mean loss over every trained token of data.val_files."""
    total = 0.0
    for micro in packing.micro_batches(self.val_rows, self.local_micro_rows):
      total += float(self.eval_step(self.trainable, self.frozen, self._place(micro)))
    return {"val/loss": total / max(1.0, hosts.process_total(packing.trained_tokens(self.val_rows)))}

  # ----- checkpoints ---------------------------------------------------------------------

  def _arrays(self) -> dict[str, Any]:
    return {"actor": self.trainable, "actor_opt": self.opt_state}

  def save(self) -> None:
    extras = {"step": self.step, "data_state": self.train_iter.get_state(), "seed": self.config.trainer.seed}
    self.checkpointer.save(self.step, self._arrays(), extras)
    self.saved_step = self.step
    metrics_file = os.path.join(self.run_dir, tracking.METRICS_FILE)
    if is_main_process() and os.path.exists(metrics_file):
      tracking.plot_curves(metrics_file, os.path.join(self.run_dir, "curves.png"), names=CURVES)

  def restore(self, path: str) -> None:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self._arrays())
    arrays, extras = checkpointing.restore_from_path(path, abstract)
    self.trainable = arrays["actor"]
    self.opt_state = arrays["actor_opt"]
    self.step = self.saved_step = int(extras["step"])
    self.train_iter.set_state(extras["data_state"])

  # ----- the run ---------------------------------------------------------------------------

  def _validation_due(self, step: int) -> bool:
    freq = self.config.trainer.test_freq
    return self.val_rows is not None and (step == self.total_steps or (freq > 0 and step % freq == 0))

  def _save_due(self, step: int) -> bool:
    freq = self.config.trainer.save_freq
    return step == self.total_steps or (freq > 0 and step % freq == 0)

  def fit(self) -> dict[str, float]:
    """Trains to `total_steps` (or SIGTERM); returns the last step's metrics."""
    resume = checkpointing.resolve_resume(self.config.trainer)
    if resume is not None:
      self.restore(resume)
      _LOG.info("resumed from %s at step %d", resume, self.step)
    return training_loop.train_loop(self, self.total_steps, self._validation_due, self._save_due)

  def close(self) -> None:
    """Closes the data, the checkpointer and the trackers (a failed run's never reached the end)."""
    self.train_iter.close()
    self.checkpointer.close()
    self.tracker.close()


def run(config: ConfigDict) -> dict[str, float]:
  """Trains with a finalized, validated SFT config; prints where the outputs are. A process of a job on several
  processes that fails stops the others and exits (`rljax.sharding.failures`)."""
  trainer, metrics = failures.run_together(functools.partial(SFTTrainer, config), SFTTrainer.fit, SFTTrainer.close)
  if is_main_process():
    checkpoints = config.trainer.default_local_dir
    print(f"rljax.sft: metrics.jsonl and curves.png in {trainer.run_dir}, checkpoints in {checkpoints} "
          f"(export with python -m rljax.export --checkpoint {checkpoints} --out DIR)")
  return metrics


__all__ = [
    "SFTTrainer", "import_external_lib", "load_val_examples", "make_mesh",
    "make_train_iterator", "run",
]
