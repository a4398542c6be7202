"""LoRA adapters on rljax's causal LMs (Flax NNX), from verl's and cosmos-rl's keys.

A targeted projection keeps its frozen kernel W [*in, *out] (q [D, H, hd],
o [H, hd, D], gate [D, F], ...) and gains an adapter::

    y = x @ W + scale * (dropout(x) @ A) @ B,    A [*in, r], B [r, *out]

with scale = alpha / r, or alpha / sqrt(r) with use_rslora. Training and
rollout never form W + scale * A @ B; `merge_lora` forms it once, for export.

Names. target_modules, r_pattern, alpha_pattern and modules_to_save use
Hugging Face module names, as PEFT does: q_proj, k_proj, v_proj, o_proj of
`model.layers.{i}.self_attn` and gate_proj, up_proj, down_proj of
`model.layers.{i}.mlp` (rljax's attn.q ... mlp.down); "all-linear" is those
seven (never lm_head). A pattern key is a regex that matches a module when
it matches the whole name or a dotted suffix of it (`q_proj` matches every
layer's q_proj, `layers\\.0\\..*` every module of layer 0); the first key in
insertion order wins. A modules_to_save entry selects every module whose
name ends with it, PEFT's rule (`norm` selects every norm, `lm_head` the
output layer). With scan_layers (one stacked adapter per projection)
r_pattern must give a projection the same rank in every layer; alpha may
differ per layer.

State. A and B are `LoRAParam`s (an nnx.Param subclass) with logical axis
names: A takes the kernel's input axis names then `lora_rank`, B
`lora_rank` then the kernel's output names (`layers` first when stacked),
so adapters shard on the mesh like their base weights (`lora_rank` itself
is replicated). Base parameters named in modules_to_save become
`TrainedParam`s. The scale (`LoRAScale`) and the dropout seed
(`LoRADropoutKey`) are constants. `trainable_filter(model)` selects what an
optimizer holds; `split_trainable` gives (graphdef, trainable, frozen).

Reference policy. `reference_split(model)` is the base model without
adapters over the model's own frozen arrays (no copy), except the
modules_to_save parameters, copied before they train: the reference keeps
their original values (PEFT's `original_module`).

Dropout. lora_dropout drops adapter inputs only in training mode
(`model.train()`; modules start in eval mode), with masks drawn from each
adapter's LoRADropoutKey; `seed_dropout(state, key)` sets them all from one
key, so a key gives the same masks on every run.

Export. `merge_lora` gives a plain CausalLM (`save_pretrained` writes it);
`save_peft` writes PEFT's adapter directory (adapter_config.json and
adapter_model.safetensors, `...q_proj.lora_A.weight` [r, in],
`...lora_B.weight` [out, r]).

The RL trainer applies LoRA to the actor only; the critic trains in full.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from rljax.config.errors import ConfigError, check, is_int, is_number
from rljax.models import checkpoint, moe, safetensors_io
from rljax.models.config import TOWER_FAMILY, ModelConfig
from rljax.models.transformer import CausalLM
from rljax.sharding.rules import Rules, logical_to_spec, param_names

RANK_AXIS = "lora_rank"
PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# HF projection name -> (rljax sub-module, kernel attribute, number of the kernel's input axes).
PROJECTIONS: dict[str, tuple[str, str, int]] = {
    "q_proj": ("attn", "q", 1),
    "k_proj": ("attn", "k", 1),
    "v_proj": ("attn", "v", 1),
    "o_proj": ("attn", "o", 2),
    "gate_proj": ("mlp", "gate", 1),
    "up_proj": ("mlp", "up", 1),
    "down_proj": ("mlp", "down", 1),
}
# The names LoRA's target_modules and modules_to_save take (HF module names).
LORA_TARGET_MODULES = tuple(PROJECTIONS)
LORA_SAVABLE_MODULES = LORA_TARGET_MODULES + (
    "embed_tokens", "lm_head", "norm", "input_layernorm", "post_attention_layernorm", "q_norm", "k_norm",
    "pre_feedforward_layernorm", "post_feedforward_layernorm")


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


_HF_PARENT = {"attn": "self_attn", "mlp": "mlp"}
_BY_KERNEL = {(parent, attr): proj for proj, (parent, attr, _) in PROJECTIONS.items()}


class LoRAParam(nnx.Param):
  """An adapter matrix, A [*in, r] or B [r, *out]: trained."""


class TrainedParam(nnx.Param):
  """A base parameter named in modules_to_save: trained in full beside the adapters."""


class LoRAScale(nnx.Variable):
  """An adapter's alpha / r (or alpha / sqrt(r)), float32 [] or [layers]: a constant."""


class LoRADropoutKey(nnx.Variable):
  """Raw PRNG key data seeding an adapter's dropout mask, [k] or [layers, k]."""


TRAINABLE = nnx.Any(LoRAParam, TrainedParam)


# ----- the keys -----------------------------------------------------------------------


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


def _plain(value: Any) -> Any:
  """A config value as plain Python (a list for a list-like)."""
  return list(value) if isinstance(value, (list, tuple)) else value


