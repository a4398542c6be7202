"""verl's engine configs, shared by several roles: optimizer, FSDP, Megatron, profiler, checkpoint.

Each builder returns a fresh node with verl's defaults; the tables name the
engine keys that `keys` marks ignored or mapped and `mapping` reads.
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict

from rljax.config.fields import follow, null

# Keys of verl's FSDP engine config (`fsdp_config`) that only tune PyTorch:
# key -> verl's default. `keys.KEYS` marks every one ignored.
_FSDP_ENGINE_KEYS = {
    "use_orig_params": False,
    "seed": 42,
    "full_determinism": False,
    "ulysses_sequence_parallel_size": 1,
    "entropy_from_logits_with_chunking": False,
    "use_torch_compile": True,
    "entropy_checkpointing": False,
    "strategy": "fsdp",
    "entropy_from_logits_chunk_size": 2048,
    "pad_to_length": False,
    "pad_to_length_bucket": 1024,
    "use_no_sync_for_gradient_accumulation": False,
}
# verl's Megatron parallel sizes that rljax maps onto the actor's mesh: key -> mesh key.
MEGATRON_MESH_KEYS = {
    "tensor_model_parallel_size": "actor_rollout_ref.actor.tensor_model_parallel_size",
    "context_parallel_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
}
# verl's Megatron engine config (`megatron`): key -> verl's default.
_MEGATRON_KEYS = {
    "param_offload": False,
    "grad_offload": False,
    "optimizer_offload": False,
    "tensor_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
    "use_dist_checkpointing": False,
    "dist_checkpointing_path": None,
    "dist_checkpointing_prefix": "",
    "seed": 42,
    "use_mbridge": True,
    "vanilla_mbridge": False,
    "use_remove_padding": True,
    "forward_only": False,
    "dtype": "bfloat16",
    "dynamic_context_parallel": False,
    "max_seqlen_per_dp_cp_rank": None,
    "dist_ckpt_optim_fully_reshardable": False,
    "distrib_optim_fully_reshardable_mem_efficient": False,
    "entropy_from_logits_with_chunking": False,
    "entropy_from_logits_chunk_size": 2048,
    "pad_bshd_to_minibatch_max": True,
    "pad_to_length": False,
    "pad_to_length_bucket": 512,
    "use_megatron_fsdp": False,
}
# Megatron optimizer keys that shape the learning-rate schedule (a non-default value is an error).
MEGATRON_SCHEDULE_KEYS = (
    "lr_warmup_init", "lr_decay_steps", "lr_decay_style", "min_lr", "weight_decay_incr_style",
    "lr_wsd_decay_style", "lr_wsd_decay_steps")
MEGATRON_FREE_FORM = ("override_ddp_config", "override_transformer_config", "override_mcore_model_config")
PROFILED_SECTIONS = (
    "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic", "reward_model")
OPTIM_SECTIONS = ("actor_rollout_ref.actor", "critic")


def optim(lr: float, weight_decay: float) -> ConfigDict:
  """verl's optimizer config with a role's learning rate and weight decay."""
  return ConfigDict({
      "lr": lr,
      "lr_warmup_steps": -1,
      "lr_warmup_steps_ratio": 0.0,
      "min_lr_ratio": 0.0,
      "num_cycles": 0.5,
      "lr_scheduler_type": "constant",
      "warmup_style": null(str),
      "zero_indexed_step": True,
      "total_training_steps": -1,
      "weight_decay": weight_decay,
      "optimizer": "AdamW",
      "optimizer_impl": "torch.optim",
      "betas": [0.9, 0.999],
      "clip_grad": 1.0,
      # verl passes it to Megatron's optimizer in override_optimizer_config (no default there: unset)
      "optimizer_offload_fraction": null(float),
      "overlap_cpu_optimizer_d2h_h2d": null(bool),
      "optimizer_cpu_offload": null(bool),
      "use_precision_aware_optimizer": False,
      **_megatron_optim(),
  })


def _megatron_optim() -> dict[str, Any]:
  """The learning-rate schedule keys of verl's Megatron optimizer config."""
  return {
      "lr_warmup_init": 0.0,
      "lr_decay_steps": null(int),
      "lr_decay_style": "constant",
      "min_lr": 0.0,
      "weight_decay_incr_style": "constant",
      "lr_wsd_decay_style": "exponential",
      "lr_wsd_decay_steps": null(int),
      "use_checkpoint_opt_param_scheduler": False,
      "main_grads_dtype": "fp32",
      "exp_avg_dtype": "fp32",
      "exp_avg_sq_dtype": "fp32",
      "use_layer_wise_distributed_optimizer": False,
      **MUON_KEYS,
  }


# verl 0.9's Megatron Muon optimizer arguments: key -> default (read only with optim.optimizer=muon)
MUON_KEYS = {
    "muon_momentum": 0.95,
    "muon_nesterov": False,
    "muon_split_qkv": True,
    "muon_scale_mode": "spectral",
    "muon_coefficient_type": "quintic",
    "muon_num_ns_steps": 5,
    "muon_tp_mode": "blockwise",
    "muon_fp32_matmul_prec": "medium",
    "muon_extra_scale_factor": 1.0,
    "muon_scalar_optimizer": "adam",
    "muon_match_adamw_update_rms": False,
}


def megatron_lora() -> ConfigDict:
  """verl's Megatron LoRA config (`model.lora`)."""
  return ConfigDict({
      "type": "lora",
      "merge": False,
      "rank": 0,
      "alpha": 32,
      "dropout": 0.0,
      "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
      "exclude_modules": [],
      "dropout_position": "pre",
      "lora_A_init_method": "xavier",
      "lora_B_init_method": "zero",
      "a2a_experimental": False,
      "dtype": null(str),
      "adapter_path": null(str),
      "freeze_vision_model": True,
      "freeze_vision_projection": True,
      "freeze_language_model": True,
  })


