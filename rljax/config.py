"""verl's PPO-trainer configuration tree as an ml_collections ConfigDict.

`get_base_config()` builds every key of verl's `ppo_trainer.yaml` (the key
paths of `verl_ppo_keys.txt`, and every key of verl's generated FSDP and
Megatron trainer configs in `tests/reference`) with the defaults verl's
documents give; where the documents disagree, the newer one wins. verl's `${...}` interpolations are
`FieldReference`s: `actor_rollout_ref.rollout.response_length` follows
`data.max_response_length` until it is set itself.

Three tables say what each key means in rljax:

* `IGNORED_KEYS`: keys that only mean something to PyTorch, Ray, vLLM, SGLang
  or Nsight. They are accepted so a verl launch line pastes over, and do
  nothing.
* `MAPPED_KEYS`: verl keys whose meaning changes on a JAX device mesh.
* `RLJAX_KEYS`: keys rljax adds to the tree (mesh rules, engine buckets,
  LoRA extras, cosmos-rl's loss terms), named in verl's style.

`DEPRECATED_KEYS` are still read: `finalize()` maps them onto their
replacements and warns once. `validate()` checks every cross-key rule before
any work starts and raises `ConfigError`, which names the key, the bad value
and the fix. `apply_overrides()` reads both override syntaxes
(`--config.a.b=v` and verl's `a.b=v`) with one parser, so they agree, and
Hydra's `+a.b=v`, `++a.b=v` and `~a.b`. `VERL_FREE_FORM` maps the entries
of verl's free-form dictionaries (DAPO's `reward_kwargs`, HF fields of
`override_config`) onto rljax's keys.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from typing import Any, Callable, Iterable, Sequence

import yaml
from ml_collections import ConfigDict, FieldReference

# The names kernels register under (`rljax.algos` registries); a test keeps
# these tuples equal to the registries.
ADV_ESTIMATORS = (
    "gae", "grpo", "grpo_vectorized", "gdpo", "grpo_passk",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo",
    "rloo_vectorized", "opo", "gpg", "optimal_token_baseline",
    "tir_optimal_token_baseline",
)
POLICY_LOSSES = (
    "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov",
    "kl_cov", "geo_mean", "dro", "cispo", "bypass_mode", "aipo",
)
# Estimators that compare the n responses of one prompt with each other.
GROUP_ESTIMATORS = (
    "grpo", "grpo_vectorized", "gdpo", "grpo_passk",
    "reinforce_plus_plus_baseline", "rloo", "rloo_vectorized", "opo", "gpg",
    "optimal_token_baseline", "tir_optimal_token_baseline",
)
LOSS_AGG_MODES = (
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
_KL_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_TYPES = _KL_BASE + tuple(k + "+" for k in _KL_BASE) + ("full",)
TRUNCATIONS = ("error", "left", "right", "middle")
RESUME_MODES = ("auto", "disable", "resume_path")
LR_SCHEDULERS = ("constant", "cosine")
KL_CONTROLLERS = ("fixed", "adaptive")
REWARD_MANAGERS = ("naive", "prime", "dapo", "batch")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
ROLLOUT_NAMES = ("jetstream", "vllm", "sglang", "hf")
CPU_DOT_LIBRARIES = ("auto", "ynnpack", "eigen")
DEVICES = ("auto", "cpu", "gpu", "cuda", "tpu")
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_IS_MODES = ("truncate", "mask")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
# `optim.optimizer` names that mean rljax's AdamW (verl's FSDP default, and Megatron's 'adam', also decoupled).
ADAM_NAMES = ("adamw", "adam")
# verl's default of `grad_clip` and `optim.clip_grad`.
GRAD_CLIP_DEFAULT = 1.0
DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")

# Keys of verl's FSDP engine config (`fsdp_config`) that only tune PyTorch:
# key -> verl's default. Every one is ignored (`IGNORED_KEYS`).
_FSDP_ENGINE_KEYS = {
    "use_orig_params": False,
    "seed": 42,
    "full_determinism": False,
    "ulysses_sequence_parallel_size": 1,
    "entropy_from_logits_with_chunking": False,
    "use_torch_compile": True,
    "entropy_checkpointing": False,
    "strategy": "fsdp",
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
    "vanilla_mbridge": True,
    "use_remove_padding": True,
    "forward_only": False,
    "dtype": "bfloat16",
}
# Megatron optimizer keys that shape the learning-rate schedule (a non-default value is an error).
_MEGATRON_SCHEDULE_KEYS = (
    "lr_warmup_init", "lr_decay_steps", "lr_decay_style", "min_lr", "weight_decay_incr_style",
    "lr_wsd_decay_style", "lr_wsd_decay_steps")
_MEGATRON_FREE_FORM = ("override_ddp_config", "override_transformer_config", "override_mcore_model_config")
_FSDP_ENGINE_SECTIONS = (
    "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.model.fsdp_config")
PROFILED_SECTIONS = (
    "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic", "reward_model")
_OPTIM_SECTIONS = ("actor_rollout_ref.actor", "critic")


def _engine_ignored() -> dict[str, str]:
  """`IGNORED_KEYS` entries for the PyTorch-only keys of verl's engine configs."""
  ignored = {f"{section}.{key}": "a PyTorch FSDP engine setting; the mesh and the actor's keys set rljax's sharding"
             for section in _FSDP_ENGINE_SECTIONS for key in _FSDP_ENGINE_KEYS}
  for section in _FSDP_ENGINE_SECTIONS:
    ignored[f"{section}.mixed_precision.*"] = "PyTorch FSDP's dtypes; fsdp_config.model_dtype and dtype set rljax's"
  ignored["actor_rollout_ref.actor.fsdp_config.forward_only"] = "verl's engine flag for roles that never update"
  ignored["critic.model.fsdp_config.forward_only"] = "verl's engine flag for roles that never update"
  for section in ("actor_rollout_ref.actor", "critic"):
    ignored[f"{section}.optim.optimizer_impl"] = "the module verl imports the optimizer from; rljax's AdamW is optax's"
  for section in PROFILED_SECTIONS:
    for key in ("tool", "discrete", "all_ranks", "ranks", "save_path", "tool_config.*"):
      ignored[f"{section}.profiler.{key}"] = ("Nsight/NPU/torch profiler options; rljax records jax.profiler traces "
                                              "(profiler.enable, global_profiler.steps)")
  for section in ("actor_rollout_ref.ref.megatron", "critic.megatron", "reward_model.megatron"):
    ignored[f"{section}.*"] = "Megatron-LM settings; this model is sharded on the actor's mesh"
  for key in _MEGATRON_KEYS:
    if key not in MEGATRON_MESH_KEYS and key != "expert_model_parallel_size":
      ignored[f"actor_rollout_ref.actor.megatron.{key}"] = (
          "a Megatron-LM setting (offload, pipelining, checkpoint format, kernels)")
  for key in _MEGATRON_FREE_FORM:
    ignored[f"actor_rollout_ref.actor.megatron.{key}"] = "Megatron-LM settings"
  return ignored


IGNORED_KEYS = {
    "actor_rollout_ref.hybrid_engine": "rljax always shares one set of parameter arrays between trainer and rollout",
    "actor_rollout_ref.model.external_lib": "registers PyTorch/HF classes; rljax models are chosen by config.json",
    "actor_rollout_ref.model.trust_remote_code": "rljax runs no model code from checkpoints",
    "actor_rollout_ref.model.use_remove_padding": "XLA needs static shapes; padding is masked instead",
    "actor_rollout_ref.model.use_liger": "a Triton kernel library for PyTorch",
    "actor_rollout_ref.model.use_fused_kernels": "XLA fuses on its own",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "XLA fuses on its own",
    "actor_rollout_ref.model.enable_activation_offload": "PyTorch activation offload",
    "actor_rollout_ref.model.use_shm": "shared-memory model loading for Ray workers",
    "actor_rollout_ref.model.override_config.attn_implementation": "HF's attention choice; rljax's is actor_rollout_ref.model.attention_kernel",
    "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router": "Megatron only",
    "actor_rollout_ref.actor.strategy": "FSDP/Megatron choice; rljax shards with a device mesh",
    "actor_rollout_ref.actor.use_torch_compile": "everything is jax.jit-compiled",
    "actor_rollout_ref.actor.data_loader_seed": "a Megatron RNG work-around; data.seed drives the data order",
    "actor_rollout_ref.actor.entropy_checkpointing": "rematerialisation is set by model.enable_gradient_checkpointing",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "PyTorch FSDP CPU offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "PyTorch FSDP CPU offload",
    "actor_rollout_ref.actor.fsdp_config.offload_policy": "PyTorch FSDP2 offload",
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": "XLA schedules all-gathers",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": "XLA schedules all-gathers",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": "sharding follows logical-axis rules, not module wrapping",
    "actor_rollout_ref.model.override_config.moe_config.*": "Megatron only",
    "actor_rollout_ref.ref.strategy": "FSDP/Megatron choice",
    "actor_rollout_ref.ref.use_torch_compile": "everything is jax.jit-compiled",
    "actor_rollout_ref.ref.fsdp_config.*": "the reference model is sharded like the actor",
    "actor_rollout_ref.rollout.mode": "the engine is always in-process",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "the KV cache is sized from max_num_seqs and the lengths",
    "actor_rollout_ref.rollout.enforce_eager": "CUDA graphs; XLA compiles the decode step",
    "actor_rollout_ref.rollout.load_format": "the engine reads the trainer's arrays in place",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "vLLM scheduler budget; prefill runs per request bucket",
    "actor_rollout_ref.rollout.enable_chunked_prefill": "vLLM option",
    "actor_rollout_ref.rollout.disable_log_stats": "vLLM option",
    "actor_rollout_ref.rollout.use_fire_sampling": "not implemented by the JetStream engine (true is an error)",
    "actor_rollout_ref.rollout.engine_kwargs.*": "vLLM/SGLang engine arguments",
    "actor_rollout_ref.rollout.agent.*": "Ray async server classes",
    "actor_rollout_ref.rollout.multi_turn.*": "multi-turn tool rollouts are not available yet (enable=true is an error)",
    "critic.strategy": "FSDP/Megatron choice",
    "critic.model.override_config.moe_config.freeze_moe_router": "Megatron only",
    "critic.model.external_lib": "registers PyTorch/HF classes",
    "critic.model.trust_remote_code": "rljax runs no model code from checkpoints",
    "critic.model.use_remove_padding": "XLA needs static shapes",
    "critic.model.enable_activation_offload": "PyTorch activation offload",
    "critic.model.fsdp_config.wrap_policy.*": "sharding follows logical-axis rules, not module wrapping",
    "critic.model.fsdp_config.param_offload": "PyTorch FSDP CPU offload",
    "critic.model.fsdp_config.optimizer_offload": "PyTorch FSDP CPU offload",
    "critic.model.fsdp_config.offload_policy": "PyTorch FSDP2 offload",
    "critic.model.fsdp_config.reshard_after_forward": "XLA schedules all-gathers",
    "critic.model.fsdp_config.forward_prefetch": "XLA schedules all-gathers",
    "critic.model.fsdp_config.fsdp_size": "the critic is sharded on the actor's mesh",
    "critic.use_torch_compile": "everything is jax.jit-compiled",
    "reward_model.strategy": "FSDP/Megatron choice",
    "reward_model.model.external_lib": "registers PyTorch/HF classes",
    "reward_model.model.trust_remote_code": "rljax runs no model code from checkpoints",
    "reward_model.model.use_remove_padding": "XLA needs static shapes",
    "reward_model.model.use_fused_kernels": "XLA fuses on its own",
    "reward_model.model.use_shm": "shared-memory loading for Ray workers",
    "reward_model.model.fsdp_config.*": "the reward model is sharded like the actor",
    "reward_model.launch_reward_fn_async": "reward functions run in the reward manager's pool",
    "reward_model.sandbox_fusion.*": "remote code sandboxes are not called; no scorer runs model output as code",
    "data.use_shm": "shared-memory loading for Ray workers",
    "data.trust_remote_code": "tokenizers run no remote code",
    "data.image_key": "multimodal data is not supported yet (data with that column filled is an error)",
    "data.video_key": "multimodal data is not supported yet (data with that column filled is an error)",
    "ray_init.*": "no Ray: one JAX program per host",
    "trainer.ray_wait_register_center_timeout": "no Ray",
    "trainer.profile_steps": "Nsight profiling; use jax.profiler instead",
    "trainer.controller_nsight_options.*": "Nsight profiling",
    "trainer.worker_nsight_options.*": "Nsight profiling",
    "trainer.default_hdfs_dir": "HDFS copy of checkpoints; default_local_dir may be any path orbax writes (gs:// included)",
    "trainer.del_local_ckpt_after_load": "HDFS workflow",
    "trainer.remove_previous_ckpt_in_save": "deprecated in verl; trainer.max_actor_ckpt_to_keep=1 keeps only the latest",
    "actor_rollout_ref.actor.checkpoint.save_contents": "an orbax checkpoint always holds model, optimizer and extra state; HF weights come from rljax.export",
    "actor_rollout_ref.actor.checkpoint.load_contents": "a resume always restores model, optimizer and extra state",
    "critic.checkpoint.save_contents": "an orbax checkpoint always holds model, optimizer and extra state",
    "critic.checkpoint.load_contents": "a resume always restores model, optimizer and extra state",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": "entropy is always computed in vocabulary-sized chunks of tokens",
    "critic.rollout_n": "the critic's batch follows actor_rollout_ref.rollout.n",
    "algorithm.pf_ppo.*": "read only with algorithm.use_pf_ppo, which rljax does not implement (an error when true)",
    **_engine_ignored(),
    "actor_rollout_ref.nccl_timeout": "NCCL collective timeout; XLA's collectives have none to set",
    "actor_rollout_ref.actor.rollout_n": "verl's copy of actor_rollout_ref.rollout.n, which rljax reads",
    "actor_rollout_ref.actor.freeze_vision_tower": "rljax has no vision towers (multimodal data is an error)",
    "actor_rollout_ref.actor.calculate_entropy": "verl's engine switch for the entropy metric; it changes no update",
    "actor_rollout_ref.actor.use_prefix_grouper": "PyTorch prefix sharing; rljax's is actor_rollout_ref.model.share_prompt_forward",
    "actor_rollout_ref.actor.checkpoint.async_save": "orbax decides how a checkpoint is written; the saved state is the same",
    "actor_rollout_ref.actor.use_fused_kernels": "XLA fuses on its own",
    "actor_rollout_ref.actor.use_remove_padding": "XLA needs static shapes; padding is masked instead",
    "actor_rollout_ref.actor.router_replay.*": "MoE router replay; rljax has no MoE models",
    "actor_rollout_ref.actor.calculate_sum_pi_squared": "read by the optimal-token-baseline estimators, which the trainer rejects",
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": "read by the optimal-token-baseline estimators, which the trainer rejects",
    "actor_rollout_ref.ref.rollout_n": "verl's copy of actor_rollout_ref.rollout.n",
    "actor_rollout_ref.ref.router_replay.*": "MoE router replay; rljax has no MoE models",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": "entropy is always computed in vocabulary-sized chunks of tokens",
    "actor_rollout_ref.ref.entropy_checkpointing": "rematerialisation is set by model.enable_gradient_checkpointing",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": "CUDA graphs; XLA compiles the decode step",
    "actor_rollout_ref.rollout.data_parallel_size": "the rollout's data axis is the training mesh's",
    "actor_rollout_ref.rollout.expert_parallel_size": "rljax has no MoE models",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": "the rollout's mesh has no pipeline axis; it changes no sample",
    "actor_rollout_ref.rollout.enable_prefix_caching": "vLLM/SGLang prefix cache",
    "actor_rollout_ref.rollout.scheduling_policy": "vLLM scheduler order",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "vLLM/SGLang memory wake-up order",
    "actor_rollout_ref.rollout.checkpoint_engine.*": "how verl ships weights to the inference servers; the engine reads the trainer's arrays in place",
    "actor_rollout_ref.rollout.trace.*": "rollout tracing to mlflow/weave",
    "actor_rollout_ref.rollout.skip_dump_dir": "read only with skip_rollout, which rljax does not implement (an error when true)",
    "actor_rollout_ref.rollout.skip_tokenizer_init": "vLLM/SGLang tokenizer start-up",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": "MoE routing replay; rljax has no MoE models",
    "actor_rollout_ref.rollout.prometheus.*": "the inference servers' Prometheus metrics",
    "actor_rollout_ref.rollout.quantization_config_file": "read only with rollout.quantization, which rljax does not implement",
    "actor_rollout_ref.rollout.mtp.*": "verl's copy of actor_rollout_ref.model.mtp (enable=true is an error there)",
    "actor_rollout_ref.rollout.layered_summon": "PyTorch FSDP weight gathering for LoRA; the engine reads the trainer's arrays in place",
    "actor_rollout_ref.model.tiled_mlp.*": "tiling the MLP to save GPU memory; it changes no result",
    "actor_rollout_ref.model.mtp.*": "multi-token prediction heads (enable=true is an error)",
    "data.tool_config_path": "read only by multi-turn tool rollouts (multi_turn.enable=true is an error)",
    "data.image_patch_size": "multimodal data is not supported yet",
    "data.return_multi_modal_inputs": "multimodal data is not supported yet",
    "reward_manager.source": "where verl finds the reward manager; reward_manager.module.path set is an error",
    "critic.optim.optimizer_impl": "the module verl imports the optimizer from; rljax's AdamW is optax's",
    "critic.model.use_shm": "shared-memory model loading for Ray workers",
    "critic.model.lora_alpha": "read only with critic.model.lora_rank > 0 (an error: the critic trains in full)",
    "critic.model.target_modules": "read only with critic.model.lora_rank > 0 (an error: the critic trains in full)",
    "critic.model.tiled_mlp.*": "tiling the MLP to save GPU memory; it changes no result",
    "critic.data_loader_seed": "a Megatron RNG work-around; data.seed drives the data order",
    "critic.checkpoint.async_save": "orbax decides how a checkpoint is written; the saved state is the same",
    "reward_model.enable_resource_pool": "Ray resource pools",
    "reward_model.n_gpus_per_node": "Ray resource pools; the reward model runs on the actor's mesh",
    "reward_model.nnodes": "Ray resource pools; the reward model runs on the actor's mesh",
    "reward_model.reward_loop_source": "where verl finds a reward loop; reward_loop_module_path set is an error",
    "reward_model.reward_loop_class_name": "read only with reward_loop_module_path (an error when set)",
    "reward_model.ulysses_sequence_parallel_size": "the reward model is sharded on the actor's mesh",
    "reward_model.use_reward_loop": "verl's async reward workers; reward functions run in the reward manager's pool",
    "reward_model.num_workers": "verl's reward-loop workers; reward_model.prime.num_workers sizes rljax's pool",
    "reward_model.rollout.*": "an inference server for generative reward models; rljax's reward model is a scorer",
    "critic.nccl_timeout": "NCCL collective timeout; XLA's collectives have none to set",
    "reward_model.nccl_timeout": "NCCL collective timeout; XLA's collectives have none to set",
    "actor_rollout_ref.rollout.layer_name_map.*": "Megatron-to-vLLM weight names; the engine reads the trainer's arrays in place",
    **{f"{section}.optim.use_checkpoint_opt_param_scheduler": "a resume always restores the schedule's step"
       for section in _OPTIM_SECTIONS},
    "actor_rollout_ref.model.lora.*": "Megatron's LoRA config (lora.rank > 0 is an error: rljax's is model.lora_rank)",
    "critic.model.lora.*": "Megatron's LoRA config (lora.rank > 0 is an error: the critic trains in full)",
    "data.sampler.class_name": "read only with data.sampler.class_path (an error when set)",
    "data.datagen.name": "read only with data.datagen.path (an error when set)",
    "reward_manager.module.name": "read only with reward_manager.module.path (an error when set)",
    "trainer.esi_redundant_time": "elastic-server preemption margin of verl's cloud jobs",
    "trainer.use_legacy_worker_impl": "chooses between verl's Ray worker classes",
    "global_profiler.global_tool_config.*": "Nsight/torch profiler options; rljax records jax.profiler traces",
    "global_profiler.profile_continuous_steps": "each listed step is one jax.profiler trace of its own",
    "transfer_queue.*": "verl's Ray data-transfer queue",
    "ray_kwargs.*": "no Ray: one JAX program per host",
}

