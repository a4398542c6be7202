"""The whole default tree: verl's PPO-trainer config, built node by node, linked and locked.

`get_base_config()` builds every key of verl's `ppo_trainer.yaml` (the key
paths of `verl_ppo_keys.txt`, and every key of verl's generated FSDP and
Megatron trainer configs in `tests/reference`) with the defaults verl's
documents give; where the documents disagree, the newer one wins. verl's
`${...}` interpolations are `FieldReference`s:
`actor_rollout_ref.rollout.response_length` follows
`data.max_response_length` until it is set itself. `OPEN_DICTS` stay
unlocked: any key may be added below them.
"""

from __future__ import annotations

import difflib

from ml_collections import ConfigDict

from rljax.config.actor_rollout_ref import build_actor, build_model, build_ref, build_rollout
from rljax.config.algorithm import build_algorithm, build_policy_rollout_correction
from rljax.config.critic import build_critic
from rljax.config.data import build_data
from rljax.config.engines import MEGATRON_FREE_FORM, PROFILED_SECTIONS
from rljax.config.errors import NO_VALUE, ConfigError
from rljax.config.fields import follow, get_node, null
from rljax.config.reward import build_reward_model
from rljax.config.trainer import (build_async_training, build_distillation, build_global_profiler, build_recipe_rollout,
                                  build_trainer, build_transfer_queue)

# Free-form dictionaries: any key may be added below these paths.
OPEN_DICTS = (
    "custom_reward_function.reward_kwargs",
    "actor_rollout_ref.model.override_config.model_config",
    "actor_rollout_ref.rollout.engine_kwargs.vllm",
    "actor_rollout_ref.rollout.engine_kwargs.sglang",
    "critic.model.override_config",
    "actor_rollout_ref.rollout.engine_kwargs.trtllm",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
    "reward_model.rollout.engine_kwargs",
    "reward_model.model.override_config",
    "data.apply_chat_template_kwargs",
    "global_profiler.global_tool_config.torch_memory.kw_args",
    "trainer.v1.sampler.sampler_kwargs",
    "distillation.teacher_models",
    *(f"{role}.megatron.{key}" for key in MEGATRON_FREE_FORM
      for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")),
)
# verl's free-form dictionaries whose entries rljax holds under keys of its
# own (verl launch lines fill them with `+KEY=VALUE`); `verl_free_form_path`


def get_base_config() -> ConfigDict:
  """The full verl PPO-trainer tree with verl's defaults, locked.

  Returns:
    A locked `ConfigDict`: unknown keys are errors; free-form dictionaries
    (`OPEN_DICTS`) stay open.
  """
  config = ConfigDict()
  config.data = build_data()
  arr = ConfigDict({"hybrid_engine": True, "model": build_model()})
  arr.actor = build_actor()
  arr.ref = build_ref(arr.actor)
  arr.rollout = build_rollout(config.data, arr.actor)
  config.actor_rollout_ref = arr
  config.critic = build_critic(arr)
  config.reward_model = build_reward_model(arr.model, config.critic)
  config.custom_reward_function = {"path": null(str), "name": "compute_score", "reward_kwargs": {}}
  config.algorithm = build_algorithm()
  arr.actor.policy_loss.rollout_correction = build_policy_rollout_correction(config.algorithm.rollout_correction)
  config.trainer = build_trainer()
  arr.rollout.n_gpus_per_node = follow(config.trainer, "n_gpus_per_node")
  config.ray_init = {"num_cpus": null(int), "timeline_json_file": null(str)}
  _add_verl_links(config)
  config.reward_manager = {
      "source": "register",
      "name": follow(config.reward_model, "reward_manager"),
      "module": {"path": null(str), "name": "custom_reward_manager"},
  }
  config.global_profiler = build_global_profiler()
  _follow_global_profiler(config)
  config.transfer_queue = build_transfer_queue()
  config.distillation = build_distillation()
  config.skip = {stage: {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}
                 for stage in ("rollout", "rollout_tq", "async_rollout")}
  config.async_training = build_async_training()
  config.rollout = build_recipe_rollout()
  config.ray_kwargs = {"ray_init": {"num_cpus": null(int), "runtime_env": {"py_executable": null(str)}},
                       "timeline_json_file": null(str)}
  config.lock()
  for path in OPEN_DICTS:
    get_node(config, path).unlock()
  return config


def _add_verl_links(config: ConfigDict) -> None:
  """Keys whose verl default is another section's key (verl's `${...}` across sections)."""
  arr = config.actor_rollout_ref
  for node in (arr, config.critic, config.reward_model):
    node.nccl_timeout = 600
  for node in (arr.actor, arr.ref, config.critic, config.reward_model):
    node.load_weight = True
  for role in (arr.actor, arr.ref):
    role.rollout_n = follow(arr.rollout, "n")
  arr.actor.use_fused_kernels = follow(arr.model, "use_fused_kernels")
  arr.actor.use_remove_padding = follow(arr.model, "use_remove_padding")
  arr.rollout.profiler.enable = follow(arr.actor.profiler, "enable")
  arr.rollout.prometheus.served_model_name = follow(arr.model, "path")
  config.data.tool_config_path = follow(arr.rollout.multi_turn, "tool_config_path")
  config.data.function_tool_path = follow(arr.rollout.multi_turn, "function_tool_path")
  for key in ("project_name", "experiment_name"):
    arr.rollout.trace[key] = follow(config.trainer, key)
  config.reward_model.megatron.use_distributed_optimizer = False


def _follow_global_profiler(config: ConfigDict) -> None:
  """Each role's profiler tool and directory follow `global_profiler`'s, as in verl."""
  for section in PROFILED_SECTIONS:
    profiler = get_node(config, section).profiler
    for key in ("tool", "save_path"):
      profiler[key] = follow(config.global_profiler, key)


def leaf_paths(config: ConfigDict, prefix: str = "") -> list[str]:
  """Every dotted path to a leaf (non-ConfigDict) value, in tree order."""
  paths = []
  for key in config.keys():
    path = f"{prefix}{key}"
    value = config[key]
    if isinstance(value, ConfigDict) and len(value) and not is_open(path):
      paths.extend(leaf_paths(value, path + "."))
    else:
      paths.append(path)
  return paths


def is_open(path: str) -> bool:
  """Whether `path` is one of `OPEN_DICTS` or lies below one."""
  return any(path == p or path.startswith(p + ".") for p in OPEN_DICTS)


def unknown_key_error(config: ConfigDict, path: str) -> ConfigError:
  """The error for a key the tree lacks, naming the closest keys it has."""
  known = leaf_paths(config)
  last = path.rsplit(".", 1)[-1]
  near = difflib.get_close_matches(path, known, n=3, cutoff=0.75)
  near += [k for k in known if k.rsplit(".", 1)[-1] == last and k not in near]
  if not near:
    near = difflib.get_close_matches(path, known, n=3, cutoff=0.5)
  hint = f"did you mean {' or '.join(near[:3])}?" if near else (
      "see rljax.config.leaf_paths(get_base_config()) for every key")
  return ConfigError(path, NO_VALUE, "unknown key", hint)
