"""verl's SFT-trainer configuration tree (`sft_trainer.yaml`) as a locked ConfigDict.

`get_sft_config()` builds verl's SFT keys with verl's defaults: `data.*`
(single-turn prompt/response columns or multi-turn `messages`), `model.*`,
`optim.*`, `ulysses_sequence_parallel_size`, `use_remove_padding` and
`trainer.*`. It is built, overridden, printed and checked with the machinery
of `rljax.config` (the same override parser, `ConfigError`, `${...}` as
`FieldReference`s, unknown keys named with the closest valid one).

`rljax.sft.keys.KEYS` says what each key means and what rljax does with it,
with the RL tree's `Key` records (ignored, mapped, added by rljax,
deprecated, an alias). `finalize()` moves the deprecated
`data.micro_batch_size` onto its replacement and warns once; an `ALIASES`
key (verl's newer `optim.lr_warmup_steps_ratio`) that is set replaces the
key it spells.

Sequence packing is verl's top-level `use_remove_padding`: verl removes the
padding of each micro-batch and runs flash-attention over the concatenated
sequences; rljax packs several examples into each `data.max_length` row
with `segment_ids` (attention stays inside an example, positions restart at
0 for each), which is the same computation with static shapes.
"""

from __future__ import annotations

import logging
import math

from ml_collections import ConfigDict, FieldReference

from rljax import config as config_lib
from rljax import sharding
from rljax.config import ConfigError, any_value, check, check_enum, check_positive, check_range, null
from rljax.config.checks import vision_language_type
from rljax.models import lora
from rljax.sft.keys import ALIASES

SFT_TRUNCATIONS = ("error", "left", "right")
LR_SCHEDULERS = ("cosine", "wsd")
DTYPES = config_lib.DTYPES
RESUME_MODES = config_lib.RESUME_MODES
LOGGERS = config_lib.LOGGERS
DEVICES = config_lib.DEVICES

_LOG = logging.getLogger("rljax.sft.config")
_WARNED: set[str] = set()


def _data() -> ConfigDict:
  return ConfigDict({
      "train_batch_size": 256,
      "micro_batch_size": null(int),
      "micro_batch_size_per_gpu": FieldReference(4, field_type=int),
      "train_files": any_value("~/data/gsm8k/train.parquet"),
      "val_files": any_value("~/data/gsm8k/test.parquet"),
      "train_max_samples": -1,
      "val_max_samples": -1,
      "prompt_key": "question",
      "response_key": "answer",
      "prompt_dict_keys": null(list),
      "response_dict_keys": null(list),
      "multiturn": {"enable": False, "messages_key": "messages"},
      "image_key": "images",
      "image_patch_size": 14,
      "max_length": 1024,
      "truncation": "error",
      "balance_dp_token": False,
      "chat_template": null(str),
      "use_shm": False,
  })


def _model() -> ConfigDict:
  return ConfigDict({
      "partial_pretrain": "~/models/gemma-1.1-7b-it",
      "strategy": "fsdp2",
      "use_shm": False,
      "fsdp_config": {
          "model_dtype": "fp32",
          "wrap_policy": {"min_num_params": 0},
          "cpu_offload": False,
          "offload_params": False,
      },
      "external_lib": null(str),
      "enable_gradient_checkpointing": False,
      "trust_remote_code": False,
      **config_lib.lora_defaults(),
      "exclude_modules": any_value(None),
      "use_liger": False,
      "scan_layers": False,
  })


def _optim() -> ConfigDict:
  return ConfigDict({
      "lr": 1e-5,
      "betas": [0.9, 0.95],
      "weight_decay": 0.01,
      "warmup_steps_ratio": 0.1,
      "lr_warmup_steps_ratio": null(float),
      "clip_grad": 1.0,
      "lr_scheduler": "cosine",
  })