MAPPED_KEYS = {
    "global_profiler.steps": "steps (1-based) recorded as jax.profiler traces when a role's profiler.enable is true: "
                             "one TensorBoard/Perfetto trace per step in global_profiler.save_path/step_N",
    "global_profiler.save_path": "directory of the jax.profiler traces (one step_N folder per traced step)",
    "global_profiler.tool": "any tool (nsys, npu, torch, torch_memory) records a jax.profiler trace",
    **{f"{section}.profiler.enable": "true on any role traces the whole step at global_profiler.steps (the roles "
                                     "are one JAX program)" for section in PROFILED_SECTIONS},
    "trainer.nnodes": "number of JAX processes (hosts); 'auto' = jax.process_count()",
    "trainer.n_gpus_per_node": "devices per process; 'auto' = jax.local_device_count()",
    "trainer.device": "JAX platform: auto, cpu, gpu (cuda), tpu",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": "size of the mesh's fsdp axis; -1 = all devices left after tensor and sequence",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "size of the mesh's sequence axis",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "tensor-axis size of the rollout's mesh (same devices, data axis kept, fsdp the rest); when it differs from training's, the sampler's compute-dtype copy of the weights is resharded once per rollout",
    "actor_rollout_ref.rollout.name": "any value selects rljax's JetStream engine",
    "actor_rollout_ref.rollout.dtype": "activation, KV-cache and weight dtype of prefill and decode; weights already in it are read in place, others are cast once per rollout",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "dtype of the trained parameters (fp32, bf16, fp16)",
    "critic.model.fsdp_config.model_dtype": "dtype of the critic's parameters",
    "actor_rollout_ref.actor.fsdp_config.dtype": "compute dtype of the actor's and reference's forward and backward passes (mixed precision: parameters and optimizer state stay in model_dtype, each matmul reads its weight cast to this)",
    "critic.model.fsdp_config.dtype": "compute dtype of the critic's passes",
    "actor_rollout_ref.rollout.max_num_seqs": "decode slots of the engine (continuous batching)",
    "actor_rollout_ref.rollout.max_model_len": "checked only: the KV cache holds exactly max_prompt_length + response_length slots, so it must be at least that",
    "actor_rollout_ref.rollout.calculate_log_probs": "always on: the sampler returns each sampled token's log-prob (rollout_log_probs)",
    "actor_rollout_ref.rollout.free_cache_engine": "drop the KV cache between rollouts",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "micro-batch rows per data-parallel device; the global micro-batch is this times the data*fsdp axis size; null (an error in verl): the device's whole mini-batch in one pass, so a job runs on any device count",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "token budget per device for use_dynamic_bsz micro-batches",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "jax.checkpoint (remat) per decoder layer",
    "actor_rollout_ref.model.override_config.model_config": "fields that override the model's config.json",
    "trainer.default_local_dir": "orbax CheckpointManager directory",
    "trainer.logger": "console, jsonl, tensorboard, wandb (wandb honours WANDB_MODE=offline)",
    "actor_rollout_ref.actor.optim.clip_grad": "verl's newer name of actor_rollout_ref.actor.grad_clip: a value other than 1.0 sets it (both set, differently: an error)",
    "critic.optim.clip_grad": "verl's newer name of critic.grad_clip: a value other than 1.0 sets it (both set, differently: an error)",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "a value other than 1 sets actor_rollout_ref.actor.tensor_model_parallel_size (the training mesh's tensor axis; both set, differently: an error)",
    "actor_rollout_ref.actor.megatron.context_parallel_size": "a value other than 1 sets actor_rollout_ref.actor.ulysses_sequence_parallel_size (the mesh's sequence axis; both set, differently: an error)",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": "the mesh's expert axis; rljax has no MoE models yet, so a value above 1 is an error",
    **{f"{section}.optim.optimizer": "AdamW or adam (Megatron's name) select rljax's optax AdamW; another name is an error"
       for section in _OPTIM_SECTIONS},
    "reward_manager.name": "verl's newer name of reward_model.reward_manager: a value set here is read as it",
}

RLJAX_KEYS = {
    "trainer.seed": "seed of the JAX PRNG key (init, sampling, clip_cov)",
    "trainer.logical_axis_rules": "logical axis -> mesh axis pairs; parallelism is a config change",
    "actor_rollout_ref.actor.tensor_model_parallel_size": "size of the training mesh's tensor axis",
    "actor_rollout_ref.model.scan_layers": "scan over decoder layers: compile time flat in depth",
    "actor_rollout_ref.model.remat_policy": "with enable_gradient_checkpointing, what each layer keeps for the backward pass: full (only its input), attention (also its attention output), dots (every matmul output)",
    "actor_rollout_ref.model.attention_kernel": "auto (pallas on TPU, xla elsewhere), xla (dense dot-product attention) or pallas (splash attention for training, log-prob and prefill passes; ragged decode attention over the live cache)",
    "actor_rollout_ref.model.share_prompt_forward": "run each prompt once for its rollout.n responses in the log-prob, value and update passes (same numbers, less work)",
    "actor_rollout_ref.model.lora_rank": "LoRA rank (verl's name); > 0 trains only the actor's adapters (rljax.models.lora), 0 = full fine-tuning; the critic stays full",
    "actor_rollout_ref.model.lora_alpha": "LoRA alpha (verl's name): adapter scale alpha / r",
    "actor_rollout_ref.model.target_modules": "LoRA targets (verl's name): all-linear, or a list (or comma string) of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj",
    "actor_rollout_ref.model.lora_dropout": "cosmos-rl: dropout on the adapter input in the actor update only, seeded by the update's key",
    "actor_rollout_ref.model.use_rslora": "cosmos-rl: scale alpha / sqrt(r) instead of alpha / r",
    "actor_rollout_ref.model.modules_to_save": "cosmos-rl: base modules trained in full beside the adapters (embed_tokens, lm_head, norm, ...)",
    "actor_rollout_ref.model.alpha_pattern": "cosmos-rl: {regex: alpha} per HF module name (model.layers.0.self_attn.q_proj); first match wins",
    "actor_rollout_ref.model.r_pattern": "cosmos-rl: {regex: r} per HF module name; first match wins (uniform over layers with scan_layers)",
    "actor_rollout_ref.model.init_lora_weights": "cosmos-rl: true (A uniform +-1/sqrt(in), B=0) or gaussian (A normal std 1/r, B=0)",
    "actor_rollout_ref.rollout.prefill_length_buckets": "prompt lengths the engine pads to; one compilation per bucket",
    "actor_rollout_ref.rollout.cpu_dot_library": "on the CPU, what runs the decode step's matmuls: auto (Eigen at 8 to 24 slots per device, else YNNPACK), ynnpack or eigen",
    "actor_rollout_ref.actor.positive_nll_coef": "cosmos-rl: NLL term on positive-advantage responses",
    "actor_rollout_ref.actor.policy_loss.aipo_rho": "cosmos-rl: AIPO clip of the importance ratio (policy_loss.loss_mode=aipo)",
    "actor_rollout_ref.actor.unbiased_loss_max_tokens": "cosmos-rl (Dr.GRPO): sets loss_agg_mode=seq-mean-token-sum-norm with loss_scale_factor=this",
    "algorithm.gdpo_reward_keys": "gdpo: the reward components (extra-info keys) to normalise separately",
    "algorithm.gdpo_reward_weights": "gdpo: their weights (null = all 1)",
    "algorithm.unbiased_advantage": "cosmos-rl (Dr.GRPO): sets algorithm.norm_adv_by_std_in_grpo=false (group mean removed, no std division)",
    "reward_model.overlong_buffer.enable": "DAPO overlong penalty (verl recipe / cosmos-rl overlong_reward)",
    "reward_model.overlong_buffer.len": "DAPO overlong buffer length in tokens",
    "reward_model.overlong_buffer.penalty_factor": "DAPO overlong penalty factor",
    "reward_model.overlong_buffer.log": "log the overlong penalty per sample",
    "reward_model.overlong_buffer.max_resp_len": "DAPO recipe's max_resp_len (verl's reward_kwargs.max_resp_len); checked equal to data.max_response_length",
    "data.gen_batch_size": "DAPO recipe: prompts per generation round of dynamic sampling (algorithm.filter_groups)",
    "algorithm.filter_groups.enable": "DAPO recipe: dynamic sampling, keeping only prompt groups whose metric varies",
    "algorithm.filter_groups.metric": "DAPO recipe: acc, score (reward-function extra info), seq_reward or seq_final_reward",
    "algorithm.filter_groups.max_num_gen_batches": "DAPO recipe: generation rounds per step before giving up (<= 0: no limit)",
    "reward_model.prime.num_workers": "processes of the prime reward manager (null = CPU count)",
    "reward_model.prime.timeout_s": "per-sample scorer timeout of the prime reward manager",
    "data.dataloader_num_workers": "grain worker processes (verl's key; rljax defaults to 0, in-process)",
}

