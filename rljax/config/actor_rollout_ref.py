"""verl's `actor_rollout_ref` node: the policy's model, the actor, the reference and the rollout."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict, FieldReference

from rljax.config.engines import (QAT_IGNORED, checkpoint, fsdp_config, megatron, megatron_lora, mtp, optim, profiler,
                                  qat, router_replay)
from rljax.config.fields import any_value, follow, null, older_rollout_is
from rljax.config.lora import lora_defaults


def build_model() -> ConfigDict:
  """The policy's model node, shared by actor, rollout and reference."""
  return ConfigDict({
      "path": "~/models/deepseek-llm-7b-chat",
      "external_lib": null(str),
      "override_config": {
          "attn_implementation": "flash_attention_2",
          "model_config": {},
          "moe_config": {"freeze_moe_router": False},
      },
      "enable_gradient_checkpointing": False,
      "enable_activation_offload": False,
      "trust_remote_code": False,
      "use_remove_padding": True,
      "use_liger": False,
      "use_fused_kernels": False,
      "fused_kernel_options": {"impl_backend": "torch"},
      "use_shm": False,
      "scan_layers": False,
      "remat_policy": "full",
      "attention_kernel": "auto",
      "share_prompt_forward": True,
      **lora_defaults(),
      "hf_config_path": null(str),
      "tokenizer_path": null(str),
      "custom_chat_template": null(str),
      "exclude_modules": any_value(None),
      "lora_adapter_path": null(str),
      "tiled_mlp": {"enabled": False, "num_shards": 4},
      "mtp": mtp(),
      "lora": megatron_lora(),
  })


def build_actor() -> ConfigDict:
  """The actor: batch geometry, PPO loss, optimizer, engine configs."""
  return ConfigDict({
      "strategy": "fsdp",
      "ppo_mini_batch_size": 256,
      "ppo_micro_batch_size": null(int),
      "ppo_micro_batch_size_per_gpu": FieldReference(8, field_type=int),
      "use_dynamic_bsz": False,
      "ppo_max_token_len_per_gpu": 16384,
      "grad_clip": 1.0,
      "clip_ratio": 0.2,
      "clip_ratio_low": 0.2,
      "clip_ratio_high": 0.2,
      "clip_ratio_c": 3.0,
      "tau_pos": 1.0,
      "tau_neg": 1.05,
      "loss_agg_mode": "token-mean",
      "loss_scale_factor": null(float),
      "entropy_coeff": 0.0,
      "entropy_from_logits_with_chunking": False,
      "entropy_from_logits_chunk_size": 2048,
      "entropy_checkpointing": False,
      "pad_to_length": False,
      "qat": qat(list(QAT_IGNORED)),
      "use_kl_loss": False,
      "kl_loss_coef": 0.001,
      "kl_loss_type": "low_var_kl",
      "policy_loss": {
          "loss_mode": "vanilla",
          "clip_cov_ratio": 0.0002,
          "clip_cov_lb": 1.0,
          "clip_cov_ub": 5.0,
          "kl_cov_ratio": 0.0002,
          "ppo_kl_coef": 0.1,
          "dro_beta": null(float),
          "aipo_rho": null(float),
      },
      "positive_nll_coef": null(float),
      "unbiased_loss_max_tokens": null(int),
      **older_rollout_is(),
      "use_torch_compile": True,
      "ppo_epochs": 1,
      "data_loader_seed": 42,
      "shuffle": False,
      "ulysses_sequence_parallel_size": 1,
      "tensor_model_parallel_size": 1,
      "optim": optim(lr=1e-6, weight_decay=0.01),
      "fsdp_config": fsdp_config(),
      "checkpoint": checkpoint(strict=True),
      "profiler": profiler(),
      "freeze_vision_tower": False,
      "calculate_entropy": False,
      "use_prefix_grouper": False,
      "router_replay": router_replay(),
      "calculate_sum_pi_squared": False,
      "sum_pi_squared_checkpointing": False,
      "megatron": megatron(router_replay_node=False),
  })


def build_ref(actor: ConfigDict) -> ConfigDict:
  """The frozen reference; its batch keys follow the actor's."""
  return ConfigDict({
      "strategy": "fsdp",
      "fsdp_config": fsdp_config(forward_only=True),
      "use_torch_compile": follow(actor, "use_torch_compile"),
      "log_prob_micro_batch_size": null(int),
      "log_prob_micro_batch_size_per_gpu": 16,
      "log_prob_use_dynamic_bsz": follow(actor, "use_dynamic_bsz"),
      "log_prob_max_token_len_per_gpu": follow(actor, "ppo_max_token_len_per_gpu"),
      "ulysses_sequence_parallel_size": follow(actor, "ulysses_sequence_parallel_size"),
      "profiler": profiler(),
      "router_replay": router_replay(),
      "entropy_from_logits_with_chunking": False,
      "entropy_from_logits_chunk_size": 2048,
      "entropy_checkpointing": False,
      "pad_to_length": False,
      "megatron": megatron(forward_only=True),
  })


