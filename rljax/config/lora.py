"""LoRA's keys on a model node (verl's and cosmos-rl's): their defaults and their checks.

Shared by the RL tree (`actor_rollout_ref.model`) and rljax.sft's `model`.
They live in the config package, not in `rljax.models.lora`: that module
imports the config, and applies what is checked here.
"""

from __future__ import annotations

import re
from typing import Any

from ml_collections import ConfigDict

from rljax.config.checks import check, is_int, is_number
from rljax.config.errors import ConfigError
from rljax.config.fields import any_value, null

# The names LoRA's target_modules and modules_to_save take (HF module names;
# rljax.models.lora maps them onto rljax's layers, and a test keeps them equal).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SAVABLE_MODULES = LORA_TARGET_MODULES + (
    "embed_tokens", "lm_head", "norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm",
    "pre_feedforward_layernorm", "post_feedforward_layernorm")


def lora_targets(value: Any, key: str = "actor_rollout_ref.model.target_modules") -> tuple[str, ...]:
  """target_modules as HF projection names: 'all-linear', a list, or a comma-separated string."""
  if value == "all-linear":
    return LORA_TARGET_MODULES
  names = [n.strip() for n in value.split(",")] if isinstance(value, str) else value
  ok = isinstance(names, (list, tuple)) and bool(names) and all(isinstance(n, str) for n in names)
  check(ok, key, value, "must be all-linear or a non-empty list of module names", f"e.g. {key}=[q_proj,v_proj]")
  unknown = [n for n in names if n not in LORA_TARGET_MODULES]
  check(not unknown, key, value, f"unknown module(s) {unknown}; LoRA targets are {', '.join(LORA_TARGET_MODULES)}",
        f"set {key}=all-linear or choose from those names")
  return tuple(dict.fromkeys(names))


def _check_patterns(values: Any, key: str, value_ok, kind: str) -> None:
  values = values.to_dict() if isinstance(values, ConfigDict) else values
  check(isinstance(values, dict), key, values, "must be a mapping {regex: value}",
        f"e.g. {key}={{'q_proj': 16}} (quote regex keys: {{'layers\\.0\\..*': 16}})")
  for pattern, value in values.items():
    try:
      re.compile(pattern)
    except (re.error, TypeError) as e:
      raise ConfigError(key, values, f"key {pattern!r} is not a regular expression ({e})",
                        "write a Python regex matched against names like model.layers.0.self_attn.q_proj") from e
    check(value_ok(value), key, values, f"value {value!r} of {pattern!r} must be {kind}", f"give each pattern {kind}")


def lora_defaults() -> dict[str, Any]:
  """verl's LoRA keys and cosmos-rl's extras with their defaults (a model node's; LoRA off)."""
  return {
      "lora_rank": 0,
      "lora_alpha": 16,
      "target_modules": any_value("all-linear"),
      "lora_dropout": 0.0,
      "use_rslora": False,
      "modules_to_save": null(list),
      "alpha_pattern": any_value({}),
      "r_pattern": any_value({}),
      "init_lora_weights": any_value(True),
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
  check(is_int(rank) and rank >= 0, key("lora_rank"), rank, "must be an integer >= 0 (0 = full fine-tuning)",
        f"set {key('lora_rank')}=8, or 0 to train every parameter")
  check(is_number(alpha) and alpha > 0, key("lora_alpha"), alpha, "must be a positive number",
        f"set {key('lora_alpha')}=16")
  check(is_number(dropout) and 0.0 <= dropout < 1.0, key("lora_dropout"), dropout, "must lie in [0, 1)",
         f"set {key('lora_dropout')}=0.0")
  check(isinstance(values["use_rslora"], bool), key("use_rslora"), values["use_rslora"], "must be true or false",
        f"set {key('use_rslora')}=false")
  lora_targets(values["target_modules"], key("target_modules"))
  saved = values["modules_to_save"]
  ok = saved is None or (isinstance(saved, (list, tuple)) and all(isinstance(n, str) for n in saved))
  check(ok, key("modules_to_save"), saved, "must be null or a list of module names",
        f"e.g. {key('modules_to_save')}=[lm_head]")
  unknown = [n for n in saved or () if n.rsplit(".", 1)[-1] not in LORA_SAVABLE_MODULES]
  check(not unknown, key("modules_to_save"), saved,
        f"unknown module(s) {unknown}; names end in one of {', '.join(LORA_SAVABLE_MODULES)}",
        "list HF module names such as lm_head, embed_tokens or model.layers.0.input_layernorm")
  _check_patterns(values["alpha_pattern"], key("alpha_pattern"), lambda v: is_number(v) and v > 0, "a positive number")
  _check_patterns(values["r_pattern"], key("r_pattern"), lambda v: is_int(v) and v > 0, "a positive integer")
  init = values["init_lora_weights"]
  check(init is True or init == "gaussian", key("init_lora_weights"), init, "must be true (B=0) or gaussian",
        f"set {key('init_lora_weights')}=true")