# Accepted keys whose non-default value would change the run: key -> (what rljax lacks, the fix).
UNIMPLEMENTED_VALUES = {
    "actor_rollout_ref.rollout.multi_turn.enable": (
        "multi-turn tool rollouts are not implemented: the run would roll out single turns",
        "set actor_rollout_ref.rollout.multi_turn.enable=false"),
    "actor_rollout_ref.rollout.use_fire_sampling": (
        "FIRE sampling (the first token at a higher temperature) is not implemented by the JetStream engine",
        "set actor_rollout_ref.rollout.use_fire_sampling=false"),
    "actor_rollout_ref.model.lora_adapter_path": (
        "starting from saved LoRA adapters is not implemented: the adapters would start fresh",
        "drop actor_rollout_ref.model.lora_adapter_path (merge the adapters into the model first)"),
    "actor_rollout_ref.model.exclude_modules": (
        "LoRA's exclude_modules is not implemented: the adapters would cover the excluded modules",
        "list the modules to adapt in actor_rollout_ref.model.target_modules instead"),
    "actor_rollout_ref.model.hf_config_path": (
        "a config.json apart from the weights is not read: the model's own would be used",
        "drop it, or copy the config.json into actor_rollout_ref.model.path"),
    "actor_rollout_ref.model.tokenizer_path": (
        "a tokenizer apart from the model is not read: the model's own would be used",
        "drop it, or copy the tokenizer files into actor_rollout_ref.model.path"),
    "actor_rollout_ref.model.custom_chat_template": (
        "a custom chat template is not applied: the tokenizer's own would be used",
        "drop it, or put the template in the tokenizer_config.json of actor_rollout_ref.model.path"),
    "actor_rollout_ref.model.mtp.enable": (
        "multi-token prediction is not implemented", "set actor_rollout_ref.model.mtp.enable=false"),
    "actor_rollout_ref.rollout.quantization": (
        "quantized rollouts are not implemented: the engine would sample at rollout.dtype",
        "drop actor_rollout_ref.rollout.quantization (rollout.dtype=bfloat16 is the closest)"),
    "actor_rollout_ref.rollout.logprobs_mode": (
        "the engine returns the log-probs of the processed (temperature, top-k, top-p) distribution only",
        "set actor_rollout_ref.rollout.logprobs_mode=processed_logprobs"),
    "actor_rollout_ref.rollout.over_sample_rate": (
        "over-sampling (aborting the slowest requests) is not implemented",
        "set actor_rollout_ref.rollout.over_sample_rate=0"),
    "actor_rollout_ref.rollout.skip_rollout": (
        "replaying dumped rollouts is not implemented", "set actor_rollout_ref.rollout.skip_rollout=false"),
    "critic.model.lora_rank": (
        "LoRA for the critic is not implemented: the critic trains in full", "set critic.model.lora_rank=0"),
    "critic.model.override_config": (
        "the critic's Hugging Face config overrides are not applied", "drop critic.model.override_config"),
    "reward_model.model.override_config": (
        "the reward model's Hugging Face config overrides are not applied", "drop reward_model.model.override_config"),
    "reward_model.reward_loop_module_path": (
        "custom reward loops are not implemented", "give a scoring function as custom_reward_function.path"),
    "reward_manager.module.path": (
        "custom reward-manager classes are not implemented",
        "give a scoring function as custom_reward_function.path, or pick reward_model.reward_manager"),
    "data.apply_chat_template_kwargs": (
        "extra chat-template arguments are not passed to the tokenizer", "drop data.apply_chat_template_kwargs"),
    "data.sampler.class_path": (
        "custom samplers are not implemented: the data order is data.shuffle's", "drop data.sampler.class_path"),
    **{f"{section}.optim.{key}": (
        "Megatron's learning-rate schedule is not implemented",
        f"drop {section}.optim.{key}; {section}.optim.lr_scheduler_type, lr_warmup_steps and min_lr_ratio "
        "set the schedule")
       for section in _OPTIM_SECTIONS for key in _MEGATRON_SCHEDULE_KEYS},
    **{f"{model}.lora.rank": (
        "Megatron's LoRA config is not read", "set actor_rollout_ref.model.lora_rank (and lora_alpha, target_modules)")
       for model in ("actor_rollout_ref.model", "critic.model")},
    **{f"{role}.load_weight": (
        "starting from random weights is not implemented: the checkpoint's weights would be loaded",
        f"set {role}.load_weight=true")
       for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")},
    "data.datagen.path": (
        "dynamic data generation is not implemented", "drop data.datagen.path"),
}

# Estimators whose extra inputs the RL loop does not produce.
TRAINER_UNSUPPORTED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")

# old key -> (replacement, how the value moves).
DEPRECATED_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices"),
    "critic.ppo_micro_batch_size": ("critic.ppo_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices"),
    "critic.forward_micro_batch_size": ("critic.forward_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices"),
    "reward_model.micro_batch_size": ("reward_model.micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices"),
    "actor_rollout_ref.actor.optim.warmup_style": ("actor_rollout_ref.actor.optim.lr_scheduler_type", "same value"),
    "critic.optim.warmup_style": ("critic.optim.lr_scheduler_type", "same value"),
    "actor_rollout_ref.actor.checkpoint.contents": ("actor_rollout_ref.actor.checkpoint.save_contents", "same value; load_contents follows"),
    "critic.checkpoint.contents": ("critic.checkpoint.save_contents", "same value; load_contents follows"),
    "data.val_batch_size": (None, "still honoured: validation prompts per batch (null = the whole set at once)"),
}

# Fields whose value is one whole dictionary (regex keys hold dots, which
# ConfigDict keys cannot): set as `KEY={'layers\.0\..*': 4}`.
DICT_FIELDS = (
    "actor_rollout_ref.model.alpha_pattern",
    "actor_rollout_ref.model.r_pattern",
    "model.alpha_pattern",  # rljax.sft's model node
    "model.r_pattern",
)
# The names LoRA's target_modules and modules_to_save take (HF module names;
# rljax.models.lora maps them onto rljax's layers, and a test keeps them equal).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SAVABLE_MODULES = LORA_TARGET_MODULES + (
    "embed_tokens", "lm_head", "norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm",
    "pre_feedforward_layernorm", "post_feedforward_layernorm")

# Free-form dictionaries: any key may be added below these paths.
OPEN_DICTS = (
    "custom_reward_function.reward_kwargs",
    "actor_rollout_ref.model.override_config.model_config",
    "actor_rollout_ref.rollout.engine_kwargs.vllm",
    "actor_rollout_ref.rollout.engine_kwargs.sglang",
    "critic.model.override_config",
    "actor_rollout_ref.rollout.engine_kwargs.trtllm",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
    "reward_model.rollout.engine_kwargs",
    "reward_model.model.override_config",
    "data.apply_chat_template_kwargs",
    "global_profiler.global_tool_config.torch_memory.kw_args",
    *(f"{role}.megatron.{key}" for key in _MEGATRON_FREE_FORM
      for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")),
)
# verl's free-form dictionaries whose entries rljax holds under keys of its
# own (verl launch lines fill them with `+KEY=VALUE`); `verl_free_form_path`
# maps an entry onto its key, or names it when rljax has none.
VERL_FREE_FORM = {
    "reward_model.reward_kwargs": (
        "DAPO's reward-manager arguments: overlong_buffer_cfg.{enable, len, penalty_factor, log} are "
        "reward_model.overlong_buffer.*, max_resp_len is reward_model.overlong_buffer.max_resp_len"),
    "actor_rollout_ref.model.override_config": (
        "Hugging Face config.json fields, held in actor_rollout_ref.model.override_config.model_config"),
    "actor_rollout_ref.actor.optim.override_optimizer_config": "optimizer arguments: lr and weight_decay",
    "critic.optim.override_optimizer_config": "optimizer arguments: lr and weight_decay",
}
_OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")
# Optimizer arguments rljax's AdamW (rljax.trainer.optim) reads from an optim node.
_OPTIMIZER_KWARGS = ("lr", "weight_decay")
# Hydra's flags that pick a YAML file; --config-name alone reads it from here.
HYDRA_CONFIG_FLAGS = ("--config-path", "--config-name")
HYDRA_CONFIG_DIR = "configs"
VERL_YAML_SUFFIXES = (".yaml", ".yml")

_LOG = logging.getLogger("rljax.config")
_WARNED: set[str] = set()


NO_VALUE = object()


class ConfigError(ValueError):
  """A bad configuration value: names the key path, the value and the fix."""

  def __init__(self, key: str, value: Any, problem: str, fix: str):
    self.key, self.value, self.problem, self.fix = key, value, problem, fix
    shown = key if value is NO_VALUE else f"{key}={value!r}"
    super().__init__(f"{shown}: {problem}. Fix: {fix}")


def _null(kind: type) -> FieldReference:
  """A field that is None by default and holds values of `kind`."""
  return FieldReference(None, field_type=kind)


def _any(value: Any) -> FieldReference:
  """A field that accepts any type (e.g. an int or the string 'auto')."""
  return FieldReference(value, field_type=object)


def _follow(node: ConfigDict, key: str) -> FieldReference:
  """verl's `${...}`: follows `node.key` until the new field is set itself."""
  return node.get_ref(key).identity()


def _nsight_options() -> dict[str, Any]:
  """verl's Nsight Systems options of the controller and the workers (accepted, ignored)."""
  controller = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
  worker = {**controller, "capture-range": "cudaProfilerApi", "capture-range-end": _null(str), "kill": "none"}
  return {"controller_nsight_options": controller, "worker_nsight_options": worker}


def _data() -> ConfigDict:
  data = ConfigDict({
      "tokenizer": _null(str),
      "use_shm": False,
      "train_files": _any("~/data/rlhf/gsm8k/train.parquet"),
      "val_files": _any("~/data/rlhf/gsm8k/test.parquet"),
      "train_max_samples": -1,
      "val_max_samples": -1,
      "prompt_key": "prompt",
      "reward_fn_key": "data_source",
      "max_prompt_length": 512,
      "max_response_length": 512,
      "train_batch_size": 1024,
      "val_batch_size": _null(int),
      "return_raw_input_ids": False,
      "return_raw_chat": False,
      "return_full_prompt": False,
      "shuffle": True,
      "validation_shuffle": False,
      "seed": 42,
      "filter_overlong_prompts": False,
      "filter_overlong_prompts_workers": 1,
      "dataloader_num_workers": 0,
      "truncation": "error",
      "image_key": "images",
      "video_key": "videos",
      "trust_remote_code": False,
      "custom_cls": {"path": _null(str), "name": _null(str)},
      "image_patch_size": 14,
      "return_multi_modal_inputs": True,
      "sampler": {"class_path": _null(str), "class_name": _null(str)},
      "datagen": {"path": _null(str), "name": _null(str)},
      "apply_chat_template_kwargs": {},
  })
  data.gen_batch_size = _follow(data, "train_batch_size")
  return data


def _optim(lr: float, weight_decay: float) -> ConfigDict:
  return ConfigDict({
      "lr": lr,
      "lr_warmup_steps": -1,
      "lr_warmup_steps_ratio": 0.0,
      "min_lr_ratio": 0.0,
      "num_cycles": 0.5,
      "lr_scheduler_type": "constant",
      "warmup_style": _null(str),
      "total_training_steps": -1,
      "weight_decay": weight_decay,
      "optimizer": "AdamW",
      "optimizer_impl": "torch.optim",
      "betas": [0.9, 0.999],
      "clip_grad": 1.0,
      **_megatron_optim(),
  })


def _megatron_optim() -> dict[str, Any]:
  """The learning-rate schedule keys of verl's Megatron optimizer config."""
  return {
      "lr_warmup_init": 0.0,
      "lr_decay_steps": _null(int),
      "lr_decay_style": "constant",
      "min_lr": 0.0,
      "weight_decay_incr_style": "constant",
      "lr_wsd_decay_style": "exponential",
      "lr_wsd_decay_steps": _null(int),
      "use_checkpoint_opt_param_scheduler": False,
  }


def _megatron_lora() -> ConfigDict:
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
      "dtype": _null(str),
      "adapter_path": _null(str),
      "freeze_vision_model": True,
      "freeze_vision_projection": True,
      "freeze_language_model": True,
  })


def _fsdp_config(forward_only: bool = False) -> ConfigDict:
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
  })


def _profiler() -> ConfigDict:
  """verl's per-role profiler options (Nsight, NPU, torch)."""
  return ConfigDict({
      "tool": _null(str),
      "enable": False,
      "discrete": False,
      "all_ranks": False,
      "ranks": [],
      "save_path": _null(str),
      "tool_config": {
          "nsys": {"discrete": False},
          "npu": {"contents": [], "level": "level0", "analysis": True, "discrete": False},
          "torch": {"contents": [], "discrete": False},
          "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32},
      },
  })


def _megatron(forward_only: bool = False) -> ConfigDict:
  """verl's Megatron engine config: parallel sizes, offload, checkpoint format and Megatron-LM overrides."""
  nulls = {"expert_tensor_parallel_size": int, "virtual_pipeline_model_parallel_size": int,
           "dist_checkpointing_path": str}
  node = ConfigDict({key: _null(nulls[key]) if key in nulls else value for key, value in _MEGATRON_KEYS.items()})
  node.forward_only = forward_only
  node.override_ddp_config = {}
  node.override_transformer_config = {
      "recompute_granularity": _null(str),
      "recompute_modules": ["core_attn"],
      "recompute_method": _null(str),
      "recompute_num_layers": _null(int),
      "attention_backend": "flash",
  }
  node.override_mcore_model_config = {}
  return node


def _mtp() -> ConfigDict:
  """verl's multi-token-prediction options."""
  return ConfigDict({
      "enable": False,
      "enable_train": False,
      "enable_rollout": False,
      "detach_encoder": False,
      "mtp_loss_scaling_factor": 0.1,
      "speculative_algorithm": "EAGLE",
      "speculative_num_steps": 2,
      "speculative_eagle_topk": 2,
      "speculative_num_draft_tokens": 4,
      "method": "mtp",
      "num_speculative_tokens": 1,
  })


def _router_replay() -> ConfigDict:
  """verl's MoE router replay options."""
  return ConfigDict({"mode": "disabled", "record_file": _null(str), "replay_file": _null(str)})


def _checkpoint() -> ConfigDict:
  node = ConfigDict({
      "contents": _null(list),
      "save_contents": ["model", "optimizer", "extra"],
      "async_save": False,
  })
  node.load_contents = _follow(node, "save_contents")
  return node