def _check_exclusions(value: Any, key: str) -> None:
  """exclude_modules: null, a regex (matched against whole HF module names) or a list of module names."""
  if value is None or value == []:
    return
  if isinstance(value, str):
    try:
      re.compile(value)
    except re.error as error:
      raise ConfigError(key, value, f"is not a regex ({error})", "write a Python regex matched against whole "
                        "names like model.layers.0.self_attn.q_proj") from None
    return
  check(isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value), key, value,
        "must be null, a regex or a list of module names", f"e.g. {key}=[o_proj]")


def _spellings(name: str) -> set[str]:
  """A module's names a user's pattern may be written against: rljax's (the released checkpoints') and
  transformers 5's, which nests a vision-language model's language model (`checkpoint.nested_name`)."""
  return {name, checkpoint.nested_name(name)}


def _excluded_as(config: "LoRAConfig", name: str) -> bool:
  """PEFT's rule for the one spelling `name`: a regex matches the whole name; a list names it, or ends it after a
  dot."""
  exclude = config.exclude_modules
  if not exclude:
    return False
  if isinstance(exclude, str):
    return re.fullmatch(exclude, name) is not None
  return name in exclude or any(name.endswith(f".{entry}") for entry in exclude)


def excluded(config: "LoRAConfig", name: str) -> bool:
  """Whether exclude_modules keeps HF module `name` out of LoRA (PEFT's rule, under either spelling)."""
  return any(_excluded_as(config, n) for n in _spellings(name))


# one of each kind of linear module in each tower family's tower (the names PEFT sees in transformers 5)
TOWER_MODULES = {
    "qwen2_5_vl": ("model.visual.blocks.0.attn.qkv", "model.visual.blocks.0.attn.proj",
                   "model.visual.blocks.0.mlp.gate_proj", "model.visual.blocks.0.mlp.up_proj",
                   "model.visual.blocks.0.mlp.down_proj", "model.visual.merger.mlp.0", "model.visual.merger.mlp.2"),
    "qwen3_vl": ("model.visual.blocks.0.attn.qkv", "model.visual.blocks.0.attn.proj",
                 "model.visual.blocks.0.mlp.linear_fc1", "model.visual.blocks.0.mlp.linear_fc2",
                 "model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2",
                 "model.visual.deepstack_merger_list.0.linear_fc1", "model.visual.deepstack_merger_list.0.linear_fc2"),
}


def tower_modules_adapted(config: "LoRAConfig", model_type: str) -> list[str]:
  """The ``model_type`` tower's modules PEFT would give adapters under `config` (target_modules 'all-linear', or
  names that end a module's name) that exclude_modules does not keep out; rljax adapts the language model's layers
  only, so a vision-language run needs this empty."""
  names = config.targets if config.target_modules != "all-linear" else None
  targeted = lambda module: names is None or module.rsplit(".", 1)[-1] in names  # noqa: E731
  return [m for m in TOWER_MODULES[TOWER_FAMILY[model_type]] if targeted(m) and not _excluded_as(config, m)]


def check_tower_left_out(config: "LoRAConfig", model_type: str, why: str) -> None:
  """Raises a ConfigError naming `{key_prefix}.exclude_modules` when `config`'s adapters would reach a
  vision-language model's tower (`tower_modules_adapted`); `why` says which model it is."""
  adapted = tower_modules_adapted(config, model_type)
  check(not adapted, f"{config.key_prefix}.exclude_modules", config.exclude_modules,
        why + f"target_modules reach its vision tower ({', '.join(adapted)}, ...), and rljax's adapters are on the "
        "language model's layers only", f"set {config.key_prefix}.exclude_modules='.*visual.*' (verl's "
        "vision-language LoRA lines): the tower then stays frozen")


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


