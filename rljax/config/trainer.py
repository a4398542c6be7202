"""verl's `trainer` and `global_profiler` nodes (the run, its devices, logging, checkpoints and profiles), and the
fully-async recipe's `async_training` and `rollout` nodes."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict

from rljax.config.fields import any_value, null


def _nsight_options() -> dict[str, Any]:
  """verl's Nsight Systems options of the controller and the workers (accepted, ignored)."""
  controller = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
  worker = {**controller, "capture-range": "cudaProfilerApi", "capture-range-end": null(str), "kill": "none"}
  return {"controller_nsight_options": controller, "worker_nsight_options": worker}


# verl V1's defaults of trainer.v1.colocate_async.num_warmup_batches and trainer.v1.sampler.max_off_policy_threshold.
V1_WARMUP_BATCHES, V1_OFF_POLICY_THRESHOLD = 1, 8


def _v1_trainer() -> dict[str, Any]:
  """verl's V1 trainer node (`trainer.v1`): its mode, the asynchronous modes' settings and its sampler."""
  return {
      "trainer_mode": "sync",
      "sync": {},
      "colocate_async": {"num_warmup_batches": V1_WARMUP_BATCHES},
      "separate_async": {
          "num_warmup_batches": 1,
          "parameter_sync_step": 4,
          "hybrid_rollout": {
              "enable_switch": False, "switch_threshold_ratio": 0.4, "adaptive_switch_threshold": True,
              "switch_threshold_step_up": 0.05, "switch_threshold_step_down": 0.03,
              "switch_threshold_release_steps": 2, "switch_cost_window_size": 3,
          },
      },
      "sampler": {
          "max_off_policy_threshold": V1_OFF_POLICY_THRESHOLD,
          "max_off_policy_strategy": "drop",
          "sync_refill_failed_groups": False,
          "custom_sampler": {"path": null(str), "name": null(str)},
          "sampler_kwargs": {},
      },
  }


def build_trainer() -> ConfigDict:
  """verl's `trainer` node; default_local_dir follows the project and experiment names."""
  trainer = ConfigDict({
      "balance_batch": True,
      "total_epochs": 30,
      "total_training_steps": null(int),
      "profile_steps": null(list),
      "project_name": "verl_examples",
      "checkpoint_callback_class": null(str),
      "experiment_name": "gsm8k",
      "logger": ["console", "wandb"],
      "log_val_generations": 0,
      "rollout_data_dir": null(str),
      "validation_data_dir": null(str),
      "nnodes": any_value(1),
      "n_gpus_per_node": any_value(8),
      "device": "auto",
      "save_freq": -1,
      "resume_mode": "auto",
      "resume_from_path": null(str),
      "val_before_train": True,
      "val_only": False,
      "test_freq": 2,
      "critic_warmup": 0,
      "default_hdfs_dir": null(str),
      "del_local_ckpt_after_load": False,
      "remove_previous_ckpt_in_save": False,
      "max_actor_ckpt_to_keep": null(int),
      "max_critic_ckpt_to_keep": null(int),
      "ray_wait_register_center_timeout": 300,
      "esi_redundant_time": 0,
      "use_legacy_worker_impl": "auto",
      "use_v1": True,
      "v1": _v1_trainer(),
      "seed": 1,
      "logical_axis_rules": [
          ["batch", ["data", "fsdp", "expert"]],
          ["length", "sequence"],
          ["activation_length", ["sequence", "tensor"]],
          ["exp", "expert"],
          ["embed", ["fsdp", "expert"]],
          ["vocab", "tensor"],
          ["mlp", "tensor"],
          ["heads", "tensor"],
          ["kv_heads", "tensor"],
          ["head_dim", None],
          ["layers", None],
      ],
      **_nsight_options(),
  })
  trainer.default_local_dir = (
      "checkpoints/" + trainer.get_ref("project_name") + "/"
      + trainer.get_ref("experiment_name")
  )
  return trainer


# verl's fully-async recipe (verl/experimental/fully_async_policy, its fully_async_ppo_trainer.yaml): the
# async_training defaults its launch lines run with, and the keys whose setting means a launch line is the recipe's.
RECIPE_DEFAULTS = {"staleness_threshold": 0.1, "trigger_parameter_sync_step": 4, "require_batches": 1,
                   "partial_rollout": True}
RECIPE_KEYS = (*(f"async_training.{name}" for name in RECIPE_DEFAULTS), "rollout.total_rollout_steps")


def fully_async_recipe(config: ConfigDict) -> bool:
  """Whether the run is a launch line of verl's fully-async recipe: any of `RECIPE_KEYS` set."""
  return any(config[section][name] is not None for section, name in (k.split(".") for k in RECIPE_KEYS))