def _model() -> ConfigDict:
  return ConfigDict({
      "path": "~/models/deepseek-llm-7b-chat",
      "external_lib": _null(str),
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
      "hf_config_path": _null(str),
      "tokenizer_path": _null(str),
      "custom_chat_template": _null(str),
      "exclude_modules": _any(None),
      "lora_adapter_path": _null(str),
      "tiled_mlp": {"enabled": False, "num_shards": 4},
      "mtp": _mtp(),
      "lora": _megatron_lora(),
  })


def _actor() -> ConfigDict:
  return ConfigDict({
      "strategy": "fsdp",
      "ppo_mini_batch_size": 256,
      "ppo_micro_batch_size": _null(int),
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
      "loss_scale_factor": _null(float),
      "entropy_coeff": 0.0,
      "entropy_from_logits_with_chunking": False,
      "entropy_checkpointing": False,
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
          "dro_beta": _null(float),
          "aipo_rho": _null(float),
      },
      "positive_nll_coef": _null(float),
      "unbiased_loss_max_tokens": _null(int),
      "rollout_is": False,
      "rollout_is_threshold": _null(float),
      "rollout_is_threshold_lower": _null(float),
      "rollout_is_level": "token",
      "rollout_is_mode": "truncate",
      "rollout_is_veto_threshold": _null(float),
      "use_torch_compile": True,
      "ppo_epochs": 1,
      "data_loader_seed": 42,
      "shuffle": False,
      "ulysses_sequence_parallel_size": 1,
      "tensor_model_parallel_size": 1,
      "optim": _optim(lr=1e-6, weight_decay=0.01),
      "fsdp_config": _fsdp_config(),
      "checkpoint": _checkpoint(),
      "profiler": _profiler(),
      "freeze_vision_tower": False,
      "calculate_entropy": False,
      "use_prefix_grouper": False,
      "router_replay": _router_replay(),
      "calculate_sum_pi_squared": False,
      "sum_pi_squared_checkpointing": False,
      "megatron": _megatron(),
  })


def _ref(actor: ConfigDict) -> ConfigDict:
  return ConfigDict({
      "strategy": "fsdp",
      "fsdp_config": _fsdp_config(forward_only=True),
      "use_torch_compile": _follow(actor, "use_torch_compile"),
      "log_prob_micro_batch_size": _null(int),
      "log_prob_micro_batch_size_per_gpu": 16,
      "log_prob_use_dynamic_bsz": _follow(actor, "use_dynamic_bsz"),
      "log_prob_max_token_len_per_gpu": _follow(actor, "ppo_max_token_len_per_gpu"),
      "ulysses_sequence_parallel_size": _follow(actor, "ulysses_sequence_parallel_size"),
      "profiler": _profiler(),
      "router_replay": _router_replay(),
      "entropy_from_logits_with_chunking": False,
      "entropy_checkpointing": False,
      "megatron": _megatron(forward_only=True),
  })


