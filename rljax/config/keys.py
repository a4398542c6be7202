"""Every key of the RL tree, described once: what it means and what rljax does with it.

`KEYS` holds one `Key` record per key of `tree.get_base_config()` (the
leaves `rljax.docs_reference.reference_paths` lists, free-form mappings
included): its meaning, written for rljax from verl's documents, and where
rljax does not honour it as verl does, how not:

* `ignored`: it only means something to PyTorch, Ray, vLLM, SGLang or
  Nsight. It is accepted so a verl launch line pastes over, and does nothing.
  `IGNORED_SECTIONS` ignores every key below a prefix.
* `mapped`: its meaning changes on a JAX device mesh.
* `added`: rljax adds it to the tree (mesh rules, engine buckets, LoRA
  extras, cosmos-rl's loss terms), named in verl's style.
* `default_only`: accepted at verl's default only; another value is an error.
* `deprecated`: an old name still read; `mapping.finalize` moves its value
  onto the replacement.
* `alias_of`: verl's other spelling of a key, read without a warning (the
  SFT tree's `optim.lr_warmup_steps_ratio`).

Keys that several roles share (optimizer, engine, profiler configs) are
described once per node (`_OPTIM`, `_MEGATRON`, ...) and placed under each
role by `described`. The tables `IGNORED_KEYS`, `MAPPED_KEYS`,
`RLJAX_KEYS`, `UNIMPLEMENTED_VALUES` and `DEPRECATED_KEYS` are views of
`KEYS` (`view`, `ignored_table`); `rljax.docs_reference` renders it as
docs/configuration.md, with `SECTIONS` introducing each group.
`tests/test_docs.py` fails when a key has no record, so a new key in the
tree needs one here. The SFT, generation and evaluation trees describe their
keys with the same `Key` records (`rljax.sft.keys`, `rljax.evaluation.keys`)
and derive their tables with the same functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

from rljax.config.engines import MEGATRON_SCHEDULE_KEYS, MUON_KEYS, OPTIM_SECTIONS, PROFILED_SECTIONS
from rljax.config.trainer import TEACHER_INFERENCE


@dataclasses.dataclass(frozen=True)
class Key:
  """One key: its meaning, and what rljax does with it where that is not what verl does.

  Attributes:
    meaning: what the key means.
    ignored: why rljax accepts the key and does nothing with it.
    mapped: the meaning the key takes in rljax (on a JAX device mesh).
    added: what a key rljax adds to verl's tree does.
    default_only: (what rljax lacks, the fix): a value other than verl's
      default is an error.
    deprecated: (the key it is read as, or None where it is still honoured;
      how the value moves).
    alias_of: the key this one is verl's other spelling of: when set, its
      value replaces that key's (no warning: it is not deprecated).
    type_note: the values a key declared with no single type accepts.
  """

  meaning: str
  ignored: str | None = None
  mapped: str | None = None
  added: str | None = None
  default_only: tuple[str, str] | None = None
  deprecated: tuple[str | None, str] | None = None
  alias_of: str | None = None
  type_note: str | None = None


_RECIPE = "sets trainer.v1.trainer_mode=colocate_async (verl's fully-async recipe, colocated)"
_SWITCH = "read only with trainer.v1.separate_async.hybrid_rollout.enable_switch, which is not implemented (an error)"
_IN_PLACE = "the engine reads the trainer's arrays in place: no weights are sent"
_COLOCATED = ("the fully-async recipe runs as colocate_async, on the training devices; trainer.v1.trainer_mode="
              "separate_async with actor_rollout_ref.rollout.nnodes and n_gpus_per_node generates on devices of its own")


# What rljax does with a node's keys: KEY -> `Key` fields, or a function of the role giving them.
Status = Union[dict[str, dict[str, Any]], Callable[[str], dict[str, dict[str, Any]]], None]


def described(roles: tuple[str, ...], node: str, meanings: dict[str, str], status: Status = None) -> dict[str, Key]:
  """A `Key` for `ROLE.NODE.KEY`, for each of `roles` and each key of `meanings` (an empty role: `NODE.KEY`)."""
  records = {}
  for role in roles:
    fields = status(role) if callable(status) else status or {}
    for key, meaning in meanings.items():
      records[".".join(part for part in (role, node, key) if part)] = Key(meaning, **fields.get(key, {}))
  return records


# MTP keys that only speculative decoding in verl's inference servers reads: a speed-up that leaves the samples'
# distribution as it is (its drafts are accepted by rejection sampling)
_SPECULATIVE = ("speculative decoding with the MTP layers in vLLM/SGLang; rljax's engine decodes one token per "
                "step, from the same distribution")


# the reason of keys verl 0.9.1 declares in its config and no code of it reads: setting one changes no run there
NOWHERE = "verl 0.9.1 declares it and reads it nowhere"


def _router_replay_status(role: str) -> dict[str, dict[str, Any]]:
  """What rljax does with `ROLE.router_replay.*`: the actor's mode is honoured (disabled, R2, R3); the files are
  listed, as verl 0.9.1 declares them and reads them nowhere."""
  files = {key: dict(ignored=f"{NOWHERE}: its replay records and replays routing in memory")
           for key in ("record_file", "replay_file")}
  if role == "actor_rollout_ref.actor":
    return files
  return {**files, "mode": dict(default_only=(
      "the reference pass follows actor_rollout_ref.actor.router_replay.mode (R3 replays the rollout's routing in it)",
      f"set {role}.router_replay.mode=disabled and choose the replay with actor_rollout_ref.actor.router_replay.mode"))}


_MEGATRON_LORA_READ = "with rank > 0 under actor_rollout_ref.actor.strategy=megatron (rljax.config.mapping)"


def _megatron_lora_status(role: str) -> dict[str, dict[str, Any]]:
  """What rljax does with `ROLE.lora.*` (verl's Megatron LoRA block): the actor's is read under the Megatron
  strategy, onto the actor's LoRA keys; the critic trains in full."""
  if role != "actor_rollout_ref.model":
    return {"rank": dict(default_only=("the critic trains in full", f"set {role}.lora.rank=0"))}
  unread = "a non-default value is an error " + _MEGATRON_LORA_READ
  return {
      "rank": dict(mapped="sets actor_rollout_ref.model.lora_rank (the actor's adapters) under "
                          "actor_rollout_ref.actor.strategy=megatron; under fsdp, whose verl engine does not read it, "
                          "an error"),
      "type": dict(mapped="lora: Megatron's fused linear_qkv and linear_fc1 adapters, so q, k and v (gate and up) "
                          "share one A (rljax.models.lora.LoRAConfig.shared_a); canonical_lora: an adapter per "
                          "projection; dora and vlm_lora: an error"),
      "alpha": dict(mapped="sets actor_rollout_ref.model.lora_alpha (scale alpha / rank) " + _MEGATRON_LORA_READ),
      "dropout": dict(mapped="sets actor_rollout_ref.model.lora_dropout " + _MEGATRON_LORA_READ),
      "target_modules": dict(mapped="Megatron's module names as HF projections (linear_qkv: q_proj, k_proj, v_proj; "
                                    "linear_proj: o_proj; linear_fc1: gate_proj, up_proj; linear_fc2: down_proj) "
                                    "onto actor_rollout_ref.model.target_modules; a mixture-of-experts model's "
                                    "experts (one adapter shared by a layer's experts in Megatron-Bridge) are an "
                                    "error"),
      "lora_A_init_method": dict(mapped="A's initialisation: xavier (normal, std sqrt(2 / (in + r))), normal (std "
                                        "0.2) or kaiming (uniform, bound 1 / sqrt(in))"),
      **{key: dict(mapped=unread) for key in ("exclude_modules", "dropout_position", "lora_B_init_method",
                                              "adapter_path")},
      "merge": dict(ignored="the rollout reads the adapters in place: nothing is merged for it"),
      "a2a_experimental": dict(ignored="a communication pattern of Megatron's expert adapters"),
      "dtype": dict(ignored="the adapters take the dtype of the weights they adapt"),
      **{key: dict(ignored="vision-language LoRA (type vlm_lora, an error)")
         for key in ("freeze_vision_model", "freeze_vision_projection", "freeze_language_model")},
  }


def _optim_status(role: str) -> dict[str, dict[str, Any]]:
  """What rljax does with the keys of `ROLE.optim`."""
  optim = f"{role}.optim"
  schedule_fix = f"{optim}.lr_scheduler_type, lr_warmup_steps and min_lr_ratio set the schedule"
  return {
      "warmup_style": dict(deprecated=(f"{optim}.lr_scheduler_type", "same value")),
      "optimizer": dict(mapped="AdamW or adam (Megatron's name) select rljax's optax AdamW; another name is an error"),
      "optimizer_impl": dict(ignored="the module verl imports the optimizer from; rljax's AdamW is optax's"),
      "clip_grad": dict(mapped=f"verl's newer name of {role}.grad_clip: a value other than 1.0 sets it (both set, "
                               "differently: an error)"),
      **{key: dict(mapped=f"read where {role}.strategy=megatron, as verl's Megatron engine reads it: the learning "
                          "rate follows Megatron-Core's scheduler (rljax.training.optim.megatron_lr); under fsdp a "
                          f"value other than verl's default is an error ({schedule_fix})")
         for key in MEGATRON_SCHEDULE_KEYS},
      "weight_decay_incr_style": dict(mapped=f"checked where {role}.strategy=megatron (constant, linear or cosine); "
                                             "verl gives Megatron equal start and end weight decay, so no style "
                                             "changes it; under fsdp a value other than verl's default is an error"),
      "use_checkpoint_opt_param_scheduler": dict(ignored="a resume always restores the schedule's step"),
      "optimizer_offload_fraction": dict(mapped="that fraction of the optimizer state's bytes stays in host memory "
                                                "between updates; the update itself runs on the devices"),
      "overlap_cpu_optimizer_d2h_h2d": dict(ignored="how Megatron's CPU optimizer overlaps its copies; XLA schedules "
                                                    "an offloaded state's copies within the update"),
      "optimizer_cpu_offload": dict(ignored="Megatron's switch for its CPU optimizer, which updates the offloaded "
                                            "share on the CPU; rljax keeps optimizer_offload_fraction of the state in "
                                            "host memory and updates on the devices, to the same numbers"),
      "use_precision_aware_optimizer": dict(ignored="Megatron's optimizer that may hold its states in lower "
                                                    "precision: at its default dtypes (float32) the update is the "
                                                    "same; its dtype arguments (exp_avg_dtype, ...) are an error"),
  }


# Reasons many keys share.
_PROFILE_TOOLS = ("Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, "
                  "global_profiler.steps)")
_MEGATRON_LM_SETTING = "a Megatron-LM setting (offload, pipelining, checkpoint format, kernels)"
ACTOR_WEIGHTS_STAY = ("the actor's weights stay in device memory: every step of a run reads them (the rollout in "
                      "place), so there is no step outside which they could leave")
GRADIENTS_STAY = "gradients exist only inside an update step, in device memory"
_FSDP_ENGINE_SETTING = "a PyTorch FSDP engine setting; the mesh and the actor's keys set rljax's sharding"

# The text introducing each group of keys in the reference.
SECTIONS = {
    "data": "Where the prompts come from and how they are cut into batches: verl's parquet layout "
            "(a chat-message `prompt` column, `data_source`, `reward_model['ground_truth']`, `extra_info`).",
    "actor_rollout_ref": "The policy in its three roles: the actor being trained, the rollout engine "
                         "sampling from it, and the frozen reference for the KL term.",
    "actor_rollout_ref.model": "The policy's checkpoint and model-level options, shared by actor, rollout and reference.",
    "actor_rollout_ref.actor": "The policy update: batch geometry, PPO clipping, the loss and its terms, "
                               "the optimizer and the actor's checkpoint contents.",
    "actor_rollout_ref.ref": "The frozen reference policy, used when `actor.use_kl_loss` or "
                             "`algorithm.use_kl_in_reward` is on.",
    "actor_rollout_ref.rollout": "Response generation: sampling parameters for training and validation, "
                                 "lengths and the engine's capacity.",
    "critic": "The value model for `algorithm.adv_estimator=gae` (PPO); most keys mirror the actor's.",
    "reward_model": "How responses are scored: a learned reward model (optional), the reward manager "
                    "that runs rule functions, and DAPO's overlong penalty.",
    "custom_reward_function": "A Python file with your own scoring function, used instead of the built-in "
                              "scorers for every `data_source`.",
    "algorithm": "The RL algorithm: advantage estimator, discounting, the KL penalty in the reward, "
                 "and rollout importance-sampling correction.",
    "trainer": "The run itself: length, devices, logging, validation, checkpoints and the mesh's logical-axis rules.",
    "ray_init": "verl's Ray start-up options; rljax runs one JAX program per host without Ray.",
    "async_training": "verl's fully-async recipe (verl/experimental/fully_async_policy): how far generation runs "
                      "ahead and how often weights are synced. Setting any of it runs trainer.v1.trainer_mode="
                      "colocate_async, one step per weight sync (docs/coming_from_verl.md).",
    "rollout": "The fully-async recipe's rollout workers: their resources (ignored: generation shares the "
               "training devices) and schedule (mapped onto trainer.* and actor_rollout_ref.rollout.n).",
    "reward_manager": "verl's newer home of the reward manager's choice: by name, or a custom class.",
    "global_profiler": "verl's Nsight/torch profiler settings for the whole run; rljax profiles with jax.profiler instead.",
    "transfer_queue": "verl's Ray data-transfer queue.",
    "distillation": "verl 0.9's on-policy distillation: a teacher model's log-probs in the actor's loss.",
    "skip": "verl 0.9's debugging switches that dump generated rollouts and replay them instead of generating.",
    "ray_kwargs": "verl's newer home of the Ray start-up options; rljax runs without Ray.",
}

# Meanings of LoRA's keys on a model node (verl's and cosmos-rl's), shared by the RL and SFT trees.
LORA_MEANINGS = {
    "alpha_pattern": "Per-module LoRA alpha, keyed by a name pattern.",
    "init_lora_weights": "LoRA initialisation: true (B = 0, so training starts at the base model) or gaussian.",
    "lora_alpha": "LoRA scaling numerator (the update is scaled by alpha / rank).",
    "lora_dropout": "Dropout on the LoRA branch's input.",
    "lora_rank": "Rank of LoRA adapters; 0 trains every weight.",
    "modules_to_save": "Modules trained in full beside the adapters.",
    "r_pattern": "Per-module LoRA rank, keyed by a name pattern.",
    "target_modules": "Layers that get LoRA adapters: all-linear or a list of names.",
    "use_rslora": "Rank-stabilised LoRA scaling.",
}

# Meanings of the keys of nodes several roles have: KEY -> meaning.
_OPTIM = {
    "lr": "Peak learning rate.",
    "lr_warmup_steps": "Linear warm-up length in optimizer steps; a negative value defers to lr_warmup_steps_ratio.",
    "lr_warmup_steps_ratio": "Warm-up length as a fraction of all optimizer steps (used when lr_warmup_steps < 0).",
    "min_lr_ratio": "Floor of the cosine schedule as a fraction of lr.",
    "num_cycles": "Number of cosine half-periods over the run (0.5 decays once from lr to the floor).",
    "lr_scheduler_type": "Learning-rate schedule after warm-up: constant or cosine.",
    "warmup_style": "Old name of lr_scheduler_type.",
    "total_training_steps": "Optimizer steps the schedule spans; -1 lets the trainer fill it in from the run length.",
    "weight_decay": "Decoupled (AdamW) weight decay.",
    "optimizer": "Optimizer name: AdamW (verl's FSDP default) or adam (Megatron's, also decoupled weight decay) both mean rljax's optax AdamW.",
    "optimizer_impl": "Python module verl imports the optimizer from.",
    "betas": "Adam's (beta1, beta2).",
    "clip_grad": "verl's newer name of grad_clip: maximum global gradient norm.",
    "lr_warmup_init": "Megatron: learning rate at the start of warm-up.",
    "lr_decay_steps": "Megatron: steps of the learning-rate decay.",
    "lr_decay_style": "Megatron: decay shape (constant, linear, cosine, inverse-square-root, WSD).",
    "min_lr": "Megatron: floor of the learning rate.",
    "weight_decay_incr_style": "Megatron: how weight decay changes over the run.",
    "lr_wsd_decay_style": "Megatron: decay shape of the WSD schedule's last phase.",
    "lr_wsd_decay_steps": "Megatron: steps of the WSD schedule's last phase.",
    "use_checkpoint_opt_param_scheduler": "Megatron: take the schedule's settings from the checkpoint on resume.",
    "optimizer_offload_fraction": "Megatron: fraction of the optimizer state kept in host memory and updated on the CPU "
                                  "(verl's override_optimizer_config.optimizer_offload_fraction lands here).",
    "optimizer_cpu_offload": "Megatron: run the offloaded share of the optimizer on the CPU (verl's "
                             "override_optimizer_config entry lands here).",
    "use_precision_aware_optimizer": "Megatron: an optimizer whose master weights, gradients and states may take "
                                     "lower-precision dtypes (verl's override_optimizer_config entry lands here).",
    "overlap_cpu_optimizer_d2h_h2d": "Megatron: overlap the offloaded optimizer's device-host copies with compute "
                                     "(verl's override_optimizer_config entry lands here).",
}
_CHECKPOINT = {
    "contents": "Old name of save_contents: what a checkpoint holds.",
    "save_contents": "What each checkpoint holds: any of model, optimizer, extra (step, data position, RNG), hf_model.",
    "load_contents": "What a resume restores; follows save_contents unless set.",
}
_PROFILER = {
    "discrete": "Nsight: one profile file per task instead of one per process.",
    "all_ranks": "Nsight: profile every rank.",
    "ranks": "Nsight: the ranks to profile.",
    "tool": "Profiler to run: nsys, npu, torch or torch_memory; follows global_profiler.tool.",
    "enable": "Profile this role (true is an error in rljax: use jax.profiler).",
    "save_path": "Directory of the profiles; follows global_profiler.save_path.",
    "tool_config.nsys.discrete": "Nsight: one profile file per task.",
    "tool_config.npu.contents": "Ascend NPU profiler: what to collect.",
    "tool_config.npu.level": "Ascend NPU profiler: collection level.",
    "tool_config.npu.analysis": "Ascend NPU profiler: analyse the profile after collection.",
    "tool_config.npu.discrete": "Ascend NPU profiler: one profile per task.",
    "tool_config.torch.contents": "torch profiler: what to collect.",
    "tool_config.torch.discrete": "torch profiler: one profile per task.",
    "tool_config.torch_memory.trace_alloc_max_entries": "torch memory snapshot: allocations kept.",
    "tool_config.torch_memory.stack_depth": "torch memory snapshot: stack frames kept per allocation.",
}
_FSDP_ENGINE = {
    "use_orig_params": "PyTorch FSDP: keep the original parameters visible to the optimizer.",
    "seed": "Seed of verl's engine workers.",
    "full_determinism": "PyTorch: deterministic kernels.",
    "ulysses_sequence_parallel_size": "verl's engine copy of the role's Ulysses sequence-parallel size.",
    "entropy_from_logits_with_chunking": "verl's engine copy of the role's chunked-entropy switch.",
    "use_torch_compile": "verl's engine copy of the role's torch.compile switch.",
    "entropy_checkpointing": "verl's engine copy of the role's entropy recomputation switch.",
    "forward_only": "The role never updates its weights (the reference).",
    "strategy": "verl's engine copy of the role's strategy.",
    "mixed_precision.param_dtype": "PyTorch FSDP: dtype of the parameters in the forward and backward passes.",
    "mixed_precision.reduce_dtype": "PyTorch FSDP: dtype of the gradient reduction.",
    "mixed_precision.buffer_dtype": "PyTorch FSDP: dtype of the buffers.",
}
_MEGATRON = {
    "param_offload": "Megatron: keep the parameters in CPU memory between uses.",
    "grad_offload": "Megatron: keep the gradients in CPU memory between uses.",
    "optimizer_offload": "Megatron: keep the optimizer state in CPU memory.",
    "tensor_model_parallel_size": "Megatron: tensor-parallel size.",
    "expert_model_parallel_size": "Megatron: expert-parallel size (mixture-of-experts models).",
    "expert_tensor_parallel_size": "Megatron: tensor-parallel size inside each expert.",
    "pipeline_model_parallel_size": "Megatron: pipeline stages.",
    "virtual_pipeline_model_parallel_size": "Megatron: interleaved pipeline chunks per stage.",
    "context_parallel_size": "Megatron: context (sequence) parallel size.",
    "sequence_parallel": "Megatron: shard activations along the sequence inside tensor parallelism.",
    "use_distributed_optimizer": "Megatron: shard the optimizer state over data-parallel ranks.",
    "use_dist_checkpointing": "Megatron: load from a Megatron distributed checkpoint.",
    "dist_checkpointing_path": "Megatron: directory of that checkpoint.",
    "dist_checkpointing_prefix": "Megatron: key prefix inside that checkpoint.",
    "seed": "Megatron: seed of its RNG.",
    "override_ddp_config": "Megatron: fields that override its DistributedDataParallel config.",
    "override_transformer_config.recompute_granularity": "Megatron: activation recomputation granularity (full or selective).",
    "override_transformer_config.recompute_modules": "Megatron: modules recomputed with selective recomputation.",
    "override_transformer_config.recompute_method": "Megatron: uniform or block recomputation.",
    "override_transformer_config.recompute_num_layers": "Megatron: layers per recomputation unit.",
    "override_transformer_config.attention_backend": "Megatron: attention kernel.",
    "override_mcore_model_config": "Megatron: fields that override its model config.",
    "use_mbridge": "Megatron: convert Hugging Face weights with mbridge.",
    "vanilla_mbridge": "Megatron: use mbridge's plain converter.",
    "use_remove_padding": "Megatron: pack sequences without padding.",
    "forward_only": "Megatron: the role never updates its weights.",
    "dtype": "Megatron: compute dtype.",
}
_MEGATRON_LORA = {
    "type": "Megatron LoRA: adapter type.",
    "merge": "Megatron LoRA: merge the adapters into the weights for the rollout.",
    "rank": "Megatron LoRA: rank (0 = no adapters).",
    "alpha": "Megatron LoRA: alpha.",
    "dropout": "Megatron LoRA: dropout on the adapter input.",
    "target_modules": "Megatron LoRA: Megatron module names to adapt.",
    "exclude_modules": "Megatron LoRA: module names left without adapters.",
    "dropout_position": "Megatron LoRA: where the dropout applies.",
    "lora_A_init_method": "Megatron LoRA: initialisation of A.",
    "lora_B_init_method": "Megatron LoRA: initialisation of B.",
    "a2a_experimental": "Megatron LoRA: experimental all-to-all for expert adapters.",
    "dtype": "Megatron LoRA: adapter dtype.",
    "adapter_path": "Megatron LoRA: saved adapters to start from.",
    "freeze_vision_model": "Megatron LoRA: keep a vision tower frozen.",
    "freeze_vision_projection": "Megatron LoRA: keep the vision projection frozen.",
    "freeze_language_model": "Megatron LoRA: keep the language model's base weights frozen.",
}
_TILED_MLP = {
    "enabled": "Run the MLP in tiles along the sequence to save memory.",
    "num_shards": "Tiles of the tiled MLP.",
}
_ROUTER_REPLAY = {
    "mode": "MoE router replay: disabled, R2 (the update replays the experts the old-log-prob pass chose) or R3 (the old-log-prob, reference and update passes replay the rollout's; needs rollout.enable_rollout_routing_replay=true).",
    "record_file": "MoE router replay: file to record to.",
    "replay_file": "MoE router replay: file to replay from.",
}
_MTP = {
    "enable": "Load and save the model's multi-token prediction layers (MiMo's; without training them unless enable_train).",
    "enable_train": "Train the multi-token prediction heads.",
    "enable_rollout": "Use them for speculative decoding.",
    "detach_encoder": "Stop gradients from the heads into the trunk.",
    "mtp_loss_scaling_factor": "Weight of the multi-token prediction loss.",
    "speculative_algorithm": "Speculative decoding algorithm of the inference server.",
    "speculative_num_steps": "Speculative decoding: draft steps.",
    "speculative_eagle_topk": "Speculative decoding: EAGLE's top-k.",
    "speculative_num_draft_tokens": "Speculative decoding: draft tokens.",
    "method": "Speculative decoding method of vLLM.",
    "num_speculative_tokens": "Speculative decoding: tokens proposed per step.",
}

# ----- keys verl 0.9 added (its generated ppo_trainer.yaml and ppo_megatron_trainer.yaml) -----------------------

_PERFORMANCE = "a PyTorch/Megatron performance or memory setting; the numbers are the same"
_QAT = {
    "enable": "Quantization-aware training: train through fake-quantized weights (and activations).",
    "mode": "Quantization-aware training: the scheme (w4a16, ...).",
    "group_size": "Quantization-aware training: weights per quantization group.",
    "ignore_patterns": "Quantization-aware training: modules left unquantized.",
    "activation_observer": "Quantization-aware training: how activation ranges are observed.",
    "quantization_config_path": "Quantization-aware training: a quantization config file.",
}
_TURBO = {
    key: f"FSDP turbo engine: {what}." for key, what in {
        "distributed.fully_shard_parallel_size": "ranks that shard the parameters",
        "distributed.tensor_parallel_size": "tensor-parallel size",
        "distributed.expert_parallel_size": "expert-parallel size",
        "distributed.expert_fully_shard_parallel_size": "ranks that shard each expert",
        "distributed.ulysses_parallel_size": "Ulysses sequence-parallel size",
        "distributed.fsdp_plan.param_dtype": "dtype of the gathered parameters",
        "distributed.fsdp_plan.reduce_dtype": "dtype of the gradient reduction",
        "distributed.fsdp_plan.output_dtype": "dtype of the outputs",
        "distributed.fsdp_plan.fsdp_implementation": "which FSDP implementation runs",
        "distributed.fsdp_plan.num_to_forward_prefetch": "layers gathered ahead in the forward pass",
        "distributed.fsdp_plan.num_to_backward_prefetch": "layers gathered ahead in the backward pass",
    }.items()}
_FSDP_09 = {
    "entropy_from_logits_chunk_size": "verl's engine copy of the role's entropy chunk size.",
    "pad_to_length": "verl's engine copy of the role's pad_to_length.",
    "pad_to_length_bucket": "Pad packed sequences up to a multiple of this many tokens (pad_to_length).",
    "use_no_sync_for_gradient_accumulation": "PyTorch FSDP: skip gradient synchronisation between micro-batches.",
    **{f"qat.{key}": meaning for key, meaning in _QAT.items()},
    **{f"turbo_config.{key}": meaning for key, meaning in _TURBO.items()},
}
_MEGATRON_09 = {
    "dynamic_context_parallel": "Megatron: choose the context-parallel split per micro-batch.",
    "max_seqlen_per_dp_cp_rank": "Megatron: the longest sequence one rank holds under dynamic context parallelism.",
    "dist_ckpt_optim_fully_reshardable": "Megatron: save the optimizer state reshardable to any layout.",
    "distrib_optim_fully_reshardable_mem_efficient": "Megatron: save that state with less memory.",
    "entropy_from_logits_with_chunking": "Megatron: compute the entropy in chunks.",
    "entropy_from_logits_chunk_size": "Megatron: tokens per entropy chunk.",
    "pad_bshd_to_minibatch_max": "Megatron: pad unpacked micro-batches to the mini-batch's longest row.",
    "pad_to_length": "Megatron: pad packed sequences to a bucketed length.",
    "pad_to_length_bucket": "Megatron: the bucket of pad_to_length.",
    "use_megatron_fsdp": "Megatron: shard with Megatron's own FSDP.",
    "router_replay.mode": "Megatron engine's copy of the role's MoE router replay mode.",
    "router_replay.record_file": "Megatron engine's copy of the role's router replay record file.",
    "router_replay.replay_file": "Megatron engine's copy of the role's router replay file.",
    **{f"qat.{key}": meaning for key, meaning in _QAT.items()},
}
_OPTIM_09 = {
    "zero_indexed_step": "Whether the learning-rate schedule counts optimizer steps from 0 (verl's FSDP default) "
                         "or from 1.",
    "main_grads_dtype": "Megatron: dtype of the gradients the optimizer reads.",
    "exp_avg_dtype": "Megatron: dtype of Adam's first moment.",
    "exp_avg_sq_dtype": "Megatron: dtype of Adam's second moment.",
    "use_layer_wise_distributed_optimizer": "Megatron: shard the optimizer state layer by layer.",
    **{key: f"Megatron's Muon optimizer: {key[len('muon_'):].replace('_', ' ')}." for key in MUON_KEYS},
}
_PROFILER_09 = {
    "relocate_results": "Move each profile into the experiment's directory.",
    "finish_hook_cmd": "A command run when a profile is written.",
    "finish_hook_all_ranks": "Run that command on every rank.",
    "finish_hook_ranks": "The ranks that run it.",
    **{f"tool_config.torch.schedule.{key}": f"torch profiler schedule: {key.replace('_', ' ')}."
       for key in ("skip_first", "wait", "warmup", "active", "repeat")},
    "tool_config.torch_memory.memory_snapshot_num_steps": "torch memory snapshot: steps per snapshot.",
    **{f"tool_config.precision_debugger.{key}": f"msprobe precision debugger: {what}." for key, what in (
        ("config_path", "its config file"), ("steps", "steps to dump"), ("stages", "stages to dump"),
        ("strict", "fail on a mismatch"))},
}
_PROFILER_09_STATUS = {key: dict(ignored=_PROFILE_TOOLS) for key in _PROFILER_09 if "." not in key}
_QAT_STATUS = {
    "qat.enable": dict(default_only=(
        "quantization-aware training (fake-quantized weights in the forward pass) is not implemented",
        "drop it; rljax trains in fsdp_config.model_dtype")),
    **{f"qat.{key}": dict(ignored="read only with qat.enable (an error)") for key in _QAT if key != "enable"},
}


def _optim_09_status(role: str) -> dict[str, dict[str, Any]]:
  """What rljax does with the optimizer keys verl 0.9 added (zero_indexed_step is honoured)."""
  lower = ("Megatron's optimizer state in a lower precision is not implemented: rljax's AdamW keeps its moments "
           f"in {role}'s parameter dtype", f"drop {role}.optim.KEY (fp32, the default)")
  return {
      **{key: dict(default_only=lower) for key in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")},
      "use_layer_wise_distributed_optimizer": dict(ignored=_MEGATRON_LM_SETTING),
      **{key: dict(ignored=f"read only with {role}.optim.optimizer=muon, an error (rljax's optimizer is AdamW)")
         for key in MUON_KEYS},
  }


_NOT_READ_BY_A_CRITIC = "the critic reads the rows' token ids; it renders no prompt and runs no kernel option"


def _role_09_keys() -> dict[str, Key]:
  """Records of the role-level keys verl 0.9 added."""
  arr = "actor_rollout_ref"
  rollout = f"{arr}.rollout"
  return {
      **{f"{arr}.{role}.entropy_from_logits_chunk_size": Key(
          "Tokens per chunk of the chunked entropy (entropy_from_logits_with_chunking).",
          ignored="rljax computes log-probs and entropy in chunks of its own size (rljax.models.logprobs)")
         for role in ("actor", "ref")},
      **{f"{arr}.{role}.pad_to_length": Key(
          "Pad each packed micro-batch to a bucketed length (fsdp_config.pad_to_length_bucket).",
          ignored="padding for PyTorch's compiled shapes; rljax's packed buffers come on a grid of their own "
                  "(rljax.rl.packing) and padding changes no number")
         for role in ("actor", "ref")},
      **described((f"{arr}.actor",), "qat", _QAT, {key[len("qat."):]: status for key, status in _QAT_STATUS.items()}),
      f"{arr}.actor.checkpoint.strict": Key(
          "Load a checkpoint's model weights strictly (every key present).",
          ignored="a resume restores the whole orbax state or fails naming what is missing"),
      **described((rollout,), "disaggregation", {
          "enabled": "Serve prefill and decode on separate replicas (SGLang).",
          "prefill_replicas": "Prefill replicas.", "decode_replicas": "Decode replicas.",
          "decode_tensor_model_parallel_size": "Tensor-parallel size of the decode replicas.",
          "transfer_backend": "KV-cache transfer backend between them.", "bootstrap_port": "Their bootstrap port.",
          "ib_device": "InfiniBand device of the transfer."},
          {key: dict(ignored="how an inference server splits prefill from decode; the samples are the same")
           for key in ("enabled", "prefill_replicas", "decode_replicas", "decode_tensor_model_parallel_size",
                       "transfer_backend", "bootstrap_port", "ib_device")}),
      f"{rollout}.full_determinism": Key(
          "Deterministic inference kernels in vLLM/SGLang (batch-invariant).",
          ignored="rljax's engine draws each row's sample from counter-based keys of trainer.seed: a run repeats"),
      f"{rollout}.seed": Key(
          "Seed of the inference servers' sampling.",
          ignored="the engine's sampling keys derive from trainer.seed"),
      f"{rollout}.moe_load_balance_metrics_interval": Key(
          "Steps between the inference servers' expert-load metrics.",
          ignored="vLLM/SGLang metrics; the update logs actor/moe_max_load"),
      f"{rollout}.router_config_path": Key(
          "Config file of SGLang's request router.", ignored="SGLang's router between its servers"),
      **described((rollout,), "qat", _QAT, {key: dict(ignored="verl's copy of the actor engine's qat")
                                             for key in _QAT}),
      f"{rollout}.multi_turn.function_tool_path": Key(
          "A Python file whose @function_tool functions become the agent's tools, after the tool YAML's, in name "
          "order (verl 0.9: schemas from type hints and Google-style docstrings, as transformers' get_json_schema "
          "makes them; `from verl.tools.function_tool import function_tool` works without verl; "
          "rljax.agents.function_tools)."),
      "data.function_tool_path": Key(
          "verl's copy of actor_rollout_ref.rollout.multi_turn.function_tool_path: with multi-turn rollouts, "
          "prompts are rendered with its tools' schemas too."),
      "data.audio_key": Key(
          "Column of the rows' audio inputs (verl 0.9: they replace the prompt's <audio> placeholders).",
          mapped="a row whose column holds audio is refused, naming the file and row: rljax's models read text and "
                 "images"),
      "algorithm.filter_groups.max_inflight_gen_batches": Key(
          "Dynamic sampling: generation batches verl keeps in flight at once (it keeps the groups that finish "
          "first and drops the rest).",
          default_only=("more than one batch in flight is not implemented: rljax's dynamic sampling generates a "
                        "step's rounds one after another and keeps the first surviving groups in generation order",
                        "drop it (1, verl's default)")),
      "trainer.checkpoint_callback_class": Key(
          "A class verl calls after each checkpoint save.",
          default_only=("checkpoint callbacks are not implemented", "drop it")),
      "critic.loss_scale_factor": Key(
          "Divisor of the critic's seq-mean-token-sum-norm; follows the actor's loss_scale_factor."),
      "critic.model.custom_chat_template": Key("A chat template for the critic's tokenizer.",
                                               ignored=_NOT_READ_BY_A_CRITIC),
      "critic.model.use_liger": Key("Liger kernels in the critic.", ignored=_NOT_READ_BY_A_CRITIC),
      "critic.model.use_fused_kernels": Key("Fused kernels in the critic.", ignored=_NOT_READ_BY_A_CRITIC),
      "critic.model.fused_kernel_options.impl_backend": Key("Backend of the critic's fused kernels.",
                                                            ignored=_NOT_READ_BY_A_CRITIC),
      "critic.model.exclude_modules": Key("Modules left out of the critic's LoRA.",
                                          ignored="read only with critic.model.lora_rank > 0 (an error)"),
      "critic.model.hf_config_path": Key(
          "A config.json directory other than critic.model.path.",
          default_only=("the critic's architecture is read from critic.model.path's config.json",
                        "drop it; point critic.model.path at a directory holding config.json")),
      "critic.model.lora_adapter_path": Key(
          "A saved PEFT adapter to start the critic's LoRA from.",
          default_only=("LoRA on the critic is not implemented (it trains in full)", "drop it")),
      **described(("critic.model",), "mtp", _MTP, {key: dict(ignored="a critic runs no multi-token prediction")
                                                   for key in _MTP}),
  }


def _verl_09_keys() -> dict[str, Key]:
  """Records of the keys verl 0.9 added to the nodes several roles share, and of its new sections."""
  fsdp_status = {**{key: dict(ignored=_PERFORMANCE) for key in _FSDP_09}, **_QAT_STATUS}
  megatron_status = {**{key: dict(ignored=_MEGATRON_LM_SETTING) for key in _MEGATRON_09}, **_QAT_STATUS}
  return {
      **described(("actor_rollout_ref.actor", "critic.model"), "fsdp_config", _FSDP_09, fsdp_status),
      **described(("actor_rollout_ref.ref",), "fsdp_config", _FSDP_09),
      **described(("actor_rollout_ref.actor",), "megatron",
                  {key: meaning for key, meaning in _MEGATRON_09.items() if not key.startswith("router_replay.")},
                  megatron_status),
      **described(("actor_rollout_ref.ref", "critic", "reward_model"), "megatron", _MEGATRON_09),
      "critic.megatron.qat.enable": Key(_QAT["enable"], default_only=_QAT_STATUS["qat.enable"]["default_only"]),
      **described(OPTIM_SECTIONS, "optim", _OPTIM_09, _optim_09_status),
      **described(PROFILED_SECTIONS, "profiler", _PROFILER_09, _PROFILER_09_STATUS),
      **described(("actor_rollout_ref.rollout",), "profiler", {
          f"tool_config.{tool}.profile_token_{end}": f"{tool} profiler: the token count its rollout profile "
                                                     f"{'starts' if end == 'start' else 'ends'} at."
          for tool in ("npu", "torch") for end in ("start", "end")}),
      **_role_09_keys(),
      **_sections_09(),
  }


def _sections_09() -> dict[str, Key]:
  """Records of the sections verl 0.9 added: distillation, skip, and the new keys of global_profiler and
  ray_kwargs (transfer_queue's are ignored with their section)."""
  distill = "read only with distillation.enabled (an error)"
  records = {
      "distillation.enabled": Key("On-policy distillation: add a teacher's log-probs to the actor's loss.",
                                  default_only=("on-policy distillation is not implemented", "drop it")),
      **{f"distillation.{key}": Key(meaning, ignored=distill) for key, meaning in {
          "n_gpus_per_node": "GPUs per node of the teacher servers.", "nnodes": "Nodes of the teacher servers.",
          "teacher_key": "Row field that picks a row's teacher.",
          "teacher_models": "The teacher models by name (free-form: path, replicas, inference server).",
          "teacher_models.teacher_model.key": "The default teacher's key (which rows it teaches).",
          "teacher_models.teacher_model.model_path": "The default teacher's checkpoint.",
          "teacher_models.teacher_model.num_replicas": "Inference replicas of the default teacher.",
          **{f"teacher_models.teacher_model.inference.{key}": f"The default teacher's inference server: "
                                                              f"{key.replace('_', ' ')}."
             for key in TEACHER_INFERENCE},
          **{f"distillation_loss.{key}": f"Distillation loss: {what}." for key, what in {
              "loss_mode": "the divergence (k1, k3, ...)", "topk": "teacher top-k tokens compared",
              "use_task_rewards": "keep the task reward beside it", "distillation_loss_coef": "its weight",
              "loss_max_clamp": "clamp of the loss", "log_prob_min_clamp": "clamp of the log-probs",
              "use_policy_gradient": "as a policy-gradient reward", "policy_loss_mode": "that policy loss",
              "clip_ratio": "its clip ratio", "clip_ratio_low": "its lower clip", "clip_ratio_high": "its upper clip",
          }.items()}}.items()},
  }
  for stage in ("rollout", "rollout_tq", "async_rollout"):
    records[f"skip.{stage}.enable"] = Key(
        f"Debugging: dump the {stage.replace('_', ' ')} results and replay them instead of generating.",
        default_only=("replaying dumped rollouts is not implemented", "drop it"))
    for key, meaning in (("dump_dir", "where the dumps go"), ("steps", "the steps dumped or replayed"),
                         ("action", "cache (dump then replay) or another action")):
      records[f"skip.{stage}.{key}"] = Key(f"Debugging rollout dumps: {meaning}.",
                                           ignored=f"read only with skip.{stage}.enable (an error)")
  records.update({
      "global_profiler.relocate_results": Key("Move each profile into the experiment's directory.",
                                              ignored=_PROFILE_TOOLS),
      "global_profiler.finish_hook_cmd": Key("A command run when a profile is written.", ignored=_PROFILE_TOOLS),
      "global_profiler.finish_hook_all_ranks": Key("Run that command on every rank.", ignored=_PROFILE_TOOLS),
      "global_profiler.finish_hook_ranks": Key("The ranks that run it.", ignored=_PROFILE_TOOLS),
      "ray_kwargs.ray_init.runtime_env.py_executable": Key("Python executable of Ray's workers.",
                                                           ignored="no Ray: one JAX program per host"),
      # keys of sections rljax ignores whole (IGNORED_SECTIONS)
      "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module": Key(
          "A module of verl's own weight-transfer backend."),
      "actor_rollout_ref.rollout.trace.project_name": Key("Tracing project; follows trainer.project_name."),
      "actor_rollout_ref.rollout.trace.experiment_name": Key("Tracing run; follows trainer.experiment_name."),
      **{f"global_profiler.global_tool_config.precision_debugger.{key}": Key(f"msprobe precision debugger: {what}.")
         for key, what in (("config_path", "its config file"), ("steps", "steps to dump"),
                           ("stages", "stages to dump"), ("strict", "fail on a mismatch"))},
      "global_profiler.global_tool_config.torch_memory.memory_snapshot_num_steps": Key(
          "torch memory snapshot: steps per snapshot."),
      **{f"transfer_queue.{key}": Key(f"verl's transfer queue: {what}.") for key, what in {
          "metrics.enabled": "export metrics", "metrics.port": "their port",
          "backend.storage_backend": "the storage backend (SimpleStorage or MooncakeStore)",
          "backend.SimpleStorage.total_storage_size": "SimpleStorage's capacity",
          "backend.SimpleStorage.num_data_storage_units": "SimpleStorage's units",
          **{f"backend.MooncakeStore.{key}": f"Mooncake store's {key.replace('_', ' ')}" for key in (
              "auto_init", "metadata_server", "master_server_address", "local_hostname", "protocol",
              "global_segment_size", "local_buffer_size", "device_name")}}.items()},
      **{f"reward_model.rollout.{key}": Key(f"The generative reward model's inference server: {what}.")
         for key, what in {
             "pipeline_model_parallel_size": "pipeline stages", "layered_summon": "gather weights layer by layer",
             "scheduling_policy": "request scheduling", "full_determinism": "deterministic kernels",
             "seed": "sampling seed", "multi_stage_wake_up": "staged memory wake-up",
             "ignore_eos": "keep generating past EOS", "temperature": "sampling temperature",
             "top_k": "top-k sampling", "top_p": "nucleus sampling", "do_sample": "sample (false: greedy)",
             "n": "samples per prompt", "quantization": "weight quantization",
             "quantization_config_file": "its config file", "mtp": "multi-token prediction (speculative decoding)",
             **{f"disaggregation.{key}": f"prefill/decode disaggregation's {key.replace('_', ' ')}" for key in (
                 "enabled", "prefill_replicas", "decode_replicas", "decode_tensor_model_parallel_size",
                 "transfer_backend", "bootstrap_port", "ib_device")}}.items()},
  })
  return records


KEYS = {
    # actor_rollout_ref.actor
    "actor_rollout_ref.actor.calculate_entropy": Key(
        "Compute the policy's entropy in verl's engine workers (a metric).",
        ignored="verl's engine switch for the entropy metric; it changes no update"),
    "actor_rollout_ref.actor.calculate_sum_pi_squared": Key(
        "Compute the sum of squared token probabilities (optimal-token-baseline estimators).",
        mapped="the old-log-prob pass computes Σ_v π_v² per response token beside the log-probs "
               "(rljax.models.token_log_probs); the optimal-token-baseline estimators need it true (an error "
               "otherwise, as verl's step fails); under any other estimator nothing reads it (listed as ignored)"),
    "actor_rollout_ref.actor.checkpoint.async_save": Key(
        "Write checkpoints in the background.",
        ignored="orbax decides how a checkpoint is written; the saved state is the same"),
    **described(("actor_rollout_ref.actor",), "checkpoint", _CHECKPOINT, {
        "contents": dict(
            deprecated=("actor_rollout_ref.actor.checkpoint.save_contents", "same value; load_contents follows")),
        "save_contents": dict(
            ignored="an orbax checkpoint always holds model, optimizer and extra state; HF weights come from rljax.export"),
        "load_contents": dict(ignored="a resume always restores model, optimizer and extra state"),
    }),
    "actor_rollout_ref.actor.clip_ratio": Key("PPO clip range ε, the default for both clip_ratio_low and clip_ratio_high."),
    "actor_rollout_ref.actor.clip_ratio_c": Key("Dual-clip bound c > 1 on the loss of negative-advantage tokens."),
    "actor_rollout_ref.actor.clip_ratio_high": Key("Upper clip range: the ratio is kept below 1 + clip_ratio_high (DAPO's clip-higher)."),
    "actor_rollout_ref.actor.clip_ratio_low": Key("Lower clip range: the ratio is kept above 1 - clip_ratio_low."),
    "actor_rollout_ref.actor.data_loader_seed": Key(
        "Seed of the actor's mini-batch order (Megatron work-around).",
        ignored="a Megatron RNG work-around; data.seed drives the data order"),
    "actor_rollout_ref.actor.entropy_checkpointing": Key(
        "Recompute the entropy in the backward pass.",
        ignored="rematerialisation is set by model.enable_gradient_checkpointing"),
    "actor_rollout_ref.actor.entropy_coeff": Key("Weight of the entropy bonus subtracted from the loss."),
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": Key(
        "Compute token entropy over chunks of the sequence to save memory.",
        ignored="entropy is always computed in vocabulary-sized chunks of tokens"),
    "actor_rollout_ref.actor.freeze_vision_tower": Key(
        "Keep a vision-language model's vision tower frozen.",
        mapped="a vision-language actor's tower gets no gradient (stop_gradient) and no optimizer state (its "
               "updates zero, outside the clipped norm and weight decay); a text model has none"),
    "actor_rollout_ref.actor.fsdp_config.dtype": Key(
        "Mixed precision: the dtype the actor computes in.",
        mapped="compute dtype of the actor's and reference's forward and backward passes (mixed precision: parameters and optimizer state stay in model_dtype, each matmul reads its weight cast to this)"),
    **described(("actor_rollout_ref.actor", "critic.model"), "fsdp_config", _FSDP_ENGINE, {
        "use_orig_params": dict(ignored=_FSDP_ENGINE_SETTING),
        "seed": dict(ignored=_FSDP_ENGINE_SETTING),
        "full_determinism": dict(ignored=_FSDP_ENGINE_SETTING),
        "ulysses_sequence_parallel_size": dict(ignored=_FSDP_ENGINE_SETTING),
        "entropy_from_logits_with_chunking": dict(ignored=_FSDP_ENGINE_SETTING),
        "use_torch_compile": dict(ignored=_FSDP_ENGINE_SETTING),
        "entropy_checkpointing": dict(ignored=_FSDP_ENGINE_SETTING),
        "forward_only": dict(ignored="verl's engine flag for roles that never update"),
        "strategy": dict(ignored=_FSDP_ENGINE_SETTING),
    }),
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch": Key(
        "FSDP: gather the next layer's parameters early.",
        ignored="XLA schedules all-gathers"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": Key(
        "Devices that shard parameters and optimizer state; -1 uses all.",
        mapped="size of the mesh's fsdp axis times ulysses_sequence_parallel_size (the FSDP group holds the Ulysses "
               "groups, as in verl); -1 = all devices left after tensor and sequence"),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": Key(
        "Dtype of the trained parameters: fp32, bf16 or fp16.",
        mapped="dtype of the trained parameters (fp32, bf16, fp16)"),
    "actor_rollout_ref.actor.fsdp_config.offload_policy": Key(
        "FSDP2: offload parameters, gradients and optimizer state.",
        ignored="PyTorch FSDP2 offload"),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": Key(
        "FSDP: keep optimizer state in host memory.",
        mapped="the optimizer state stays in host memory (JAX's pinned_host) between updates, brought in once each "
               "update's gradients exist"),
    "actor_rollout_ref.actor.fsdp_config.param_offload": Key(
        "FSDP: keep parameters in host memory between uses.",
        ignored=ACTOR_WEIGHTS_STAY),
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": Key(
        "FSDP: free gathered parameters after the forward pass.",
        ignored="XLA schedules all-gathers"),
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": Key(
        "FSDP: wrap modules with at least this many parameters.",
        ignored="sharding follows logical-axis rules, not module wrapping"),
    "actor_rollout_ref.actor.grad_clip": Key("Global gradient-norm clip of the actor."),
    "actor_rollout_ref.actor.kl_loss_coef": Key("Weight of the KL loss term."),
    "actor_rollout_ref.actor.kl_loss_type": Key("KL estimator of the loss term: kl (k1), abs, mse (k2), low_var_kl (k3), full, or a + variant."),
    "actor_rollout_ref.actor.load_weight": Key(
        "Load the checkpoint's weights (false: random initialisation).",
        default_only=("starting from random weights is not implemented: the checkpoint's weights would be loaded", "set actor_rollout_ref.actor.load_weight=true")),
    "actor_rollout_ref.actor.loss_agg_mode": Key(
        "How token losses become one number: token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."),
    "actor_rollout_ref.actor.loss_scale_factor": Key("Divisor of seq-mean-token-sum-norm; null uses the response length."),
    **described(("actor_rollout_ref.actor",), "megatron", _MEGATRON, {
        "param_offload": dict(ignored=ACTOR_WEIGHTS_STAY),
        "grad_offload": dict(ignored=GRADIENTS_STAY),
        "optimizer_offload": dict(mapped="as actor_rollout_ref.actor.fsdp_config.optimizer_offload"),
        "tensor_model_parallel_size": dict(
            mapped="a value other than 1 sets actor_rollout_ref.actor.tensor_model_parallel_size (the training mesh's tensor axis; both set, differently: an error)"),
        "expert_model_parallel_size": dict(
            mapped="the mesh's expert axis: a mixture-of-experts model's experts split over it (expert parallelism); other "
                   "weights are sharded over it as over fsdp. A size that only tensor x context x data holds (one the "
                   "devices left after tensor and context cannot hold, e.g. 4 with tensor 4 on 24 devices) splits the "
                   "experts over expert x tensor (x sequence), each expert whole, as Megatron carves its expert "
                   "groups (the exp rule of trainer.logical_axis_rules gains those axes)"),
        "expert_tensor_parallel_size": dict(ignored=_MEGATRON_LM_SETTING),
        "pipeline_model_parallel_size": dict(ignored=_MEGATRON_LM_SETTING),
        "virtual_pipeline_model_parallel_size": dict(ignored=_MEGATRON_LM_SETTING),
        "context_parallel_size": dict(
            mapped="a value other than 1 sets actor_rollout_ref.actor.ulysses_sequence_parallel_size (the mesh's sequence axis; both set, differently: an error)"),
        "sequence_parallel": dict(ignored=_MEGATRON_LM_SETTING),
        "use_distributed_optimizer": dict(ignored=_MEGATRON_LM_SETTING),
        "use_dist_checkpointing": dict(ignored=_MEGATRON_LM_SETTING),
        "dist_checkpointing_path": dict(ignored=_MEGATRON_LM_SETTING),
        "dist_checkpointing_prefix": dict(ignored=_MEGATRON_LM_SETTING),
        "seed": dict(ignored=_MEGATRON_LM_SETTING),
        "override_ddp_config": dict(ignored="Megatron-LM settings"),
        "override_mcore_model_config": dict(
            mapped="Megatron-LM settings, ignored but for moe_config.freeze_moe_router: under the actor's "
                   "strategy=megatron its routers take no gradient and no update (verl 0.9.1 reads it here); a "
                   "critic's is an error"),
        "use_mbridge": dict(ignored=_MEGATRON_LM_SETTING),
        "vanilla_mbridge": dict(ignored=_MEGATRON_LM_SETTING),
        "use_remove_padding": dict(ignored=_MEGATRON_LM_SETTING),
        "forward_only": dict(ignored=_MEGATRON_LM_SETTING),
        "dtype": dict(ignored=_MEGATRON_LM_SETTING),
    }),
    "actor_rollout_ref.actor.megatron.override_transformer_config": Key(
        "Megatron: fields that override its transformer config.",
        ignored="Megatron-LM settings"),
    **described(OPTIM_SECTIONS, "optim", _OPTIM, _optim_status),
    "actor_rollout_ref.actor.policy_loss.aipo_rho": Key(
        "AIPO: cap on the importance ratio (loss_mode=aipo).",
        added="cosmos-rl: AIPO clip of the importance ratio (policy_loss.loss_mode=aipo)"),
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": Key("Clip-Cov: lower bound of the covariance window."),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": Key("Clip-Cov: fraction of tokens whose gradient is detached."),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": Key("Clip-Cov: upper bound of the covariance window."),
    "actor_rollout_ref.actor.policy_loss.dro_beta": Key("DRO: weight of the quadratic log-ratio penalty (must be > 0 for loss_mode=dro)."),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": Key("KL-Cov: fraction of tokens that get the KL penalty."),
    "actor_rollout_ref.actor.policy_loss.loss_mode": Key("Policy loss by name (see docs/algorithms.md)."),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": Key("KL-Cov: weight of the |log-ratio| penalty."),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.bypass_mode": Key("Whether bypass mode is on; follows algorithm.rollout_correction.bypass_mode."),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.loss_type": Key("Bypass mode's loss: ppo_clip or reinforce."),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is": Key("Bypass mode's IS level; follows algorithm.rollout_correction.rollout_is."),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_batch_normalize": Key("Bypass mode's IS batch normalisation; follows algorithm.rollout_correction."),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_threshold": Key(
        "Bypass mode's IS threshold; follows algorithm.rollout_correction.",
        type_note="float or str"),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_rs": Key("Bypass mode's rejection rule; follows algorithm.rollout_correction."),
    "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_rs_threshold": Key(
        "Bypass mode's rejection threshold; follows algorithm.rollout_correction.",
        type_note="float, str or null"),
    "actor_rollout_ref.actor.positive_nll_coef": Key(
        "Weight of an NLL (SFT-like) term on positive-reward responses; null turns it off.",
        added="cosmos-rl: NLL term on positive-advantage responses"),
    "actor_rollout_ref.actor.ppo_epochs": Key("Passes over each batch of rollouts."),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": Key(
        "Token budget of one packed micro-batch per device (use_dynamic_bsz).",
        mapped="token budget per device for use_dynamic_bsz micro-batches"),
    "actor_rollout_ref.actor.ppo_micro_batch_size": Key(
        "Old global micro-batch size; replaced by ppo_micro_batch_size_per_gpu.",
        deprecated=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices")),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": Key(
        "Responses per forward/backward pass on each device; gradients accumulate over micro-batches. null: the device's whole mini-batch in one pass (verl requires a value).",
        mapped="micro-batch rows per data-parallel device, at most (the most that divide the device's mini-batch "
               "rows evenly: verl runs a larger value as one micro-batch and one that does not divide as a shorter "
               "last one, with the same loss); the global micro-batch is this times the data*fsdp axis size; null "
               "(an error in verl): the device's whole mini-batch in one pass, so a job runs on any device count"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": Key("Prompts per optimizer step; each step updates on this many prompts times rollout.n responses."),
    **described(PROFILED_SECTIONS, "profiler", _PROFILER, {
        "discrete": dict(
            ignored="Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)"),
        "all_ranks": dict(
            ignored="Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)"),
        "ranks": dict(
            ignored="Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)"),
        "tool": dict(
            ignored="Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)"),
        "enable": dict(
            mapped="true on any role traces the whole step at global_profiler.steps (the roles are one JAX program)"),
        "save_path": dict(
            ignored="Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)"),
    }),
    "actor_rollout_ref.actor.rollout_is": Key("Older switch for rollout importance sampling in the actor (see algorithm.rollout_correction)."),
    "actor_rollout_ref.actor.rollout_is_level": Key("Older key: IS weights per token or per sequence."),
    "actor_rollout_ref.actor.rollout_is_mode": Key("Older key: truncate weights above the bound, or mask tokens outside the bounds."),
    "actor_rollout_ref.actor.rollout_is_threshold": Key("Older key: upper bound of the rollout IS weights."),
    "actor_rollout_ref.actor.rollout_is_threshold_lower": Key("Older key: lower bound of the rollout IS weights (mask mode; null = 1 / upper)."),
    "actor_rollout_ref.actor.rollout_is_veto_threshold": Key("Older key: veto whole sequences with a tiny token ratio (removed in verl 0.9)."),
    "actor_rollout_ref.actor.rollout_n": Key(
        "verl's copy of actor_rollout_ref.rollout.n.",
        ignored="verl's copy of actor_rollout_ref.rollout.n, which rljax reads"),
    **described(("actor_rollout_ref.actor", "actor_rollout_ref.ref"), "router_replay", _ROUTER_REPLAY,
                 _router_replay_status),
    "actor_rollout_ref.actor.shuffle": Key("Shuffle the rollouts before splitting them into mini-batches."),
    "actor_rollout_ref.actor.strategy": Key(
        "Training backend (fsdp or megatron in verl).",
        mapped="rljax shards with a device mesh whichever it is; megatron lets Megatron's LoRA block "
               "(actor_rollout_ref.model.lora) train adapters and makes the learning rate follow Megatron's "
               "scheduler (optim.lr_decay_style, min_lr, ...), as in verl"),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": Key(
        "Recompute that sum in the backward pass to save memory.",
        ignored="rljax computes the sum in the old-log-prob pass, which takes no gradient: nothing to recompute"),
    "actor_rollout_ref.actor.tau_neg": Key("SAPO gate temperature for negative advantages."),
    "actor_rollout_ref.actor.tau_pos": Key("SAPO gate temperature for positive advantages."),
    "actor_rollout_ref.actor.tensor_model_parallel_size": Key(
        "Devices that split each weight matrix during training (tensor parallelism).",
        added="size of the training mesh's tensor axis"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": Key(
        "Devices that split each sequence (sequence parallelism).",
        mapped="size of the mesh's sequence axis"),
    "actor_rollout_ref.actor.unbiased_loss_max_tokens": Key(
        "Dr.GRPO's unbiased loss: divide every response's token sum by this constant.",
        added="cosmos-rl (Dr.GRPO): sets loss_agg_mode=seq-mean-token-sum-norm with loss_scale_factor=this"),
    "actor_rollout_ref.actor.use_dynamic_bsz": Key("Pack micro-batches by token count instead of a fixed number of responses."),
    "actor_rollout_ref.actor.use_fused_kernels": Key(
        "verl's copy of actor_rollout_ref.model.use_fused_kernels.",
        ignored="XLA fuses on its own"),
    "actor_rollout_ref.actor.use_kl_loss": Key("Add a KL(policy ‖ reference) term to the actor loss (GRPO's choice)."),
    "actor_rollout_ref.actor.use_prefix_grouper": Key(
        "Share the prompt's forward pass among its responses (PyTorch).",
        ignored="PyTorch prefix sharing; rljax's is actor_rollout_ref.model.share_prompt_forward"),
    "actor_rollout_ref.actor.use_remove_padding": Key(
        "verl's copy of actor_rollout_ref.model.use_remove_padding (follows it)."),
    "actor_rollout_ref.actor.use_torch_compile": Key(
        "Compile the actor with torch.compile.",
        ignored="everything is jax.jit-compiled"),
    # actor_rollout_ref
    "actor_rollout_ref.hybrid_engine": Key(
        "Actor and rollout share one set of weights.",
        ignored="rljax always shares one set of parameter arrays between trainer and rollout"),
    # actor_rollout_ref.model
    "actor_rollout_ref.model.attention_kernel": Key(
        "Attention implementation: auto, xla or pallas.",
        added="auto (pallas on TPU, xla elsewhere), xla (dense dot-product attention) or pallas (splash attention for training, log-prob and prefill passes; ragged decode attention over the live cache)"),
    "actor_rollout_ref.model.custom_chat_template": Key(
        "A Jinja chat template used instead of the tokenizer's.",
        mapped="the tokenizer renders every prompt and turn (tools' results included) with it instead of its own, "
               "as verl's agent loop sets it on the tokenizer; a template that is not valid Jinja is an error"),
    "actor_rollout_ref.model.enable_activation_offload": Key(
        "Move activations to host memory during training.",
        mapped="with enable_gradient_checkpointing (remat_policy=full), each layer keeps its input in host memory "
               "between the forward and the backward pass; without checkpointing it changes nothing"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": Key(
        "Recompute activations in the backward pass instead of storing them.",
        mapped="jax.checkpoint (remat) per decoder layer"),
    "actor_rollout_ref.model.exclude_modules": Key(
        "LoRA: modules left without adapters.",
        mapped="PEFT's rule (rljax.models.lora.excluded): a regex matching the whole HF module name "
               "(model.layers.0.self_attn.q_proj), or a list of names each matching the name or its end after a "
               "dot; under scan_layers an excluded layer's slice of the stacked adapter adds nothing and never "
               "trains (scale 0), and it is left out of PEFT exports",
        type_note="str, list or null"),
    "actor_rollout_ref.model.external_lib": Key(
        "Python package imported first to register extra model or tokenizer classes.",
        ignored="registers PyTorch/HF classes; rljax models are chosen by config.json"),
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": Key(
        "Backend of the fused kernels (torch or triton).",
        ignored="XLA fuses on its own"),
    "actor_rollout_ref.model.hf_config_path": Key(
        "Directory of a config.json to use instead of the model's.",
        default_only=("a config.json apart from the weights is not read: the model's own would be used", "drop it, or copy the config.json into actor_rollout_ref.model.path")),
    **described(("actor_rollout_ref",), "model", LORA_MEANINGS, {
        "alpha_pattern": dict(added="cosmos-rl: {regex: alpha} per HF module name (model.layers.0.self_attn.q_proj); "
                                    "first match wins", type_note="mapping {regex: number}"),
        "init_lora_weights": dict(added="cosmos-rl: true (A uniform +-1/sqrt(in), B=0) or gaussian (A normal std 1/r, "
                                        "B=0)", type_note="bool or 'gaussian'"),
        "lora_alpha": dict(added="LoRA alpha (verl's name): adapter scale alpha / r"),
        "lora_dropout": dict(added="cosmos-rl: dropout on the adapter input in the actor update only, seeded by the "
                                   "update's key"),
        "lora_rank": dict(added="LoRA rank (verl's name); > 0 trains only the actor's adapters (rljax.models.lora), "
                                "0 = full fine-tuning; the critic stays full"),
        "modules_to_save": dict(added="cosmos-rl: base modules trained in full beside the adapters (embed_tokens, "
                                      "lm_head, norm, ...)"),
        "r_pattern": dict(added="cosmos-rl: {regex: r} per HF module name; first match wins (uniform over layers "
                                "with scan_layers)", type_note="mapping {regex: int}"),
        "target_modules": dict(added="LoRA targets (verl's name): all-linear, or a list (or comma string) of q_proj "
                                     "k_proj v_proj o_proj gate_proj up_proj down_proj", type_note="str or list"),
        "use_rslora": dict(added="cosmos-rl: scale alpha / sqrt(r) instead of alpha / r"),
    }),
    **described(("actor_rollout_ref.model", "critic.model"), "lora", _MEGATRON_LORA, _megatron_lora_status),
    "actor_rollout_ref.model.lora_adapter_path": Key(
        "Saved LoRA adapters to start from.",
        mapped="a PEFT adapter directory the actor's adapters start from, with its settings (r, lora_alpha, "
               "target_modules, use_rslora, rank_pattern, alpha_pattern), which replace the line's LoRA keys as in "
               "verl (rljax.models.lora.read_peft_config); DoRA, biases and modules_to_save are an error"),
    **described(("actor_rollout_ref.model",), "mtp", _MTP, {
        "enable": dict(mapped="MiMo's layers (model_type mimo, num_nextn_predict_layers) are loaded, saved by "
                       "checkpoints and exports, and frozen unless enable_train (rljax.rl.mtp); false drops them as "
                       "verl does; a model without them is a config error"),
        "enable_train": dict(mapped="the actor update adds mtp_loss_scaling_factor / K times each depth's token-mean "
                             "cross-entropy over the mini-batch (Megatron's per-token regime; rljax.rl.mtp); an error "
                             "beside LoRA"),
        **{key: dict(ignored=_SPECULATIVE) for key in _MTP if key.startswith(("speculative", "num_speculative"))},
        "enable_rollout": dict(ignored=_SPECULATIVE),
        "method": dict(ignored=_SPECULATIVE),
    }),
    "actor_rollout_ref.model.override_config.attn_implementation": Key(
        "Attention implementation to request from transformers.",
        ignored="HF's attention choice; rljax's is actor_rollout_ref.model.attention_kernel"),
    "actor_rollout_ref.model.override_config.model_config": Key(
        "Fields that replace the checkpoint's config.json values (e.g. rope_theta); verl's +override_config.FIELD=VALUE lands here. Only fields rljax's models read, and dropout fields set to 0, are accepted.",
        mapped="fields that override the model's config.json"),
    "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router": Key(
        "Keep the mixture-of-experts router fixed (Megatron).",
        mapped="older verl's place of the key verl 0.9.1 reads from actor_rollout_ref.actor.megatron."
               "override_mcore_model_config (its moe_config.freeze_moe_router), read as that one: under actor_rollout_ref.actor.strategy=megatron "
               "a mixture-of-experts actor's routers take no gradient and no update (no optimizer state, no share of "
               "the clipped norm); under fsdp, whose verl engine does not read it, true is an error"),
    "actor_rollout_ref.model.path": Key("Policy checkpoint: a Hugging Face directory, a GGUF file or a known alias."),
    "actor_rollout_ref.model.remat_policy": Key(
        "What a rematerialised layer saves for the backward pass: full, attention or dots.",
        added="with enable_gradient_checkpointing, what each layer keeps for the backward pass: full (only its input), attention (also its attention output), dots (every matmul output)"),
    "actor_rollout_ref.model.scan_layers": Key(
        "Run the decoder layers as one scanned layer.",
        added="scan over decoder layers: compile time flat in depth"),
    "actor_rollout_ref.model.share_prompt_forward": Key(
        "Run each prompt's tokens once for its rollout.n responses when computing log-probs, values and updates "
        "that run padded rows (a packed pass, use_remove_padding, runs each row's own tokens).",
        added="run each prompt once for its rollout.n responses in the padded log-prob, value and update passes (same numbers, less work)"),
    **described(("actor_rollout_ref.model", "critic.model"), "tiled_mlp", _TILED_MLP),
    "actor_rollout_ref.model.tokenizer_path": Key(
        "Directory of a tokenizer to use instead of the model's.",
        mapped="the run's tokenizer where set (prompts, responses, rewards, validation, generation from the run's "
               "checkpoints, the tokenizer export writes), as verl 0.9.1's model config loads it; data.tokenizer, "
               "where set, comes first"),
    "actor_rollout_ref.model.trust_remote_code": Key(
        "Allow checkpoints that ship their own model code.",
        ignored="rljax runs no model code from checkpoints"),
    "actor_rollout_ref.model.use_fused_kernels": Key(
        "Use fused log-prob/entropy kernels.",
        ignored="XLA fuses on its own"),
    "actor_rollout_ref.model.use_liger": Key(
        "Use the Liger fused kernels.",
        ignored="a Triton kernel library for PyTorch"),
    "actor_rollout_ref.model.use_remove_padding": Key(
        "Pack the rows' real tokens into fixed-length buffers (segment ids keep each row to itself) in the "
        "actor's training passes: old and reference log-probs and the update. The same numbers as padded rows, "
        "for the real tokens' cost (under router replay too: the replayed experts are packed with the tokens)."),
    "actor_rollout_ref.model.use_shm": Key(
        "Load the model through shared memory.",
        ignored="shared-memory model loading for Ray workers"),
    # actor_rollout_ref
    "actor_rollout_ref.nccl_timeout": Key(
        "Seconds before an NCCL collective times out.",
        ignored="NCCL collective timeout; XLA's collectives have none to set"),
    # actor_rollout_ref.ref
    "actor_rollout_ref.ref.entropy_checkpointing": Key(
        "Recompute the reference's entropy in the backward pass.",
        ignored="rematerialisation is set by model.enable_gradient_checkpointing"),
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": Key(
        "Compute the reference's entropy in chunks of tokens.",
        ignored="entropy is always computed in vocabulary-sized chunks of tokens"),
    "actor_rollout_ref.ref.fsdp_config.dtype": Key("Mixed precision: the dtype the reference computes in."),
    **described(("actor_rollout_ref.ref",), "fsdp_config", _FSDP_ENGINE),
    "actor_rollout_ref.ref.fsdp_config.forward_prefetch": Key("FSDP: gather the reference's next layer early."),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": Key("FSDP group size of the reference."),
    "actor_rollout_ref.ref.fsdp_config.model_dtype": Key("dtype of the reference's stored parameters."),
    "actor_rollout_ref.ref.fsdp_config.offload_policy": Key("FSDP2: offload the reference's parameters."),
    "actor_rollout_ref.ref.fsdp_config.optimizer_offload": Key("FSDP: keep optimizer state in host memory (the reference has none)."),
    "actor_rollout_ref.ref.fsdp_config.param_offload": Key("FSDP: keep the reference's parameters in host memory."),
    "actor_rollout_ref.ref.fsdp_config.reshard_after_forward": Key("FSDP: free the reference's gathered parameters after use."),
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params": Key("FSDP: wrap the reference's modules with at least this many parameters."),
    "actor_rollout_ref.ref.load_weight": Key(
        "Load the checkpoint's weights (false: random initialisation).",
        default_only=("starting from random weights is not implemented: the checkpoint's weights would be loaded", "set actor_rollout_ref.ref.load_weight=true")),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": Key("Token budget of a packed reference micro-batch; follows the actor's."),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": Key(
        "Old global micro-batch of reference log-probs; replaced by the per-GPU key.",
        deprecated=("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices")),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": Key("Responses per reference forward pass on each device."),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": Key("Pack reference micro-batches by token count; follows the actor's use_dynamic_bsz."),
    **described(("actor_rollout_ref.ref", "critic", "reward_model"), "megatron", _MEGATRON),
    "actor_rollout_ref.ref.rollout_n": Key(
        "verl's copy of actor_rollout_ref.rollout.n.",
        ignored="verl's copy of actor_rollout_ref.rollout.n"),
    "actor_rollout_ref.ref.strategy": Key(
        "Backend of the reference model (fsdp or megatron in verl).",
        ignored="FSDP/Megatron choice"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": Key("Sequence-parallel size of the reference; follows the actor's."),
    "actor_rollout_ref.ref.use_torch_compile": Key(
        "Compile the reference with torch.compile; follows the actor's setting.",
        ignored="everything is jax.jit-compiled"),
    # actor_rollout_ref.rollout
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": Key(
        "File that registers agent loops.",
        default_only=("custom agent loops are not implemented: rows run single_turn_agent or tool_agent",
                      "drop actor_rollout_ref.rollout.agent.agent_loop_config_path")),
    "actor_rollout_ref.rollout.agent.custom_async_server.name": Key(
        "Class name of that server.", ignored="no Ray async servers: the engine runs in-process"),
    "actor_rollout_ref.rollout.agent.custom_async_server.path": Key(
        "File defining a custom async rollout server.", ignored="no Ray async servers: the engine runs in-process"),
    "actor_rollout_ref.rollout.agent.default_agent_loop": Key(
        "Agent loop of rows whose agent_name is empty: single_turn_agent or tool_agent (with multi_turn.enable)."),
    "actor_rollout_ref.rollout.agent.num_workers": Key(
        "Agent-loop worker processes.", ignored="one host loop drives the engine's slots; tools run on threads"),
    "actor_rollout_ref.rollout.calculate_log_probs": Key(
        "Have the engine return the sampled tokens' log-probs.",
        mapped="always on: the sampler returns each sampled token's log-prob (rollout_log_probs)"),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": Key("How verl sends updated weights to the inference servers."),
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs": Key("Arguments of that backend."),
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": Key("Size of each weight-update bucket."),
    "actor_rollout_ref.rollout.cpu_dot_library": Key(
        "On the CPU, the library that runs the decode step's matrix products.",
        added="on the CPU, what runs the decode step's matmuls: auto (Eigen at 8 to 24 slots per device on a host "
              "without AVX-512, else YNNPACK), ynnpack or eigen"),
    "actor_rollout_ref.rollout.kv_cache_dtype": Key(
        "The KV cache's storage dtype (vLLM's kv_cache_dtype).",
        added="auto (rollout.dtype), int8, or fp8 / fp8_e4m3 / fp8_e5m2: 8 bits with a scale per token and KV head, "
              "half the cache bytes, so twice the slots fit and a decode step reads about half the cache; "
              "+engine_kwargs.vllm.kv_cache_dtype (or sglang's) sets it too"),
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": Key(
        "Batch sizes the inference server captures CUDA graphs for.",
        ignored="CUDA graphs; XLA compiles the decode step"),
    "actor_rollout_ref.rollout.data_parallel_size": Key(
        "Data-parallel size of the inference server.",
        ignored="the rollout's data axis is the training mesh's"),
    "actor_rollout_ref.rollout.disable_log_stats": Key(
        "vLLM: silence its throughput statistics.",
        ignored="vLLM option"),
    "actor_rollout_ref.rollout.do_sample": Key("Sample (true) or decode greedily (false) during training rollouts."),
    "actor_rollout_ref.rollout.dtype": Key(
        "Dtype of the weights and activations during generation.",
        mapped="activation, KV-cache and weight dtype of prefill and decode; weights already in it are read in place, others are cast once per rollout"),
    "actor_rollout_ref.rollout.enable_chunked_prefill": Key(
        "vLLM: split long prefills into chunks.",
        ignored="vLLM option"),
    "actor_rollout_ref.rollout.enable_prefix_caching": Key(
        "Reuse the KV cache of shared prompt prefixes in the inference server.",
        ignored="vLLM/SGLang prefix cache"),
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": Key(
        "Record the rollout's MoE expert choices for the update (with actor_rollout_ref.actor.router_replay.mode=R3)."),
    "actor_rollout_ref.rollout.enforce_eager": Key(
        "vLLM: run without CUDA graphs.",
        ignored="CUDA graphs; XLA compiles the decode step"),
    "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend": Key("SGLang: attention backend (more SGLang arguments may be added beside it)."),
    "actor_rollout_ref.rollout.engine_kwargs.trtllm": Key("Extra arguments for the TensorRT-LLM engine."),
    "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": Key("vLLM: CPU swap space in GB (more vLLM arguments may be added beside it)."),
    "actor_rollout_ref.rollout.expert_parallel_size": Key(
        "Expert-parallel size of the inference server.",
        ignored="the rollout shares the training mesh's expert axis (actor_rollout_ref.actor.megatron.expert_model_parallel_size)"),
    "actor_rollout_ref.rollout.free_cache_engine": Key(
        "Release the engine's KV cache after each rollout, so training gets the memory.",
        mapped="drop the KV cache between rollouts"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": Key(
        "vLLM/SGLang: fraction of GPU memory the engine may take.",
        ignored="the KV cache is sized from max_num_seqs and the lengths"),
    "actor_rollout_ref.rollout.ignore_eos": Key("Keep generating after the end-of-sequence token until response_length."),
    "actor_rollout_ref.rollout.layer_name_map.gate_proj_layer_name": Key("Megatron-to-inference name of the fused gate/up projection."),
    "actor_rollout_ref.rollout.layer_name_map.qkv_layer_name": Key("Megatron-to-inference name of the fused QKV projection."),
    "actor_rollout_ref.rollout.layered_summon": Key(
        "Gather LoRA weights layer by layer for the inference server.",
        ignored="PyTorch FSDP weight gathering for LoRA; the engine reads the trainer's arrays in place"),
    "actor_rollout_ref.rollout.load_format": Key(
        "How vLLM receives the actor's weights.",
        ignored="the engine reads the trainer's arrays in place"),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": Key("Token budget of a packed log-prob micro-batch; follows the actor's."),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": Key(
        "Old global micro-batch of old-policy log-probs; replaced by the per-GPU key.",
        deprecated=("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices")),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": Key("Responses per old-policy log-prob forward pass on each device."),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": Key("Pack those micro-batches by token count; follows the actor's use_dynamic_bsz."),
    "actor_rollout_ref.rollout.logprobs_mode": Key(
        "Which log-probs the rollout returns: of the processed (temperature, top-k, top-p) or raw distribution.",
        default_only=("the engine returns the log-probs of the processed (temperature, top-k, top-p) distribution only", "set actor_rollout_ref.rollout.logprobs_mode=processed_logprobs")),
    "actor_rollout_ref.rollout.max_model_len": Key(
        "Longest prompt plus response the engine holds; null = prompt_length + response_length.",
        mapped="checked only: the KV cache holds exactly max_prompt_length + response_length slots, so it must be at least that"),
    "actor_rollout_ref.rollout.max_num_batched_tokens": Key(
        "vLLM: tokens processed per scheduler step.",
        ignored="vLLM scheduler budget; prefill runs per request bucket"),
    "actor_rollout_ref.rollout.max_num_seqs": Key(
        "Sequences the engine decodes at once.",
        mapped="decode slots of the engine (continuous batching), at most the responses in flight: a step's in "
               "sync, those of the batches admitted ahead under colocate_async"),
    "actor_rollout_ref.rollout.mode": Key(
        "Engine mode in verl: sync or async server.",
        ignored="the engine is always in-process"),
    **described(("actor_rollout_ref.rollout",), "mtp", _MTP),
    "actor_rollout_ref.rollout.multi_stage_wake_up": Key(
        "Wake the inference server's weights and KV cache up in stages.",
        ignored="vLLM/SGLang memory wake-up order"),
    "actor_rollout_ref.rollout.multi_turn.completion_callback": Key(
        "verl's older class handling each completion of its chat scheduler (tool calls).",
        default_only=("completion callbacks hook into verl's chat scheduler; rljax's tool agent loop runs the tools of "
                      "multi_turn.tool_config_path itself", "drop it and set actor_rollout_ref.rollout.multi_turn.tool_config_path")),
    "actor_rollout_ref.rollout.multi_turn.enable": Key(
        "Multi-turn rollouts: rows whose agent (agent_name, else agent.default_agent_loop) is tool_agent call tools "
        "and talk to an interaction between turns."),
    "actor_rollout_ref.rollout.multi_turn.enable_tokenization_sanity_check": Key(
        "Check that turn-by-turn and whole-conversation tokenization agree.",
        deprecated=("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", "true -> strict, false -> disable")),
    "actor_rollout_ref.rollout.multi_turn.format": Key(
        "Tool-call format the model writes: hermes (<tool_call>{json}</tool_call>), llama3_json, mistral, "
        "qwen3_coder (Qwen3-Coder's XML) or glm (verl 0.9.1's parsers; rljax.agents.parsing)."),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": Key(
        "YAML file of interactions (simulated users that answer an assistant turn and may end the episode); a row "
        "picks one with extra_info.interaction_kwargs.name."),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": Key("Most assistant turns per conversation; null = no limit "
                                                                    "but response_length."),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": Key(
        "Tool calls of one turn run (at once); later calls in the turn get an error message instead."),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": Key(
        "Longest tool response kept, in characters (as verl); longer ones are cut as tool_response_truncate_side says."),
    "actor_rollout_ref.rollout.multi_turn.max_turns": Key(
        "Most assistant turns per conversation (verl's older name).",
        deprecated=("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "same value")),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": Key("Most user turns (tool or interaction answers) per "
                                                               "conversation; null = no limit but response_length."),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": Key(
        "SGLang: rollouts repeated per interaction.",
        ignored=f"{NOWHERE}: rollout.n samples each prompt there as here"),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": Key(
        "Compare the trained ids with the chat template's rendering of the finished conversation: strict, "
        "ignore_strippable (whitespace differences allowed) or disable; differences are logged and counted."),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": Key("verl's tool YAML (tools: class_name, config, tool_schema)."),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": Key("Which part of a long tool response is kept: "
                                                                            "left, middle or right."),
    "actor_rollout_ref.rollout.multi_turn.tool_timeout_s": Key(
        "Seconds a tool call (or an interaction's answer) may take before it becomes an error message.",
        added="a call past it is abandoned and answered with a timeout error; the rollout goes on"),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": Key(
        "Re-template the finished conversation with the inference chat template before training.",
        ignored=f"{NOWHERE} (only a request class no code creates holds a field of that name): both train the "
                "ids the engine generated and appended"),
    "actor_rollout_ref.rollout.n": Key("Responses sampled per prompt (the group size of GRPO and RLOO)."),
    "actor_rollout_ref.rollout.nnodes": Key(
        "Nodes of a rollout of its own (0: the rollout shares the trainer's devices).",
        mapped="with trainer.v1.trainer_mode=separate_async, nnodes x n_gpus_per_node devices generate, the "
               "last ones JAX lists, and the trainer trains on the others; no effect in the other modes"),
    "actor_rollout_ref.rollout.n_gpus_per_node": Key(
        "Accelerators per node of a rollout of its own (default: trainer.n_gpus_per_node).",
        mapped="devices per node of separate_async's rollout; no effect in the other modes",
        type_note="int (it follows trainer.n_gpus_per_node, which may be 'auto': set it under separate_async)"),
    "actor_rollout_ref.rollout.name": Key(
        "Inference engine (vllm, sglang, trtllm or hf in verl).",
        mapped="any value selects rljax's JetStream engine"),
    "actor_rollout_ref.rollout.over_sample_rate": Key(
        "Fraction of the slowest requests aborted per rollout.",
        ignored=f"{NOWHERE}: every request runs to its end there as here"),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": Key(
        "Pipeline stages of the inference server.",
        ignored="the rollout's mesh has no pipeline axis; it changes no sample"),
    "actor_rollout_ref.rollout.prefill_length_buckets": Key(
        "Prompt lengths the engine pads prompts up to before prefill.",
        added="prompt lengths the engine pads to; one compilation per bucket"),
    "actor_rollout_ref.rollout.prometheus.enable": Key("Export the inference servers' metrics to Prometheus."),
    "actor_rollout_ref.rollout.prometheus.file": Key("Prometheus configuration file."),
    "actor_rollout_ref.rollout.prometheus.port": Key("Prometheus port."),
    "actor_rollout_ref.rollout.prometheus.served_model_name": Key("Model name in the metrics; follows actor_rollout_ref.model.path."),
    "actor_rollout_ref.rollout.prompt_length": Key("Prompt length the engine is sized for; follows data.max_prompt_length."),
    "actor_rollout_ref.rollout.quantization": Key(
        "Quantization of the rollout's weights (fp8, ...).",
        mapped="null (rollout.dtype), fp8 (e4m3) or int8: the engine quantizes the trainer's weights on the device "
               "at each weight sync, one scale per output channel (weights only: activations stay in rollout.dtype); "
               "the trainer keeps full precision, and rollout_corr/* report the mismatch"),
    "actor_rollout_ref.rollout.quantization_config_file": Key(
        "File with the quantization's settings.",
        ignored="rljax's quantization has no settings to read: absmax scales per output channel"),
    "actor_rollout_ref.rollout.response_length": Key("Tokens generated per response at most; follows data.max_response_length."),
    "actor_rollout_ref.rollout.scheduling_policy": Key(
        "Request order of the inference server (fcfs, priority).",
        ignored="vLLM scheduler order"),
    "actor_rollout_ref.rollout.skip_dump_dir": Key(
        "Directory of dumped rollouts for skip_rollout.",
        ignored="read only with skip_rollout, which rljax does not implement (an error when true)"),
    "actor_rollout_ref.rollout.skip_rollout": Key(
        "Replay dumped rollouts instead of generating.",
        default_only=("replaying dumped rollouts is not implemented", "set actor_rollout_ref.rollout.skip_rollout=false")),
    "actor_rollout_ref.rollout.skip_tokenizer_init": Key(
        "Start the inference server without a tokenizer.",
        ignored="vLLM/SGLang tokenizer start-up"),
    "actor_rollout_ref.rollout.temperature": Key("Sampling temperature during training rollouts."),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": Key(
        "Devices that split each weight matrix during generation.",
        mapped="tensor-axis size of the rollout's mesh (same devices, data axis kept, fsdp the rest); when it differs from training's, the sampler's compute-dtype copy of the weights is resharded once per rollout"),
    "actor_rollout_ref.rollout.top_k": Key("Sample from the k most likely tokens; -1 (or 0) samples from all."),
    "actor_rollout_ref.rollout.top_p": Key("Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p."),
    "actor_rollout_ref.rollout.trace.backend": Key("Rollout tracing backend (mlflow, weave)."),
    "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker": Key("Most traced samples per step and worker."),
    "actor_rollout_ref.rollout.trace.token2text": Key("Decode token ids in the traces."),
    "actor_rollout_ref.rollout.use_fire_sampling": Key(
        "FIRE sampling (a higher temperature for the first token).",
        ignored="not implemented by the JetStream engine (true is an error)",
        default_only=("FIRE sampling (the first token at a higher temperature) is not implemented by the JetStream engine", "set actor_rollout_ref.rollout.use_fire_sampling=false")),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": Key("Sample during validation; false decodes greedily."),
    "actor_rollout_ref.rollout.val_kwargs.n": Key("Responses per validation prompt."),
    "actor_rollout_ref.rollout.val_kwargs.temperature": Key("Temperature during validation (0 = greedy)."),
    "actor_rollout_ref.rollout.val_kwargs.top_k": Key("top_k during validation."),
    "actor_rollout_ref.rollout.val_kwargs.top_p": Key("top_p during validation."),
    # algorithm
    "algorithm.adv_estimator": Key("Advantage estimator by name (see docs/algorithms.md)."),
    "algorithm.filter_groups.enable": Key(
        "DAPO dynamic sampling: drop prompt groups whose filter metric has zero variance and generate more rounds until train_batch_size groups are kept.",
        added="DAPO recipe: dynamic sampling, keeping only prompt groups whose metric varies; under colocate_async "
              "each group is judged as it finishes, and a dropped one's slots go to the next prompts"),
    "algorithm.filter_groups.max_num_gen_batches": Key(
        "Generation rounds a step may take before it stops with an error (0 or less: no limit).",
        added="DAPO recipe: generation rounds per step before giving up (<= 0: no limit); under colocate_async, "
              "an update judges at most this many times data.gen_batch_size prompts"),
    "algorithm.filter_groups.metric": Key(
        "The per-response value whose spread within a group decides: acc or score (the reward function's extra info), seq_reward (summed scores) or seq_final_reward (summed rewards).",
        added="DAPO recipe: acc, score (reward-function extra info), seq_reward or seq_final_reward"),
    "algorithm.gamma": Key("Discount factor."),
    "algorithm.gdpo_reward_keys": Key(
        "GDPO: the per-sample reward components normalised separately.",
        added="gdpo: the reward components (extra-info keys) to normalise separately"),
    "algorithm.gdpo_reward_weights": Key(
        "GDPO: weights of those components; null weighs them equally.",
        added="gdpo: their weights (null = all 1)"),
    "algorithm.kl_ctrl.horizon": Key("Adaptive controller: steps over which the coefficient adapts."),
    "algorithm.kl_ctrl.kl_coef": Key("(Initial) coefficient of the KL penalty in the reward."),
    "algorithm.kl_ctrl.target_kl": Key("Adaptive controller: the KL it steers towards."),
    "algorithm.kl_ctrl.type": Key("KL coefficient controller: fixed or adaptive."),
    "algorithm.kl_penalty": Key("KL estimator of the reward penalty: kl (k1), abs, mse (k2), low_var_kl (k3), full."),
    "algorithm.lam": Key("GAE λ: the bias/variance trade-off of advantage estimation."),
    "algorithm.norm_adv_by_std_in_grpo": Key("Divide GRPO advantages by the group's standard deviation; false gives Dr.GRPO."),
    "algorithm.pf_ppo.reweight_method": Key("PF-PPO weighting: pow, max_min or max_random."),
    "algorithm.pf_ppo.weight_pow": Key("PF-PPO exponent of the pow weighting."),
    "algorithm.rollout_correction.bypass_mode": Key("Skip the old-log-prob pass and correct towards the rollout policy inside the loss."),
    "algorithm.rollout_correction.loss_type": Key("Policy loss of bypass mode (ppo_clip); the actor's policy_loss.rollout_correction follows it."),
    "algorithm.rollout_correction.rollout_is": Key("Importance weights between rollout and training policies: null, token or sequence."),
    "algorithm.rollout_correction.rollout_is_batch_normalize": Key("Divide the IS weights by their batch mean."),
    "algorithm.rollout_correction.rollout_is_threshold": Key(
        "IS bound: an upper bound (truncate), or 'lower_upper' to zero weights outside the range.",
        type_note="float or str"),
    "algorithm.rollout_correction.rollout_rs": Key("Rejection sampling of mismatched tokens or sequences (e.g. token_k1, seq_mean_k3); null is off."),
    "algorithm.rollout_correction.rollout_rs_threshold": Key(
        "Bound of the rejection statistic.",
        type_note="float, str or null"),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": Key(
        "verl 0.6-0.7: lower bound of the ratio pi_train/pi_rollout kept by rejection sampling (null = 1 / upper); "
        "removed in verl 0.9.",
        default_only=("verl 0.9 removed it with the token, sequence and geometric rejection modes it bounded; rljax "
                      "implements verl 0.9's options, where a k1 option's lower bound is part of rollout_rs_threshold",
                      "drop it and give both bounds as algorithm.rollout_correction.rollout_rs_threshold=LOWER_UPPER "
                      "with a k1 option (token_k1, seq_sum_k1, seq_mean_k1); they bound pi_rollout/pi_train, so "
                      "verl 0.7's rollout_rs=token with ratio bounds [L, U] is rollout_rs=token_k1 with "
                      "rollout_rs_threshold=(1/U)_(1/L) (sequence: seq_sum_k1, geometric: seq_mean_k1)")),
    "algorithm.rollout_correction.rollout_token_veto_threshold": Key(
        "verl 0.6-0.7: reject a whole sequence when any token's ratio pi_train/pi_rollout is below it; "
        "removed in verl 0.9.",
        default_only=("verl 0.9 removed the per-token veto; rljax implements verl 0.9's rejection options",
                      "drop it; to reject whole sequences holding an outlier token, set "
                      "algorithm.rollout_correction.rollout_rs=seq_max_k3 (or seq_max_k2) with "
                      "rollout_rs_threshold=UPPER")),
    "algorithm.rollout_correction.use_policy_gradient": Key(
        "verl 0.6: bypass mode's loss is REINFORCE with the IS weights instead of PPO's; verl 0.7 made it loss_type.",
        default_only=("verl 0.7 replaced it by algorithm.rollout_correction.loss_type",
                      "drop it and set algorithm.rollout_correction.loss_type=reinforce "
                      "(with algorithm.rollout_correction.bypass_mode=true)")),
    "algorithm.rollout_is": Key("Older switch for rollout importance sampling; mapped onto rollout_correction."),
    "algorithm.rollout_is_level": Key("Older key: IS weights per token or per sequence."),
    "algorithm.rollout_is_mode": Key("Older key: truncate weights above the bound, or mask tokens outside the bounds."),
    "algorithm.rollout_is_threshold": Key("Older key: upper bound of the rollout IS weights."),
    "algorithm.rollout_is_threshold_lower": Key("Older key: lower bound of the rollout IS weights (mask mode; null = 1 / upper)."),
    "algorithm.rollout_is_veto_threshold": Key("Older key: veto rule of verl before 0.9 (now an error naming its replacement)."),
    "algorithm.unbiased_advantage": Key(
        "Dr.GRPO's unbiased advantage: subtract the group mean, do not divide by the std.",
        added="cosmos-rl (Dr.GRPO): sets algorithm.norm_adv_by_std_in_grpo=false (group mean removed, no std division)"),
    "algorithm.use_kl_in_reward": Key("Subtract a KL(policy ‖ reference) penalty from the token rewards (PPO's choice)."),
    "algorithm.use_pf_ppo": Key(
        "Preference-feedback PPO: reweight samples by their reward before the update.",
        mapped="as verl 0.9.1's legacy trainer draws it under adv_estimator=gae (rljax.algos.pf_ppo): the update "
               "trains on the step's rows drawn again with replacement, weighted by their sequence scores (the "
               "step's metrics stay those of the generated rows); with another estimator it changes nothing, as "
               "in verl, and is listed in the warning of keys that change nothing"),
    # critic
    "critic.checkpoint.async_save": Key(
        "Write checkpoints in the background.",
        ignored="orbax decides how a checkpoint is written; the saved state is the same"),
    **described(("critic",), "checkpoint", _CHECKPOINT, {
        "contents": dict(deprecated=("critic.checkpoint.save_contents", "same value; load_contents follows")),
        "save_contents": dict(ignored="an orbax checkpoint always holds model, optimizer and extra state"),
        "load_contents": dict(ignored="a resume always restores model, optimizer and extra state"),
    }),
    "critic.cliprange_value": Key("Clip range of the value prediction around its rollout-time value."),
    "critic.data_loader_seed": Key(
        "A Megatron RNG work-around for the critic's data order.",
        ignored="a Megatron RNG work-around; data.seed drives the data order"),
    "critic.enable": Key("Train a critic; null decides from algorithm.adv_estimator (gae needs one)."),
    "critic.forward_max_token_len_per_gpu": Key("Token budget of a packed value forward pass; follows ppo_max_token_len_per_gpu."),
    "critic.forward_micro_batch_size": Key(
        "Old global micro-batch of value computation; replaced by the per-GPU key.",
        deprecated=("critic.forward_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices")),
    "critic.forward_micro_batch_size_per_gpu": Key("Responses per value forward pass on each device; follows ppo_micro_batch_size_per_gpu."),
    "critic.grad_clip": Key("Global gradient-norm clip of the critic."),
    "critic.load_weight": Key(
        "Load the checkpoint's weights (false: random initialisation).",
        default_only=("starting from random weights is not implemented: the checkpoint's weights would be loaded", "set critic.load_weight=true")),
    "critic.loss_agg_mode": Key("Aggregation of the value loss; follows the actor's loss_agg_mode."),
    "critic.model.enable_activation_offload": Key(
        "Move the critic's activations to host memory.",
        mapped="as actor_rollout_ref.model.enable_activation_offload, for the critic"),
    "critic.model.enable_gradient_checkpointing": Key("Recompute the critic's activations in the backward pass; follows the policy's."),
    "critic.model.external_lib": Key(
        "Package imported to register the critic's classes; follows the policy's.",
        ignored="registers PyTorch/HF classes"),
    "critic.model.fsdp_config.dtype": Key(
        "Mixed precision: the dtype the critic computes in.",
        mapped="compute dtype of the critic's passes"),
    "critic.model.fsdp_config.forward_prefetch": Key(
        "FSDP: gather the critic's next layer early.",
        ignored="XLA schedules all-gathers"),
    "critic.model.fsdp_config.fsdp_size": Key(
        "FSDP group size of the critic.",
        ignored="the critic is sharded on the actor's mesh"),
    "critic.model.fsdp_config.model_dtype": Key(
        "Dtype of the critic's parameters: fp32, bf16 or fp16.",
        mapped="dtype of the critic's parameters"),
    "critic.model.fsdp_config.offload_policy": Key(
        "FSDP2: offload the critic's parameters, gradients and optimizer state.",
        ignored="PyTorch FSDP2 offload"),
    "critic.model.fsdp_config.optimizer_offload": Key(
        "FSDP: keep the critic's optimizer state in host memory.",
        mapped="the critic's optimizer state stays in host memory between its updates"),
    "critic.model.fsdp_config.param_offload": Key(
        "FSDP: keep the critic's parameters in host memory.",
        mapped="the critic's parameters stay in host memory outside its values pass and its update"),
    "critic.model.fsdp_config.reshard_after_forward": Key(
        "FSDP: free the critic's gathered parameters after the forward pass.",
        ignored="XLA schedules all-gathers"),
    "critic.model.fsdp_config.wrap_policy.min_num_params": Key("FSDP: wrap the critic's modules with at least this many parameters."),
    "critic.model.lora_alpha": Key(
        "LoRA alpha of the critic.",
        ignored="read only with critic.model.lora_rank > 0 (an error: the critic trains in full)"),
    "critic.model.lora_rank": Key(
        "LoRA rank of the critic (0 = full fine-tuning).",
        default_only=("LoRA for the critic is not implemented: the critic trains in full", "set critic.model.lora_rank=0")),
    "critic.model.override_config": Key(
        "Fields that replace the critic's config.json values.",
        default_only=("the critic's Hugging Face config overrides are not applied", "drop critic.model.override_config")),
    "critic.model.override_config.moe_config.freeze_moe_router": Key(
        "Keep the critic's mixture-of-experts router fixed (Megatron).",
        default_only=("freezing a mixture-of-experts critic's routers is not implemented",
                      "set critic.model.override_config.moe_config.freeze_moe_router=false")),
    "critic.model.path": Key("Critic checkpoint; follows the policy's path."),
    "critic.model.target_modules": Key(
        "LoRA targets of the critic.",
        ignored="read only with critic.model.lora_rank > 0 (an error: the critic trains in full)",
        type_note="str or list"),
    "critic.model.tokenizer_path": Key("Tokenizer of the critic; follows the policy's path."),
    "critic.model.trust_remote_code": Key(
        "Allow a critic checkpoint with its own model code.",
        ignored="rljax runs no model code from checkpoints"),
    "critic.model.use_remove_padding": Key(
        "Pack the rows' real tokens in the critic's passes (values and the update), as the actor's "
        "actor_rollout_ref.model.use_remove_padding does."),
    "critic.model.use_shm": Key(
        "Load the critic through shared memory.",
        ignored="shared-memory model loading for Ray workers"),
    "critic.nccl_timeout": Key(
        "Seconds before an NCCL collective times out.",
        ignored="NCCL collective timeout; XLA's collectives have none to set"),
    "critic.ppo_epochs": Key("Critic passes over each batch of rollouts; follows the actor's."),
    "critic.ppo_max_token_len_per_gpu": Key("Token budget of a packed critic micro-batch."),
    "critic.ppo_micro_batch_size": Key(
        "Old global critic micro-batch; replaced by ppo_micro_batch_size_per_gpu.",
        deprecated=("critic.ppo_micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices")),
    "critic.ppo_micro_batch_size_per_gpu": Key("Responses per critic forward/backward pass on each device; follows the actor's."),
    "critic.ppo_mini_batch_size": Key("Prompts per critic optimizer step; follows the actor's."),
    "critic.rollout_n": Key(
        "Responses per prompt, as the critic sees them; follows actor_rollout_ref.rollout.n.",
        ignored="the critic's batch follows actor_rollout_ref.rollout.n"),
    "critic.shuffle": Key("Shuffle rollouts before the critic's mini-batches; follows the actor's."),
    "critic.strategy": Key("Backend of the critic (fsdp or megatron in verl).",
                           mapped="rljax shards with a device mesh whichever it is; megatron makes the critic's "
                                  "learning rate follow Megatron's scheduler (critic.optim.lr_decay_style, ...)"),
    "critic.ulysses_sequence_parallel_size": Key("Sequence-parallel size of the critic."),
    "critic.use_dynamic_bsz": Key("Pack critic micro-batches by token count; follows the actor's."),
    "critic.use_torch_compile": Key("Compile the critic with torch.compile.", ignored="everything is jax.jit-compiled"),
    # custom_reward_function
    "custom_reward_function.name": Key("Name of the function in that file (verl's signature: data_source, solution_str, ground_truth, extra_info)."),
    "custom_reward_function.path": Key("Python file with your scoring function; null uses the built-in scorers."),
    "custom_reward_function.reward_kwargs": Key("Extra keyword arguments passed to that function."),
    # data
    "data.apply_chat_template_kwargs": Key(
        "Extra arguments of the tokenizer's apply_chat_template (e.g. enable_thinking).",
        mapped="the chat template's own variables (enable_thinking, reasoning_effort) on every rendering of a "
               "prompt, a multi-turn turn and validation; transformers' call arguments (tokenize, "
               "continue_final_message, ...) are an error"),
    "data.custom_cls.name": Key("Name of the dataset class in that file."),
    "data.custom_cls.path": Key("Python file defining your own dataset class; null uses the built-in one."),
    "data.datagen.name": Key(
        "Class name of a dynamic data generator.",
        ignored="read only with data.datagen.path (an error when set)"),
    "data.datagen.path": Key(
        "File of a dynamic data generator.",
        default_only=("dynamic data generation is not implemented", "drop data.datagen.path")),
    "data.dataloader_num_workers": Key(
        "Worker processes of the data loader.",
        added="grain worker processes (verl's key; rljax defaults to 0, in-process)"),
    "data.filter_overlong_prompts": Key("Drop prompts longer than max_prompt_length before training."),
    "data.filter_overlong_prompts_workers": Key("Processes that filter overlong prompts."),
    "data.gen_batch_size": Key(
        "Prompts per data-loader fetch (follows train_batch_size): with algorithm.filter_groups on, per generation "
        "round; else a step's train_batch_size prompts come in whole chunks of it (trainer.use_v1=false: a step "
        "trains gen_batch_size prompts).",
        added="DAPO's prompts per generation round of dynamic sampling (algorithm.filter_groups); without it, as "
              "verl 0.9.1 reads it: in sync mode a divisor of data.train_batch_size that changes nothing (rljax "
              "reads the same prompts, but drops an epoch's last partial train batch where verl's step may join "
              "the last chunks of one epoch to the first of the next), in the async modes nothing (verl sets it "
              "to 1); under trainer.use_v1=false, data.train_batch_size = gen_batch_size, as in verl's legacy "
              "trainer"),
    "data.image_key": Key(
        "Column holding images in multimodal data (a list per row of {'bytes': ...}, {'path': ...} or paths; each "
        "<image> in the prompt's text is where one goes). Read for a vision-language actor (Qwen2.5-VL, "
        "Qwen3-VL); with a text model, data with that column filled is an error."),
    "data.image_patch_size": Key(
        "Patch size of a vision model's image preprocessing: images are first resized to multiples of twice it, "
        "as verl's qwen_vl_utils does, then by the model's preprocessor_config.json."),
    "data.max_prompt_length": Key("Prompt length in tokens; prompts are left-padded to it."),
    "data.max_response_length": Key("Most tokens generated per response."),
    "data.prompt_key": Key("Column holding the prompt (a list of chat messages)."),
    "data.return_full_prompt": Key("Also keep the templated prompt text."),
    "data.return_multi_modal_inputs": Key(
        "Return a vision model's processed inputs with each batch.",
        ignored="a batch with images always carries them (multi_modal_inputs), which the rollout and the passes "
                "read"),
    "data.return_raw_chat": Key("Also keep the prompt's chat messages untemplated."),
    "data.return_raw_input_ids": Key("Also keep the prompt's ids without the chat template (for a reward model with another template)."),
    "data.reward_fn_key": Key("Column whose value picks the scoring function (the data source)."),
    "data.sampler.class_name": Key(
        "Class name of a custom sampler.",
        ignored=f"{NOWHERE} (see data.sampler.class_path)"),
    "data.sampler.class_path": Key(
        "File of a custom sampler.",
        ignored=f"{NOWHERE}: its create_rl_sampler orders the rows by data.shuffle and data.seed alone, as "
                "rljax does"),
    "data.seed": Key("Seed of the data order."),
    "data.shuffle": Key("Shuffle the training rows every epoch."),
    "data.tokenizer": Key("Tokenizer to use; null takes the policy model's own tokenizer."),
    "data.tool_config_path": Key(
        "verl's copy of actor_rollout_ref.rollout.multi_turn.tool_config_path: with multi-turn rollouts, prompts "
        "are rendered with these tools' schemas (the chat template's `tools`)."),
    "data.train_batch_size": Key("Prompts per training step (each sampled rollout.n times)."),
    "data.train_files": Key("Training parquet file, or a list of them; ~ expands.", type_note="str or list"),
    "data.train_max_samples": Key("Use at most this many training rows; -1 uses them all."),
    "data.truncation": Key("What to do with an overlong prompt: error, or cut it at the left, right or middle."),
    "data.trust_remote_code": Key(
        "Allow a tokenizer that ships its own Python code.",
        ignored="tokenizers run no remote code"),
    "data.use_shm": Key(
        "Load data through shared memory (verl's Ray workers).",
        ignored="shared-memory loading for Ray workers"),
    "data.val_batch_size": Key(
        "Validation prompts per batch; null validates the whole set at once.",
        deprecated=(None, "still honoured: validation prompts per batch (null = the whole set at once)")),
    "data.val_files": Key("Validation parquet file, or a list of them.", type_note="str or list"),
    "data.val_max_samples": Key("Use at most this many validation rows; -1 uses them all."),
    "data.validation_shuffle": Key("Shuffle the validation rows."),
    "data.video_key": Key(
        "Column holding videos in multimodal data.",
        ignored="videos are not supported (data with that column filled is an error; give frames as images)"),
    # global_profiler
    "global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-graph-trace": Key("Nsight: CUDA graph tracing."),
    "global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-memory-usage": Key("Nsight: track CUDA memory."),
    "global_profiler.global_tool_config.nsys.controller_nsight_options.trace": Key("Nsight: APIs to trace."),
    "global_profiler.global_tool_config.nsys.discrete": Key("Nsight: one profile file per task."),
    "global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range": Key("Nsight: what starts a capture on the workers."),
    "global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end": Key("Nsight: what ends a capture on the workers."),
    "global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-graph-trace": Key("Nsight: CUDA graph tracing."),
    "global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage": Key("Nsight: track CUDA memory."),
    "global_profiler.global_tool_config.nsys.worker_nsight_options.kill": Key("Nsight: signal sent to the workers when profiling ends."),
    "global_profiler.global_tool_config.nsys.worker_nsight_options.trace": Key("Nsight: APIs to trace."),
    "global_profiler.global_tool_config.torch_memory.context": Key("torch memory snapshot: which events keep their context."),
    "global_profiler.global_tool_config.torch_memory.kw_args": Key("torch memory snapshot: extra arguments."),
    "global_profiler.global_tool_config.torch_memory.stack_depth": Key("torch memory snapshot: stack frames kept per allocation."),
    "global_profiler.global_tool_config.torch_memory.stacks": Key("torch memory snapshot: which stacks to record (python, cpp, all)."),
    "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries": Key("torch memory snapshot: allocations kept."),
    "global_profiler.profile_continuous_steps": Key(
        "One profile over consecutive steps instead of one per step.",
        ignored="each listed step is one jax.profiler trace of its own"),
    "global_profiler.save_path": Key(
        "Directory of the profiles.",
        mapped="directory of the jax.profiler traces (one step_N folder per traced step)"),
    "global_profiler.steps": Key(
        "Training steps to profile.",
        mapped="steps (1-based) recorded as jax.profiler traces when a role's profiler.enable is true: one TensorBoard/Perfetto trace per step in global_profiler.save_path/step_N"),
    "global_profiler.tool": Key(
        "Profiler of the run: nsys, npu, torch or torch_memory.",
        mapped="any tool (nsys, npu, torch, torch_memory) records a jax.profiler trace"),
    # ray_init
    "ray_init.num_cpus": Key("CPUs Ray may use; null = all."),
    "ray_init.timeline_json_file": Key("File to write Ray's timeline to."),
    # ray_kwargs
    "ray_kwargs.ray_init.num_cpus": Key("CPUs Ray may use; null = all."),
    "ray_kwargs.timeline_json_file": Key("File to write Ray's timeline to."),
    # reward_manager
    "reward_manager.module.name": Key(
        "Class name in that file.",
        ignored="read only with reward_manager.module.path (an error when set)"),
    "reward_manager.module.path": Key(
        "File of a custom reward-manager class.",
        default_only=("custom reward-manager classes are not implemented", "give a scoring function as custom_reward_function.path, or pick reward_model.reward_manager")),
    "reward_manager.name": Key(
        "Reward manager by name; follows reward_model.reward_manager (and sets it when given).",
        mapped="verl's newer name of reward_model.reward_manager: a value set here is read as it"),
    "reward_manager.source": Key(
        "Where the reward manager comes from: register (by name) or importlib (module.path).",
        ignored="where verl finds the reward manager; reward_manager.module.path set is an error"),
    # reward_model
    "reward_model.enable": Key("Score responses with a learned reward model (in addition to rule functions)."),
    "reward_model.enable_resource_pool": Key(
        "Give the reward model its own Ray resource pool.",
        ignored="Ray resource pools"),
    "reward_model.forward_max_token_len_per_gpu": Key("Token budget of a packed reward-model micro-batch; follows the critic's."),
    "reward_model.launch_reward_fn_async": Key(
        "Compute rule rewards concurrently with the log-prob passes.",
        ignored="reward functions run in the reward manager's pool"),
    "reward_model.load_weight": Key(
        "Load the checkpoint's weights (false: random initialisation).",
        default_only=("starting from random weights is not implemented: the checkpoint's weights would be loaded", "set reward_model.load_weight=true")),
    "reward_model.max_length": Key("Longest input the reward model scores; null = prompt + response length."),
    "reward_model.micro_batch_size": Key(
        "Old global reward-model micro-batch; replaced by micro_batch_size_per_gpu.",
        deprecated=("reward_model.micro_batch_size_per_gpu", "global, in prompts: x rollout.n / data-parallel devices")),
    "reward_model.micro_batch_size_per_gpu": Key("Responses per reward-model forward pass on each device."),
    "reward_model.model.external_lib": Key(
        "Package imported to register the reward model's classes; follows the policy's.",
        ignored="registers PyTorch/HF classes"),
    "reward_model.model.fsdp_config.forward_prefetch": Key("FSDP: gather the reward model's next layer early."),
    "reward_model.model.fsdp_config.fsdp_size": Key("FSDP group size of the reward model."),
    "reward_model.model.fsdp_config.min_num_params": Key("FSDP: wrap threshold of the reward model (older spelling)."),
    "reward_model.model.fsdp_config.param_offload": Key("FSDP: keep the reward model's parameters in host memory."),
    "reward_model.model.fsdp_config.reshard_after_forward": Key("FSDP: free the reward model's gathered parameters after use."),
    "reward_model.model.fsdp_config.wrap_policy.min_num_params": Key("FSDP: wrap the reward model's modules with at least this many parameters."),
    "reward_model.model.input_tokenizer": Key(
        "Tokenizer of the policy, to decode responses before re-templating them for the reward model; follows the policy's path."),
    "reward_model.model.override_config": Key(
        "Fields that replace the reward model's config.json values.",
        default_only=("the reward model's Hugging Face config overrides are not applied", "drop reward_model.model.override_config")),
    "reward_model.model.path": Key("Reward model checkpoint (a sequence-classification model)."),
    "reward_model.model.trust_remote_code": Key(
        "Allow a reward model checkpoint with its own code.",
        ignored="rljax runs no model code from checkpoints"),
    "reward_model.model.use_fused_kernels": Key(
        "Use fused kernels in the reward model.",
        ignored="XLA fuses on its own"),
    "reward_model.model.use_remove_padding": Key(
        "Pack the reward model's rows' real tokens into fixed-length buffers (segment ids keep each row to "
        "itself), each score read at its row's last token: the same scores for the real tokens' cost."),
    "reward_model.model.use_shm": Key(
        "Load the reward model through shared memory.",
        ignored="shared-memory loading for Ray workers"),
    "reward_model.n_gpus_per_node": Key(
        "GPUs per node of the reward model's pool.",
        ignored="Ray resource pools; the reward model runs on the actor's mesh"),
    "reward_model.nccl_timeout": Key(
        "Seconds before an NCCL collective times out.",
        ignored="NCCL collective timeout; XLA's collectives have none to set"),
    "reward_model.nnodes": Key(
        "Nodes of the reward model's pool.",
        ignored="Ray resource pools; the reward model runs on the actor's mesh"),
    "reward_model.num_workers": Key(
        "Reward-loop worker processes.",
        ignored="verl's reward-loop workers; reward_model.prime.num_workers sizes rljax's pool"),
    "reward_model.overlong_buffer.enable": Key(
        "Apply DAPO's soft penalty to responses that run into the last len tokens.",
        added="DAPO overlong penalty (verl recipe / cosmos-rl overlong_reward)"),
    "reward_model.overlong_buffer.len": Key(
        "Length in tokens of the penalty ramp before max_response_length.",
        added="DAPO overlong buffer length in tokens"),
    "reward_model.overlong_buffer.log": Key(
        "Record the penalty per sample in the reward's extra info.",
        added="log the overlong penalty per sample"),
    "reward_model.overlong_buffer.max_resp_len": Key(
        "DAPO's max_resp_len (verl's reward_kwargs.max_resp_len): the length at which the penalty is full; null means data.max_response_length, the only value rljax accepts.",
        added="DAPO recipe's max_resp_len (verl's reward_kwargs.max_resp_len); checked equal to data.max_response_length"),
    "reward_model.overlong_buffer.penalty_factor": Key(
        "Penalty at the length limit (the ramp goes from 0 to minus this).",
        added="DAPO overlong penalty factor"),
    "reward_model.prime.num_workers": Key(
        "Processes of the prime reward manager; null = the CPU count.",
        added="processes of the prime reward manager (null = CPU count)"),
    "reward_model.prime.timeout_s": Key(
        "Seconds one sample may take in the prime manager before it scores 0.",
        added="per-sample scorer timeout of the prime reward manager"),
    "reward_model.reward_loop_class_name": Key(
        "Class name of a custom reward loop.",
        ignored="read only with reward_loop_module_path (an error when set)"),
    "reward_model.reward_loop_module_path": Key(
        "File of a custom reward loop.",
        default_only=("custom reward loops are not implemented", "give a scoring function as custom_reward_function.path")),
    "reward_model.reward_loop_source": Key(
        "Where the reward loop comes from: register or importlib.",
        ignored="where verl finds a reward loop; reward_loop_module_path set is an error"),
    "reward_model.reward_manager": Key(
        "How rule rewards are computed: naive (one by one), prime (process pool), dapo (with the overlong penalty), batch (one call per batch)."),
    "reward_model.rollout.cudagraph_capture_sizes": Key("Its CUDA-graph batch sizes."),
    "reward_model.rollout.data_parallel_size": Key("Its data-parallel size."),
    "reward_model.rollout.disable_log_stats": Key("Silence its statistics log."),
    "reward_model.rollout.dtype": Key("Its dtype."),
    "reward_model.rollout.enable_chunked_prefill": Key("Its chunked-prefill switch."),
    "reward_model.rollout.enable_prefix_caching": Key("Its prefix-cache switch."),
    "reward_model.rollout.enforce_eager": Key("Its CUDA-graph switch."),
    "reward_model.rollout.engine_kwargs": Key("Its engine arguments."),
    "reward_model.rollout.expert_parallel_size": Key("Its expert-parallel size."),
    "reward_model.rollout.free_cache_engine": Key("Free its KV cache between uses."),
    "reward_model.rollout.gpu_memory_utilization": Key("Its share of GPU memory."),
    "reward_model.rollout.limit_images": Key("Images per prompt it accepts."),
    "reward_model.rollout.load_format": Key("How it loads weights."),
    "reward_model.rollout.max_model_len": Key("Its context length."),
    "reward_model.rollout.max_num_batched_tokens": Key("Its scheduler's token budget."),
    "reward_model.rollout.max_num_seqs": Key("Its concurrent sequences."),
    "reward_model.rollout.name": Key("Inference server of a generative reward model (vllm, sglang, trtllm)."),
    "reward_model.rollout.prompt_length": Key("Longest prompt it scores."),
    "reward_model.rollout.response_length": Key("Longest judgement it generates."),
    "reward_model.rollout.skip_tokenizer_init": Key("Start it without a tokenizer."),
    "reward_model.rollout.tensor_model_parallel_size": Key("Its tensor-parallel size."),
    "reward_model.sandbox_fusion.max_concurrent": Key("Concurrent requests to that sandbox."),
    "reward_model.sandbox_fusion.memory_limit_mb": Key("Memory limit of each sandbox run."),
    "reward_model.sandbox_fusion.url": Key("URL of a remote code-execution sandbox for code rewards."),
    "reward_model.strategy": Key(
        "Backend of the reward model (fsdp or megatron in verl).",
        ignored="FSDP/Megatron choice"),
    "reward_model.ulysses_sequence_parallel_size": Key(
        "Ulysses sequence-parallel size of the reward model.",
        ignored="the reward model is sharded on the actor's mesh"),
    "reward_model.use_dynamic_bsz": Key("Pack reward-model micro-batches by token count; follows the critic's."),
    "reward_model.use_reward_loop": Key(
        "Score with verl's asynchronous reward loop.",
        ignored="verl's async reward workers; reward functions run in the reward manager's pool"),
    # trainer
    "trainer.balance_batch": Key("Reorder a batch so that every data-parallel device gets a similar number of tokens."),
    "trainer.controller_nsight_options.cuda-graph-trace": Key("Nsight: CUDA graph tracing on the controller."),
    "trainer.controller_nsight_options.cuda-memory-usage": Key("Nsight: track CUDA memory on the controller."),
    "trainer.controller_nsight_options.trace": Key("Nsight: APIs traced on the controller."),
    "trainer.critic_warmup": Key("The global step (1-based) from which the actor trains; the steps before it train "
                                 "only the critic (0 and 1: the actor trains from the first step)."),
    "trainer.default_hdfs_dir": Key(
        "HDFS directory checkpoints are copied to.",
        ignored="HDFS copy of checkpoints; default_local_dir may be any path orbax writes (gs:// included)"),
    "trainer.default_local_dir": Key(
        "Checkpoint directory; follows checkpoints/project_name/experiment_name.",
        mapped="orbax CheckpointManager directory"),
    "trainer.del_local_ckpt_after_load": Key(
        "Delete the local checkpoint once it has been loaded.",
        ignored="HDFS workflow"),
    "trainer.device": Key("Accelerator platform.", mapped="JAX platform: auto, cpu, gpu (cuda), tpu"),
    "trainer.esi_redundant_time": Key(
        "Seconds kept spare before an elastic server instance expires, to checkpoint.",
        ignored="elastic-server preemption margin of verl's cloud jobs"),
    "trainer.experiment_name": Key("Run name for the loggers and the checkpoint directory."),
    "trainer.log_val_generations": Key("Validation responses to log as text each validation."),
    "trainer.logger": Key(
        "Where metrics go: a list of console, jsonl, tensorboard, wandb, mlflow.",
        mapped="console, jsonl, tensorboard, wandb (wandb honours WANDB_MODE=offline), mlflow (as verl's: "
               "MLFLOW_TRACKING_URI, default sqlite:////tmp/mlruns.db, and MLFLOW_RUN_ID honoured; "
               "rljax.training.tracking)"),
    "trainer.logical_axis_rules": Key(
        "Pairs (logical axis, mesh axes) that decide how parameters and batches are sharded.",
        added="logical axis -> mesh axis pairs; parallelism is a config change"),
    "trainer.max_actor_ckpt_to_keep": Key("Actor checkpoints kept; null keeps all."),
    "trainer.max_critic_ckpt_to_keep": Key("Critic checkpoints kept; null keeps all."),
    "trainer.n_gpus_per_node": Key(
        "Accelerators per host.",
        mapped="devices per process; 'auto' = jax.local_device_count()",
        type_note="int or 'auto'"),
    "trainer.nnodes": Key(
        "Number of hosts.",
        mapped="number of JAX processes (hosts); 'auto' = jax.process_count()",
        type_note="int or 'auto'"),
    "trainer.profile_steps": Key("Steps to profile with Nsight.", ignored="Nsight profiling; use jax.profiler instead"),
    "trainer.project_name": Key("Project name for the loggers and the checkpoint directory."),
    "trainer.ray_wait_register_center_timeout": Key("Seconds to wait for Ray's register center.", ignored="no Ray"),
    "trainer.remove_previous_ckpt_in_save": Key(
        "Delete the previous checkpoint when a new one is saved.",
        ignored="deprecated in verl; trainer.max_actor_ckpt_to_keep=1 keeps only the latest"),
    "trainer.resume_from_path": Key("Checkpoint to resume from with resume_mode=resume_path."),
    "trainer.resume_mode": Key("auto resumes from the latest checkpoint, disable starts fresh, resume_path uses resume_from_path."),
    "trainer.rollout_data_dir": Key(
        "Directory to dump training rollouts to (STEP.jsonl; STEP.processK.jsonl per host on several hosts); null dumps nothing."),
    "trainer.save_freq": Key("Save a checkpoint every this many steps; -1 never saves."),
    "trainer.seed": Key(
        "Seed of the run's random numbers (initialisation, sampling).",
        added="seed of the JAX PRNG key (init, sampling, clip_cov)"),
    "trainer.test_freq": Key("Validate every this many steps; -1 never."),
    "trainer.total_epochs": Key("Passes over the training set."),
    "trainer.total_training_steps": Key("Stop after this many steps; null runs total_epochs."),
    "trainer.use_legacy_worker_impl": Key(
        "Which of verl's Ray worker classes to use (auto, enable, disable).",
        ignored="chooses between verl's Ray worker classes"),
    "trainer.use_v1": Key(
        "Run verl's V1 trainer (its loop with the synchronous and asynchronous modes of trainer.v1.trainer_mode).",
        mapped="rljax has one trainer, which runs trainer.v1.trainer_mode; true and false run it alike"),
    "trainer.v1.trainer_mode": Key(
        "sync: generate, then train on what was generated; colocate_async: generation and training overlap on "
        "the same devices; separate_async: on separate devices, weights sent every parameter_sync_step steps.",
        mapped="colocate_async as rljax.rl.streaming describes (the engine's slots stay full across updates, "
               "partial rollouts continue under the new weights); separate_async streams the same way on the "
               "actor_rollout_ref.rollout.nnodes x n_gpus_per_node devices of its own, on a thread of its own, "
               "while the trainer updates on the rest (rljax.rl.separate; on several processes, processes of its own, "
               "a multiple or a divisor of the trainer's, rljax.rl.remote)"),
    "trainer.v1.sync": Key("Settings of the sync mode (none)."),
    "trainer.v1.colocate_async.num_warmup_batches": Key(
        "colocate_async: batches generated before the first update.",
        mapped="colocate_async admits prompts while fewer than 1 + num_warmup_batches batches of them are "
               "untrained (how far generation runs ahead of training); no effect in sync"),
    "trainer.v1.separate_async.num_warmup_batches": Key(
        "separate_async: batches generated before the first update.",
        mapped="separate_async: batches the rollout runs ahead of the trainer (it admits prompts while fewer than "
               "1 + num_warmup_batches batches of them are untrained, and batch b decodes under the weights sent "
               "after update parameter_sync_step x floor((b - num_warmup_batches) / parameter_sync_step))"),
    "trainer.v1.separate_async.parameter_sync_step": Key(
        "separate_async: updates between two weight transfers to the rollout devices.",
        mapped="separate_async: the weights go to the rollout devices after every parameter_sync_step-th update, "
               "device to device (cast to rollout.dtype first)"),
    "trainer.v1.separate_async.hybrid_rollout.enable_switch": Key(
        "separate_async: let rollout devices switch to training when generation outpaces it.",
        default_only=("switching rollout devices to training is not implemented (the rollout keeps its devices)",
                      "set it to false, or give the trainer more devices")),
    "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio": Key(
        "separate_async: share of idle rollout capacity that triggers a switch.",
        ignored=_SWITCH),
    "trainer.v1.separate_async.hybrid_rollout.adaptive_switch_threshold": Key(
        "separate_async: adjust that threshold from the measured switch costs.",
        ignored=_SWITCH),
    "trainer.v1.separate_async.hybrid_rollout.switch_threshold_step_up": Key(
        "separate_async: how much the threshold rises after a costly switch.",
        ignored=_SWITCH),
    "trainer.v1.separate_async.hybrid_rollout.switch_threshold_step_down": Key(
        "separate_async: how much the threshold falls after a cheap switch.",
        ignored=_SWITCH),
    "trainer.v1.separate_async.hybrid_rollout.switch_threshold_release_steps": Key(
        "separate_async: steps before switched devices return to rollout.",
        ignored=_SWITCH),
    "trainer.v1.separate_async.hybrid_rollout.switch_cost_window_size": Key(
        "separate_async: switches averaged to estimate a switch's cost.",
        ignored=_SWITCH),
    "trainer.v1.sampler.max_off_policy_threshold": Key(
        "Policy versions a sample may span (1: generated whole by the policy it trains).",
        mapped="colocate_async: no trained group spans more policy versions than this, counted from the "
               "version of its first sampled token; no effect in sync"),
    "trainer.v1.sampler.max_off_policy_strategy": Key(
        "drop: discard a sample older than the threshold; wait: hold generation until training catches up.",
        mapped="colocate_async: drop evicts groups past the threshold at an update (off_policy/evicted_samples) "
               "and refills their slots; wait drops nothing: an update waits for the groups that would pass "
               "it, and at most threshold batches are admitted untrained; no effect in sync"),
    "trainer.v1.sampler.sync_refill_failed_groups": Key(
        "Generate new groups in place of groups that failed.",
        default_only=("refilling failed groups is not implemented (dynamic sampling regenerates filtered groups: "
                      "algorithm.filter_groups)", "set trainer.v1.sampler.sync_refill_failed_groups=false")),
    "trainer.v1.sampler.custom_sampler.path": Key(
        "Python file with your own sampler class.",
        default_only=("custom samplers are not loaded", "drop trainer.v1.sampler.custom_sampler.path")),
    "trainer.v1.sampler.custom_sampler.name": Key("Name of the sampler class in that file."),
    "trainer.v1.sampler.sampler_kwargs": Key(
        "Extra arguments of the sampler.",
        ignored="verl 0.9.1 hands it to a custom sampler alone (trainer.v1.sampler.custom_sampler.path, an error "
                "here); its own replay buffer keeps it unread"),
    "trainer.val_before_train": Key("Validate once before the first step."),
    "trainer.val_only": Key("Validate and exit without training."),
    "trainer.validation_data_dir": Key(
        "Directory to dump validation generations to (STEP.jsonl; one file per host on several hosts); null dumps nothing."),
    "trainer.worker_nsight_options.capture-range": Key("Nsight: what starts a capture on the workers."),
    "trainer.worker_nsight_options.capture-range-end": Key("Nsight: what ends a capture on the workers."),
    "trainer.worker_nsight_options.cuda-graph-trace": Key("Nsight: CUDA graph tracing on the workers."),
    "trainer.worker_nsight_options.cuda-memory-usage": Key("Nsight: track CUDA memory on the workers."),
    "trainer.worker_nsight_options.kill": Key("Nsight: signal sent to the workers when profiling ends."),
    "trainer.worker_nsight_options.trace": Key("Nsight: APIs traced on the workers."),
    # transfer_queue
    "transfer_queue.enable": Key("Move batches through verl's Ray transfer queue."),
    # async_training and rollout: verl's fully-async recipe (verl/experimental/fully_async_policy)
    "async_training.staleness_threshold": Key(
        "Fully-async recipe: share of extra prompts generation may produce between two weight syncs (0: on-policy).",
        mapped=f"{_RECIPE}: generation runs this share of a step ahead of training (the recipe's default 0.1 where "
               "another recipe key is set); no policy-version bound unless trainer.v1.sampler."
               "max_off_policy_threshold is set"),
    "async_training.trigger_parameter_sync_step": Key(
        "Fully-async recipe: local updates between two weight syncs (default 4).",
        mapped=f"{_RECIPE}: one rljax step is one sync: data.train_batch_size = this x require_batches x "
               "actor.ppo_mini_batch_size; with actor.ppo_epochs > 1 it must be 1"),
    "async_training.require_batches": Key(
        "Fully-async recipe: ppo_mini_batch_size batches in each local update (default 1).",
        mapped=f"{_RECIPE}: a factor of data.train_batch_size (see trigger_parameter_sync_step)"),
    "async_training.partial_rollout": Key(
        "Fully-async recipe: in-flight samples continue under the new weights after a sync (default true).",
        mapped=f"{_RECIPE}: true is what colocate_async does; false with staleness_threshold > 0 is an error "
               "(waiting for in-flight samples before a sync is not implemented)"),
    "async_training.use_trainer_do_validate": Key(
        "Fully-async recipe: validate on the trainer's workers.", ignored="validation runs on the job's devices"),
    "async_training.parallel_validate_and_rollout": Key(
        "Fully-async recipe: validate while generating.", ignored="validation runs between steps"),
    "async_training.checkpoint_engine.enable": Key(
        "Fully-async recipe: ship weights to the rollout workers in buckets.", ignored=_IN_PLACE),
    "async_training.checkpoint_engine.overlap_broadcast_and_consume": Key(
        "Fully-async recipe: overlap the weight broadcast with loading.", ignored=_IN_PLACE),
    "async_training.checkpoint_engine.device_buffer_size_M": Key(
        "Fully-async recipe: bucket size (MB) of the weight transfer.", ignored=_IN_PLACE),
    "rollout.nnodes": Key("Fully-async recipe: nodes of the rollout workers.", ignored=_COLOCATED),
    "rollout.n_gpus_per_node": Key("Fully-async recipe: GPUs per node of the rollout workers.", ignored=_COLOCATED),
    "rollout.n": Key("Fully-async recipe: responses per prompt.",
                     mapped="sets actor_rollout_ref.rollout.n (both set, differently: an error)"),
    "rollout.total_rollout_steps": Key(
        "Fully-async recipe: prompts to generate in the whole run.",
        mapped=f"{_RECIPE}: trainer.total_training_steps = this / data.train_batch_size (a whole number, else an "
               "error)"),
    "rollout.total_epochs": Key("Fully-async recipe: passes over the data.", mapped="sets trainer.total_epochs"),
    "rollout.test_freq": Key("Fully-async recipe: validate every this many weight syncs.",
                             mapped="sets trainer.test_freq (a step is one sync)"),
    "rollout.max_concurrent_samples_per_replica": Key(
        "Fully-async recipe: samples in flight per rollout server.",
        ignored="the engine's decode slots are actor_rollout_ref.rollout.max_num_seqs"),
    **_verl_09_keys(),
}