def build_rollout(data: ConfigDict, actor: ConfigDict) -> ConfigDict:
  """The rollout: sampling, lengths (following `data`'s), the engine's capacity."""
  return ConfigDict({
      "name": "vllm",
      "mode": "async",
      "temperature": 1.0,
      "top_k": -1,
      "top_p": 1.0,
      "use_fire_sampling": False,
      "prompt_length": follow(data, "max_prompt_length"),
      "response_length": follow(data, "max_response_length"),
      "dtype": "bfloat16",
      "gpu_memory_utilization": 0.5,
      "ignore_eos": False,
      "enforce_eager": False,
      "free_cache_engine": True,
      "load_format": "dummy",
      "tensor_model_parallel_size": 2,
      "nnodes": 0,
      "n_gpus_per_node": 8,
      "max_num_batched_tokens": 8192,
      "max_model_len": null(int),
      "max_num_seqs": 1024,
      "prefill_length_buckets": [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
      "cpu_dot_library": "auto",
      "kv_cache_dtype": "auto",
      "log_prob_micro_batch_size": null(int),
      "log_prob_micro_batch_size_per_gpu": 16,
      "log_prob_use_dynamic_bsz": follow(actor, "use_dynamic_bsz"),
      "log_prob_max_token_len_per_gpu": follow(actor, "ppo_max_token_len_per_gpu"),
      "disable_log_stats": True,
      "enable_chunked_prefill": True,
      "do_sample": True,
      "n": 1,
      "calculate_log_probs": True,
      "engine_kwargs": {
          "vllm": {"swap_space": null(int)},
          "sglang": {"attention_backend": null(str)},
          "trtllm": {},
      },
      "val_kwargs": {
          "top_k": -1,
          "top_p": 1.0,
          "temperature": 0.0,
          "n": 1,
          "do_sample": False,
      },
      "multi_turn": {
          "enable": False,
          "max_turns": null(int),
          "tool_config_path": null(str),
          "completion_callback": null(str),
          "use_inference_chat_template": False,
          "enable_tokenization_sanity_check": null(bool),
          "max_assistant_turns": null(int),
          "max_user_turns": null(int),
          "max_parallel_calls": 1,
          "max_tool_response_length": 256,
          "tool_response_truncate_side": "middle",
          "interaction_config_path": null(str),
          "tokenization_sanity_check_mode": "strict",
          "format": "hermes",
          "num_repeat_rollouts": null(int),
          "tool_timeout_s": 30.0,
          "function_tool_path": null(str),
      },
      "agent": {
          "num_workers": 8,
          "default_agent_loop": "single_turn_agent",
          "agent_loop_config_path": null(str),
          "custom_async_server": {"path": null(str), "name": null(str)},
      },
      **_rollout_engine_keys(),
  })


def disaggregation() -> ConfigDict:
  """verl 0.9's prefill/decode disaggregation of an inference server (SGLang)."""
  return ConfigDict({"enabled": False, "prefill_replicas": 1, "decode_replicas": 1,
                     "decode_tensor_model_parallel_size": null(int), "transfer_backend": "nixl",
                     "bootstrap_port": null(int), "ib_device": null(str)})


def _rollout_engine_keys() -> dict[str, Any]:
  """Rollout keys of verl's inference servers (vLLM, SGLang, TensorRT-LLM) that rljax's engine does not read.

  Each is ignored, or an error where a value other than verl's default would
  change the samples (`UNIMPLEMENTED_VALUES`).
  """
  return {
      "cudagraph_capture_sizes": null(list),
      "data_parallel_size": 1,
      "expert_parallel_size": 1,
      "pipeline_model_parallel_size": 1,
      "enable_prefix_caching": True,
      "logprobs_mode": "processed_logprobs",
      "scheduling_policy": "fcfs",
      "over_sample_rate": 0.0,
      "multi_stage_wake_up": False,
      "checkpoint_engine": {"backend": "naive", "update_weights_bucket_megabytes": 2048, "engine_kwargs": {},
                            "custom_backend_module": null(str)},
      "trace": {"backend": null(str), "token2text": False, "max_samples_per_step_per_worker": null(int),
                "project_name": null(str), "experiment_name": null(str)},
      "skip_rollout": False,
      "skip_dump_dir": "/tmp/rollout_dump",
      "skip_tokenizer_init": True,
      "enable_rollout_routing_replay": False,
      "profiler": profiler(rollout=True),
      "disaggregation": disaggregation(),
      "full_determinism": False,
      "seed": 42,
      "moe_load_balance_metrics_interval": 0,
      "router_config_path": null(str),
      "qat": qat(list(QAT_IGNORED)),  # verl's copy of the actor engine's
      "prometheus": {
          "enable": False,
          "port": 9090,
          "file": "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
          "served_model_name": null(str),
      },
      "quantization": null(str),
      "quantization_config_file": null(str),
      "mtp": mtp(),
      "layer_name_map": {"qkv_layer_name": "qkv", "gate_proj_layer_name": "gate_up"},
      "layered_summon": False,
  }
