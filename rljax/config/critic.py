"""verl's `critic` node: the value model of PPO (`algorithm.adv_estimator=gae`)."""

from __future__ import annotations

from ml_collections import ConfigDict

from rljax.config.engines import checkpoint, fsdp_config, megatron, megatron_lora, mtp, optim, profiler
from rljax.config.fields import any_value, follow, null


def build_critic(arr: ConfigDict) -> ConfigDict:
  """The critic; its model and batch keys follow the policy's (`arr`: actor_rollout_ref)."""
  actor, rollout, model = arr.actor, arr.rollout, arr.model
  critic = ConfigDict({
      "enable": null(bool),
      "rollout_n": follow(rollout, "n"),
      "strategy": "fsdp",
      "optim": optim(lr=1e-5, weight_decay=0.01),
      "model": {
          "path": follow(model, "path"),
          "tokenizer_path": follow(model, "path"),
          "override_config": {"moe_config": {"freeze_moe_router": False}},
          "external_lib": follow(model, "external_lib"),
          "enable_gradient_checkpointing": follow(model, "enable_gradient_checkpointing"),
          "enable_activation_offload": False,
          "use_remove_padding": True,
          "trust_remote_code": False,
          "fsdp_config": fsdp_config(),
          "use_shm": False,
          "lora_rank": 0,
          "lora_alpha": 16,
          "target_modules": any_value("all-linear"),
          "tiled_mlp": {"enabled": False, "num_shards": 4},
          "lora": megatron_lora(),
          # verl 0.9's critic model is an HF model config like the policy's
          "hf_config_path": null(str),
          "custom_chat_template": null(str),
          "exclude_modules": any_value(None),
          "lora_adapter_path": null(str),
          "use_liger": False,
          "use_fused_kernels": False,
          "fused_kernel_options": {"impl_backend": "torch"},
          "mtp": mtp(),
      },
      "ppo_mini_batch_size": follow(actor, "ppo_mini_batch_size"),
      "ppo_micro_batch_size": null(int),
      "ppo_micro_batch_size_per_gpu": follow(actor, "ppo_micro_batch_size_per_gpu"),
      "forward_micro_batch_size": null(int),
      "use_dynamic_bsz": follow(actor, "use_dynamic_bsz"),
      "ppo_max_token_len_per_gpu": 32768,
      "ulysses_sequence_parallel_size": 1,
      "ppo_epochs": follow(actor, "ppo_epochs"),
      "shuffle": follow(actor, "shuffle"),
      "grad_clip": 1.0,
      "cliprange_value": 0.5,
      "loss_agg_mode": follow(actor, "loss_agg_mode"),
      "loss_scale_factor": follow(actor, "loss_scale_factor"),
      "use_torch_compile": True,
      "checkpoint": checkpoint(),
      "data_loader_seed": 42,
      "profiler": profiler(),
      "megatron": megatron(),
  })
  critic.forward_micro_batch_size_per_gpu = follow(critic, "ppo_micro_batch_size_per_gpu")
  critic.forward_max_token_len_per_gpu = follow(critic, "ppo_max_token_len_per_gpu")
  return critic
