"""Supervised fine-tuning (verl's `fsdp_sft_trainer` with `sft_trainer.yaml` keys).

    python -m rljax.sft --config=configs/sft.py[:PRESET] [KEY=VALUE ...]

Presets:

* `smollm2_arithmetic` (default): SmolLM2-135M-Instruct (the offline
  `smollm2-135m-instruct` alias) on the synthetic arithmetic task's word
  problems (levels 1-2: one-digit sums and differences told as short
  stories), generated on first use under `~/data/rljax/arithmetic_word/`.
  The chat prompt is the RL prompt; the response is the worked solution
  `extra_info.solution` ("6 + 9 = 15"), so the model learns to write the
  sum the story tells and then its value. Sized for a 2-core CPU (a few
  minutes): 16 steps of 8 examples at lr 5e-5. The base model mostly
  retells the story and its greedy task reward on these prompts is low;
  `benchmarks/sft_reward.py` measures val loss and greedy reward before and
  after this run.
* `smollm2_calculator`: SmolLM2-135M-Instruct warm-started for multi-turn
  tool use on the synthetic calculator task (`rljax.data.synthetic.
  calculator`, written on first use under `~/data/rljax/calculator/`):
  multi-turn rows (`data.multiturn.enable`), each a system message
  describing the calculator and its hermes call format, the question, the
  assistant's `<tool_call>`, the tool's result and the assistant's answer;
  only the two assistant turns are trained on. Conversations are 200-225
  tokens (max_length 256). Sized for a 2-core CPU (about 5 minutes): 12
  steps of 8 examples at lr 1e-4 (the train loss is under 0.01 by step 6:
  the call copies the question's expression, the answer the tool's result). Export the result to a Hugging Face directory with
  `python -m rljax.export --checkpoint checkpoints/rljax/sft_smollm2_calculator --out DIR`.
* `qwen2_5_0_5b_gsm8k`: verl's GSM8K SFT example (question -> worked
  answer from `extra_info`) on Qwen2.5-0.5B-Instruct, packed, for a TPU VM.
"""

from typing import Any

from rljax import config as config_lib
from rljax.data.synthetic import arithmetic
from rljax.data.synthetic import calculator
from rljax.sft.config import get_sft_config

SMOLLM2_ARITHMETIC: dict[str, Any] = {
    "model.partial_pretrain": "smollm2-135m-instruct",
    "data.train_files": f"{arithmetic.WORD_LOCAL_DIR}/train.parquet",
    "data.val_files": f"{arithmetic.WORD_LOCAL_DIR}/test.parquet",
    "data.prompt_key": "prompt",
    "data.response_key": "extra_info",
    "data.response_dict_keys": ["solution"],
    "data.max_length": 80,
    "data.train_batch_size": 8,
    "data.micro_batch_size_per_gpu": None,  # the whole per-device batch, any device count
    "data.val_max_samples": 64,
    "optim.lr": 5e-5,
    "trainer.n_gpus_per_node": "auto",
    "trainer.total_epochs": 1,
    "trainer.total_training_steps": 16,
    "trainer.project_name": "rljax",
    "trainer.experiment_name": "sft_smollm2_arithmetic",
    "trainer.logger": ["console", "jsonl"],
    "trainer.test_freq": 8,
    "trainer.save_freq": -1,
}

SMOLLM2_CALCULATOR: dict[str, Any] = {
    **SMOLLM2_ARITHMETIC,
    "data.train_files": f"{calculator.DEFAULT_LOCAL_DIR}/sft_train.parquet",
    "data.val_files": f"{calculator.DEFAULT_LOCAL_DIR}/sft_test.parquet",
    "data.prompt_key": "prompt",
    "data.response_key": "extra_info",
    "data.response_dict_keys": None,
    "data.multiturn.enable": True,
    "data.multiturn.messages_key": "messages",
    "data.max_length": 256,
    "data.val_max_samples": 32,
    "optim.lr": 1e-4,
    "trainer.total_training_steps": 12,
    "trainer.test_freq": 6,
    "trainer.experiment_name": "sft_smollm2_calculator",
}

QWEN2_5_0_5B_GSM8K: dict[str, Any] = {
    "model.partial_pretrain": "~/models/Qwen2.5-0.5B-Instruct",
    "model.enable_gradient_checkpointing": True,
    "data.train_files": "~/data/gsm8k/train.parquet",
    "data.val_files": "~/data/gsm8k/test.parquet",
    "data.prompt_key": "extra_info",
    "data.prompt_dict_keys": ["question"],
    "data.response_key": "extra_info",
    "data.response_dict_keys": ["answer"],
    "data.max_length": 1024,
    "data.micro_batch_size_per_gpu": 4,
    "use_remove_padding": True,
    "optim.lr": 1e-5,
    "trainer.nnodes": "auto",
    "trainer.n_gpus_per_node": "auto",
    "trainer.device": "tpu",
    "trainer.total_epochs": 1,
    "trainer.project_name": "rljax_gsm8k_sft",
    "trainer.experiment_name": "qwen2_5_0_5b",
    "trainer.logger": ["console", "tensorboard"],
    "trainer.test_freq": 20,
    "trainer.save_freq": 100,
}

PRESETS = {"smollm2_arithmetic": SMOLLM2_ARITHMETIC, "smollm2_calculator": SMOLLM2_CALCULATOR,
           "qwen2_5_0_5b_gsm8k": QWEN2_5_0_5B_GSM8K}
DEFAULT_PRESET = "smollm2_arithmetic"


def get_config(arg=None):
  name = arg or DEFAULT_PRESET
  if name not in PRESETS:
    raise config_lib.ConfigError("--config", f":{name}", "unknown preset",
                                 f"choose one of {', '.join(sorted(PRESETS))}")
  config = get_sft_config()
  for path, value in PRESETS[name].items():
    config_lib.set_value(config, path, value)
  return config
