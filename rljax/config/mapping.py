"""`finalize`: verl's other spellings of a key mapped onto the one rljax reads.

Deprecated keys (`DEPRECATED_KEYS`, with one warning each), global
micro-batch sizes onto per-device ones, the documented `rollout_is*` keys,
cosmos-rl's Dr.GRPO keys, `optim.clip_grad`, `reward_manager.name`, and
Megatron's parallel sizes onto the mesh (`_map_megatron_mesh`).
"""

from __future__ import annotations

import logging

from ml_collections import ConfigDict

from rljax.config.choices import GRAD_CLIP_DEFAULT
from rljax.config.engines import MEGATRON_MESH_KEYS, OPTIM_SECTIONS
from rljax.config.errors import ConfigError, check
from rljax.config.fields import get_node
from rljax.config.keys import DEPRECATED_KEYS
from rljax.config.overrides import set_value

_LOG = logging.getLogger("rljax.config")
_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
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
  per_device = value * n // dp
  if per_device < 1:
    raise ConfigError(old, value, f"x rollout.n ({n}) is smaller than the {dp} data-parallel devices", f"set {new} directly (rows per device)")
  set_value(config, new, per_device)


def _fill_micro_batch(config: ConfigDict, dp: int) -> None:
  """An unset `ppo_micro_batch_size_per_gpu` becomes the device's whole mini-batch (rows per data-parallel device).

  Left unset where the mini-batch does not split over `dp` devices (the
  check names that key) or where use_dynamic_bsz sizes micro-batches.
  """
  actor = config.actor_rollout_ref.actor
  rows = actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n
  if actor.ppo_micro_batch_size_per_gpu is None and not actor.use_dynamic_bsz and rows > 0 and rows % dp == 0:
    set_value(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", rows // dp)


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


def finalize(config: ConfigDict, device_count: int | None = None) -> ConfigDict:
  """Maps deprecated keys onto their replacements (warning once each).

  Args:
    config: the tree after overrides.
    device_count: devices in the job (default: from `trainer.*`, or JAX).

  Returns:
    The same config, with replacements filled in.
  """
  # JAX counts the devices for "auto": imported here so that importing the config does not start it
  from rljax.sharding.mesh import resolve_world_size  # pylint: disable=import-outside-toplevel
  _map_megatron_mesh(config)  # before the data-parallel size, which the mesh sizes set
  world = resolve_world_size(config, device_count)
  dp = data_parallel_size(config, world)
  for old, (new, how) in DEPRECATED_KEYS.items():
    value = get_node(config, old)
    if value is None:
      continue
    _warn_once(old, f"{old} is deprecated; {'use ' + new + ' ' if new else ''}({how})")
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
