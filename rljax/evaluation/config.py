"""The config trees of offline generation and evaluation, and their checks.

`get_generate_config()` holds verl's `generation.yaml` keys with verl's
defaults (`data.path`, `data.prompt_key`, `data.n_samples`,
`data.output_path`, `data.batch_size`, `model.path`, `rollout.*`,
`trainer.{nnodes, n_gpus_per_node}`), plus keys rljax adds.
`get_eval_config()` holds verl's `evaluation.yaml` keys (`data.{path,
prompt_key, response_key, data_source_key, reward_model_key}`,
`custom_reward_function.{path, name}`) plus keys rljax adds. Both trees are
locked: overrides go through `rljax.config.apply_overrides`, so an unknown
key names the closest valid one, and `validate_*` raise
`rljax.config.ConfigError` naming the key, the value and the fix.

`rljax.evaluation.keys` describes every key of both trees with the RL tree's
`Key` records: the keys rljax adds, and those it accepts so a verl launch
line pastes over and ignores (`GENERATE_IGNORED_KEYS`, `EVAL_IGNORED_KEYS`).
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax.config import any_value, check, is_int, is_number, null

DEFAULT_PREFILL_BUCKETS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def _locked(tree: dict[str, Any]) -> ConfigDict:
  config = ConfigDict(tree)
  config.lock()
  return config


def get_generate_config() -> ConfigDict:
  """verl's generation.yaml tree with its defaults (plus rljax's keys), locked."""
  return _locked({
      "trainer": {"nnodes": any_value(1), "n_gpus_per_node": any_value(8), "seed": 1},
      "data": {
          "path": "~/data/rlhf/math/test.parquet",
          "prompt_key": "prompt",
          "n_samples": 5,
          "output_path": null(str),
          "batch_size": 128,
          "truncation": "error",
          "tokenizer": null(str),
          "image_key": "images",
          "image_patch_size": 14,
      },
      "model": {"path": "~/models/Qwen2-7B-Instruct", "external_lib": null(str), "checkpoint": null(str)},
      "rollout": {
          "name": "vllm",
          "mode": "sync",
          "temperature": 1.0,
          "top_k": 50,
          "top_p": 0.7,
          "prompt_length": 1536,
          "response_length": 512,
          "dtype": "bfloat16",
          "gpu_memory_utilization": 0.5,
          "ignore_eos": False,
          "enforce_eager": True,
          "free_cache_engine": True,
          "load_format": "dummy_dtensor",
          "tensor_model_parallel_size": 1,
          "max_num_batched_tokens": 8192,
          "max_model_len": null(int),
          "max_num_seqs": 1024,
          "log_prob_micro_batch_size": null(int),
          "log_prob_micro_batch_size_per_gpu": 8,
          "use_fire_sampling": False,
          "do_sample": True,
          "disable_log_stats": True,
          "enable_chunked_prefill": True,
          "n": 1,
          "prefill_length_buckets": list(DEFAULT_PREFILL_BUCKETS),
          "cpu_dot_library": "auto",
          "kv_cache_dtype": "auto",
          "quantization": None,
          "attention_kernel": "auto",
      },
      "actor": {"strategy": "fsdp", "ulysses_sequence_parallel_size": 1, "fsdp_config": {"fsdp_size": -1}},
      "ray_init": {"num_cpus": null(int), "timeline_json_file": null(str)},
  })


def get_eval_config() -> ConfigDict:
  """verl's evaluation.yaml tree with its defaults (plus rljax's keys), locked.

  `custom_reward_function.reward_kwargs` stays open (any key may be added).
  """
  config = _locked({
      "data": {
          "path": "/tmp/math_Qwen2-7B-Instruct.parquet",
          "prompt_key": "prompt",
          "response_key": "responses",
          "data_source_key": "data_source",
          "reward_model_key": "reward_model",
          "output_path": null(str),
      },
      "custom_reward_function": {"path": null(str), "name": "compute_score", "reward_kwargs": {}},
      "eval": {"pass_threshold": 1.0},
      "ray_init": {"num_cpus": null(int)},
  })
  config.custom_reward_function.reward_kwargs.unlock()
  return config


def _check_positive_int(config: ConfigDict, key: str, example: int) -> None:
  value = config_lib.get_node(config, key)
  check(is_int(value) and value > 0, key, value, "must be a positive integer", f"set {key}={example}")


def _check_text(config: ConfigDict, key: str, example: str) -> None:
  value = config_lib.get_node(config, key)
  check(isinstance(value, str) and bool(value.strip()), key, value, "must be a non-empty string",
        f"set {key}={example}")


def greedy(rollout: ConfigDict) -> bool:
  """verl's rule: do_sample=False or temperature=0 decodes greedily."""
  return (not rollout.do_sample) or rollout.temperature == 0