# Sections whose every key rljax ignores: prefix -> why.
IGNORED_SECTIONS = {
    "actor_rollout_ref.ref.fsdp_config": "the reference model is sharded like the actor",
    "actor_rollout_ref.rollout.engine_kwargs": "vLLM/SGLang/TensorRT-LLM engine arguments",
    "critic.model.fsdp_config.wrap_policy": "sharding follows logical-axis rules, not module wrapping",
    "reward_model.model.fsdp_config": "the reward model is sharded like the actor",
    "reward_model.sandbox_fusion": "remote code sandboxes are not called; no scorer runs model output as code",
    "ray_init": "no Ray: one JAX program per host",
    "trainer.controller_nsight_options": "Nsight profiling",
    "trainer.worker_nsight_options": "Nsight profiling",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision": "PyTorch FSDP's dtypes; fsdp_config.model_dtype and dtype set rljax's",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision": "PyTorch FSDP's dtypes; fsdp_config.model_dtype and dtype set rljax's",
    "critic.model.fsdp_config.mixed_precision": "PyTorch FSDP's dtypes; fsdp_config.model_dtype and dtype set rljax's",
    "actor_rollout_ref.actor.profiler.tool_config": "Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)",
    "actor_rollout_ref.ref.profiler.tool_config": "Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)",
    "actor_rollout_ref.rollout.profiler.tool_config": "Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)",
    "critic.profiler.tool_config": "Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)",
    "reward_model.profiler.tool_config": "Nsight/NPU/torch profiler options; rljax records jax.profiler traces (profiler.enable, global_profiler.steps)",
    "actor_rollout_ref.ref.megatron": "Megatron-LM settings; this model is sharded on the actor's mesh",
    "critic.megatron": "Megatron-LM settings; this model is sharded on the actor's mesh",
    "reward_model.megatron": "Megatron-LM settings; this model is sharded on the actor's mesh",
    "actor_rollout_ref.rollout.checkpoint_engine": "how verl ships weights to the inference servers; the engine reads the trainer's arrays in place",
    "actor_rollout_ref.rollout.trace": "rollout tracing to mlflow/weave",
    "actor_rollout_ref.rollout.prometheus": "the inference servers' Prometheus metrics",
    "actor_rollout_ref.rollout.mtp": "verl's copy of actor_rollout_ref.model.mtp for its inference servers",
    "actor_rollout_ref.model.tiled_mlp": "tiling the MLP to save GPU memory; it changes no result",
    "critic.model.tiled_mlp": "tiling the MLP to save GPU memory; it changes no result",
    "reward_model.rollout": "an inference server for generative reward models; rljax's reward model is a scorer",
    "actor_rollout_ref.rollout.layer_name_map": "Megatron-to-vLLM weight names; the engine reads the trainer's arrays in place",
    "critic.model.lora": "Megatron's LoRA config (lora.rank > 0 is an error: the critic trains in full)",
    "global_profiler.global_tool_config": "Nsight/torch profiler options; rljax records jax.profiler traces",
    "transfer_queue": "verl's Ray data-transfer queue",
    "ray_kwargs": "no Ray: one JAX program per host",
}