def fsdp_config(forward_only: bool = False) -> ConfigDict:
  """verl's FSDP engine config; `forward_only` for a role that never updates (the reference)."""
  return ConfigDict({
      **_FSDP_ENGINE_KEYS,
      "forward_only": forward_only,
      "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
      "wrap_policy": {"min_num_params": 0},
      "param_offload": False,
      "optimizer_offload": False,
      "offload_policy": False,
      "reshard_after_forward": True,
      "forward_prefetch": False,
      "fsdp_size": -1,
      "model_dtype": "fp32",
      "dtype": "bfloat16",
      "qat": qat(list(QAT_IGNORED)),
      "turbo_config": turbo_config(),
  })


def profiler(rollout: bool = False) -> ConfigDict:
  """verl's per-role profiler options (Nsight, NPU, torch, msprobe's precision debugger); the `rollout`'s also
  bound what it profiles by token counts."""
  node = ConfigDict({
      "tool": null(str),
      "enable": False,
      "discrete": False,
      "all_ranks": False,
      "ranks": [],
      "save_path": null(str),
      "relocate_results": False,
      "finish_hook_cmd": null(str),
      "finish_hook_all_ranks": False,
      "finish_hook_ranks": [],
      "tool_config": {
          "nsys": {"discrete": False},
          "npu": {"contents": [], "level": "level0", "analysis": True, "discrete": False},
          "torch": {"contents": [], "discrete": False,
                    "schedule": {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0}},
          "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32, "memory_snapshot_num_steps": 1},
          "precision_debugger": {"config_path": null(str), "steps": null(list), "stages": null(list),
                                 "strict": False},
      },
  })
  if rollout:
    for tool in ("npu", "torch"):
      node.tool_config[tool].profile_token_start = null(int)
      node.tool_config[tool].profile_token_end = null(int)
  return node


def megatron(forward_only: bool = False, router_replay_node: bool = True) -> ConfigDict:
  """verl's Megatron engine config: parallel sizes, offload, checkpoint format and Megatron-LM overrides (and
  verl 0.9's copy of the role's router replay, except where `router_replay_node` is False: the actor's, which
  rljax reads as actor.router_replay, `rljax.config.overrides.VERL_09_PATHS`)."""
  nulls = {"expert_tensor_parallel_size": int, "virtual_pipeline_model_parallel_size": int,
           "dist_checkpointing_path": str, "max_seqlen_per_dp_cp_rank": int}
  node = ConfigDict({key: null(nulls[key]) if key in nulls else value for key, value in _MEGATRON_KEYS.items()})
  node.forward_only = forward_only
  node.override_ddp_config = {}
  node.override_transformer_config = {
      "recompute_granularity": null(str),
      "recompute_modules": ["core_attn"],
      "recompute_method": null(str),
      "recompute_num_layers": null(int),
      "attention_backend": "flash",
  }
  node.override_mcore_model_config = {}
  if router_replay_node:
    node.router_replay = router_replay()
  node.qat = qat(["lm_head", "*mlp.gate"], null(str))
  return node


def qat(ignore_patterns: list[str], activation_observer: Any = "static_minmax") -> ConfigDict:
  """verl 0.9's quantization-aware training config (an engine's or the actor's)."""
  return ConfigDict({
      "enable": False,
      "mode": "w4a16",
      "group_size": 16,
      "ignore_patterns": ignore_patterns,
      "activation_observer": activation_observer,
      "quantization_config_path": null(str),
  })


QAT_IGNORED = ["lm_head", "embed_tokens", "re:.*mlp.gate$"]  # verl's FSDP default of qat.ignore_patterns


def turbo_config() -> ConfigDict:
  """verl 0.9's FSDP "turbo" engine's parallel plan."""
  return ConfigDict({"distributed": {
      "fully_shard_parallel_size": 16,
      "tensor_parallel_size": 1,
      "expert_parallel_size": 1,
      "expert_fully_shard_parallel_size": 1,
      "ulysses_parallel_size": 1,
      "fsdp_plan": {"param_dtype": "bf16", "reduce_dtype": "fp32", "output_dtype": "bf16",
                    "fsdp_implementation": "native", "num_to_forward_prefetch": 1, "num_to_backward_prefetch": 1},
  }})


def mtp() -> ConfigDict:
  """verl's multi-token-prediction options."""
  return ConfigDict({
      "enable": False,
      "enable_train": False,
      "enable_rollout": False,
      "detach_encoder": False,
      "mtp_loss_scaling_factor": 0.1,
      "speculative_algorithm": "EAGLE",
      "speculative_num_steps": 3,
      "speculative_eagle_topk": 1,
      "speculative_num_draft_tokens": 4,
      "method": "mtp",
      "num_speculative_tokens": 1,
  })


def router_replay() -> ConfigDict:
  """verl's MoE router replay options."""
  return ConfigDict({"mode": "disabled", "record_file": null(str), "replay_file": null(str)})


def checkpoint(strict: bool = False) -> ConfigDict:
  """What a role's checkpoints hold; load_contents follows save_contents (`strict`: the actor's, with verl 0.9's
  strict-loading switch)."""
  node = ConfigDict({
      "contents": null(list),
      "save_contents": ["model", "optimizer", "extra"],
      "async_save": False,
  })
  if strict:
    node.strict = True
  node.load_contents = follow(node, "save_contents")
  return node
