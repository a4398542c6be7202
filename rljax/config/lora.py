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


# verl's Megatron LoRA (`model.lora`, read by its Megatron engine through Megatron-Bridge): type -> {Megatron
# module name -> the HF projections it adapts}. "lora" adapts Megatron's fused linears, so the projections of one
# fused module share one A (x @ A feeds every slice of B); "canonical_lora" gives each projection its own adapter.
MEGATRON_LORA_TARGETS = {
    "lora": {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
             "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)},
    "canonical_lora": {"linear_q": ("q_proj",), "linear_k": ("k_proj",), "linear_v": ("v_proj",),
                       "linear_proj": ("o_proj",), "linear_fc1_gate": ("gate_proj",), "linear_fc1_up": ("up_proj",),
                       "linear_fc2": ("down_proj",)},
}
# Megatron-Bridge's initialisations of A (lora_A_init_method): xavier normal, normal with std 0.2, kaiming uniform
# with a = sqrt(5) (PEFT's default, the bound 1 / sqrt(fan_in)).
MEGATRON_A_INITS = ("xavier", "normal", "kaiming")


def megatron_shared_a(lora_type: str, megatron_targets: Any) -> tuple[tuple[str, ...], ...]:
  """The HF projections that share one A under Megatron LoRA `lora_type` with `megatron_targets`: those of each
  fused module targeted with more than one projection."""
  table = MEGATRON_LORA_TARGETS.get(lora_type, {})
  return tuple(table[name] for name in megatron_targets if len(table.get(name, ())) > 1)
