"""verl's `reward_model` node: the learned reward model, the reward manager and DAPO's overlong penalty."""

from __future__ import annotations

from ml_collections import ConfigDict

from rljax.config.engines import megatron, profiler
from rljax.config.fields import follow, null
from rljax.config.actor_rollout_ref import disaggregation


def build_reward_model(model: ConfigDict, critic: ConfigDict) -> ConfigDict:
  """The reward model and reward manager; its tokenizer follows the policy's `model`."""
  return ConfigDict({
      "enable": False,
      "strategy": "fsdp",
      "model": {
          "input_tokenizer": follow(model, "path"),
          "path": "~/models/Anomy-RM-v0.1",
          "external_lib": follow(model, "external_lib"),
          "trust_remote_code": False,
          "use_remove_padding": False,
          "use_fused_kernels": False,
          "use_shm": False,
          "override_config": {},
          "fsdp_config": {
              "min_num_params": 0,
              "wrap_policy": {"min_num_params": 0},
              "param_offload": False,
              "reshard_after_forward": True,
              "forward_prefetch": False,
              "fsdp_size": -1,
          },
      },
      "micro_batch_size": null(int),
      "micro_batch_size_per_gpu": 16,
      "max_length": null(int),
      "use_dynamic_bsz": follow(critic, "use_dynamic_bsz"),
      "forward_max_token_len_per_gpu": follow(critic, "forward_max_token_len_per_gpu"),
      "reward_manager": "naive",
      "launch_reward_fn_async": False,
      "sandbox_fusion": {"url": null(str), "max_concurrent": 64, "memory_limit_mb": 1024},
      "prime": {"num_workers": null(int), "timeout_s": 300.0},
      "profiler": profiler(),
      "enable_resource_pool": False,
      "n_gpus_per_node": 8,
      "nnodes": 0,
      "reward_loop_source": "register",
      "reward_loop_module_path": null(str),
      "reward_loop_class_name": null(str),
      "ulysses_sequence_parallel_size": 1,
      "use_reward_loop": True,
      "num_workers": 8,
      "rollout": _reward_rollout(),
      "megatron": megatron(forward_only=True),
      "overlong_buffer": {
          "enable": False,
          "len": 0,
          "penalty_factor": 0.0,
          "log": False,
          "max_resp_len": null(int),
      },
  })


def _reward_rollout() -> ConfigDict:
  """verl's inference server for generative reward models."""
  return ConfigDict({
      "name": null(str),
      "dtype": "bfloat16",
      "gpu_memory_utilization": 0.5,
      "enforce_eager": True,
      "cudagraph_capture_sizes": null(list),
      "free_cache_engine": True,
      "data_parallel_size": 1,
      "expert_parallel_size": 1,
      "tensor_model_parallel_size": 2,
      "max_num_batched_tokens": 8192,
      "max_model_len": null(int),
      "max_num_seqs": 1024,
      "load_format": "auto",
      "engine_kwargs": {},
      "limit_images": null(int),
      "enable_chunked_prefill": True,
      "enable_prefix_caching": True,
      "disable_log_stats": True,
      "skip_tokenizer_init": False,
      "prompt_length": 2048,
      "response_length": 2048,
      # verl 0.9's reward.reward_model.rollout, a full rollout config
      "pipeline_model_parallel_size": 1,
      "layered_summon": False,
      "scheduling_policy": "fcfs",
      "full_determinism": False,
      "seed": 42,
      "multi_stage_wake_up": False,
      "ignore_eos": False,
      "temperature": 1.0,
      "top_k": -1,
      "top_p": 1.0,
      "do_sample": True,
      "n": 1,
      "quantization": null(str),
      "quantization_config_file": null(str),
      "mtp": null(dict),
      "disaggregation": disaggregation(),
  })