def _trainer() -> ConfigDict:
  trainer = ConfigDict({
      "default_hdfs_dir": null(str),
      "project_name": "gsm8k-sft",
      "experiment_name": "test",
      "total_epochs": 4,
      "total_training_steps": null(int),
      "logger": ["console", "wandb"],
      "seed": 1,
      "save_freq": -1,
      "test_freq": -1,
      "nnodes": any_value(1),
      "n_gpus_per_node": any_value(8),
      "max_ckpt_to_keep": null(int),
      "resume_mode": "auto",
      "resume_from_path": null(str),
      "device": "auto",
      "logical_axis_rules": [list(pair) for pair in config_lib.get_base_config().trainer.logical_axis_rules],
  })
  trainer.default_local_dir = (
      "checkpoints/" + trainer.get_ref("project_name") + "/" + trainer.get_ref("experiment_name"))
  return trainer


def get_sft_config() -> ConfigDict:
  """verl's sft_trainer.yaml tree with verl's defaults, locked (unknown keys are errors)."""
  config = ConfigDict({
      "data": _data(),
      "model": _model(),
      "optim": _optim(),
      "ulysses_sequence_parallel_size": 1,
      "use_remove_padding": False,
      "trainer": _trainer(),
  })
  config.lock()
  return config


def _warn_once(key: str, message: str) -> None:
  if key not in _WARNED:
    _WARNED.add(key)
    _LOG.warning(message)