def _check_generate_sampling(config: ConfigDict) -> None:
  rollout = config.rollout
  temperature, top_p, top_k = rollout.temperature, rollout.top_p, rollout.top_k
  check(is_number(temperature) and temperature >= 0, "rollout.temperature", temperature, "must be >= 0",
        "set rollout.temperature=1.0")
  check(is_number(top_p) and 0 < top_p <= 1, "rollout.top_p", top_p, "must be in (0, 1]",
        "set rollout.top_p=1.0 to disable")
  check(is_int(top_k) and top_k >= -1, "rollout.top_k", top_k, "must be -1 or 0 (off) or a positive integer",
        "set rollout.top_k=-1 to disable")
  check(rollout.n == 1, "rollout.n", rollout.n, "generation draws data.n_samples responses per prompt",
        f"set rollout.n=1 and data.n_samples={rollout.n * config.data.n_samples}")
  check(not (greedy(rollout) and config.data.n_samples > 1), "data.n_samples", config.data.n_samples,
        "greedy decoding (rollout.do_sample=false or rollout.temperature=0) gives n identical responses",
        "set data.n_samples=1, or rollout.do_sample=true with rollout.temperature > 0")


def _check_generate_lengths(config: ConfigDict) -> None:
  for key, example in (("rollout.prompt_length", 512), ("rollout.response_length", 512),
                       ("rollout.max_num_seqs", 256), ("rollout.tensor_model_parallel_size", 1)):
    _check_positive_int(config, key, example)
  key = "rollout.prefill_length_buckets"
  buckets = list(config.rollout.prefill_length_buckets)
  check(bool(buckets) and all(is_int(b) and b > 0 for b in buckets) and buckets == sorted(set(buckets)),
        key, buckets, "must be a non-empty increasing list of positive lengths", f"e.g. {key}=[64,128,256,512]")
  library = config.rollout.cpu_dot_library
  check(library in config_lib.CPU_DOT_LIBRARIES, "rollout.cpu_dot_library", library,
        f"must be one of {', '.join(config_lib.CPU_DOT_LIBRARIES)}", "set rollout.cpu_dot_library=auto")
  from rljax.models import kv_quant  # pylint: disable=import-outside-toplevel
  check(config.rollout.kv_cache_dtype in kv_quant.KV_CACHE_DTYPES, "rollout.kv_cache_dtype",
        config.rollout.kv_cache_dtype, f"must be one of {', '.join(kv_quant.KV_CACHE_DTYPES)}",
        "set rollout.kv_cache_dtype=auto (the rollout dtype) or int8")
  from rljax.models import weight_quant  # pylint: disable=import-outside-toplevel
  quantization = config.rollout.quantization
  check(quantization is None or quantization in weight_quant.QUANTIZATIONS, "rollout.quantization", quantization,
        f"must be null or one of {', '.join(weight_quant.QUANTIZATIONS)}",
        "set rollout.quantization=int8 or fp8, or leave it out (the rollout dtype)")
  from rljax.models import attention  # pylint: disable=import-outside-toplevel
  kernels = ("auto",) + attention.KERNELS
  check(config.rollout.attention_kernel in kernels, "rollout.attention_kernel", config.rollout.attention_kernel,
        f"must be one of {', '.join(kernels)}", "set rollout.attention_kernel=auto")


def validate_generate(config: ConfigDict) -> ConfigDict:
  """Checks a generation config before any work starts.

  Returns:
    The config, unchanged.

  Raises:
    ConfigError: naming the first bad key, its value and the fix.
  """
  _check_text(config, "data.path", "~/data/gsm8k/test.parquet")
  _check_text(config, "data.prompt_key", "prompt")
  _check_positive_int(config, "data.n_samples", 5)
  _check_positive_int(config, "data.batch_size", 128)
  check(config.data.truncation in config_lib.TRUNCATIONS, "data.truncation", config.data.truncation,
        "is not a truncation mode", f"choose one of {', '.join(config_lib.TRUNCATIONS)}")
  check(bool(config.model.path) or bool(config.model.checkpoint), "model.path", config.model.path,
        "no model to generate with", "set model.path=DIR (or an alias) or model.checkpoint=RUN_DIR")
  if not config.model.checkpoint:
    config_lib.check_model_path("model.path", config.model.path, vision_language=True)
  _check_text(config, "data.image_key", "images")
  _check_positive_int(config, "data.image_patch_size", 14)
  _check_generate_sampling(config)
  _check_generate_lengths(config)
  return config


def validate_eval(config: ConfigDict) -> ConfigDict:
  """Checks an evaluation config before any file is read.

  Returns:
    The config, unchanged.

  Raises:
    ConfigError: naming the first bad key, its value and the fix.
  """
  _check_text(config, "data.path", "~/data/gsm8k/test-output.parquet")
  for key, example in (("data.response_key", "responses"), ("data.data_source_key", "data_source"),
                       ("data.reward_model_key", "reward_model")):
    _check_text(config, key, example)
  reward = config.custom_reward_function
  if reward.path:
    _check_text(config, "custom_reward_function.name", "compute_score")
  threshold = config.eval.pass_threshold
  check(is_number(threshold), "eval.pass_threshold", threshold, "must be a number", "set eval.pass_threshold=1.0")
  return config
