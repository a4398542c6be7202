"""`finalize`: verl's other spellings of a key mapped onto the one rljax reads.

Deprecated keys (`DEPRECATED_KEYS`, with one warning each), global
micro-batch sizes onto per-device ones, the documented `rollout_is*` keys,
cosmos-rl's Dr.GRPO keys, `optim.clip_grad`, `reward_manager.name`,
Megatron's parallel sizes onto the mesh (`_map_megatron_mesh`), verl's
fully-async recipe (`async_training.*`, its top-level `rollout.*`) onto
`trainer.v1.trainer_mode=colocate_async` (`_map_fully_async`), the legacy
trainer's prompts per step (`_map_legacy_gen_batch`), and a saved LoRA
adapter's settings (`_map_lora_adapter`).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from ml_collections import ConfigDict

from rljax.config.choices import GRAD_CLIP_DEFAULT
from rljax.config.engines import MEGATRON_MESH_KEYS, OPTIM_SECTIONS
from rljax.config.errors import ConfigError, check, is_int
from rljax.config.fields import get_node
from rljax.config.keys import DEPRECATED_KEYS, ENGINE_KV_CACHE_KEYS
from rljax.config.overrides import set_value
from rljax.config.trainer import V1_OFF_POLICY_THRESHOLD, V1_WARMUP_BATCHES, fully_async_recipe, recipe_setting

_LOG = logging.getLogger("rljax.config")
_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
  """Logs `message` as a warning the first time `key` is warned of in this process."""
  if key not in _WARNED:
    _WARNED.add(key)
    _LOG.warning(message)


def data_parallel_size(config: ConfigDict, world_size: int) -> int:
  """Devices that split the batch: world size over tensor and sequence axes."""
  actor = config.actor_rollout_ref.actor
  return max(1, world_size // (actor.tensor_model_parallel_size * actor.ulysses_sequence_parallel_size))


def _map_global_micro_batch(config: ConfigDict, old: str, new: str, dp: int) -> None:
  value = get_node(config, old)
  n = config.actor_rollout_ref.rollout.n
  set_value(config, new, max(1, value * n // dp))  # fewer rows than devices: a row slot each


def _fill_micro_batch(config: ConfigDict, dp: int) -> None:
  """An unset `ppo_micro_batch_size_per_gpu` becomes the device's whole mini-batch (its share of the
  mini-batch's row slots, `rl.layout.slots_of`).

  Left unset where use_dynamic_bsz sizes micro-batches.
  """
  actor = config.actor_rollout_ref.actor
  rows = actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n
  if actor.ppo_micro_batch_size_per_gpu is None and not actor.use_dynamic_bsz and rows > 0:
    set_value(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", -(-rows // dp))


def _map_rollout_is(config: ConfigDict, section: str) -> None:
  """Maps the documented `rollout_is*` keys onto `algorithm.rollout_correction`.

  truncate -> truncated IS (upper clamp); mask -> IcePop "lower_upper"
  (lower defaults to 1/upper); level token/sequence is kept.
  """
  node = get_node(config, section)
  if not node.rollout_is:
    return
  if node.rollout_is_veto_threshold is not None:
    raise ConfigError(f"{section}.rollout_is_veto_threshold", node.rollout_is_veto_threshold,
                      "veto rejection was replaced in verl 0.9 by rejection sampling",
                      "set algorithm.rollout_correction.rollout_rs=token_k1 with rollout_rs_threshold")
  upper = node.rollout_is_threshold
  if upper is None or upper <= 0:
    raise ConfigError(f"{section}.rollout_is_threshold", upper, "rollout_is=True needs a positive upper threshold", f"set {section}.rollout_is_threshold=2.0")
  lower = node.rollout_is_threshold_lower
  if node.rollout_is_mode == "truncate":
    if lower is not None:
      raise ConfigError(f"{section}.rollout_is_threshold_lower", lower, "truncated IS has no lower bound",
                        f"set {section}.rollout_is_mode=mask to zero weights outside [lower, upper]")
    threshold = upper
  else:
    threshold = f"{lower if lower is not None else 1.0 / upper}_{upper}"
  target = config.algorithm.rollout_correction
  target.rollout_is = node.rollout_is_level
  target.rollout_is_threshold = threshold


def finalize(config: ConfigDict, device_count: int | None = None, explicit: Iterable[str] = ()) -> ConfigDict:
  """Maps deprecated keys onto their replacements (warning once each), and verl's other spellings.

  Args:
    config: the tree after overrides.
    device_count: devices in the job (default: from `trainer.*`, or JAX).
    explicit: the keys the launch line set (where a mapping fills in a
      default, a key set explicitly keeps its value).

  Returns:
    The same config, with replacements filled in.
  """
  # JAX counts the devices for "auto": imported here so that importing the config does not start it
  from rljax.sharding.mesh import resolve_world_size  # pylint: disable=import-outside-toplevel
  _map_megatron_mesh(config)  # before the data-parallel size, which the mesh sizes set
  _map_fully_async(config, set(explicit))  # before the micro-batch mappings, which read rollout.n
  _map_legacy_gen_batch(config)
  _map_lora_adapter(config, set(explicit))
  _map_megatron_lora(config)
  _map_engine_kv_cache_dtype(config, set(explicit))
  world = resolve_world_size(config, device_count)
  _map_megatron_experts(config, world, set(explicit))
  dp = data_parallel_size(config, world)
  for old, (new, how) in DEPRECATED_KEYS.items():
    value = get_node(config, old)
    if value is None:
      continue
    warn_once(old, f"{old} is deprecated; {'use ' + new + ' ' if new else ''}({how})")
    if new is None:
      continue
    if "micro_batch_size" in old:
      _map_global_micro_batch(config, old, new, dp)
    elif old.endswith("enable_tokenization_sanity_check"):
      set_value(config, new, "strict" if value else "disable")
    else:
      set_value(config, new, value)
  _fill_micro_batch(config, dp)
  for section in ("algorithm", "actor_rollout_ref.actor"):
    _map_rollout_is(config, section)
  _map_cosmos_keys(config)
  for section in OPTIM_SECTIONS:
    _map_clip_grad(config, section)
  _map_reward_manager_name(config)
  return config


def _map_lora_adapter(config: ConfigDict, explicit: set[str]) -> None:
  """actor_rollout_ref.model.lora_adapter_path: verl starts the actor's adapters from the saved PEFT adapter with
  its own settings (PeftModel.from_pretrained), whatever the line's LoRA keys say; here they take the adapter's
  (`rljax.models.lora.read_peft_config`), and a line setting one of them otherwise is named in a warning."""
  model = config.actor_rollout_ref.model
  if not model.lora_adapter_path:
    return
  from rljax.models import lora  # pylint: disable=import-outside-toplevel
  adapter = lora.read_peft_config(model.lora_adapter_path)
  differing = [f"actor_rollout_ref.model.{name}" for name, value in adapter.items()
               if f"actor_rollout_ref.model.{name}" in explicit and model[name] != value]
  if differing:
    warn_once("lora_adapter_path", f"actor_rollout_ref.model.lora_adapter_path: the adapter's own settings "
               f"replace {', '.join(differing)} (as verl's PeftModel.from_pretrained reads them)")
  for name, value in adapter.items():
    set_value(config, f"actor_rollout_ref.model.{name}", value)


def _map_legacy_gen_batch(config: ConfigDict) -> None:
  """data.gen_batch_size=null (verl 0.9's default) is train_batch_size.

  verl's legacy trainer (trainer.use_v1=false) loads data.gen_batch_size prompts per step and, without dynamic
  sampling, trains on all of them: rljax's step then trains data.train_batch_size = gen_batch_size prompts. (verl
  0.9.1's V1 trainer, its default, fetches a step's train_batch_size prompts in whole gen_batch_size chunks;
  `rljax.config.validation` holds it to a divisor.)"""
  data, legacy = config.data, not (config.trainer.use_v1 or config.algorithm.filter_groups.enable)
  if data.gen_batch_size is None:  # verl 0.9's default: a step's prompts in one batch
    data.gen_batch_size = data.train_batch_size
  if legacy and data.gen_batch_size != data.train_batch_size:
    _LOG.info("trainer.use_v1=false: each step trains data.gen_batch_size=%s prompts (data.train_batch_size=%s is "
              "not read, as in verl's legacy trainer)", data.gen_batch_size, data.train_batch_size)
    data.train_batch_size = data.gen_batch_size


def _map_engine_kv_cache_dtype(config: ConfigDict, explicit: set[str]) -> None:
  """vLLM's and SGLang's `engine_kwargs.<engine>.kv_cache_dtype` (a verl launch line's way to an 8-bit cache)
  onto `actor_rollout_ref.rollout.kv_cache_dtype`.

  Raises:
    ConfigError: a value rljax's cache does not store, or one that conflicts with rollout.kv_cache_dtype set on
      the same line.
  """
  from rljax.models.kv_quant import KV_CACHE_DTYPES  # pylint: disable=import-outside-toplevel
  rollout, target = config.actor_rollout_ref.rollout, "actor_rollout_ref.rollout.kv_cache_dtype"
  for key in ENGINE_KV_CACHE_KEYS:
    value = _entry(config, key)
    if value is None:
      continue
    check(value in KV_CACHE_DTYPES, key, value, f"must be one of {', '.join(KV_CACHE_DTYPES)} (rljax stores the "
          "cache in 8 bits with a scale per token and KV head)", f"set {target} instead")
    check(target not in explicit or rollout.kv_cache_dtype == value, key, value,
          f"conflicts with {target}={rollout.kv_cache_dtype!r} on the same line", "set only one of them")
    rollout.kv_cache_dtype = value


def _entry(config: ConfigDict, key: str) -> Any:
  """The value of `key`, an entry of a free-form dictionary, or None where the launch line did not add it."""
  try:
    return get_node(config, key)
  except (KeyError, AttributeError):
    return None


def _map_clip_grad(config: ConfigDict, section: str) -> None:
  """verl's `optim.clip_grad` (its newer name of `grad_clip`): a value other than the default sets `grad_clip`.

  Raises:
    ConfigError: both keys set, to different values.
  """
  node = get_node(config, section)
  new, old = node.optim.clip_grad, node.grad_clip
  if new == GRAD_CLIP_DEFAULT:
    return
  check(old in (GRAD_CLIP_DEFAULT, new), f"{section}.optim.clip_grad", new, f"conflicts with {section}.grad_clip={old}",
        f"set only one of {section}.optim.clip_grad and {section}.grad_clip")
  node.grad_clip = float(new)


def _map_megatron_mesh(config: ConfigDict) -> None:
  """verl's Megatron parallel sizes onto the actor's mesh axes (`MEGATRON_MESH_KEYS`).

  A size other than 1 sets the mesh key. `expert_model_parallel_size` is
  read by the mesh itself (`rljax.sharding.mesh_shape`: the expert axis).

  Raises:
    ConfigError: a size that conflicts with the mesh key set to another value.
  """
  megatron = config.actor_rollout_ref.actor.megatron
  for key, target in MEGATRON_MESH_KEYS.items():
    size, current = megatron[key], get_node(config, target)
    if size == 1:
      continue
    check(current in (1, size), f"actor_rollout_ref.actor.megatron.{key}", size, f"conflicts with {target}={current}",
          f"set only one of actor_rollout_ref.actor.megatron.{key} and {target}")
    set_value(config, target, size)


_MEGATRON_LORA = "actor_rollout_ref.model.lora"
# PEFT-only LoRA keys verl's Megatron engine does not read, at their defaults.
_PEFT_ONLY_LORA = {"use_rslora": False, "r_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
                   "init_lora_weights": True, "exclude_modules": None, "lora_adapter_path": None}


def _map_megatron_lora(config: ConfigDict) -> None:
  """verl's Megatron LoRA block (`actor_rollout_ref.model.lora` with rank > 0, under actor.strategy=megatron) onto
  rljax's LoRA keys: lora_rank, lora_alpha, lora_dropout and target_modules as HF projections
  (`MEGATRON_LORA_TARGETS`); the adapters of one fused module share A (`rljax.models.lora.LoRAConfig.shared_a`).

  Raises:
    ConfigError: naming the key, for what Megatron-Bridge does that rljax does not (DoRA, post-dropout, a B that
      does not start at 0, exclusions by Megatron module name, a Megatron adapter checkpoint), or a PEFT key set
      beside the block.
  """
  from rljax.models.lora import MEGATRON_A_INITS, MEGATRON_LORA_TARGETS  # pylint: disable=import-outside-toplevel
  model, block = config.actor_rollout_ref.model, config.actor_rollout_ref.model.lora
  rank = block.rank
  if not is_int(rank) or rank <= 0:
    check(rank == 0, f"{_MEGATRON_LORA}.rank", rank, "must be an integer >= 0 (0 = no adapters)", "set it to 0 or 16")
    return
  strategy = config.actor_rollout_ref.actor.strategy
  check(strategy == "megatron", f"{_MEGATRON_LORA}.rank", rank,
        f"is read only by verl's Megatron engine; with actor_rollout_ref.actor.strategy={strategy} verl trains every "
        "parameter", "set actor_rollout_ref.model.lora_rank for LoRA, or actor_rollout_ref.actor.strategy=megatron")
  check(model.lora_rank in (0, rank), f"{_MEGATRON_LORA}.rank", rank,
        f"conflicts with actor_rollout_ref.model.lora_rank={model.lora_rank}", "set only one of them")
  check(block.type in MEGATRON_LORA_TARGETS, f"{_MEGATRON_LORA}.type", block.type,
        "is not implemented (DoRA and vision-language LoRA)", "set it to lora or canonical_lora")
  table = MEGATRON_LORA_TARGETS[block.type]
  targets = list(block.target_modules) if isinstance(block.target_modules, (list, tuple)) else None
  check(bool(targets) and all(t in table for t in targets), f"{_MEGATRON_LORA}.target_modules", block.target_modules,
        f"{block.type} adapts Megatron's {', '.join(table)}",
        "choose from those names (type canonical_lora names linear_q, linear_k, linear_v, linear_fc1_gate and "
        "linear_fc1_up; type lora their fused linear_qkv and linear_fc1)")
  for name, wanted, why in (("dropout_position", "pre", "dropout after the adapter"),
                            ("lora_B_init_method", "zero", "a B that does not start at 0"),
                            ("adapter_path", None, "starting from a Megatron adapter checkpoint")):
    check(block[name] == wanted, f"{_MEGATRON_LORA}.{name}", block[name], f"{why} is not implemented",
          f"set {_MEGATRON_LORA}.{name}={'null' if wanted is None else wanted}")
  check(block.lora_A_init_method in MEGATRON_A_INITS, f"{_MEGATRON_LORA}.lora_A_init_method",
        block.lora_A_init_method, f"must be one of {', '.join(MEGATRON_A_INITS)}", "set it to xavier")
  check(not block.exclude_modules, f"{_MEGATRON_LORA}.exclude_modules", list(block.exclude_modules),
        "exclusions by Megatron module name are not implemented", f"set {_MEGATRON_LORA}.exclude_modules=[]")
  for key, default in _PEFT_ONLY_LORA.items():
    value = model.get(key)
    check(not value if default in (None, {}) else value == default, f"actor_rollout_ref.model.{key}", value,
          "is a PEFT key that verl's Megatron LoRA does not read", f"leave it out beside {_MEGATRON_LORA}.rank")
  set_value(config, "actor_rollout_ref.model.lora_rank", rank)
  set_value(config, "actor_rollout_ref.model.lora_alpha", float(block.alpha))
  set_value(config, "actor_rollout_ref.model.lora_dropout", float(block.dropout))
  model.target_modules = [proj for name in targets for proj in table[name]]


def _map_megatron_experts(config: ConfigDict, world: int, explicit: set[str]) -> None:
  """A Megatron expert-parallel size that only tensor x context x data holds (`carved_expert_axes`: expert 4 with
  tensor 4 and pipeline 3 on 24 devices) splits the experts over the expert axis and those model axes, as Megatron
  carves its expert groups with expert_tensor_parallel_size=1: the `exp` rule of `trainer.logical_axis_rules`
  gains them (the dense layers keep theirs). Rules the launch line sets are left as they are."""
  from rljax.sharding import mesh  # pylint: disable=import-outside-toplevel  (jax only when finalizing)
  actor = config.actor_rollout_ref.actor
  expert, tensor = actor.megatron.expert_model_parallel_size, actor.tensor_model_parallel_size
  sequence = actor.ulysses_sequence_parallel_size
  if ("trainer.logical_axis_rules" in explicit or mesh.expert_rule_axes(config) != ("expert",)
      or not all(is_int(v) and v >= 1 for v in (expert, tensor, sequence))):
    return
  left = world // (tensor * sequence)
  carved = mesh.carved_expert_axes(expert, tensor, sequence, left)
  if not carved:
    return
  config.trainer.logical_axis_rules = [["exp", ["expert", *carved]] if logical == "exp" else [logical, axis]
                                       for logical, axis in config.trainer.logical_axis_rules]
  _LOG.info("actor_rollout_ref.actor.megatron.expert_model_parallel_size=%d: the %d devices left after tensor x "
            "sequence cannot hold %d expert groups; the experts split over expert x %s, as Megatron carves them "
            "out of tensor x context x data", expert, left, expert, " x ".join(carved))


def _map_reward_manager_name(config: ConfigDict) -> None:
  """verl's `reward_manager.name` (its newer home of `reward_model.reward_manager`), where set to another value."""
  name = config.reward_manager.name
  if name != config.reward_model.reward_manager:
    set_value(config, "reward_model.reward_manager", name)


def _map_cosmos_keys(config: ConfigDict) -> None:
  """cosmos-rl's Dr.GRPO keys onto verl's: unbiased loss and unbiased advantage."""
  actor = config.actor_rollout_ref.actor
  if actor.unbiased_loss_max_tokens is not None:
    set_value(config, "actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-sum-norm")
    set_value(config, "actor_rollout_ref.actor.loss_scale_factor", float(actor.unbiased_loss_max_tokens))
  if config.algorithm.unbiased_advantage:
    set_value(config, "algorithm.norm_adv_by_std_in_grpo", False)


# The policy versions a sample may span under verl's fully-async recipe, which bounds none (its staleness is
# bounded only through how far generation runs ahead).
UNBOUNDED_VERSIONS = 2**31 - 1


def _map_fully_async(config: ConfigDict, explicit: set[str]) -> None:
  """verl's fully-async recipe onto colocate_async, where a launch line sets its keys (`fully_async_recipe`).

  The recipe syncs weights after trigger_parameter_sync_step local updates of require_batches x
  ppo_mini_batch_size prompts each, and generates at most (1 + staleness_threshold) times that many prompts
  per sync. rljax's colocate_async step is one sync: data.train_batch_size = k x r x ppo_mini_batch_size
  prompts (the recipe reads no data.train_batch_size, and its data.gen_batch_size=1 is the prompt-by-prompt
  streaming colocate_async does: set to the step's prompts without dynamic sampling), generation runs
  staleness_threshold of a step ahead (`rljax.rl.staleness.policy_of`), no version bound (`UNBOUNDED_VERSIONS`, unless
  trainer.v1.sampler.max_off_policy_threshold is set), and the recipe's own default
  algorithm.rollout_correction.bypass_mode=true (the rollout's log-probs as the old ones) unless the line
  sets it.

  Raises:
    ConfigError: a value out of range, partial_rollout=false (not implemented), a setting the recipe and
      rljax's step would run differently (ppo_epochs > 1 over several local updates), or a V1 key that
      conflicts.
  """
  if not fully_async_recipe(config):
    return
  names = ("staleness_threshold", "trigger_parameter_sync_step", "require_batches", "partial_rollout")
  ahead, syncs, batches, partial = (recipe_setting(config, name) for name in names)
  check(ahead >= 0, "async_training.staleness_threshold", ahead,
        "is the share of one sync's prompts that generation may run ahead, 0 or more",
        "set it to 0 (on-policy) or more")
  for name, value in (("trigger_parameter_sync_step", syncs), ("require_batches", batches)):
    check(is_int(value) and value >= 1, f"async_training.{name}", value, "must be a whole number, at least 1",
          "set it to 1 or more")
  check(partial or ahead == 0, "async_training.partial_rollout", partial,
        "rljax continues in-flight responses under the new weights (partial rollouts); waiting for them to "
        "end before each weight sync is not implemented",
        "set async_training.partial_rollout=true, or staleness_threshold=0 (on-policy)")
  v1, actor = config.trainer.v1, config.actor_rollout_ref.actor
  check(v1.trainer_mode != "separate_async", "trainer.v1.trainer_mode", v1.trainer_mode,
        "conflicts with async_training.* (verl's fully-async recipe, which rljax runs as colocate_async)",
        "drop trainer.v1.trainer_mode")
  check(v1.colocate_async.num_warmup_batches == V1_WARMUP_BATCHES, "trainer.v1.colocate_async.num_warmup_batches",
        v1.colocate_async.num_warmup_batches, "conflicts with async_training.staleness_threshold, which sets how "
        "far generation runs ahead under verl's fully-async recipe", "set only async_training.staleness_threshold")
  check(syncs == 1 or actor.ppo_epochs == 1, "async_training.trigger_parameter_sync_step", syncs,
        f"with actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs}: the recipe runs its epochs over each local "
        "update's mini-batches, rljax's step over all of a sync's", "set actor_rollout_ref.actor.ppo_epochs=1, or "
        "trigger_parameter_sync_step=1 and require_batches to the mini-batches per sync")
  prompts = syncs * batches * actor.ppo_mini_batch_size
  if config.data.train_batch_size not in (0, prompts):
    warn_once("async_training", f"async_training: each weight sync trains trigger_parameter_sync_step x "
               f"require_batches x ppo_mini_batch_size = {prompts} prompts; data.train_batch_size="
               f"{config.data.train_batch_size} is not read (as in verl's fully-async recipe)")
  config.data.train_batch_size = prompts
  if not config.algorithm.filter_groups.enable:  # the recipe's streaming unit (1): colocate_async streams by prompt
    config.data.gen_batch_size = prompts
  v1.trainer_mode = "colocate_async"
  if v1.sampler.max_off_policy_threshold == V1_OFF_POLICY_THRESHOLD:
    v1.sampler.max_off_policy_threshold = UNBOUNDED_VERSIONS
  if "algorithm.rollout_correction.bypass_mode" not in explicit:
    config.algorithm.rollout_correction.bypass_mode = True
  _map_recipe_rollout(config, prompts, explicit)


def _map_recipe_rollout(config: ConfigDict, prompts: int, explicit: set[str]) -> None:
  """The recipe's top-level `rollout` schedule onto rljax's keys: n, total_epochs, test_freq (per weight sync:
  one step), total_rollout_steps (prompts) in steps of `prompts`."""
  node = config.rollout
  for name, key in (("n", "actor_rollout_ref.rollout.n"), ("total_epochs", "trainer.total_epochs"),
                    ("test_freq", "trainer.test_freq")):
    value = node[name]
    if value is None:
      continue
    check(key not in explicit or get_node(config, key) == value, f"rollout.{name}", value,
          f"conflicts with {key}={get_node(config, key)}", f"set only one of rollout.{name} and {key}")
    set_value(config, key, value)
  total = node.total_rollout_steps
  if total is not None:
    steps, rest = divmod(total, prompts)
    check(rest == 0 and steps >= 1, "rollout.total_rollout_steps", total,
          f"is not a whole number of weight syncs of {prompts} prompts (trigger_parameter_sync_step x "
          "require_batches x ppo_mini_batch_size)", f"set it to a multiple of {prompts}")
    config.trainer.total_training_steps = steps