def data_parallel_size(config: ConfigDict, world_size: int) -> int:
  """Devices that split the batch: the world over the sequence axis."""
  return max(1, world_size // config.ulysses_sequence_parallel_size)


def finalize(config: ConfigDict, device_count: int | None = None) -> ConfigDict:
  """Moves deprecated keys onto their replacements (warning once each).

  Args:
    config: the tree after overrides.
    device_count: devices in the job (default: from `trainer.*`, or JAX).

  Returns:
    The same config.
  """
  data = config.data
  if data.micro_batch_size is not None:
    _warn_once("data.micro_batch_size", "data.micro_batch_size is deprecated; use data.micro_batch_size_per_gpu")
    dp = data_parallel_size(config, sharding.resolve_world_size(config, device_count))
    check(data.micro_batch_size >= dp, "data.micro_batch_size", data.micro_batch_size,
          f"is smaller than the {dp} data-parallel devices", "set data.micro_batch_size_per_gpu directly")
    config_lib.set_value(config, "data.micro_batch_size_per_gpu", data.micro_batch_size // dp)
  for alias, key in ALIASES.items():
    value = config_lib.get_node(config, alias)
    if value is not None:
      config_lib.set_value(config, key, value)
  dp = data_parallel_size(config, sharding.resolve_world_size(config, device_count))
  if data.micro_batch_size_per_gpu is None and data.train_batch_size > 0 and data.train_batch_size % dp == 0:
    config_lib.set_value(config, "data.micro_batch_size_per_gpu", data.train_batch_size // dp)
  return config


def _check_data(config: ConfigDict, world_size: int | None) -> None:
  data = config.data
  for key in ("data.train_batch_size", "data.max_length"):
    check_positive(config, key)
  if data.micro_batch_size_per_gpu is not None or world_size is None:
    check_positive(config, "data.micro_batch_size_per_gpu")
  check_enum(config, "data.truncation", SFT_TRUNCATIONS)
  config_lib.check_data_files(config, "data.train_files")
  config_lib.check_data_files(config, "data.val_files", required=False)
  for key in ("data.train_max_samples", "data.val_max_samples"):
    value = config_lib.get_node(config, key)
    check(value == -1 or value > 0, key, value, "must be -1 (all rows) or a positive count", f"set {key}=-1")
  if data.multiturn.enable:
    check(bool(data.multiturn.messages_key), "data.multiturn.messages_key", data.multiturn.messages_key,
          "multi-turn data needs the column holding each row's messages", "set data.multiturn.messages_key=messages")
  else:
    for key in ("data.prompt_key", "data.response_key"):
      check(bool(config_lib.get_node(config, key)), key, config_lib.get_node(config, key),
            "single-turn data needs a column name", f"set {key} to a column of data.train_files")
  if world_size is None:
    return
  dp = data_parallel_size(config, world_size)
  check(data.micro_batch_size_per_gpu is not None, "data.train_batch_size", data.train_batch_size,
        f"does not split over {dp} data-parallel devices (data.micro_batch_size_per_gpu is null: each device's "
        "whole share)", f"make data.train_batch_size a multiple of {dp}")
  micro_rows = data.micro_batch_size_per_gpu * dp
  check(data.train_batch_size % micro_rows == 0, "data.train_batch_size", data.train_batch_size,
        f"does not split into micro-batches of micro_batch_size_per_gpu ({data.micro_batch_size_per_gpu}) x "
        f"{dp} data-parallel devices = {micro_rows} rows",
        f"make data.train_batch_size a multiple of {micro_rows}")


def _check_model(config: ConfigDict) -> None:
  model = config.model
  check_enum(config, "model.fsdp_config.model_dtype", DTYPES)
  lora.check_lora_keys(model, "model")
  check(bool(model.partial_pretrain), "model.partial_pretrain", model.partial_pretrain,
        "names no model", "set model.partial_pretrain to an HF directory, a .gguf file or smollm2-135m-instruct")
  config_lib.check_model_path("model.partial_pretrain", model.partial_pretrain, vision_language=True)
  model_type = vision_language_type(model.partial_pretrain)
  if model_type is not None and model.lora_rank > 0:
    lora.check_tower_left_out(lora.LoRAConfig.from_model_config(model, "model"), model_type,
                              f"model.partial_pretrain is a vision-language model ({model_type}), and ")


def _check_optim(config: ConfigDict) -> None:
  optim = config.optim
  check_enum(config, "optim.lr_scheduler", LR_SCHEDULERS)
  for key in ("optim.lr", "optim.weight_decay", "optim.clip_grad"):
    check_positive(config, key, allow_zero=True)
  check_range(config, "optim.warmup_steps_ratio", 0.0, 1.0)
  betas = list(optim.betas)
  check(len(betas) == 2 and all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas),
        "optim.betas", betas, "must be two numbers in [0, 1)", "set optim.betas=[0.9,0.95]")


def _check_trainer(config: ConfigDict, world_size: int | None) -> None:
  trainer = config.trainer
  check_enum(config, "trainer.resume_mode", RESUME_MODES)
  check_enum(config, "trainer.device", DEVICES)
  check_positive(config, "trainer.total_epochs")
  if trainer.total_training_steps is not None:
    check_positive(config, "trainer.total_training_steps")
  for key in ("trainer.save_freq", "trainer.test_freq"):
    value = config_lib.get_node(config, key)
    check(value == -1 or value > 0, key, value, "must be -1 (never) or a positive step count",
          f"set {key}=-1 or a step count")
  check(trainer.resume_mode != "resume_path" or bool(trainer.resume_from_path), "trainer.resume_from_path",
        trainer.resume_from_path, "trainer.resume_mode=resume_path needs a checkpoint path",
        "set trainer.resume_from_path=DIR/global_step_N or trainer.resume_mode=auto")
  check(trainer.max_ckpt_to_keep is None or trainer.max_ckpt_to_keep >= 1, "trainer.max_ckpt_to_keep",
        trainer.max_ckpt_to_keep, "must keep at least one checkpoint", "set it to null (keep all) or a count >= 1")
  loggers = trainer.logger if isinstance(trainer.logger, (list, tuple)) else [trainer.logger]
  for name in loggers:
    check(name in LOGGERS, "trainer.logger", list(loggers), f"{name!r} is not a logger rljax has",
          f"choose from {', '.join(LOGGERS)}")
  sequence = config.ulysses_sequence_parallel_size
  check_positive(config, "ulysses_sequence_parallel_size")
  if world_size is not None:
    check(world_size % sequence == 0, "ulysses_sequence_parallel_size", sequence,
          f"does not divide the {world_size} devices", f"choose a divisor of {world_size}")


def validate(config: ConfigDict, world_size: int | None = None) -> ConfigDict:
  """Checks every SFT rule; raises ConfigError naming the key, value and fix.

  Args:
    config: a finalized SFT config.
    world_size: devices in the job; enables the micro-batch divisibility and
      mesh rules (None checks only what does not depend on devices).

  Returns:
    The config, unchanged.
  """
  _check_data(config, world_size)
  _check_model(config)
  _check_optim(config)
  _check_trainer(config, world_size)
  return config


def optim_view(optim: ConfigDict) -> ConfigDict:
  """The SFT `optim` node in the RL optimizer's spelling, for `rljax.training.optim`.

  verl's SFT trainer calls its cosine and wsd schedules with their defaults
  (min_lr_ratio 0, num_cycles 0.5) and warmup = int(warmup_steps_ratio *
  total steps).
  """
  return ConfigDict({
      "lr": float(optim.lr),
      "lr_warmup_steps": -1,
      "lr_warmup_steps_ratio": float(optim.warmup_steps_ratio),
      "min_lr_ratio": 0.0,
      "num_cycles": 0.5,
      "lr_scheduler_type": optim.lr_scheduler,
      "weight_decay": float(optim.weight_decay),
      "betas": [float(b) for b in optim.betas],
  })


def export_view(config: ConfigDict) -> ConfigDict:
  """An RL-tree config naming the model behind the checkpoint's "actor" arrays.

  `python -m rljax.export` reads `config.yaml` beside the checkpoints as an
  RL config (`actor_rollout_ref.model.path`, `scan_layers`,
  `override_config`, and the LoRA keys of a LoRA run, so the adapters are
  rebuilt); the SFT trainer writes this view there, and the full SFT config
  to `sft_config.yaml`.
  """
  view = config_lib.get_base_config()
  trainer = config.trainer
  lora_keys = lora.LoRAConfig.from_model_config(config.model, "model").as_keys() if config.model.lora_rank > 0 else {}
  for path, value in (
      *((f"actor_rollout_ref.model.{key}", value) for key, value in lora_keys.items()),
      ("actor_rollout_ref.model.path", config.model.partial_pretrain),
      ("actor_rollout_ref.model.scan_layers", config.model.scan_layers),
      ("actor_rollout_ref.model.enable_gradient_checkpointing", config.model.enable_gradient_checkpointing),
      ("actor_rollout_ref.actor.fsdp_config.model_dtype", config.model.fsdp_config.model_dtype),
      ("trainer.project_name", trainer.project_name),
      ("trainer.experiment_name", trainer.experiment_name),
      ("trainer.default_local_dir", trainer.default_local_dir),
      ("trainer.logger", list(trainer.logger) if isinstance(trainer.logger, (list, tuple)) else [trainer.logger]),
  ):
    config_lib.set_value(view, path, value)
  return view


def total_steps(config: ConfigDict, batches_per_epoch: int) -> int:
  """`trainer.total_training_steps`, else batches per epoch x `trainer.total_epochs`.

  Raises:
    ConfigError: total_training_steps asks for more batches than the epochs hold.
  """
  trainer = config.trainer
  available = batches_per_epoch * trainer.total_epochs
  if trainer.total_training_steps is None:
    return available
  check(trainer.total_training_steps <= available, "trainer.total_training_steps", trainer.total_training_steps,
        f"asks for more steps than {trainer.total_epochs} epochs of {batches_per_epoch} batches hold ({available})",
        f"set trainer.total_epochs >= {math.ceil(trainer.total_training_steps / batches_per_epoch)} or lower it")
  return int(trainer.total_training_steps)


__all__ = [
    "ConfigError", "data_parallel_size", "export_view", "finalize", "get_sft_config", "optim_view", "total_steps",
    "validate",
]