def view(records: dict[str, Key], field: str) -> dict[str, Any]:
  """key -> the `field` of its record, for each of `records` that has one (a tree's table of that field)."""
  return {path: getattr(key, field) for path, key in records.items() if getattr(key, field) is not None}


def ignored_table(records: dict[str, Key], sections: dict[str, str]) -> dict[str, str]:
  """A tree's `IGNORED_KEYS`: each key whose record is `ignored`, and `prefix.*` for each of `sections`."""
  return {**view(records, "ignored"), **{f"{prefix}.*": why for prefix, why in sections.items()}}


IGNORED_KEYS = ignored_table(KEYS, IGNORED_SECTIONS)
# Keys only some trainer.v1.trainer_mode values read: in the other modes they change nothing (listed in the one
# warning).
_ASYNC = ("colocate_async", "separate_async")
MODE_KEYS = {
    "trainer.v1.colocate_async.num_warmup_batches": ("colocate_async",),
    "trainer.v1.sampler.max_off_policy_threshold": _ASYNC,
    "trainer.v1.sampler.max_off_policy_strategy": _ASYNC,
    "trainer.v1.separate_async.num_warmup_batches": ("separate_async",),
    "trainer.v1.separate_async.parameter_sync_step": ("separate_async",),
    "actor_rollout_ref.rollout.nnodes": ("separate_async",),
    "actor_rollout_ref.rollout.n_gpus_per_node": ("separate_async",),
}
MAPPED_KEYS = view(KEYS, "mapped")
RLJAX_KEYS = view(KEYS, "added")
UNIMPLEMENTED_VALUES = view(KEYS, "default_only")
DEPRECATED_KEYS = view(KEYS, "deprecated")


