"""The models of an RL run: actor (with LoRA), reference, critic and reward model, with real or abstract weights.

The trainer loads weights (`load_actor`, `load_critic`, `load_reward_model`);
`rljax.compile` builds the same modules with abstract parameters
(`abstract_actor`, `abstract_critic`, `abstract_reward_model`):
ShapeDtypeStructs laid out by the same rules, from a config.json alone. Both
read their options here, so the graphs agree.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import models, sharding
from rljax.models import checkpoint, gguf_io, lora as lora_lib
from rljax.models.known import known_architecture
from rljax.rollout.factory import attention_kernel, dtype_of
from rljax.models import reward as reward_lib
from rljax.models.reward import RewardModel
from rljax.rl.critic import ValueModel
from rljax.rl.steps import SplitModel


def model_options(config: ConfigDict, mesh: Mesh, critic: bool = False) -> dict[str, Any]:
  """ModelConfig options of the actor (or the critic): dtypes, layers, remat, attention kernel, overrides, and
  whether a MiMo actor keeps its multi-token prediction layers (model.mtp.enable; a critic never does)."""
  arr = config.actor_rollout_ref
  node = config.critic.model if critic else arr.model
  fsdp = config.critic.model.fsdp_config if critic else arr.actor.fsdp_config
  return dict(dtype=dtype_of(fsdp.dtype), param_dtype=dtype_of(fsdp.model_dtype),
              override_config=arr.model.override_config.model_config.to_dict(), scan_layers=arr.model.scan_layers, remat=bool(node.enable_gradient_checkpointing),
              remat_policy=arr.model.remat_policy, attention_kernel=attention_kernel(arr.model.attention_kernel, mesh),
              offload_activations=bool(node.enable_activation_offload and node.enable_gradient_checkpointing),
              mtp=not critic and bool(arr.model.mtp.enable))


def lora_config(config: ConfigDict) -> lora_lib.LoRAConfig | None:
  model = config.actor_rollout_ref.model
  return lora_lib.LoRAConfig.from_model_config(model) if model.lora_rank > 0 else None


def load_actor(config: ConfigDict, mesh: Mesh, rules: Any, key: jax.Array) -> models.CausalLM:
  """The actor from `actor_rollout_ref.model.path`, placed on `mesh`, with LoRA adapters when configured (those of
  actor_rollout_ref.model.lora_adapter_path, where it is set)."""
  arr = config.actor_rollout_ref
  model = models.from_pretrained(arr.model.path, mesh=mesh, rules=rules, **model_options(config, mesh))
  lora = lora_config(config)
  if lora is not None:
    lora_lib.apply_lora(model, lora, jax.random.fold_in(key, 7), mesh, rules)
    if arr.model.lora_adapter_path:
      lora_lib.load_peft_weights(model, arr.model.lora_adapter_path)
  return model


def architecture(path: str, key: str = "actor_rollout_ref.model.path") -> dict[str, Any]:
  """The config.json dict of a model directory, GGUF file or alias, else of a known model name (`models.known`).

  Raises:
    ConfigError: naming `key`, when the path is none of these.
  """
  try:
    local = models.resolve_path(path)
  except FileNotFoundError:
    local = None
  if local is not None and local.endswith(".gguf"):
    return gguf_io.read_gguf(local)[0]
  if local is not None and os.path.exists(os.path.join(local, "config.json")):
    with open(os.path.join(local, "config.json")) as f:
      return json.load(f)
  known = known_architecture(path)
  if known is None:
    raise config_lib.ConfigError(key, path, "is not a model directory, GGUF file or known model name",
                                 "point it at a directory holding config.json (weights are not read)")
  return known


def abstract_actor(config: ConfigDict, mesh: Mesh, rules: Any) -> models.CausalLM:
  """The actor with abstract parameters (ShapeDtypeStructs with shardings), LoRA adapters included."""
  options = model_options(config, mesh)
  override = options.pop("override_config")
  cfg = models.from_hf_dict(architecture(config.actor_rollout_ref.model.path), override, **options)
  lora = lora_config(config)

  def build():
    model = models.CausalLM(cfg, nnx.Rngs(0))
    if lora is not None:
      lora_lib.apply_lora(model, lora, jax.random.key(7))
    return model

  return checkpoint.abstract_state(nnx.eval_shape(build), mesh, rules)


def reference(model: models.CausalLM, graphdef: nnx.GraphDef, actor_params: Any,
              lora: lora_lib.LoRAConfig | None) -> SplitModel:
  """The reference policy: a copy of the initial actor, or under LoRA the base model without adapters over the
  actor's own frozen arrays (only modules_to_save are copied). Abstract parameters stay abstract."""
  if lora is not None:
    return SplitModel(*lora_lib.reference_split(model))
  copy = lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jnp.copy(x)  # noqa: E731
  return SplitModel(graphdef, jax.tree.map(copy, actor_params))


def load_critic(config: ConfigDict, mesh: Mesh, rules: Any) -> ValueModel:
  """The critic: `critic.model.path`'s backbone with a fresh value head, placed on `mesh`."""
  backbone = models.from_pretrained(config.critic.model.path, mesh=mesh, rules=rules,
                                    **model_options(config, mesh, critic=True))
  value_model = ValueModel(backbone, nnx.Rngs(config.trainer.seed + 1))
  graphdef, params = nnx.split(value_model)
  return nnx.merge(graphdef, sharding.shard_like(params, sharding.param_shardings(params, mesh, rules)))


def abstract_critic(config: ConfigDict, mesh: Mesh, rules: Any) -> ValueModel:
  """The critic with abstract parameters."""
  options = model_options(config, mesh, critic=True)
  override = options.pop("override_config")
  cfg = models.from_hf_dict(architecture(config.critic.model.path, "critic.model.path"), override, **options)
  return checkpoint.abstract_state(nnx.eval_shape(lambda: ValueModel(models.CausalLM(cfg, nnx.Rngs(0)),
                                                                      nnx.Rngs(1))), mesh, rules)


def reward_model_dtype(config: ConfigDict) -> Any:
  """The reward model's parameter and compute dtype: the actor's parameter dtype."""
  return dtype_of(config.actor_rollout_ref.actor.fsdp_config.model_dtype)


def load_reward_model(config: ConfigDict, mesh: Mesh, rules: Any) -> RewardModel:
  """`reward_model.model.path`'s backbone and score head, placed on `mesh` by the rules."""
  model = reward_lib.load_reward_model(config.reward_model.model.path, dtype=reward_model_dtype(config), mesh=mesh,
                                   rules=rules)
  graphdef, params = nnx.split(model)
  return nnx.merge(graphdef, sharding.shard_like(params, sharding.param_shardings(params, mesh, rules)))


def abstract_reward_model(config: ConfigDict, mesh: Mesh, rules: Any) -> RewardModel:
  """The reward model with abstract parameters."""
  hf = architecture(config.reward_model.model.path, "reward_model.model.path")
  return checkpoint.abstract_state(nnx.eval_shape(lambda: reward_lib.reward_model_from_hf(hf, reward_model_dtype(config))),
                                   mesh, rules)