def _rollout(data: ConfigDict, actor: ConfigDict) -> ConfigDict:
  return ConfigDict({
      "name": "vllm",
      "mode": "async",
      "temperature": 1.0,
      "top_k": -1,
      "top_p": 1.0,
      "use_fire_sampling": False,
      "prompt_length": _follow(data, "max_prompt_length"),
      "response_length": _follow(data, "max_response_length"),
      "dtype": "bfloat16",
      "gpu_memory_utilization": 0.5,
      "ignore_eos": False,
      "enforce_eager": False,
      "free_cache_engine": True,
      "load_format": "dummy",
      "tensor_model_parallel_size": 2,
      "max_num_batched_tokens": 8192,
      "max_model_len": _null(int),
      "max_num_seqs": 1024,
      "prefill_length_buckets": [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
      "cpu_dot_library": "auto",
      "log_prob_micro_batch_size": _null(int),
      "log_prob_micro_batch_size_per_gpu": 16,
      "log_prob_use_dynamic_bsz": _follow(actor, "use_dynamic_bsz"),
      "log_prob_max_token_len_per_gpu": _follow(actor, "ppo_max_token_len_per_gpu"),
      "disable_log_stats": True,
      "enable_chunked_prefill": True,
      "do_sample": True,
      "n": 1,
      "calculate_log_probs": False,
      "engine_kwargs": {
          "vllm": {"swap_space": _null(int)},
          "sglang": {"attention_backend": _null(str)},
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
          "max_turns": _null(int),
          "tool_config_path": _null(str),
          "completion_callback": _null(str),
          "use_inference_chat_template": False,
          "enable_tokenization_sanity_check": True,
          "max_assistant_turns": _null(int),
          "max_user_turns": _null(int),
          "max_parallel_calls": 1,
          "max_tool_response_length": 256,
          "tool_response_truncate_side": "middle",
          "interaction_config_path": _null(str),
          "tokenization_sanity_check_mode": "strict",
          "format": "hermes",
          "num_repeat_rollouts": _null(int),
      },
      "agent": {
          "num_workers": 8,
          "default_agent_loop": "single_turn_agent",
          "agent_loop_config_path": _null(str),
          "custom_async_server": {"path": _null(str), "name": _null(str)},
      },
      **_rollout_engine_keys(),
  })


def _rollout_engine_keys() -> dict[str, Any]:
  """Rollout keys of verl's inference servers (vLLM, SGLang, TensorRT-LLM) that rljax's engine does not read.

  Each is ignored, or an error where a value other than verl's default would
  change the samples (`UNIMPLEMENTED_VALUES`).
  """
  return {
      "cudagraph_capture_sizes": _null(list),
      "data_parallel_size": 1,
      "expert_parallel_size": 1,
      "pipeline_model_parallel_size": 1,
      "enable_prefix_caching": True,
      "logprobs_mode": "processed_logprobs",
      "scheduling_policy": "fcfs",
      "over_sample_rate": 0.0,
      "multi_stage_wake_up": False,
      "checkpoint_engine": {"backend": "naive", "update_weights_bucket_megabytes": 2048, "engine_kwargs": {}},
      "trace": {"backend": _null(str), "token2text": False, "max_samples_per_step_per_worker": _null(int)},
      "skip_rollout": False,
      "skip_dump_dir": "/tmp/rollout_dump",
      "skip_tokenizer_init": True,
      "enable_rollout_routing_replay": False,
      "profiler": _profiler(),
      "prometheus": {
          "enable": False,
          "port": 9090,
          "file": "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
          "served_model_name": _null(str),
      },
      "quantization": _null(str),
      "quantization_config_file": _null(str),
      "mtp": _mtp(),
      "layer_name_map": {"qkv_layer_name": "qkv", "gate_proj_layer_name": "gate_up"},
      "layered_summon": False,
  }


def _critic(arr: ConfigDict) -> ConfigDict:
  actor, rollout, model = arr.actor, arr.rollout, arr.model
  critic = ConfigDict({
      "enable": _null(bool),
      "rollout_n": _follow(rollout, "n"),
      "strategy": "fsdp",
      "optim": _optim(lr=1e-5, weight_decay=0.01),
      "model": {
          "path": _follow(model, "path"),
          "tokenizer_path": _follow(model, "path"),
          "override_config": {"moe_config": {"freeze_moe_router": False}},
          "external_lib": _follow(model, "external_lib"),
          "enable_gradient_checkpointing": _follow(model, "enable_gradient_checkpointing"),
          "enable_activation_offload": False,
          "use_remove_padding": False,
          "trust_remote_code": False,
          "fsdp_config": _fsdp_config(),
          "use_shm": False,
          "lora_rank": 0,
          "lora_alpha": 16,
          "target_modules": _any("all-linear"),
          "tiled_mlp": {"enabled": False, "num_shards": 4},
          "lora": _megatron_lora(),
      },
      "ppo_mini_batch_size": _follow(actor, "ppo_mini_batch_size"),
      "ppo_micro_batch_size": _null(int),
      "ppo_micro_batch_size_per_gpu": _follow(actor, "ppo_micro_batch_size_per_gpu"),
      "forward_micro_batch_size": _null(int),
      "use_dynamic_bsz": _follow(actor, "use_dynamic_bsz"),
      "ppo_max_token_len_per_gpu": 32768,
      "ulysses_sequence_parallel_size": 1,
      "ppo_epochs": _follow(actor, "ppo_epochs"),
      "shuffle": _follow(actor, "shuffle"),
      "grad_clip": 1.0,
      "cliprange_value": 0.5,
      "loss_agg_mode": _follow(actor, "loss_agg_mode"),
      "use_torch_compile": True,
      "checkpoint": _checkpoint(),
      "data_loader_seed": 42,
      "profiler": _profiler(),
      "megatron": _megatron(),
  })
  critic.forward_micro_batch_size_per_gpu = _follow(critic, "ppo_micro_batch_size_per_gpu")
  critic.forward_max_token_len_per_gpu = _follow(critic, "ppo_max_token_len_per_gpu")
  return critic


def _reward_model(model: ConfigDict, critic: ConfigDict) -> ConfigDict:
  return ConfigDict({
      "enable": False,
      "strategy": "fsdp",
      "model": {
          "input_tokenizer": _follow(model, "path"),
          "path": "~/models/Anomy-RM-v0.1",
          "external_lib": _follow(model, "external_lib"),
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
      "micro_batch_size": _null(int),
      "micro_batch_size_per_gpu": 16,
      "max_length": _null(int),
      "use_dynamic_bsz": _follow(critic, "use_dynamic_bsz"),
      "forward_max_token_len_per_gpu": _follow(critic, "forward_max_token_len_per_gpu"),
      "reward_manager": "naive",
      "launch_reward_fn_async": False,
      "sandbox_fusion": {"url": _null(str), "max_concurrent": 64, "memory_limit_mb": 1024},
      "prime": {"num_workers": _null(int), "timeout_s": 300.0},
      "profiler": _profiler(),
      "enable_resource_pool": False,
      "n_gpus_per_node": 8,
      "nnodes": 0,
      "reward_loop_source": "register",
      "reward_loop_module_path": _null(str),
      "reward_loop_class_name": _null(str),
      "ulysses_sequence_parallel_size": 1,
      "use_reward_loop": True,
      "num_workers": 1,
      "rollout": _reward_rollout(),
      "megatron": _megatron(forward_only=True),
      "overlong_buffer": {
          "enable": False,
          "len": 0,
          "penalty_factor": 0.0,
          "log": False,
          "max_resp_len": _null(int),
      },
  })


def _reward_rollout() -> ConfigDict:
  """verl's inference server for generative reward models."""
  return ConfigDict({
      "name": _null(str),
      "dtype": "bfloat16",
      "gpu_memory_utilization": 0.5,
      "enforce_eager": True,
      "cudagraph_capture_sizes": _null(list),
      "free_cache_engine": True,
      "data_parallel_size": 1,
      "expert_parallel_size": 1,
      "tensor_model_parallel_size": 2,
      "max_num_batched_tokens": 8192,
      "max_model_len": _null(int),
      "max_num_seqs": 1024,
      "load_format": "auto",
      "engine_kwargs": {},
      "limit_images": _null(int),
      "enable_chunked_prefill": True,
      "enable_prefix_caching": True,
      "disable_log_stats": True,
      "skip_tokenizer_init": False,
      "prompt_length": 2048,
      "response_length": 2048,
  })


def _algorithm() -> ConfigDict:
  return ConfigDict({
      "gamma": 1.0,
      "lam": 1.0,
      "adv_estimator": "gae",
      "norm_adv_by_std_in_grpo": True,
      "unbiased_advantage": False,
      "gdpo_reward_keys": [],
      "gdpo_reward_weights": _null(list),
      "use_kl_in_reward": False,
      "kl_penalty": "kl",
      "kl_ctrl": {
          "type": "fixed",
          "kl_coef": 0.005,
          "horizon": 10000,
          "target_kl": 0.1,
      },
      "use_pf_ppo": False,
      "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0},
      "filter_groups": {"enable": False, "metric": _null(str), "max_num_gen_batches": 0},
      "rollout_is": False,
      "rollout_is_threshold": _null(float),
      "rollout_is_threshold_lower": _null(float),
      "rollout_is_level": "token",
      "rollout_is_mode": "truncate",
      "rollout_is_veto_threshold": _null(float),
      "rollout_correction": {
          "rollout_is": _null(str),
          "rollout_is_threshold": _any(2.0),
          "rollout_is_batch_normalize": False,
          "rollout_rs": _null(str),
          "rollout_rs_threshold": _any(None),
          "bypass_mode": False,
          "loss_type": "ppo_clip",
      },
  })


def _policy_rollout_correction(source: ConfigDict) -> ConfigDict:
  """`actor.policy_loss.rollout_correction`: follows `algorithm.rollout_correction` (bypass mode reads it)."""
  node = ConfigDict()
  for key in ("loss_type", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
              "rollout_rs_threshold", "bypass_mode"):
    node[key] = _follow(source, key)
  return node


def _trainer() -> ConfigDict:
  trainer = ConfigDict({
      "balance_batch": True,
      "total_epochs": 30,
      "total_training_steps": _null(int),
      "profile_steps": _null(list),
      "project_name": "verl_examples",
      "experiment_name": "gsm8k",
      "logger": ["console", "wandb"],
      "log_val_generations": 0,
      "rollout_data_dir": _null(str),
      "validation_data_dir": _null(str),
      "nnodes": _any(1),
      "n_gpus_per_node": _any(8),
      "device": "auto",
      "save_freq": -1,
      "resume_mode": "auto",
      "resume_from_path": _null(str),
      "val_before_train": True,
      "val_only": False,
      "test_freq": 2,
      "critic_warmup": 0,
      "default_hdfs_dir": _null(str),
      "del_local_ckpt_after_load": False,
      "remove_previous_ckpt_in_save": False,
      "max_actor_ckpt_to_keep": _null(int),
      "max_critic_ckpt_to_keep": _null(int),
      "ray_wait_register_center_timeout": 300,
      "esi_redundant_time": 0,
      "use_legacy_worker_impl": "auto",
      "seed": 1,
      "logical_axis_rules": [
          ["batch", ["data", "fsdp"]],
          ["length", "sequence"],
          ["activation_length", ["sequence", "tensor"]],
          ["embed", "fsdp"],
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


def get_base_config() -> ConfigDict:
  """The full verl PPO-trainer tree with verl's defaults, locked.

  Returns:
    A locked `ConfigDict`: unknown keys are errors; free-form dictionaries
    (`OPEN_DICTS`) stay open.
  """
  config = ConfigDict()
  config.data = _data()
  arr = ConfigDict({"hybrid_engine": True, "model": _model()})
  arr.actor = _actor()
  arr.ref = _ref(arr.actor)
  arr.rollout = _rollout(config.data, arr.actor)
  config.actor_rollout_ref = arr
  config.critic = _critic(arr)
  config.reward_model = _reward_model(arr.model, config.critic)
  config.custom_reward_function = {"path": _null(str), "name": "compute_score", "reward_kwargs": {}}
  config.algorithm = _algorithm()
  arr.actor.policy_loss.rollout_correction = _policy_rollout_correction(config.algorithm.rollout_correction)
  config.trainer = _trainer()
  config.ray_init = {"num_cpus": _null(int), "timeline_json_file": _null(str)}
  _add_verl_links(config)
  config.reward_manager = {
      "source": "register",
      "name": _follow(config.reward_model, "reward_manager"),
      "module": {"path": _null(str), "name": "custom_reward_manager"},
  }
  config.global_profiler = _global_profiler()
  _follow_global_profiler(config)
  config.transfer_queue = {"enable": False}
  config.ray_kwargs = {"ray_init": {"num_cpus": _null(int)}, "timeline_json_file": _null(str)}
  config.lock()
  for path in OPEN_DICTS:
    get_node(config, path).unlock()
  return config


def _add_verl_links(config: ConfigDict) -> None:
  """Keys whose verl default is another section's key (verl's `${...}` across sections)."""
  arr = config.actor_rollout_ref
  for node in (arr, config.critic, config.reward_model):
    node.nccl_timeout = 600
  for node in (arr.actor, arr.ref, config.critic, config.reward_model):
    node.load_weight = True
  for role in (arr.actor, arr.ref):
    role.rollout_n = _follow(arr.rollout, "n")
  arr.actor.use_fused_kernels = _follow(arr.model, "use_fused_kernels")
  arr.actor.use_remove_padding = _follow(arr.model, "use_remove_padding")
  arr.rollout.profiler.enable = _follow(arr.actor.profiler, "enable")
  arr.rollout.prometheus.served_model_name = _follow(arr.model, "path")
  config.data.tool_config_path = _follow(arr.rollout.multi_turn, "tool_config_path")
  config.reward_model.megatron.use_distributed_optimizer = False


def _follow_global_profiler(config: ConfigDict) -> None:
  """Each role's profiler tool and directory follow `global_profiler`'s, as in verl."""
  for section in PROFILED_SECTIONS:
    profiler = get_node(config, section).profiler
    for key in ("tool", "save_path"):
      profiler[key] = _follow(config.global_profiler, key)


def _global_profiler() -> ConfigDict:
  """verl's `global_profiler`: which steps its Nsight/torch profilers record."""
  return ConfigDict({
      "tool": _null(str),
      "steps": _null(list),
      "profile_continuous_steps": False,
      "save_path": "outputs/profile",
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
          },
      },
  })


def get_node(config: ConfigDict, path: str) -> Any:
  """Returns the value or sub-tree at a dotted `path`."""
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def leaf_paths(config: ConfigDict, prefix: str = "") -> list[str]:
  """Every dotted path to a leaf (non-ConfigDict) value, in tree order."""
  paths = []
  for key in config.keys():
    path = f"{prefix}{key}"
    value = config[key]
    if isinstance(value, ConfigDict) and len(value) and not _is_open(path):
      paths.extend(leaf_paths(value, path + "."))
    else:
      paths.append(path)
  return paths


def _is_open(path: str) -> bool:
  return any(path == p or path.startswith(p + ".") for p in OPEN_DICTS)


def unknown_key_error(config: ConfigDict, path: str) -> ConfigError:
  known = leaf_paths(config)
  last = path.rsplit(".", 1)[-1]
  near = difflib.get_close_matches(path, known, n=3, cutoff=0.75)
  near += [k for k in known if k.rsplit(".", 1)[-1] == last and k not in near]
  if not near:
    near = difflib.get_close_matches(path, known, n=3, cutoff=0.5)
  hint = f"did you mean {' or '.join(near[:3])}?" if near else (
      "see rljax.config.leaf_paths(get_base_config()) for every key")
  return ConfigError(path, NO_VALUE, "unknown key", hint)


# A mapping key written against its value, as Hydra allows (`{a:1}`; YAML needs `{a: 1}`).
_GLUED_KEY = re.compile(r"([{,]\s*[A-Za-z_][\w.\-]*):(?=\S)")


def _has_glued_key(value: Any) -> bool:
  """Whether YAML read a Hydra `{a:1}` entry as the key 'a:1' with no value, at any depth."""
  if isinstance(value, dict):
    return any((isinstance(k, str) and ":" in k and v is None) or _has_glued_key(v) for k, v in value.items())
  return isinstance(value, list) and any(_has_glued_key(v) for v in value)


def _parse_scalar(text: str) -> Any:
  """Parses one override value as verl's Hydra would.

  YAML with OmegaConf's float rule (`1e-6`, inside lists too), and Hydra's
  mappings without a space after the colon (`{a:1,b:2}`).
  """
  if not text.strip():
    return ""
  try:
    value = parse_yaml(text)
    if _has_glued_key(value):
      value = parse_yaml(_GLUED_KEY.sub(r"\1: ", text))
  except yaml.YAMLError:
    return text
  if isinstance(value, str):
    for cast in (int, float):
      try:
        return cast(value)
      except ValueError:
        pass
  return value


def _unquoted_collection(value: Any) -> Any:
  """A string that spells a list or a mapping (`"['a.parquet','b.parquet']"`, its quotes kept) as that value."""
  if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
    parsed = _parse_scalar(value)
    if isinstance(parsed, (list, dict)):
      return parsed
  return value


def _field_type(parent: ConfigDict, key: str) -> type | None:
  """The declared type of `parent.key`, or None when any type is accepted."""
  raw = parent._fields[key]  # pylint: disable=protected-access
  if isinstance(raw, FieldReference):
    kind = raw.get_type()
    return None if kind is object else kind
  if raw is None:
    return None
  return type(raw)


def _coerce(path: str, value: Any, kind: type | None) -> Any:
  """Casts a parsed override to the field's type, or raises ConfigError."""
  if kind in (None, list, tuple):
    value = _unquoted_collection(value)
  if value is None or kind is None:
    return value
  if kind is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(path, value, "expects a boolean", f"use {path}=true or {path}=false")
  if kind is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    if isinstance(value, float) and value.is_integer():
      return int(value)
    raise ConfigError(path, value, "expects an integer", f"give a whole number, e.g. {path}=8")
  if kind is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    raise ConfigError(path, value, "expects a number", f"give a number, e.g. {path}=0.5")
  if kind is str:
    if isinstance(value, (list, dict)):
      raise ConfigError(path, value, "expects a string", f"give one value, e.g. {path}=name")
    return value if isinstance(value, str) else str(value)
  if kind in (list, tuple):
    return list(value) if isinstance(value, (list, tuple)) else [value]
  if kind is ConfigDict:
    if isinstance(value, dict):
      return value
    raise ConfigError(path, value, "is a section, not a value", f"set one of its keys, e.g. {path}.KEY=VALUE")
  return value


def set_value(config: ConfigDict, path: str, value: Any) -> None:
  """Sets `path` to `value` (already parsed), checking key and type.

  Setting a field that follows another (`${...}` in verl) cuts the link:
  from then on it keeps its own value. An entry of one of verl's free-form
  dictionaries lands on the rljax key that holds it (`verl_free_form_path`);
  such a dictionary set whole to null (verl's default for some) sets nothing.
  """
  if _in_verl_free_form(path) and (isinstance(value, dict) or (value is None and path in VERL_FREE_FORM)):
    for sub_key, sub_value in (value or {}).items():
      set_value(config, f"{path}.{sub_key}", sub_value)
    return
  path = verl_free_form_path(config, path, value)
  *parents, key = path.split(".")
  node = config
  walked = []
  for part in parents:
    walked.append(part)
    if not isinstance(node, ConfigDict) or part not in node:
      if isinstance(node, ConfigDict) and _is_open(".".join(walked[:-1])):
        with node.unlocked():
          node[part] = {}
      else:
        raise unknown_key_error(config, path)
    node = node[part]
  if not isinstance(node, ConfigDict):
    raise unknown_key_error(config, path)
  if key not in node:
    if _is_open(".".join(parents)):
      with node.unlocked():
        node[key] = value
      return
    raise unknown_key_error(config, path)
  kind = _field_type(node, key)
  if kind is ConfigDict and isinstance(value, dict):
    for sub_key, sub_value in value.items():
      set_value(config, f"{path}.{sub_key}", sub_value)
    return
  value = _coerce(path, value, kind)
  raw = node._fields[key]  # pylint: disable=protected-access
  if isinstance(raw, FieldReference):
    raw.set(value, type_safe=False)
  else:
    node[key] = value


def _in_verl_free_form(path: str) -> bool:
  return any(path == root or path.startswith(root + ".") for root in VERL_FREE_FORM)


def _section(config: ConfigDict, path: str) -> ConfigDict | None:
  """The section at `path` (the root for ''), or None where the tree has no such section."""
  node = config
  for part in path.split(".") if path else ():
    node = node.get(part) if isinstance(node, ConfigDict) else None
  return node if isinstance(node, ConfigDict) else None


def _reward_kwargs_path(path: str, rest: str, value: Any) -> str:
  """`reward_model.reward_kwargs.REST` (DAPO's reward-manager arguments) as rljax's overlong-buffer key."""
  if rest == "max_resp_len":
    return "reward_model.overlong_buffer.max_resp_len"
  group, _, key = rest.partition(".")
  if group == "overlong_buffer_cfg" and key in _OVERLONG_BUFFER_KEYS:
    return f"reward_model.overlong_buffer.{key}"
  raise ConfigError(path, value, "is not a reward-manager argument rljax has",
                    "reward_model.reward_kwargs takes DAPO's overlong_buffer_cfg.{enable, len, penalty_factor, log} "
                    "and max_resp_len; give a custom reward function's arguments as "
                    "custom_reward_function.reward_kwargs.NAME")


def verl_free_form_path(config: ConfigDict, path: str, value: Any = NO_VALUE) -> str:
  """The rljax key holding `path` where it is an entry of one of verl's free-form dictionaries.

  `VERL_FREE_FORM` lists them: DAPO's `reward_model.reward_kwargs`, the HF
  fields of `actor_rollout_ref.model.override_config` (held in its
  `model_config`) and `*.optim.override_optimizer_config`. Other paths come
  back unchanged.

  Raises:
    ConfigError: naming an entry rljax has no key for (`value` is shown).
  """
  root = next((r for r in VERL_FREE_FORM if path.startswith(r + ".")), None)
  if root is None:
    return path
  rest = path[len(root) + 1:]
  if root == "reward_model.reward_kwargs":
    return _reward_kwargs_path(path, rest, value)
  if root == "actor_rollout_ref.model.override_config":
    own = rest.split(".", 1)[0] in (_section(config, root) or ())
    return path if own else f"{root}.model_config.{rest}"
  node = root.rsplit(".", 1)[0]
  if rest in _OPTIMIZER_KWARGS:
    return f"{node}.{rest}"
  raise ConfigError(path, value, "is an optimizer argument rljax does not implement (its AdamW reads only lr and "
                    "weight_decay from the config)", f"drop it, or set {node}.lr or {node}.weight_decay")


def free_form_dicts() -> tuple[str, ...]:
  """Every path below which an override may add a key: rljax's open dictionaries and verl's mapped ones."""
  return tuple(p for p in OPEN_DICTS if not _in_verl_free_form(p)) + tuple(VERL_FREE_FORM)


def parse_override(text: str) -> tuple[str, str, Any]:
  """Splits one override: verl's `a.b.c=value` (also `--config.a.b.c=value`) or Hydra's spellings.

  Hydra's `+a.b=value` (add) and `++a.b=value` (add or override) set the
  key like `a.b=value`; `~a.b` (delete) resets it, and `~a.b=value` resets
  it only where it holds that value.

  Returns:
    (operation, key path, parsed value): operation is `set`, `add` or
    `reset`; a reset without `=value` has the value NO_VALUE.
  """
  if text.lstrip().startswith("~"):
    path, equals, raw = text.lstrip()[1:].partition("=")
    return "reset", path.strip(), _parse_scalar(raw) if equals else NO_VALUE
  if "=" not in text:
    raise ConfigError(text, NO_VALUE, "an override needs KEY=VALUE", f"write {text}=VALUE")
  path, raw = text.split("=", 1)
  path = path.strip()
  operation = "add" if path.startswith("+") else "set"
  path = path.lstrip("+")
  if path.startswith("--config."):
    path = path[len("--config."):]
  return operation, path, _parse_scalar(raw)


def add_value(config: ConfigDict, path: str, value: Any) -> None:
  """Hydra's `+KEY=VALUE`: sets a key of the tree, or adds one below a free-form dictionary.

  Raises:
    ConfigError: an unknown key elsewhere, naming the closest keys and where `+` may add one.
  """
  try:
    set_value(config, path, value)
  except ConfigError as error:
    if error.problem != "unknown key":
      raise
    raise ConfigError(error.key, error.value, error.problem,
                      f"{error.fix} (`+` adds keys only below the free-form dictionaries rljax knows: "
                      f"{', '.join(free_form_dicts())})") from None


def _plain_value(value: Any) -> Any:
  if isinstance(value, ConfigDict):
    return value.to_dict()
  return list(value) if isinstance(value, tuple) else value


def _reset(node: ConfigDict, default_node: ConfigDict | None, key: str) -> None:
  """`node[key]` back to `default_node[key]`; removed where the defaults lack it; a section key by key."""
  if not isinstance(default_node, ConfigDict) or key not in default_node:
    with node.unlocked():
      del node[key]
    return
  value, default = node[key], default_node[key]
  if isinstance(value, ConfigDict) and isinstance(default, ConfigDict):
    for sub_key in list(value.keys()):
      _reset(value, default, sub_key)
    return
  raw = node._fields[key]  # pylint: disable=protected-access
  if isinstance(raw, FieldReference):
    raw.set(default, type_safe=False)
  else:
    node[key] = default


def reset_value(config: ConfigDict, path: str, defaults: Callable[[], ConfigDict] = get_base_config,
                expected: Any = NO_VALUE) -> None:
  """Hydra's `~KEY`: `path` back to its value in `defaults()` (rljax's base config).

  A key added below a free-form dictionary is removed; a section resets
  every key below it. A key that follows another by default (verl's
  `${...}`, e.g. data.gen_batch_size) follows it again; inside a reset
  section such keys take the default's value.

  Args:
    config: the tree to change.
    path: the key (verl's free-form spellings map as in `set_value`).
    defaults: builds the tree holding the defaults.
    expected: with `~KEY=VALUE`, the value the key must hold (Hydra's rule).

  Raises:
    ConfigError: an unknown key, or a value other than `expected`.
  """
  path = verl_free_form_path(config, path)
  parent, _, key = path.rpartition(".")
  node = _section(config, parent)
  if node is None or key not in node:
    raise unknown_key_error(config, path)
  current = _plain_value(node[key])
  if expected is not NO_VALUE and current != expected:
    raise ConfigError(path, current, f"~{path}={expected!r} resets the key only where it holds that value",
                      f"write ~{path} to reset it whatever it holds")
  base = defaults()
  section = _section(base, parent)
  source = None if section is None else _followed_path(base, section._fields.get(key))  # pylint: disable=protected-access
  if source is not None:
    source_parent, _, source_key = source.rpartition(".")
    node[key] = _follow(_section(config, source_parent), source_key)
    return
  _reset(node, _section(base, parent), key)


def _followed_path(root: ConfigDict, field: Any, prefix: str = "") -> str | None:
  """The path of the key that `field` (a raw field of `root`'s tree) follows by identity, or None."""
  target = field._value if isinstance(field, FieldReference) and field._ops else None  # pylint: disable=protected-access
  if not isinstance(target, FieldReference):
    return None
  for key, raw in root._fields.items():  # pylint: disable=protected-access
    if raw is target:
      return f"{prefix}{key}"
    if isinstance(raw, ConfigDict):
      found = _followed_path(raw, field, f"{prefix}{key}.")
      if found is not None:
        return found
  return None


def apply_overrides(config: ConfigDict, overrides: Iterable[str],
                    defaults: Callable[[], ConfigDict] = get_base_config) -> ConfigDict:
  """Applies overrides in order; both CLI syntaxes and Hydra's `+`, `++` and `~` land here.

  Args:
    config: the tree to change.
    overrides: `KEY=VALUE`, `+KEY=VALUE`, `++KEY=VALUE`, `~KEY` strings.
    defaults: builds the tree whose values `~KEY` restores (rljax.sft and
      rljax.generate/eval pass their own).

  Returns:
    The config.
  """
  for text in overrides:
    operation, path, value = parse_override(text)
    if operation == "reset":
      reset_value(config, path, defaults, value)
    elif operation == "add":
      add_value(config, path, value)
    else:
      set_value(config, path, value)
  return config


def _warn_once(key: str, message: str) -> None:
  if key not in _WARNED:
    _WARNED.add(key)
    _LOG.warning(message)


def resolve_world_size(config: ConfigDict, device_count: int | None = None) -> int:
  """Devices in the job: nnodes * n_gpus_per_node, or JAX's count for 'auto'."""
  nodes, per_node = config.trainer.nnodes, config.trainer.n_gpus_per_node
  if nodes == "auto" or per_node == "auto":
    if device_count is None:
      import jax  # pylint: disable=import-outside-toplevel
      device_count = jax.device_count()
    return device_count
  for key, value in (("trainer.nnodes", nodes), ("trainer.n_gpus_per_node", per_node)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(key, value, "must be a positive integer or 'auto'", f"set {key}=auto to use every visible device")
  return nodes * per_node


def data_parallel_size(config: ConfigDict, world_size: int) -> int:
  """Devices that split the batch: world size over tensor and sequence axes."""
  actor = config.actor_rollout_ref.actor
  return max(1, world_size // (actor.tensor_model_parallel_size * actor.ulysses_sequence_parallel_size))


def _map_global_micro_batch(config: ConfigDict, old: str, new: str, dp: int) -> None:
  value = get_node(config, old)
  n = config.actor_rollout_ref.rollout.n
  per_device = value * n // dp
  if per_device < 1:
    raise ConfigError(old, value, f"x rollout.n ({n}) is smaller than the {dp} data-parallel devices", f"set {new} directly (rows per device)")
  set_value(config, new, per_device)


def _fill_micro_batch(config: ConfigDict, dp: int) -> None:
  """An unset `ppo_micro_batch_size_per_gpu` becomes the device's whole mini-batch (rows per data-parallel device).

  Left unset where the mini-batch does not split over `dp` devices (the
  check names that key) or where use_dynamic_bsz sizes micro-batches.
  """
  actor = config.actor_rollout_ref.actor
  rows = actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n
  if actor.ppo_micro_batch_size_per_gpu is None and not actor.use_dynamic_bsz and rows > 0 and rows % dp == 0:
    set_value(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", rows // dp)


def _map_rollout_is(config: ConfigDict, section: str) -> None:
  """Maps the documented `rollout_is*` keys onto `algorithm.rollout_correction`.

  truncate -> truncated IS (upper clamp); mask -> IcePop "lower_upper"
  (lower defaults to 1/upper); level token/sequence is kept.
  """
  node = get_node(config, section)
  if not node.rollout_is:
    return
  if node.rollout_is_veto_threshold is not None:
    raise ConfigError(f"{section}.rollout_is_veto_threshold", node.rollout_is_veto_threshold,
                      "veto rejection was replaced in verl 0.9 by rejection sampling",
                      "set algorithm.rollout_correction.rollout_rs=token_k1 with rollout_rs_threshold")
  upper = node.rollout_is_threshold
  if upper is None or upper <= 0:
    raise ConfigError(f"{section}.rollout_is_threshold", upper, "rollout_is=True needs a positive upper threshold", f"set {section}.rollout_is_threshold=2.0")
  lower = node.rollout_is_threshold_lower
  if node.rollout_is_mode == "truncate":
    if lower is not None:
      raise ConfigError(f"{section}.rollout_is_threshold_lower", lower, "truncated IS has no lower bound",
                        f"set {section}.rollout_is_mode=mask to zero weights outside [lower, upper]")
    threshold = upper
  else:
    threshold = f"{lower if lower is not None else 1.0 / upper}_{upper}"
  target = config.algorithm.rollout_correction
  target.rollout_is = node.rollout_is_level
  target.rollout_is_threshold = threshold


def finalize(config: ConfigDict, device_count: int | None = None) -> ConfigDict:
  """Maps deprecated keys onto their replacements (warning once each).

  Args:
    config: the tree after overrides.
    device_count: devices in the job (default: from `trainer.*`, or JAX).

  Returns:
    The same config, with replacements filled in.
  """
  _map_megatron_mesh(config)  # before the data-parallel size, which the mesh sizes set
  world = resolve_world_size(config, device_count)
  dp = data_parallel_size(config, world)
  for old, (new, how) in DEPRECATED_KEYS.items():
    value = get_node(config, old)
    if value is None:
      continue
    _warn_once(old, f"{old} is deprecated; {'use ' + new + ' ' if new else ''}({how})")
    if new is None:
      continue
    if "micro_batch_size" in old:
      _map_global_micro_batch(config, old, new, dp)
    else:
      set_value(config, new, value)
  _fill_micro_batch(config, dp)
  for section in ("algorithm", "actor_rollout_ref.actor"):
    _map_rollout_is(config, section)
  _map_cosmos_keys(config)
  for section in _OPTIM_SECTIONS:
    _map_clip_grad(config, section)
  _map_reward_manager_name(config)
  return config


def _map_clip_grad(config: ConfigDict, section: str) -> None:
  """verl's `optim.clip_grad` (its newer name of `grad_clip`): a value other than the default sets `grad_clip`.

  Raises:
    ConfigError: both keys set, to different values.
  """
  node = get_node(config, section)
  new, old = node.optim.clip_grad, node.grad_clip
  if new == GRAD_CLIP_DEFAULT:
    return
  _check(old in (GRAD_CLIP_DEFAULT, new), f"{section}.optim.clip_grad", new, f"conflicts with {section}.grad_clip={old}",
         f"set only one of {section}.optim.clip_grad and {section}.grad_clip")
  node.grad_clip = float(new)


def _map_megatron_mesh(config: ConfigDict) -> None:
  """verl's Megatron parallel sizes onto the actor's mesh axes (`MEGATRON_MESH_KEYS`).

  A size other than 1 sets the mesh key; the expert axis does not exist yet.

  Raises:
    ConfigError: an expert size above 1, or a size that conflicts with the
      mesh key set to another value.
  """
  megatron = config.actor_rollout_ref.actor.megatron
  expert = megatron.expert_model_parallel_size
  _check(expert == 1, "actor_rollout_ref.actor.megatron.expert_model_parallel_size", expert,
         "rljax has no MoE models yet, so its mesh has no expert axis", "set it to 1")
  for key, target in MEGATRON_MESH_KEYS.items():
    size, current = megatron[key], get_node(config, target)
    if size == 1:
      continue
    _check(current in (1, size), f"actor_rollout_ref.actor.megatron.{key}", size, f"conflicts with {target}={current}",
           f"set only one of actor_rollout_ref.actor.megatron.{key} and {target}")
    set_value(config, target, size)


def _map_reward_manager_name(config: ConfigDict) -> None:
  """verl's `reward_manager.name` (its newer home of `reward_model.reward_manager`), where set to another value."""
  name = config.reward_manager.name
  if name != config.reward_model.reward_manager:
    set_value(config, "reward_model.reward_manager", name)


def _map_cosmos_keys(config: ConfigDict) -> None:
  """cosmos-rl's Dr.GRPO keys onto verl's: unbiased loss and unbiased advantage."""
  actor = config.actor_rollout_ref.actor
  if actor.unbiased_loss_max_tokens is not None:
    set_value(config, "actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-sum-norm")
    set_value(config, "actor_rollout_ref.actor.loss_scale_factor", float(actor.unbiased_loss_max_tokens))
  if config.algorithm.unbiased_advantage:
    set_value(config, "algorithm.norm_adv_by_std_in_grpo", False)


def _check(ok: bool, key: str, value: Any, problem: str, fix: str) -> None:
  if not ok:
    raise ConfigError(key, value, problem, fix)


def _check_enum(config: ConfigDict, key: str, allowed: Sequence[str]) -> None:
  value = get_node(config, key)
  if value not in allowed:
    near = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise ConfigError(key, value, f"must be one of {', '.join(allowed)}", f"{hint}set {key} to one of them")


def _check_positive(config: ConfigDict, key: str, allow_zero: bool = False) -> None:
  value = get_node(config, key)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
      value >= 0 if allow_zero else value > 0)
  _check(ok, key, value, "must be " + ("non-negative" if allow_zero else "positive"), f"set {key} to a value {'>= 0' if allow_zero else '> 0'}")


def _check_range(config: ConfigDict, key: str, lo: float, hi: float, lo_open: bool = False) -> None:
  value = get_node(config, key)
  ok = value is not None and (lo < value if lo_open else lo <= value) and value <= hi
  _check(ok, key, value, f"must lie in {'(' if lo_open else '['}{lo}, {hi}]", f"set {key} inside that range")


def _check_batches(config: ConfigDict, world_size: int | None) -> None:
  data, actor = config.data, config.actor_rollout_ref.actor
  n = config.actor_rollout_ref.rollout.n
  mini_key = "actor_rollout_ref.actor.ppo_mini_batch_size"
  _check_positive(config, "data.train_batch_size")
  _check_positive(config, mini_key)
  _check_positive(config, "actor_rollout_ref.rollout.n")
  _check(actor.ppo_mini_batch_size <= data.train_batch_size, mini_key, actor.ppo_mini_batch_size,
         f"is larger than data.train_batch_size ({data.train_batch_size})", f"set {mini_key} <= {data.train_batch_size}")
  _check((data.train_batch_size * n) % (actor.ppo_mini_batch_size * n) == 0, mini_key, actor.ppo_mini_batch_size,
         f"data.train_batch_size * rollout.n ({data.train_batch_size * n}) is not divisible by ppo_mini_batch_size * rollout.n ({actor.ppo_mini_batch_size * n})",
         f"set {mini_key} to a divisor of {data.train_batch_size}")
  if actor.use_dynamic_bsz:
    key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    need = data.max_prompt_length + data.max_response_length
    _check(actor.ppo_max_token_len_per_gpu >= need, key, actor.ppo_max_token_len_per_gpu,
           f"must hold one whole sequence (max_prompt_length + max_response_length = {need})", f"set {key} >= {need}")
    return
  mini_rows = actor.ppo_mini_batch_size * n
  dp = data_parallel_size(config, world_size) if world_size else 1
  _check(mini_rows % dp == 0, mini_key, actor.ppo_mini_batch_size,
         f"ppo_mini_batch_size * rollout.n ({mini_rows}) rows do not split over {dp} data-parallel devices",
         f"make ppo_mini_batch_size * rollout.n a multiple of {dp}")
  micro_key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
  micro = actor.ppo_micro_batch_size_per_gpu
  _check(isinstance(micro, int) and not isinstance(micro, bool) and micro > 0, micro_key, micro,
         "must be a positive integer, or null for the whole per-device mini-batch (or set use_dynamic_bsz=true)",
         f"set {micro_key}=8")
  per_device = mini_rows // dp
  _check(per_device % micro == 0, micro_key, micro,
         f"the mini-batch per device ({per_device} rows = ppo_mini_batch_size {actor.ppo_mini_batch_size} x rollout.n {n} / {dp} devices) is not divisible by it",
         f"set {micro_key} to a divisor of {per_device}")


def _check_lengths(config: ConfigDict) -> None:
  for key in ("data.max_prompt_length", "data.max_response_length",
              "actor_rollout_ref.rollout.prompt_length",
              "actor_rollout_ref.rollout.response_length",
              "actor_rollout_ref.rollout.max_num_seqs"):
    _check_positive(config, key)
  buckets = config.actor_rollout_ref.rollout.prefill_length_buckets
  key = "actor_rollout_ref.rollout.prefill_length_buckets"
  _check(bool(buckets) and all(isinstance(b, int) and b > 0 for b in buckets) and list(buckets) == sorted(set(buckets)),
         key, buckets, "must be a non-empty increasing list of positive lengths", f"e.g. {key}=[64,128,256,512]")


def _check_sampling(config: ConfigDict) -> None:
  for prefix in ("actor_rollout_ref.rollout", "actor_rollout_ref.rollout.val_kwargs"):
    _check_range(config, f"{prefix}.top_p", 0.0, 1.0, lo_open=True)
    _check_positive(config, f"{prefix}.temperature", allow_zero=True)
    _check_positive(config, f"{prefix}.n")
    top_k = get_node(config, f"{prefix}.top_k")
    _check(isinstance(top_k, int) and top_k >= -1, f"{prefix}.top_k", top_k, "must be -1 or 0 (off) or a positive integer", f"set {prefix}.top_k=-1 to disable")
  _check_enum(config, "actor_rollout_ref.rollout.name", ROLLOUT_NAMES)
  _check_enum(config, "actor_rollout_ref.rollout.cpu_dot_library", CPU_DOT_LIBRARIES)
  for key in ("actor_rollout_ref.rollout.dtype", "actor_rollout_ref.actor.fsdp_config.model_dtype",
              "actor_rollout_ref.actor.fsdp_config.dtype", "critic.model.fsdp_config.model_dtype",
              "critic.model.fsdp_config.dtype"):
    _check_enum(config, key, DTYPES)
  from rljax.models import attention, remat  # pylint: disable=import-outside-toplevel
  _check_enum(config, "actor_rollout_ref.model.remat_policy", remat.POLICIES)
  _check_enum(config, "actor_rollout_ref.model.attention_kernel", ("auto",) + attention.KERNELS)


def ignored_reason(path: str) -> str | None:
  """Why rljax accepts and ignores the key `path` (an `IGNORED_KEYS` entry, `prefix.*` ones included), or None.

  An entry of an ignored free-form dictionary (`OPEN_DICTS`) is ignored with it.
  """
  for key, reason in IGNORED_KEYS.items():
    below = key[:-1] if key.endswith(".*") else (key + "." if _is_open(key) else None)
    if path == key or (below and path.startswith(below)):
      return reason
  return None


def ignored_overrides(overrides: Iterable[str]) -> list[str]:
  """`KEY=VALUE` for each override that sets a key rljax accepts and ignores (its value changes nothing)."""
  found = []
  for text in overrides:
    operation, path, value = parse_override(text)
    if operation != "reset" and ignored_reason(path) is not None:
      found.append(f"{path}={value}")
  return found


def _check_profiler(config: ConfigDict) -> None:
  """global_profiler.steps: null or a list of step numbers (1-based, as verl counts steps)."""
  steps = config.global_profiler.steps
  _check(steps is None or all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps),
         "global_profiler.steps", steps, "must be a list of step numbers (1 is the first step)",
         "e.g. global_profiler.steps=[2,3] with actor_rollout_ref.actor.profiler.enable=true")


def _check_unimplemented(config: ConfigDict) -> None:
  """Each `UNIMPLEMENTED_VALUES` key at its default (anything else would run something other than asked)."""
  base = get_base_config()
  for key, (problem, fix) in UNIMPLEMENTED_VALUES.items():
    value = get_node(config, key)
    _check(value == get_node(base, key), key, value, problem, fix)


def _check_dynamic_sampling(config: ConfigDict) -> None:
  """DAPO's dynamic sampling: a metric to filter on, and data.gen_batch_size only where it is used."""
  groups, data = config.algorithm.filter_groups, config.data
  _check_positive(config, "data.gen_batch_size")
  if not groups.enable:
    _check(data.gen_batch_size == data.train_batch_size, "data.gen_batch_size", data.gen_batch_size,
           f"differs from data.train_batch_size ({data.train_batch_size}) but only dynamic sampling uses it",
           "set algorithm.filter_groups.enable=true (and its metric), or drop data.gen_batch_size")
    return
  _check(isinstance(groups.metric, str) and bool(groups.metric), "algorithm.filter_groups.metric", groups.metric,
         "dynamic sampling needs the per-response value whose spread decides which groups to keep",
         "set algorithm.filter_groups.metric=acc (or score, seq_reward, seq_final_reward)")
  _check(not (groups.metric == "seq_final_reward" and config.algorithm.use_kl_in_reward),
         "algorithm.filter_groups.metric", groups.metric,
         "the final reward with use_kl_in_reward needs old and reference log-probs of every generated response, "
         "which rljax computes after filtering", "use algorithm.filter_groups.metric=seq_reward (the score)")
  _check(isinstance(groups.max_num_gen_batches, int), "algorithm.filter_groups.max_num_gen_batches",
         groups.max_num_gen_batches, "must be an integer", "set it to 0 for no limit")


def _check_algorithm(config: ConfigDict) -> None:
  alg, actor = config.algorithm, config.actor_rollout_ref.actor
  _check_enum(config, "algorithm.adv_estimator", ADV_ESTIMATORS)
  _check_enum(config, "algorithm.kl_penalty", KL_TYPES)
  _check_enum(config, "algorithm.kl_ctrl.type", KL_CONTROLLERS)
  _check_enum(config, "actor_rollout_ref.actor.kl_loss_type", KL_TYPES)
  _check_enum(config, "actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG_MODES)
  _check_enum(config, "critic.loss_agg_mode", LOSS_AGG_MODES)
  _check_enum(config, "actor_rollout_ref.actor.policy_loss.loss_mode", POLICY_LOSSES)
  _check(alg.adv_estimator not in TRAINER_UNSUPPORTED_ESTIMATORS, "algorithm.adv_estimator", alg.adv_estimator,
         "needs sum_pi_squared (the sum of squared token probabilities), which the RL trainer does not compute",
         "use the kernel from rljax.algos directly, or choose grpo, rloo, reinforce_plus_plus or gae")
  _check(not alg.use_pf_ppo, "algorithm.use_pf_ppo", alg.use_pf_ppo, "PF-PPO batch reweighting is not implemented",
         "set algorithm.use_pf_ppo=false")
  for key in ("algorithm.gamma", "algorithm.lam"):
    _check_range(config, key, 0.0, 1.0)
  for key in ("actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
              "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.entropy_coeff",
              "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef",
              "actor_rollout_ref.actor.grad_clip", "critic.cliprange_value"):
    _check_positive(config, key, allow_zero=True)
  _check(actor.clip_ratio_c > 1.0, "actor_rollout_ref.actor.clip_ratio_c", actor.clip_ratio_c,
         "dual-clip needs a lower bound > 1", "set actor_rollout_ref.actor.clip_ratio_c=3.0")
  _check_positive(config, "actor_rollout_ref.actor.ppo_epochs")
  n = config.actor_rollout_ref.rollout.n
  _check(alg.adv_estimator not in GROUP_ESTIMATORS or n > 1, "actor_rollout_ref.rollout.n", n,
         f"algorithm.adv_estimator={alg.adv_estimator} compares several responses per prompt",
         "set actor_rollout_ref.rollout.n to 2 or more (e.g. 5)")
  _check(not (alg.adv_estimator == "gae" and config.critic.enable is False), "critic.enable", False,
         "algorithm.adv_estimator=gae needs a critic for its values",
         "set critic.enable=null (auto) or choose a critic-free estimator such as grpo")
  for key in ("algorithm.rollout_is_level", "actor_rollout_ref.actor.rollout_is_level"):
    _check_enum(config, key, ROLLOUT_IS_LEVELS)
  for key in ("algorithm.rollout_is_mode", "actor_rollout_ref.actor.rollout_is_mode"):
    _check_enum(config, key, ROLLOUT_IS_MODES)


def _check_optim(config: ConfigDict) -> None:
  for prefix in ("actor_rollout_ref.actor.optim", "critic.optim"):
    _check_enum(config, f"{prefix}.lr_scheduler_type", LR_SCHEDULERS)
    _check_positive(config, f"{prefix}.lr", allow_zero=True)
    _check_positive(config, f"{prefix}.weight_decay", allow_zero=True)
    _check_range(config, f"{prefix}.lr_warmup_steps_ratio", 0.0, 1.0)
    _check_range(config, f"{prefix}.min_lr_ratio", 0.0, 1.0)
    _check_positive(config, f"{prefix}.num_cycles", allow_zero=True)
    name = get_node(config, f"{prefix}.optimizer")
    _check(str(name).lower() in ADAM_NAMES, f"{prefix}.optimizer", name,
           "rljax's optimizer is optax's AdamW (decoupled weight decay)", f"set {prefix}.optimizer=AdamW")


def _check_trainer(config: ConfigDict) -> None:
  trainer = config.trainer
  _check_enum(config, "trainer.resume_mode", RESUME_MODES)
  _check_enum(config, "trainer.device", DEVICES)
  _check_enum(config, "data.truncation", TRUNCATIONS)
  _check_enum(config, "reward_model.reward_manager", REWARD_MANAGERS)
  _check_positive(config, "trainer.total_epochs")
  if trainer.total_training_steps is not None:
    _check_positive(config, "trainer.total_training_steps")
  for key in ("trainer.save_freq", "trainer.test_freq"):
    value = get_node(config, key)
    _check(value == -1 or value > 0, key, value, "must be -1 (never) or a positive step count", f"set {key}=-1 or a step count")
  _check(trainer.resume_mode != "resume_path" or bool(trainer.resume_from_path), "trainer.resume_from_path",
         trainer.resume_from_path, "trainer.resume_mode=resume_path needs a checkpoint path",
         "set trainer.resume_from_path=DIR or trainer.resume_mode=auto")
  loggers = trainer.logger if isinstance(trainer.logger, (list, tuple)) else [trainer.logger]
  for name in loggers:
    _check(name in LOGGERS, "trainer.logger", list(loggers), f"{name!r} is not a logger rljax has", f"choose from {', '.join(LOGGERS)}")
  for key in ("actor_rollout_ref.actor.checkpoint.save_contents", "critic.checkpoint.save_contents"):
    contents = get_node(config, key)
    bad = [c for c in contents if c not in CHECKPOINT_CONTENTS]
    _check(not bad, key, list(contents), f"unknown entries {bad}", f"choose from {', '.join(CHECKPOINT_CONTENTS)}")
  for key in ("data.train_max_samples", "data.val_max_samples"):
    value = get_node(config, key)
    _check(value == -1 or value > 0, key, value, "must be -1 (all rows) or a positive count", f"set {key}=-1")
  _check_positive(config, "data.filter_overlong_prompts_workers")


def _check_cache_length(config: ConfigDict) -> None:
  rollout = config.actor_rollout_ref.rollout
  needed = config.data.max_prompt_length + rollout.response_length
  _check(rollout.max_model_len is None or rollout.max_model_len >= needed, "actor_rollout_ref.rollout.max_model_len",
         rollout.max_model_len, f"is shorter than a prompt and its response ({needed} tokens)",
         f"set it to at least {needed} or null")


def _check_reward_model(config: ConfigDict) -> None:
  rm = config.reward_model
  if not rm.enable:
    return
  if rm.max_length is not None:
    _check_positive(config, "reward_model.max_length")
  own_tokens = rm.model.input_tokenizer not in (None, config.actor_rollout_ref.model.path)
  _check(not own_tokens or config.data.return_raw_chat, "data.return_raw_chat", config.data.return_raw_chat,
         "reward_model.model.input_tokenizer differs from the actor's, so the chat must be re-rendered "
         "from the prompt messages", "set data.return_raw_chat=true, or reward_model.model.input_tokenizer=null "
         "when both models share a tokenizer")


def _check_overlong_buffer(config: ConfigDict) -> None:
  """DAPO's max_resp_len (verl's reward_model.reward_kwargs.max_resp_len) is where rljax's penalty ramp ends."""
  limit, length = config.reward_model.overlong_buffer.max_resp_len, config.data.max_response_length
  _check(limit is None or limit == length, "reward_model.overlong_buffer.max_resp_len", limit,
         f"differs from data.max_response_length ({length}), the length at which rljax's overlong penalty is full",
         f"set them equal: reward_model.overlong_buffer.max_resp_len={length} "
         f"(verl's +reward_model.reward_kwargs.max_resp_len) or data.max_response_length={limit}")


def check_data_files(config: ConfigDict, key: str, required: bool = True) -> None:
  """`key` holds one parquet path or a list of them (verl mixes data sets with a list).

  Args:
    config: the tree.
    key: data.train_files or data.val_files.
    required: without it, null or an empty value (no such data) passes.

  Raises:
    ConfigError: naming `key`.
  """
  files = get_node(config, key)
  if not required and not files:
    return
  paths = [files] if isinstance(files, str) else files
  ok = isinstance(paths, (list, tuple)) and bool(paths) and all(isinstance(p, str) and p for p in paths)
  _check(ok, key, files, "must be a parquet file or a list of them", f"e.g. {key}=[a.parquet,b.parquet]")


def _check_data_files(config: ConfigDict) -> None:
  check_data_files(config, "data.train_files")
  check_data_files(config, "data.val_files", required=False)


def _check_model_overrides(config: ConfigDict) -> None:
  """The HF fields of override_config.model_config must change the model rljax builds (or change nothing)."""
  from rljax.models import config as model_config  # pylint: disable=import-outside-toplevel
  prefix = "actor_rollout_ref.model.override_config.model_config"
  for name, value in get_node(config, prefix).to_dict().items():
    _check(model_config.override_applies(name, value), f"{prefix}.{name}", value,
           "is a Hugging Face config field rljax's models do not read, so the override would not change the "
           "model here as it does in verl",
           f"drop it; rljax reads {', '.join(sorted(model_config.READ_FIELDS))} (dropout fields may be 0: "
           "rljax's models have no dropout)")


# A Hugging Face Hub repository id: ORG/NAME.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def check_model_path(key: str, path: Any, must_exist: bool = False) -> None:
  """Raises a ConfigError naming `key` unless `path` names a model rljax can read.

  rljax reads a local directory, a .gguf file or one of its aliases
  (`rljax.models.api.ALIASES`) and downloads nothing. A Hugging Face Hub id
  (`ORG/NAME` with no such local path) is always an error; another missing
  path only with `must_exist` (when a run starts): presets name
  `~/models/...` directories that need not exist where a config is only
  validated, printed or compiled (rljax.compile knows architectures by name).

  Args:
    key: the key holding the path, for the message.
    path: its value.
    must_exist: also reject a missing local path.
  """
  from rljax.models.api import ALIASES  # pylint: disable=import-outside-toplevel
  if not isinstance(path, str) or path.lower() in ALIASES or os.path.exists(os.path.expanduser(path)):
    return
  hub = _HUB_ID.match(path) is not None
  if not (hub or must_exist):
    return
  local = f"~/models/{path.rsplit('/', 1)[-1]}" if hub else path
  raise ConfigError(key, path, f"is not a local directory, a .gguf file or an alias ({', '.join(ALIASES)}); "
                    "rljax downloads no weights",
                    f"huggingface-cli download {path if hub else 'ORG/NAME'} --local-dir {local}, "
                    f"then set {key}={local}")


def model_path_keys(config: ConfigDict) -> list[str]:
  """The keys naming the models an RL run loads.

  The actor's; the critic's where it has one (critic.enable, by default
  algorithm.adv_estimator=gae); the reward model's where it is enabled.
  """
  keys = ["actor_rollout_ref.model.path"]
  critic = config.critic.enable
  if critic or (critic is None and config.algorithm.adv_estimator == "gae"):
    keys.append("critic.model.path")
  if config.reward_model.enable:
    keys.append("reward_model.model.path")
  return keys


def _check_model_paths(config: ConfigDict) -> None:
  for key in model_path_keys(config):
    check_model_path(key, get_node(config, key))


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def lora_targets(value: Any, key: str = "actor_rollout_ref.model.target_modules") -> tuple[str, ...]:
  """target_modules as HF projection names: 'all-linear', a list, or a comma-separated string."""
  if value == "all-linear":
    return LORA_TARGET_MODULES
  names = [n.strip() for n in value.split(",")] if isinstance(value, str) else value
  ok = isinstance(names, (list, tuple)) and bool(names) and all(isinstance(n, str) for n in names)
  _check(ok, key, value, "must be all-linear or a non-empty list of module names", f"e.g. {key}=[q_proj,v_proj]")
  unknown = [n for n in names if n not in LORA_TARGET_MODULES]
  _check(not unknown, key, value, f"unknown module(s) {unknown}; LoRA targets are {', '.join(LORA_TARGET_MODULES)}",
         f"set {key}=all-linear or choose from those names")
  return tuple(dict.fromkeys(names))


def _check_patterns(values: Any, key: str, value_ok, kind: str) -> None:
  values = values.to_dict() if isinstance(values, ConfigDict) else values
  _check(isinstance(values, dict), key, values, "must be a mapping {regex: value}",
         f"e.g. {key}={{'q_proj': 16}} (quote regex keys: {{'layers\\.0\\..*': 16}})")
  for pattern, value in values.items():
    try:
      re.compile(pattern)
    except (re.error, TypeError) as e:
      raise ConfigError(key, values, f"key {pattern!r} is not a regular expression ({e})",
                        "write a Python regex matched against names like model.layers.0.self_attn.q_proj") from e
    _check(value_ok(value), key, values, f"value {value!r} of {pattern!r} must be {kind}", f"give each pattern {kind}")


def lora_defaults() -> dict[str, Any]:
  """verl's LoRA keys and cosmos-rl's extras with their defaults (a model node's; LoRA off)."""
  return {
      "lora_rank": 0,
      "lora_alpha": 16,
      "target_modules": _any("all-linear"),
      "lora_dropout": 0.0,
      "use_rslora": False,
      "modules_to_save": _null(list),
      "alpha_pattern": _any({}),
      "r_pattern": _any({}),
      "init_lora_weights": _any(True),
  }


def check_lora(values: Any, prefix: str = "actor_rollout_ref.model") -> None:
  """Checks a model node's LoRA keys (verl's and cosmos-rl's); ConfigError names `prefix.KEY`.

  Args:
    values: a mapping with lora_rank, lora_alpha, target_modules, lora_dropout,
      use_rslora, modules_to_save, alpha_pattern, r_pattern, init_lora_weights.
    prefix: the node's key path, for the messages.
  """
  key = lambda name: f"{prefix}.{name}"  # noqa: E731
  rank, alpha, dropout = values["lora_rank"], values["lora_alpha"], values["lora_dropout"]
  _check(_is_int(rank) and rank >= 0, key("lora_rank"), rank, "must be an integer >= 0 (0 = full fine-tuning)",
         f"set {key('lora_rank')}=8, or 0 to train every parameter")
  _check(_is_number(alpha) and alpha > 0, key("lora_alpha"), alpha, "must be a positive number",
         f"set {key('lora_alpha')}=16")
  _check(_is_number(dropout) and 0.0 <= dropout < 1.0, key("lora_dropout"), dropout, "must lie in [0, 1)",
         f"set {key('lora_dropout')}=0.0")
  _check(isinstance(values["use_rslora"], bool), key("use_rslora"), values["use_rslora"], "must be true or false",
         f"set {key('use_rslora')}=false")
  lora_targets(values["target_modules"], key("target_modules"))
  saved = values["modules_to_save"]
  ok = saved is None or (isinstance(saved, (list, tuple)) and all(isinstance(n, str) for n in saved))
  _check(ok, key("modules_to_save"), saved, "must be null or a list of module names",
         f"e.g. {key('modules_to_save')}=[lm_head]")
  unknown = [n for n in saved or () if n.rsplit(".", 1)[-1] not in LORA_SAVABLE_MODULES]
  _check(not unknown, key("modules_to_save"), saved,
         f"unknown module(s) {unknown}; names end in one of {', '.join(LORA_SAVABLE_MODULES)}",
         "list HF module names such as lm_head, embed_tokens or model.layers.0.input_layernorm")
  _check_patterns(values["alpha_pattern"], key("alpha_pattern"), lambda v: _is_number(v) and v > 0, "a positive number")
  _check_patterns(values["r_pattern"], key("r_pattern"), lambda v: _is_int(v) and v > 0, "a positive integer")
  init = values["init_lora_weights"]
  _check(init is True or init == "gaussian", key("init_lora_weights"), init, "must be true (B=0) or gaussian",
         f"set {key('init_lora_weights')}=true")


def _check_lora(config: ConfigDict) -> None:
  check_lora(config.actor_rollout_ref.model)


def _check_mesh(config: ConfigDict, world_size: int | None) -> None:
  actor = config.actor_rollout_ref.actor
  for key in ("actor_rollout_ref.actor.tensor_model_parallel_size",
              "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
              "actor_rollout_ref.rollout.tensor_model_parallel_size"):
    _check_positive(config, key)
  fsdp = actor.fsdp_config.fsdp_size
  _check(fsdp == -1 or fsdp > 0, "actor_rollout_ref.actor.fsdp_config.fsdp_size", fsdp, "must be -1 (all remaining devices) or positive", "set it to -1")
  if world_size is None:
    return
  model_axes = actor.tensor_model_parallel_size * actor.ulysses_sequence_parallel_size
  _check(world_size % model_axes == 0, "actor_rollout_ref.actor.tensor_model_parallel_size", actor.tensor_model_parallel_size,
         f"tensor x sequence ({model_axes}) does not divide the {world_size} devices", f"choose sizes whose product divides {world_size}")
  if fsdp != -1:
    _check((world_size // model_axes) % fsdp == 0, "actor_rollout_ref.actor.fsdp_config.fsdp_size", fsdp,
           f"does not divide the {world_size // model_axes} devices left after tensor x sequence", "set it to -1 or a divisor")
  tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
  _check(world_size % tp == 0, "actor_rollout_ref.rollout.tensor_model_parallel_size", tp,
         f"does not divide the {world_size} devices", f"set it to a divisor of {world_size}")


def validate(config: ConfigDict, world_size: int | None = None) -> ConfigDict:
  """Checks every cross-key rule; raises ConfigError on the first failure.

  Args:
    config: a finalized config.
    world_size: devices in the job; enables the per-device divisibility and
      mesh rules (None checks only what does not depend on devices).

  Returns:
    The config, unchanged.
  """
  _check_mesh(config, world_size)
  _check_lengths(config)
  _check_batches(config, world_size)
  _check_sampling(config)
  _check_algorithm(config)
  _check_unimplemented(config)
  _check_profiler(config)
  _check_dynamic_sampling(config)
  _check_optim(config)
  _check_trainer(config)
  _check_reward_model(config)
  _check_overlong_buffer(config)
  _check_data_files(config)
  _check_model_paths(config)
  _check_model_overrides(config)
  _check_cache_length(config)
  _check_lora(config)
  return config


def to_plain(config: ConfigDict) -> dict:
  """The resolved tree as plain Python (references followed, lists as lists)."""
  def plain(value):
    if isinstance(value, dict):
      return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [plain(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
      return str(value)
    return value
  return plain(config.to_dict())


def to_yaml(config: ConfigDict) -> str:
  """The resolved config as YAML in verl's layout (ppo_trainer.yaml keys)."""
  return yaml.safe_dump(to_plain(config), sort_keys=False, default_flow_style=None, width=100)


def _flatten(tree: dict, prefix: str = "") -> Iterable[tuple[str, Any]]:
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, dict) and value and not _is_open(path) and path not in DICT_FIELDS:
      yield from _flatten(value, path + ".")
    else:
      yield path, value


class YamlLoader(yaml.SafeLoader):
  """YAML as OmegaConf (verl) reads it: `1e-6` is a float (PyYAML alone reads a string)."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def parse_yaml(text: str) -> Any:
  """Parses YAML text with OmegaConf's float rule (verl's files write `lr: 1e-6`)."""
  return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)


def from_yaml(text: str, base: ConfigDict | None = None) -> ConfigDict:
  """Loads a verl-style YAML tree onto `base` (default: the base config).

  Every leaf is applied with the same checks as a command-line override, so
  an unknown key names the closest valid one.
  """
  config = base if base is not None else get_base_config()
  tree = parse_yaml(text) or {}
  if not isinstance(tree, dict):
    raise ConfigError("<yaml>", type(tree).__name__, "the top level must be a mapping", "write KEY: VALUE lines")
  for path, value in _flatten(tree):
    set_value(config, path, value)
  return config


_CONFIG_ARG = re.compile(r"^--config\.(?P<path>[^=]+)(=(?P<value>.*))?$")
_VERL_ARG = re.compile(r"^(\+\+?|~)?[A-Za-z_][\w\-]*(\.[\w\-]+)*=")
_DELETE_ARG = re.compile(r"^~[A-Za-z_][\w\-]*(\.[\w\-]+)*$")


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates config overrides from the other command-line arguments.

  Both `--config.KEY=VALUE` (also `--config.KEY VALUE`) and verl's positional
  `KEY=VALUE` become `KEY=VALUE` strings, kept in command-line order so the
  last one wins whatever its syntax. Hydra's `+KEY=VALUE`, `++KEY=VALUE`
  and `~KEY[=VALUE]` are kept as they are (`apply_overrides` reads them).

  Returns:
    (overrides, remaining arguments for absl).
  """
  overrides, rest = [], []
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    match = _CONFIG_ARG.match(arg)
    if match:
      value = match.group("value")
      if value is None:
        if i + 1 >= len(args):
          raise ConfigError(match.group("path"), NO_VALUE, "the flag has no value", f"write --config.{match.group('path')}=VALUE")
        i += 1
        value = args[i]
      overrides.append(f"{match.group('path')}={value}")
    elif _VERL_ARG.match(arg) or _DELETE_ARG.match(arg):
      overrides.append(arg)
    else:
      rest.append(arg)
    i += 1
  return overrides, rest


def _flag_values(argv: Sequence[str], names: Sequence[str]) -> tuple[dict[str, str], list[str]]:
  """Takes the flags `names` (`--NAME=VALUE` or `--NAME VALUE`) out of `argv` -> (values, the rest)."""
  values, rest = {}, []
  args = list(argv)
  i = 0
  while i < len(args):
    flag, equals, value = args[i].partition("=")
    if flag not in names:
      rest.append(args[i])
    elif equals:
      values[flag] = value
    elif i + 1 < len(args):
      i += 1
      values[flag] = args[i]
    else:
      raise ConfigError(flag, NO_VALUE, "the flag has no value", f"write {flag}=VALUE")
    i += 1
  return values, rest


def hydra_config_file(argv: Sequence[str]) -> tuple[str | None, list[str]]:
  """Takes Hydra's `--config-path DIR --config-name NAME` out of the command line.

  verl launch lines pick their YAML file this way; `--config-name` alone
  reads it from `configs/`, and NAME may leave out `.yaml`.

  Returns:
    (DIR/NAME.yaml, or None without those flags; the other arguments).

  Raises:
    ConfigError: a flag without a value, --config-path without
      --config-name, --config given as well, or no such file.
  """
  values, rest = _flag_values(argv, HYDRA_CONFIG_FLAGS)
  if not values:
    return None, rest
  name = values.get("--config-name")
  if name is None:
    raise ConfigError("--config-path", values["--config-path"], "names a directory but not the file in it",
                      "add --config-name=NAME, the YAML file's name")
  if any(arg == "--config" or arg.startswith("--config=") for arg in rest):
    raise ConfigError("--config-name", name, "--config names an experiment as well",
                      "use one: --config=FILE.py[:PRESET], or --config-path=DIR --config-name=NAME for a verl YAML file")
  file = name if name.endswith(VERL_YAML_SUFFIXES) else name + ".yaml"
  path = os.path.join(values.get("--config-path", HYDRA_CONFIG_DIR), file)
  if not os.path.isfile(os.path.expanduser(path)):
    raise ConfigError("--config-name", name, f"no such YAML file {path}",
                      "give --config-path the directory that holds it (default: configs)")
  return path, rest


def load_config_file(spec: str) -> ConfigDict:
  """Imports an experiment file and returns its `get_config(arg)`.

  Args:
    spec: `path/to/file.py` or `path/to/file.py:ARG` (ml_collections'
      config_flags spelling; ARG picks a preset), or a verl YAML file
      (`FILE.yaml`), loaded as `configs/verl_yaml.py:FILE.yaml` loads it.
  """
  import importlib.util  # pylint: disable=import-outside-toplevel

  if spec.endswith(VERL_YAML_SUFFIXES) and os.path.isfile(os.path.expanduser(spec)):
    from rljax import verl_yaml  # pylint: disable=import-outside-toplevel
    return verl_yaml.load_file(spec)
  path, _, arg = spec.partition(":")
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise ConfigError("--config", spec, "no such file", "pass an experiment file such as configs/grpo.py")
  module_spec = importlib.util.spec_from_file_location(
      "rljax_experiment_" + re.sub(r"\W", "_", os.path.abspath(path)), path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError("--config", spec, "defines no get_config(arg=None)", "add def get_config(arg=None) returning a ConfigDict")
  config = module.get_config(arg) if arg else module.get_config()
  if not isinstance(config, ConfigDict):
    raise ConfigError("--config", spec, f"get_config returned {type(config).__name__}", "return a ConfigDict built from rljax.config.get_base_config()")
  return config


__all__ = [
    "ConfigError", "get_base_config", "load_config_file", "apply_overrides", "split_overrides",
    "hydra_config_file", "reset_value", "add_value", "verl_free_form_path", "VERL_FREE_FORM",
    "finalize", "validate",
    "to_yaml", "from_yaml", "leaf_paths", "get_node", "set_value",
    "IGNORED_KEYS", "MAPPED_KEYS", "RLJAX_KEYS", "DEPRECATED_KEYS",
    "check_lora", "lora_targets", "LORA_TARGET_MODULES", "LORA_SAVABLE_MODULES",
    "check_data_files", "check_model_path", "model_path_keys",
]