def check_lora_keys(values: Any, prefix: str = "actor_rollout_ref.model") -> None:
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
  _check_exclusions(values.get("exclude_modules"), key("exclude_modules"))
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


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """verl's lora_rank / lora_alpha / target_modules and cosmos-rl's LoRA extras.

  Attributes:
    rank: r of every adapter without an r_pattern match (> 0 here).
    alpha: alpha of every adapter without an alpha_pattern match.
    target_modules: "all-linear", a list of projection names, or a comma string.
    dropout: probability of dropping an adapter input in training mode.
    use_rslora: scale alpha / sqrt(r) instead of alpha / r.
    modules_to_save: base modules trained in full (HF names, e.g. lm_head).
    alpha_pattern, r_pattern: {regex: value} overrides per HF module name.
    init_lora_weights: True (A uniform +-1/sqrt(in), B = 0) or "gaussian"
      (A normal with std 1/r, B = 0).
    key_prefix: where these keys live in the run config, for error messages.
    shared_a: groups of HF projections whose adapters share one A in each layer (Megatron's fused linear_qkv and
      linear_fc1 under verl's `model.lora.type=lora`): A's gradient is the sum of theirs.
    a_init: Megatron-Bridge's lora_A_init_method (xavier, normal, kaiming) in place of init_lora_weights.
    megatron: from verl's Megatron LoRA block (`model.lora`), whose keys the errors then name.
  """

  rank: int
  alpha: float = 16.0
  target_modules: Any = "all-linear"
  dropout: float = 0.0
  use_rslora: bool = False
  modules_to_save: tuple[str, ...] = ()
  alpha_pattern: Mapping[str, float] = dataclasses.field(default_factory=dict)
  r_pattern: Mapping[str, int] = dataclasses.field(default_factory=dict)
  init_lora_weights: bool | str = True
  exclude_modules: Any = None
  key_prefix: str = "actor_rollout_ref.model"
  shared_a: tuple[tuple[str, ...], ...] = ()
  a_init: str | None = None
  megatron: bool = False

  def __post_init__(self):
    check_lora_keys(self.as_keys(), self.key_prefix)
    if self.rank == 0:
      raise ConfigError(f"{self.key_prefix}.lora_rank", 0,
                                   "LoRA needs a rank > 0 (0 means full fine-tuning)",
                                   f"set {self.key_prefix}.lora_rank=8, or do not apply LoRA")

  @classmethod
  def from_model_config(cls, node: Any, key_prefix: str = "actor_rollout_ref.model") -> "LoRAConfig":
    """From a config node holding verl's names (lora_rank, lora_alpha, target_modules, ...)."""
    as_dict = lambda v: dict(v.to_dict() if hasattr(v, "to_dict") else v)  # noqa: E731
    target = node.target_modules
    block = node.get("lora")
    megatron = block is not None and is_int(block.rank) and block.rank > 0
    return cls(
        rank=node.lora_rank, alpha=node.lora_alpha,
        target_modules=tuple(target) if isinstance(target, (list, tuple)) else target,
        dropout=node.lora_dropout, use_rslora=node.use_rslora,
        modules_to_save=tuple(node.modules_to_save or ()),
        alpha_pattern=as_dict(node.alpha_pattern), r_pattern=as_dict(node.r_pattern),
        init_lora_weights=node.init_lora_weights, exclude_modules=_plain(node.get("exclude_modules")),
        key_prefix=key_prefix,
        shared_a=megatron_shared_a(block.type, list(block.target_modules)) if megatron else (),
        a_init=block.lora_A_init_method if megatron else None, megatron=megatron)

  def as_keys(self) -> dict[str, Any]:
    """The values under verl's key names."""
    return {"lora_rank": self.rank, "lora_alpha": self.alpha, "target_modules": self.target_modules,
            "lora_dropout": self.dropout, "use_rslora": self.use_rslora,
            "modules_to_save": list(self.modules_to_save), "alpha_pattern": dict(self.alpha_pattern),
            "r_pattern": dict(self.r_pattern), "init_lora_weights": self.init_lora_weights,
            "exclude_modules": self.exclude_modules}

  @property
  def targets(self) -> tuple[str, ...]:
    """The targeted HF projection names."""
    return lora_targets(self.target_modules, f"{self.key_prefix}.target_modules")


# ----- the adapter ---------------------------------------------------------------------


def lora_scale(rank: int, alpha: float, use_rslora: bool) -> float:
  """alpha / r, or alpha / sqrt(r) (rank-stabilised LoRA)."""
  return alpha / math.sqrt(rank) if use_rslora else alpha / rank


