"""What rljax does with each verl key that it does not honour as verl does.

* `IGNORED_KEYS`: keys that only mean something to PyTorch, Ray, vLLM, SGLang
  or Nsight. They are accepted so a verl launch line pastes over, and do
  nothing (`prefix.*` covers every key below a prefix).
* `MAPPED_KEYS`: verl keys whose meaning changes on a JAX device mesh.
* `RLJAX_KEYS`: keys rljax adds to the tree (mesh rules, engine buckets,
  LoRA extras, cosmos-rl's loss terms), named in verl's style.
* `UNIMPLEMENTED_VALUES`: keys accepted at verl's default only.
* `DEPRECATED_KEYS`: old names still read; `mapping.finalize` moves their
  values onto the replacements.
"""

from __future__ import annotations

from rljax.config.engines import (
    FSDP_ENGINE_KEYS, FSDP_ENGINE_SECTIONS, MEGATRON_FREE_FORM, MEGATRON_KEYS, MEGATRON_MESH_KEYS,
    MEGATRON_SCHEDULE_KEYS, OPTIM_SECTIONS, PROFILED_SECTIONS,
)
from rljax.config.tree import is_open


def _engine_ignored() -> dict[str, str]:
  """`IGNORED_KEYS` entries for the PyTorch-only keys of verl's engine configs."""
  ignored = {f"{section}.{key}": "a PyTorch FSDP engine setting; the mesh and the actor's keys set rljax's sharding"
             for section in FSDP_ENGINE_SECTIONS for key in FSDP_ENGINE_KEYS}
  for section in FSDP_ENGINE_SECTIONS:
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
  for key in MEGATRON_KEYS:
    if key not in MEGATRON_MESH_KEYS and key != "expert_model_parallel_size":
      ignored[f"actor_rollout_ref.actor.megatron.{key}"] = (
          "a Megatron-LM setting (offload, pipelining, checkpoint format, kernels)")
  for key in MEGATRON_FREE_FORM:
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
       for section in OPTIM_SECTIONS},
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
       for section in OPTIM_SECTIONS},
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
       for section in OPTIM_SECTIONS for key in MEGATRON_SCHEDULE_KEYS},
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


def ignored_reason(path: str) -> str | None:
  """Why rljax accepts and ignores the key `path` (an `IGNORED_KEYS` entry, `prefix.*` ones included), or None.

  An entry of an ignored free-form dictionary (`OPEN_DICTS`) is ignored with it.
  """
  for key, reason in IGNORED_KEYS.items():
    below = key[:-1] if key.endswith(".*") else (key + "." if is_open(key) else None)
    if path == key or (below and path.startswith(below)):
      return reason
  return None