def recipe_setting(config: ConfigDict, name: str) -> Any:
  """`async_training.<name>`, or the recipe's default where it is null."""
  value = config.async_training[name]
  return RECIPE_DEFAULTS[name] if value is None else value


def build_async_training() -> ConfigDict:
  """verl's fully-async recipe's `async_training` node. Every key defaults to null: the recipe is off until a
  launch line sets one (`fully_async_recipe`); a null key then takes the recipe's
  default (`RECIPE_DEFAULTS`)."""
  return ConfigDict({
      "staleness_threshold": null(float),
      "trigger_parameter_sync_step": null(int),
      "require_batches": null(int),
      "partial_rollout": null(bool),
      "use_trainer_do_validate": null(bool),
      "parallel_validate_and_rollout": null(bool),
      "checkpoint_engine": {"enable": null(bool), "overlap_broadcast_and_consume": null(bool),
                            "device_buffer_size_M": null(int)},
  })


def build_recipe_rollout() -> ConfigDict:
  """The fully-async recipe's top-level `rollout` node (the rollout workers' own resources and schedule), every
  key null until set."""
  return ConfigDict({
      "nnodes": null(int),
      "n_gpus_per_node": null(int),
      "n": null(int),
      "total_rollout_steps": null(int),
      "total_epochs": null(int),
      "test_freq": null(int),
      "max_concurrent_samples_per_replica": null(int),
  })


def build_global_profiler() -> ConfigDict:
  """verl's `global_profiler`: which steps its Nsight/torch profilers record."""
  return ConfigDict({
      "tool": null(str),
      "steps": null(list),
      "profile_continuous_steps": False,
      "save_path": "outputs/profile",
      "relocate_results": False,
      "finish_hook_cmd": null(str),
      "finish_hook_all_ranks": False,
      "finish_hook_ranks": [],
      "global_tool_config": {
          "nsys": {
              "discrete": False,
              **_nsight_options(),
          },
          "torch_memory": {
              "trace_alloc_max_entries": 100000,
              "stack_depth": 32,
              "context": "all",
              "stacks": "all",
              "kw_args": {},
              "memory_snapshot_num_steps": 1,
          },
          "precision_debugger": {"config_path": null(str), "steps": null(list), "stages": null(list),
                                 "strict": False},
      },
  })


def build_transfer_queue() -> ConfigDict:
  """verl 0.9's Ray data-transfer queue and its storage backends."""
  return ConfigDict({
      "enable": False,
      "metrics": {"enabled": False, "port": 0},
      "backend": {
          "storage_backend": "SimpleStorage",
          "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
          "MooncakeStore": {"auto_init": False, "metadata_server": "localhost:50123",
                            "master_server_address": "localhost:50124", "local_hostname": "localhost",
                            "protocol": "tcp", "global_segment_size": 4294967296, "local_buffer_size": 1073741824,
                            "device_name": ""},
      },
  })


# verl 0.9's default teacher's inference server (prompt and response lengths and temperature follow the rollout's
# there; here its defaults)
TEACHER_INFERENCE = {
    "name": "vllm", "dtype": "bfloat16", "gpu_memory_utilization": 0.5, "enforce_eager": True,
    "cudagraph_capture_sizes": None, "free_cache_engine": True, "data_parallel_size": 1, "expert_parallel_size": 1,
    "tensor_model_parallel_size": 2, "max_num_batched_tokens": 8192, "max_model_len": None, "max_num_seqs": 1024,
    "load_format": "auto", "engine_kwargs": {}, "limit_images": None, "enable_chunked_prefill": True,
    "enable_prefix_caching": True, "disable_log_stats": True, "skip_tokenizer_init": True, "prompt_length": 512,
    "response_length": 512, "temperature": 1.0,
}
_TEACHER_NULLS = {"cudagraph_capture_sizes": list, "max_model_len": int, "limit_images": int}


def teacher_model() -> ConfigDict:
  """verl 0.9's default entry of distillation.teacher_models."""
  inference = {key: null(_TEACHER_NULLS[key]) if key in _TEACHER_NULLS else value
               for key, value in TEACHER_INFERENCE.items()}
  return ConfigDict({"key": null(str), "model_path": null(str), "num_replicas": 0, "inference": inference})


def build_distillation() -> ConfigDict:
  """verl 0.9's on-policy distillation from teacher models (teacher_models is free-form: one entry per teacher)."""
  return ConfigDict({
      "enabled": False,
      "distillation_loss": {
          "loss_mode": "k3", "topk": 32, "use_task_rewards": True, "distillation_loss_coef": 1.0,
          "loss_max_clamp": null(float), "log_prob_min_clamp": null(float), "use_policy_gradient": False,
          "policy_loss_mode": "vanilla", "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
      },
      "n_gpus_per_node": 8,
      "nnodes": 0,
      "teacher_models": {"teacher_model": teacher_model()},
      "teacher_key": "data_source",
  })