# entries of vLLM's and SGLang's free-form engine arguments rljax reads (`rljax.config.mapping`), though their
# section is ignored
ENGINE_KV_CACHE_KEYS = ("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype",
                        "actor_rollout_ref.rollout.engine_kwargs.sglang.kv_cache_dtype")
# keys of ignored sections that rljax honours (`rljax.sharding.offload`)
OFFLOAD_KEYS = ("actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.ref.megatron.param_offload",
                "critic.megatron.param_offload", "critic.megatron.optimizer_offload",
                "reward_model.model.fsdp_config.param_offload", "reward_model.megatron.param_offload")


def ignored_reason(path: str, ignored: dict[str, str] = IGNORED_KEYS) -> str | None:
  """Why rljax accepts and ignores the key `path` (an entry of `ignored`, `prefix.*` ones included), or None.

  A key below an ignored one (an entry of an ignored free-form dictionary)
  is ignored with it.

  Args:
    path: a key of the tree `ignored` belongs to.
    ignored: the tree's `IGNORED_KEYS` (default: the RL tree's).
  """
  if path in ENGINE_KV_CACHE_KEYS + OFFLOAD_KEYS:
    return None
  for key, reason in ignored.items():
    below = key[:-1] if key.endswith(".*") else key + "."
    if path == key or path.startswith(below):
      return reason
  return None
