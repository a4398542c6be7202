"""LoRA's keys on a model node (verl's and cosmos-rl's) with their defaults.

Shared by the RL tree (`actor_rollout_ref.model`) and rljax.sft's `model`.
Their checks belong to the code that applies them (`rljax.models.lora.check_lora_keys`).
"""

from __future__ import annotations

from typing import Any

from rljax.config.fields import any_value, null


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