def pattern_value(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
  """The value of the first pattern (insertion order) matching module `name`, else `default`.

  A pattern matches when it matches the whole name or a dotted suffix of it, under either spelling
  (`_spellings`).
  """
  for pattern, value in patterns.items():
    if any(re.fullmatch(rf"(?:.*\.)?(?:{pattern})", n) for n in _spellings(name)):
      return value
  return default


def names_module(entry: str, name: str) -> bool:
  """Whether a modules_to_save `entry` selects module `name`: the name ends with it (PEFT's rule)."""
  return name.endswith(entry)


def init_a(key: jax.Array, shape: tuple[int, ...], fan_in: int, rank: int, how: bool | str) -> jax.Array:
  """A [..., *in, r] in float32.

  True or "kaiming": uniform in +-1/sqrt(fan_in) (PEFT's and Megatron-Bridge's kaiming-uniform with a=sqrt(5)).
  "gaussian": normal with std 1/r.
  "xavier": normal with std sqrt(2 / (fan_in + r)) (Megatron-Bridge's default, torch's xavier_normal_).
  "normal": normal with std 0.2 (Megatron-Bridge's).
  """
  if how == "gaussian":
    return jax.random.normal(key, shape, jnp.float32) / rank
  if how == "xavier":
    return jax.random.normal(key, shape, jnp.float32) * math.sqrt(2.0 / (fan_in + rank))
  if how == "normal":
    return jax.random.normal(key, shape, jnp.float32) * 0.2
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def dropout(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
  """x with each element zeroed with probability `rate`, the others scaled by 1 / (1 - rate)."""
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


class LoRA(nnx.Module):
  """One projection's adapter: scale * (dropout(x) @ A) @ B.

  Stacked for lax.scan, every variable has a leading `layers` axis and the
  call runs on one layer's slice.
  """

  def __init__(self, a: LoRAParam, b: LoRAParam, scale: LoRAScale, rate: float,
               dropout_key: LoRADropoutKey | None = None):
    self.a = a
    self.b = b
    self.scale = scale
    self.rate = float(rate)
    self.deterministic = True
    if dropout_key is not None:
      self.dropout_key = dropout_key

  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., *in] -> [..., *out] for one layer's A [*in, r] and B [r, *out]."""
    a = self.a[...]
    if self.rate > 0 and not self.deterministic:
      x = dropout(x, self.rate, jax.random.wrap_key_data(self.dropout_key[...]))
    h = jnp.tensordot(x, a.astype(x.dtype), axes=a.ndim - 1)
    return jnp.tensordot(h * self.scale[...].astype(x.dtype), self.b[...].astype(x.dtype), axes=1)


class ExpertLoRA(LoRA):
  """A mixture-of-experts projection's adapter, one per expert: A [(layers,) E, in, r], B [(layers,) E, r, out].

  The MoE dispatch applies it to each expert's rows (`rljax.models.moe`);
  PEFT names each expert's adapter `mlp.experts.{e}.gate_proj`.
  """


def adapter_delta(adapter: LoRA) -> jax.Array:
  """scale * A @ B in float32, shaped like the adapted kernel [(layers,) (experts,) *in, *out]."""
  a, b, scale = (adapter.a[...].astype(jnp.float32), adapter.b[...].astype(jnp.float32),
                 adapter.scale[...])
  if isinstance(adapter, ExpertLoRA):
    product = jnp.einsum("...ir,...ro->...io", a, b, precision=jax.lax.Precision.HIGHEST)
    return scale.reshape(scale.shape + (1,) * (product.ndim - scale.ndim)) * product
  product = lambda a, b, s: s * jnp.tensordot(a, b, axes=1, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
  return jax.vmap(product)(a, b, scale) if scale.ndim else product(a, b, scale)


# ----- applying adapters ----------------------------------------------------------------


def module_name(layer: int, proj: str) -> str:
  """The HF module name of projection `proj` in decoder layer `layer`."""
  parent = _HF_PARENT[PROJECTIONS[proj][0]]
  return f"model.layers.{layer}.{parent}.{proj}"


def expert_module_name(layer: int, expert: int, proj: str) -> str:
  """The HF module name of expert `expert`'s projection `proj` in mixture-of-experts layer `layer`."""
  return f"model.layers.{layer}.mlp.experts.{expert}.{proj}"


def _blocks(model: CausalLM) -> list[tuple[nnx.Module, tuple[int, ...]]]:
  """(decoder block, the layers it holds): one stacked block, or one block per layer."""
  if model.cfg.scan_layers:
    return [(model.layers, tuple(range(model.cfg.num_layers)))]
  return [(block, (i,)) for i, block in enumerate(model.layers)]


def _place(value: jax.Array, names: tuple, mesh: Mesh | None, rules: Rules | None) -> jax.Array:
  if mesh is None:
    return value
  return jax.device_put(value, NamedSharding(mesh, logical_to_spec(names, value.shape, mesh, rules)))


def _layer_rank(config: LoRAConfig, names: list[str], experts: bool) -> int:
  ranks = {pattern_value(config.r_pattern, n, config.rank) for n in names if not excluded(config, n)}
  if len(ranks) > 1:
    stacked = "the experts of a layer share one stacked adapter" if experts else "scan_layers stacks them into one adapter"
    fix = "use one rank per projection" + ("" if experts else f", or set {config.key_prefix}.scan_layers=false")
    raise ConfigError(
        f"{config.key_prefix}.r_pattern", dict(config.r_pattern),
        f"gives the modules {names[0]} ... {names[-1]} different ranks {sorted(ranks)}, but {stacked}", fix)
  return ranks.pop()


def _layer_scales(config: LoRAConfig, names: list[str], rank: int, experts: int) -> list[float]:
  """One scale per layer of `names` (each layer's `experts` names in a row, or one name per layer); 0 for a layer
  exclude_modules keeps out (its stacked adapter then adds nothing, and neither of its matrices trains)."""
  scales = [0.0 if excluded(config, n) else
            lora_scale(rank, pattern_value(config.alpha_pattern, n, config.alpha), config.use_rslora) for n in names]
  per_layer = [scales[i:i + max(experts, 1)] for i in range(0, len(scales), max(experts, 1))]
  for layer in per_layer:
    if len(set(layer)) > 1:
      key = "exclude_modules" if 0.0 in layer else "alpha_pattern"
      raise ConfigError(f"{config.key_prefix}.{key}", config.as_keys()[key],
                        f"gives the experts of a layer different {'adapters' if 0.0 in layer else 'alphas'}, but "
                        "they share one stacked adapter", "treat every expert of a layer alike")
  return [layer[0] for layer in per_layer]


def _new_adapter(kernel: nnx.Variable, n_in: int, names: list[str], stacked: bool, config: LoRAConfig,
                 key: jax.Array, mesh: Mesh | None, rules: Rules | None, experts: int = 0) -> LoRA:
  """The adapter of `kernel` [(layers,) (experts,) *in, *out] for the HF modules `names`.

  `names`: one per layer, or with `experts` > 0 (a mixture-of-experts
  projection) one per layer and expert, the experts of a layer in a row.
  """
  shape, axes = tuple(kernel.shape), param_names(kernel)
  lead = (1 if stacked else 0) + (1 if experts else 0)
  rank = _layer_rank(config, names, bool(experts))
  if experts and config.dropout > 0:
    raise ConfigError(f"{config.key_prefix}.lora_dropout", config.dropout,
                                 "dropout on the adapters of mixture-of-experts experts is not implemented",
                                 f"set it to 0, or target only attention projections in {config.key_prefix}"
                                 ".target_modules")
  in_shape = shape[lead:lead + n_in]
  a_names = axes[:lead] + axes[lead:lead + n_in] + (RANK_AXIS,)
  b_names = axes[:lead] + (RANK_AXIS,) + axes[lead + n_in:]
  a = init_a(key, shape[:lead] + in_shape + (rank,), math.prod(in_shape), rank,
             config.a_init or config.init_lora_weights)
  b = jnp.zeros(shape[:lead] + (rank,) + shape[lead + n_in:], kernel.dtype)
  scales = _layer_scales(config, names, rank, experts)
  scale = jnp.asarray(scales if stacked else scales[0], jnp.float32)
  scale_axes = axes[:1] if stacked else ()
  drop_key = None
  if config.dropout > 0:
    data = jax.random.key_data(jax.random.key(0))
    drop_key = LoRADropoutKey(jnp.zeros(shape[:lead] + data.shape, data.dtype))
  return (ExpertLoRA if experts else LoRA)(
      LoRAParam(_place(a.astype(kernel.dtype), a_names, mesh, rules), out_sharding=a_names, eager_sharding=False),
      LoRAParam(_place(b, b_names, mesh, rules), out_sharding=b_names, eager_sharding=False),
      LoRAScale(_place(scale, scale_axes, mesh, rules), out_sharding=scale_axes, eager_sharding=False),
      config.dropout, drop_key)


def apply_lora(model: CausalLM, config: LoRAConfig, key: jax.Array | None = None, mesh: Mesh | None = None,
               rules: Rules | None = None) -> CausalLM:
  """Adds adapters to `model`'s targeted projections and marks modules_to_save trainable, in place.

  A mixture-of-experts layer's experts get one adapter each where its checkpoints name a module per expert
  (Qwen3-MoE); Qwen3-VL-MoE's experts are one tensor per projection (`checkpoint.experts_fused`), which PEFT's
  target_modules do not reach, so they get none, as under PEFT.

  Args:
    model: a CausalLM without adapters.
    config: the LoRA settings.
    key: PRNG key of the A initialisation (default jax.random.key(0)).
    mesh, rules: place the adapters by their logical axis names (default:
      JAX's default device).

  Returns:
    `model`, now with adapters.
  """
  if has_lora(model):
    raise ValueError("the model already has LoRA adapters; apply_lora once per model.")
  key = jax.random.key(0) if key is None else key
  stacked = model.cfg.scan_layers
  for block, layers in _blocks(model):
    for p, proj in enumerate(config.targets):
      parent_name, attr, n_in = PROJECTIONS[proj]
      parent = getattr(block, parent_name)
      experts = parent.gate.shape[-3] if isinstance(parent, moe.MoE) else 0
      if experts and checkpoint.experts_fused(model.cfg):
        continue  # one 3-D parameter per projection, not a module per expert: PEFT targets none of them
      names = ([expert_module_name(i, e, proj) for i in layers for e in range(experts)] if experts
               else [module_name(i, proj) for i in layers])
      if all(excluded(config, name) for name in names):
        continue
      if experts and config.megatron:
        raise ConfigError(f"{config.key_prefix}.lora.target_modules", list(config.targets),
                          "Megatron-Bridge gives a mixture-of-experts layer's experts one shared adapter, which is not "
                          "implemented (rljax's expert adapters are per expert)",
                          f"target only attention (linear_qkv, linear_proj), or use {config.key_prefix}.lora_rank")
      adapter = _new_adapter(getattr(parent, attr), n_in, names, stacked, config,
                             jax.random.fold_in(key, layers[0] * len(PROJECTIONS) + p), mesh, rules, experts)
      if getattr(parent, "adapters", None) is None:
        parent.adapters = nnx.Dict()
      parent.adapters[attr] = adapter
    _share_a(block, config.shared_a)
  _train_modules(model, config)
  return model


def _share_a(block: nnx.Module, groups: tuple[tuple[str, ...], ...]) -> None:
  """Each group's adapters in `block` read the first one's A (and dropout seed): one variable, so the state, the
  optimizer and the checkpoint hold it once and its gradient sums over the group (Megatron's fused adapters)."""
  for group in groups:
    adapters = []
    for proj in group:
      parent_name, attr, _ = PROJECTIONS[proj]
      held = getattr(getattr(block, parent_name), "adapters", None)
      if held is not None and attr in held:
        adapters.append(held[attr])
    for adapter in adapters[1:]:
      adapter.a = adapters[0].a
      if hasattr(adapters[0], "dropout_key"):
        adapter.dropout_key = adapters[0].dropout_key


def _node(model: nnx.Module, path: tuple) -> Any:
  """The object at a state `path` (attributes, list indices and dict keys)."""
  node = model
  for part in path:
    node = node[part] if isinstance(part, int) or isinstance(node, nnx.Dict) else getattr(node, part)
  return node


def _module_names(cfg: ModelConfig, path: tuple) -> list[str]:
  """HF module names behind the parameter at `path`, one per layer it holds."""
  return [name.rsplit(".", 1)[0] for name in checkpoint.hf_sources(cfg, path).names]


def _train_modules(model: CausalLM, config: LoRAConfig) -> None:
  """Turns the Params of the modules_to_save into TrainedParams (same arrays)."""
  if not config.modules_to_save:
    return
  key = f"{config.key_prefix}.modules_to_save"
  targeted = {module_name(0, proj).rsplit(".", 1)[-1] for proj in config.targets}
  used = set()
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    if isinstance(var, LoRAParam):
      continue
    modules = _module_names(model.cfg, path)
    hits = [[e for e in config.modules_to_save if names_module(e, m)] for m in modules]
    if not any(hits):
      continue
    if not all(hits):
      raise ConfigError(key, list(config.modules_to_save),
                                   f"selects only some layers of {path[-2]}, which scan_layers stacks",
                                   f"name every layer, or set {config.key_prefix}.scan_layers=false")
    if modules[0].rsplit(".", 1)[-1] in targeted:
      raise ConfigError(key, list(config.modules_to_save),
                                   f"{modules[0]} is also a LoRA target", f"drop it from {key} or from target_modules")
    used.update(e for h in hits for e in h)
    setattr(_node(model, path[:-1]), path[-1], TrainedParam(var[...], **var.get_metadata()))
  unused = [e for e in config.modules_to_save if e not in used]
  if unused:
    tied = " (tie_word_embeddings: lm_head is embed_tokens here)" if model.cfg.tie_word_embeddings else ""
    raise ConfigError(key, list(config.modules_to_save), f"{unused} name no module of this model{tied}",
                                 "use HF module names such as embed_tokens, lm_head, norm, input_layernorm")


# ----- trainable / frozen -------------------------------------------------------------


def has_lora(model: nnx.Module) -> bool:
  """Whether `model` carries adapters."""
  return bool(jax.tree.leaves(nnx.state(model, LoRAParam)))


def trainable_filter(model: nnx.Module) -> Any:
  """The nnx filter of what an optimizer trains: adapters and modules_to_save with LoRA, else every Param."""
  return TRAINABLE if has_lora(model) else nnx.Param


def split_trainable(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
  """(graphdef, trainable state, frozen state); the frozen one is empty without LoRA.

  `nnx.merge(graphdef, trainable, frozen)` rebuilds the model from the same arrays.
  """
  return nnx.split(model, trainable_filter(model), ...)


def seed_dropout(state: nnx.State, key: jax.Array) -> nnx.State:
  """`state` with every LoRADropoutKey drawn from `key`; unchanged when it holds none.

  Adapter k (in state order) gets fold_in(key, k), split over its layers
  when stacked.
  """
  flat = nnx.to_flat_state(state)
  if not any(isinstance(var, LoRADropoutKey) for _, var in flat):
    return state
  seeded, k = [], 0
  for path, var in flat:
    if isinstance(var, LoRADropoutKey):
      sub = jax.random.fold_in(key, k)
      layers = tuple(var.shape[:-1])
      var = var.replace(jax.random.key_data(jax.random.split(sub, layers) if layers else sub))
      k += 1
    seeded.append((path, var))
  return nnx.from_flat_state(seeded)


# ----- without adapters: reference and merged ----------------------------------------


def _adapted(model: CausalLM) -> Iterator[tuple[nnx.Module, tuple[int, ...], str, nnx.Module]]:
  """(attn or mlp module holding adapters, its layers, its rljax name, the module)."""
  for block, layers in _blocks(model):
    for parent_name in _HF_PARENT:
      parent = getattr(block, parent_name)
      if getattr(parent, "adapters", None) is not None:
        yield parent, layers, parent_name, parent.adapters


def _without_adapters(model: CausalLM, merge: bool) -> CausalLM:
  """A new CausalLM without adapters over `model`'s arrays.

  merge: kernels become W + scale * A @ B (else stay W) and TrainedParams
  keep their values (else are copied: a snapshot of the originals).
  """
  plain = nnx.merge(*nnx.split(model))
  for path, var in nnx.to_flat_state(nnx.state(plain, TrainedParam)):
    value = var[...] if merge else jnp.copy(var[...])
    setattr(_node(plain, path[:-1]), path[-1], nnx.Param(value, **var.get_metadata()))
  for parent, _, _, adapters in list(_adapted(plain)):
    if merge:
      for attr, adapter in adapters.items():
        kernel = getattr(parent, attr)
        merged = kernel[...].astype(jnp.float32) + adapter_delta(adapter)
        setattr(parent, attr, kernel.replace(merged.astype(kernel.dtype)))
    del parent.adapters
  return plain


def reference_split(model: CausalLM) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, state) of the base model: no adapters, the frozen arrays themselves.

  Call it before training: modules_to_save parameters are copied as they are now.
  """
  return nnx.split(_without_adapters(model, merge=False))


def merge_lora(model: CausalLM) -> CausalLM:
  """A plain CausalLM with every adapted kernel W + scale * A @ B (for save_pretrained)."""
  return _without_adapters(model, merge=True)


# ----- PEFT's adapter format --------------------------------------------------------------


def _host(x: jax.Array) -> np.ndarray:
  return np.asarray(jax.device_get(x))


def _adapter_modules(model: CausalLM) -> Iterator[tuple[LoRA, tuple[np.ndarray, np.ndarray], list]]:
  """(adapter, its (A, B) as writable host copies, [(HF module name, A view [*in, r], B view [r, *out])] of every
  module it adapts): a layer exclude_modules keeps out (scale 0) has none."""
  for _, layers, parent_name, adapters in _adapted(model):
    for attr, adapter in adapters.items():
      proj = _BY_KERNEL[(parent_name, attr)]
      a, b = np.array(_host(adapter.a[...])), np.array(_host(adapter.b[...]))
      scales = np.atleast_1d(_host(adapter.scale[...]))
      modules = []
      for j, layer in enumerate(layers):
        if scales[j if model.cfg.scan_layers else 0] == 0:
          continue
        a_l, b_l = (a[j], b[j]) if model.cfg.scan_layers else (a, b)
        if isinstance(adapter, ExpertLoRA):
          modules += [(expert_module_name(layer, e, proj), a_l[e], b_l[e]) for e in range(a_l.shape[0])]
        else:
          modules.append((module_name(layer, proj), a_l, b_l))
      yield adapter, (a, b), modules


def peft_tensors(model: CausalLM) -> dict[str, np.ndarray]:
  """PEFT's adapter_model tensors.

  For each adapted module M: `base_model.model.M.lora_A.weight` [r, in] and
  `.lora_B.weight` [out, r] (in / out flattened in HF's order); for each
  modules_to_save parameter: `base_model.model.<HF tensor name>` (names as
  transformers 5's module tree has them: `checkpoint.module_name`).
  """
  out: dict[str, np.ndarray] = {}
  named = lambda name: PEFT_PREFIX + checkpoint.module_name(model.cfg, name)  # noqa: E731
  for _, _, modules in _adapter_modules(model):
    for module, a_m, b_m in modules:
      rank = a_m.shape[-1]
      out[named(f"{module}.lora_A.weight")] = a_m.reshape(-1, rank).T
      out[named(f"{module}.lora_B.weight")] = b_m.reshape(rank, -1).T
  trained = ((path, _host(var[...])) for path, var in nnx.to_flat_state(nnx.state(model, TrainedParam)))
  out.update({named(name): v for name, v in checkpoint.to_hf_tensors(model.cfg, trained).items()})
  return out


def peft_patterns(model: CausalLM, config: LoRAConfig) -> tuple[dict[str, int], dict[str, float]]:
  """(rank_pattern, alpha_pattern) for PEFT: the user's r_pattern and alpha_pattern, or, for a vision-language
  model with any, each adapted module's own rank and alpha where they are not r and lora_alpha, keyed by its
  full name as PEFT sees it (transformers 5 nests the language model, `checkpoint.module_name`; escaped, so PEFT
  matches that module alone). A user's key anchored on rljax's names (`model.layers.0.self_attn.q_proj`) matches
  no nested name in PEFT, so the resolved values are written instead of the keys."""
  if model.cfg.vision is None or not (config.r_pattern or config.alpha_pattern):
    return dict(config.r_pattern), dict(config.alpha_pattern)
  ranks: dict[str, int] = {}
  alphas: dict[str, float] = {}
  for _, _, modules in _adapter_modules(model):
    for name, _, _ in modules:
      key = re.escape(checkpoint.module_name(model.cfg, name))
      rank, alpha = pattern_value(config.r_pattern, name, config.rank), pattern_value(config.alpha_pattern, name,
                                                                                        config.alpha)
      if rank != config.rank:
        ranks[key] = rank
      if alpha != config.alpha:
        alphas[key] = alpha
  return ranks, alphas


def peft_adapter_config(config: LoRAConfig, base_model_name_or_path: str | None,
                        patterns: tuple[Mapping[str, int], Mapping[str, float]] | None = None) -> dict[str, Any]:
  """adapter_config.json for PEFT (its LoraConfig fields; rank_pattern is cosmos-rl's r_pattern; `patterns`,
  `peft_patterns`' (rank_pattern, alpha_pattern), in place of the config's own)."""
  ranks, alphas = patterns or (config.r_pattern, config.alpha_pattern)
  return {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
      "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout,
      "target_modules": list(config.targets), "use_rslora": config.use_rslora,
      "modules_to_save": list(config.modules_to_save) or None,
      "rank_pattern": dict(ranks), "alpha_pattern": dict(alphas),
      "init_lora_weights": config.init_lora_weights, "exclude_modules": config.exclude_modules or None,
      "bias": "none", "fan_in_fan_out": False,
      "inference_mode": True,
  }


def save_peft(model: CausalLM, config: LoRAConfig, path: str, base_model_name_or_path: str | None = None) -> None:
  """Writes PEFT's adapter directory (adapter_config.json, adapter_model.safetensors) to `path`.

  Files are built in a temporary sibling directory and moved in when complete.
  """
  if not has_lora(model):
    raise ValueError("the model has no LoRA adapters to write in PEFT's format.")
  if model.cfg.tie_word_embeddings and any(names_module(e, "model.embed_tokens") for e in config.modules_to_save):
    raise ValueError(
        f"{config.key_prefix}.modules_to_save trains the tied embedding, which PEFT's format cannot "
        "express (PEFT would untie lm_head); export the merged model instead.")
  tmp = path.rstrip("/") + ".rljax-tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  safetensors_io.write_file(os.path.join(tmp, ADAPTER_WEIGHTS), peft_tensors(model))
  with open(os.path.join(tmp, ADAPTER_CONFIG), "w") as f:
    json.dump(peft_adapter_config(config, base_model_name_or_path, peft_patterns(model, config)), f, indent=2)
  os.makedirs(path, exist_ok=True)
  for name in os.listdir(tmp):
    os.replace(os.path.join(tmp, name), os.path.join(path, name))
  os.rmdir(tmp)


# adapter_config.json fields a LoRA adapter may set only to these values: rljax's adapters implement no other
PEFT_FIXED = {"peft_type": ("LORA",), "bias": ("none",), "fan_in_fan_out": (False,), "use_dora": (False, None),
              "layers_to_transform": (None,), "layers_pattern": (None,), "target_parameters": (None, []),
              "modules_to_save": (None, [])}


def read_peft_config(path: str, key: str = "actor_rollout_ref.model.lora_adapter_path") -> dict[str, Any]:
  """verl's LoRA keys (lora_rank, lora_alpha, target_modules, lora_dropout, use_rslora, r_pattern, alpha_pattern)
  of PEFT's adapter directory `path`, as verl starts from it (PeftModel.from_pretrained: the adapter's settings,
  not the launch line's).

  Raises:
    ConfigError: naming `key` and the file, where the directory is not a LoRA adapter rljax's adapters hold.
  """
  file = os.path.join(os.path.expanduser(path), ADAPTER_CONFIG)
  try:
    with open(file) as f:
      peft = json.load(f)
  except FileNotFoundError:
    raise ConfigError(key, path, f"holds no {ADAPTER_CONFIG}",
                      f"point it at a PEFT adapter directory ({ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})") from None
  except json.JSONDecodeError as error:
    raise ConfigError(key, path, f"{file} is not JSON ({error})", "point it at a PEFT adapter directory") from None
  for name, allowed in PEFT_FIXED.items():
    check(peft.get(name) in allowed, key, path, f"{file} sets {name}={peft.get(name)!r}, which rljax's LoRA "
          f"adapters do not implement (they take {allowed[0]!r})", "start from an adapter without it")
  targets = peft.get("target_modules")
  names = sorted(targets) if isinstance(targets, (list, tuple, set)) else targets
  try:
    lora_targets(names, key)
  except ConfigError:
    raise ConfigError(key, path, f"{file} targets {targets!r}; rljax's adapters sit on "
                      f"{', '.join(PROJECTIONS)} ('all-linear')", "start from an adapter of those modules") from None
  return {"lora_rank": peft["r"], "lora_alpha": peft["lora_alpha"], "target_modules": names,
          "lora_dropout": peft.get("lora_dropout", 0.0) or 0.0, "use_rslora": bool(peft.get("use_rslora", False)),
          "r_pattern": dict(peft.get("rank_pattern") or {}), "alpha_pattern": dict(peft.get("alpha_pattern") or {}),
          "exclude_modules": _plain(peft.get("exclude_modules")) or None}


def load_peft_weights(model: CausalLM, path: str, key: str = "actor_rollout_ref.model.lora_adapter_path") -> None:
  """Sets `model`'s adapters (applied from `read_peft_config(path)`) to the A and B of PEFT's adapter directory
  `path`, in place (placed as the adapters are), as `peft_tensors` writes them.

  Raises:
    ConfigError: naming `key`, where a tensor is missing, of another shape, or left over.
  """
  reader = safetensors_io.SafetensorsReader(os.path.join(os.path.expanduser(path), ADAPTER_WEIGHTS))
  file, left = os.path.join(path, ADAPTER_WEIGHTS), set(reader.names())

  def read(name: str, shape: tuple[int, ...]) -> np.ndarray:
    check(name in left, key, path, f"{file} has no tensor {name}", "start from the adapter of this model")
    left.discard(name)
    tensor = np.asarray(reader.tensor(name))
    check(tensor.shape == shape, key, path, f"{file}: {name} is {list(tensor.shape)}, the model's is {list(shape)}",
          "start from the adapter of this model (its rank_pattern included)")
    return tensor

  for adapter, (a, b), modules in _adapter_modules(model):
    for module, a_m, b_m in modules:
      rank = a_m.shape[-1]
      # transformers 5's module names (what peft_tensors writes), or an older adapter's flat ones
      named = PEFT_PREFIX + checkpoint.module_name(model.cfg, module)
      named = named if f"{named}.lora_A.weight" in left else PEFT_PREFIX + module
      a_m[...] = read(f"{named}.lora_A.weight", (rank, a_m.size // rank)).T.reshape(a_m.shape)
      b_m[...] = read(f"{named}.lora_B.weight", (b_m.size // rank, rank)).T.reshape(b_m.shape)
    adapter.a.value = jax.device_put(a.astype(adapter.a.value.dtype), adapter.a.value.sharding)
    adapter.b.value = jax.device_put(b.astype(adapter.b.value.dtype), adapter.b.value.sharding)
  check(not left, key, path, f"{file} holds tensors the model's adapters do not: {sorted(left)[:3]}",
        "start from the adapter of this model")


__all__ = [
    "ExpertLoRA", "LoRA", "LoRAConfig", "LoRADropoutKey", "LoRAParam", "LoRAScale", "PROJECTIONS", "TRAINABLE",
    "TrainedParam", "adapter_delta", "apply_lora", "excluded", "has_lora", "load_peft_weights", "lora_scale",
    "merge_lora", "pattern_value", "peft_adapter_config", "peft_tensors", "read_peft_config", "reference_split",
    "save_peft", "seed_dropout", "split_trainable", "trainable_filter",
]
