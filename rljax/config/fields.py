"""Building blocks of a config tree: typed fields, verl's `${...}` links, dotted paths.

`null` and `any_value` declare fields whose default alone would not fix their
type; `follow` is verl's interpolation. rljax.sft and rljax.evaluation build
their trees with the same helpers.
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict, FieldReference


def null(kind: type) -> FieldReference:
  """A field that is None by default and holds values of `kind`."""
  return FieldReference(None, field_type=kind)


def any_value(value: Any) -> FieldReference:
  """A field that accepts any type (e.g. an int or the string 'auto')."""
  return FieldReference(value, field_type=object)


def follow(node: ConfigDict, key: str) -> FieldReference:
  """verl's `${...}`: follows `node.key` until the new field is set itself."""
  return node.get_ref(key).identity()


def older_rollout_is() -> dict[str, Any]:
  """verl's older rollout importance-sampling keys, which both algorithm and the actor carry."""
  return {"rollout_is": False, "rollout_is_threshold": null(float), "rollout_is_threshold_lower": null(float),
          "rollout_is_level": "token", "rollout_is_mode": "truncate", "rollout_is_veto_threshold": null(float)}


def get_node(config: ConfigDict, path: str) -> Any:
  """Returns the value or sub-tree at a dotted `path`."""
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def tokenizer_key(config: ConfigDict) -> str:
  """The key naming an RL run's tokenizer: data.tokenizer where set (older verl), else
  actor_rollout_ref.model.tokenizer_path where set (verl 0.9.1's model config loads it from there), else the
  actor's model path."""
  if config.data.get("tokenizer"):
    return "data.tokenizer"
  if config.actor_rollout_ref.model.get("tokenizer_path"):
    return "actor_rollout_ref.model.tokenizer_path"
  return "actor_rollout_ref.model.path"


OLD_FREEZE_ROUTER = "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router"
MCORE_OVERRIDES = "megatron.override_mcore_model_config"


def routers_frozen(config: ConfigDict, role: str = "actor_rollout_ref.actor") -> tuple[str, Any] | None:
  """(key, value) where `role` (actor_rollout_ref.actor or critic) asks for Megatron's freeze_moe_router, else None:
  verl 0.9.1's engine reads it from ROLE.megatron.override_mcore_model_config.moe_config (a free-form dict); older
  verl read the actor's from actor_rollout_ref.model.override_config.moe_config."""
  value = _free_form_get(get_node(config, f"{role}.{MCORE_OVERRIDES}"), "moe_config.freeze_moe_router")
  if value:
    return f"{role}.{MCORE_OVERRIDES}.moe_config.freeze_moe_router", value
  older = get_node(config, OLD_FREEZE_ROUTER) if role == "actor_rollout_ref.actor" else None
  return (OLD_FREEZE_ROUTER, older) if older else None


def _free_form_get(tree: Any, dotted: str) -> Any:
  """`tree`[a][b]... for `dotted` "a.b...", None where a step is missing (a free-form dict of verl's)."""
  for part in dotted.split("."):
    tree = tree.get(part) if hasattr(tree, "get") else None
    if tree is None:
      return None
  return tree
