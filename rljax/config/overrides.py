"""Setting keys: verl's `a.b=v` and `--config.a.b=v` overrides, Hydra's `+`, `++` and `~`, YAML trees.

One parser reads both override syntaxes, so they agree. `set_value` checks
the key and casts the value to the field's type; `VERL_FREE_FORM` maps the
entries of verl's free-form dictionaries (DAPO's `reward_kwargs`, HF fields
of `override_config`) onto rljax's keys; `from_yaml` applies a verl YAML
tree leaf by leaf with the same checks.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import yaml
from ml_collections import ConfigDict, FieldReference

from rljax.config.errors import NO_VALUE, ConfigError
from rljax.config import kernel_names
from rljax.config.fields import follow
from rljax.config.keys import MODE_KEYS, ignored_reason
from rljax.config.trainer import fully_async_recipe
from rljax.config.tree import OPEN_DICTS, get_base_config, is_open, unknown_key_error
from rljax.config.yaml_io import parse_yaml

# Fields whose value is one whole dictionary (regex keys hold dots, which
# ConfigDict keys cannot): set as `KEY={'layers\.0\..*': 4}`.
DICT_FIELDS = (
    "actor_rollout_ref.model.alpha_pattern",
    "actor_rollout_ref.model.r_pattern",
    "model.alpha_pattern",  # rljax.sft's model node
    "model.r_pattern",
)

_OPTIMIZER_ARGUMENTS = ("optimizer arguments: lr and weight_decay, Megatron's optimizer_offload_fraction (the "
                        "optimizer state's share in host memory), and overlap_cpu_optimizer_d2h_h2d, "
                        "optimizer_cpu_offload and use_precision_aware_optimizer (accepted and ignored)")
# verl's free-form dictionaries whose entries rljax holds under keys of its
# own (verl launch lines fill them with `+KEY=VALUE`); `verl_free_form_path`
# maps an entry onto its key, or names it when rljax has none.
VERL_FREE_FORM = {
    "reward_model.reward_kwargs": (
        "DAPO's reward-manager arguments: overlong_buffer_cfg.{enable, len, penalty_factor, log} are "
        "reward_model.overlong_buffer.*, max_resp_len is reward_model.overlong_buffer.max_resp_len"),
    "actor_rollout_ref.model.override_config": (
        "Hugging Face config.json fields, held in actor_rollout_ref.model.override_config.model_config"),
    "actor_rollout_ref.actor.optim.override_optimizer_config": _OPTIMIZER_ARGUMENTS,
    "critic.optim.override_optimizer_config": _OPTIMIZER_ARGUMENTS,
}
_OVERLONG_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")
# Optimizer arguments rljax's AdamW (rljax.training.optim) reads from an optim node.
_OPTIMIZER_KWARGS = ("lr", "weight_decay")
# Optimizer arguments that only place the optimizer's memory, held on the optim node (`rljax.sharding.offload`).
_OPTIMIZER_MEMORY_HINTS = ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d", "optimizer_cpu_offload",
                           "use_precision_aware_optimizer")

# A mapping key written against its value, as Hydra allows (`{a:1}`; YAML needs `{a: 1}`).
_GLUED_KEY = re.compile(r"([{,]\s*[A-Za-z_][\w.\-]*):(?=\S)")


def _has_glued_key(value: Any) -> bool:
  """Whether YAML read a Hydra `{a:1}` entry as the key 'a:1' with no value, at any depth."""
  if isinstance(value, dict):
    return any((isinstance(k, str) and ":" in k and v is None) or _has_glued_key(v) for k, v in value.items())
  return isinstance(value, list) and any(_has_glued_key(v) for v in value)


def _parse_scalar(text: str) -> Any:
  """Parses one override value as verl's Hydra would.

  YAML with OmegaConf's float rule (`1e-6`, inside lists too), and Hydra's
  mappings without a space after the colon (`{a:1,b:2}`).
  """
  if not text.strip():
    return ""
  try:
    value = parse_yaml(text)
    if _has_glued_key(value):
      value = parse_yaml(_GLUED_KEY.sub(r"\1: ", text))
  except yaml.YAMLError:
    return text
  if isinstance(value, str):
    for cast in (int, float):
      try:
        return cast(value)
      except ValueError:
        pass
  return value


def _unquoted_collection(value: Any) -> Any:
  """A string that spells a list or a mapping (`"['a.parquet','b.parquet']"`, its quotes kept) as that value."""
  if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
    parsed = _parse_scalar(value)
    if isinstance(parsed, (list, dict)):
      return parsed
  return value


def _field_type(parent: ConfigDict, key: str) -> type | None:
  """The declared type of `parent.key`, or None when any type is accepted."""
  raw = parent._fields[key]  # pylint: disable=protected-access
  if isinstance(raw, FieldReference):
    kind = raw.get_type()
    return None if kind is object else kind
  if raw is None:
    return None
  return type(raw)


def _coerce(path: str, value: Any, kind: type | None) -> Any:
  """Casts a parsed override to the field's type, or raises ConfigError."""
  if kind in (None, list, tuple):
    value = _unquoted_collection(value)
  if value is None or kind is None:
    return value
  if kind is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(path, value, "expects a boolean", f"use {path}=true or {path}=false")
  if kind is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    if isinstance(value, float) and value.is_integer():
      return int(value)
    raise ConfigError(path, value, "expects an integer", f"give a whole number, e.g. {path}=8")
  if kind is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    raise ConfigError(path, value, "expects a number", f"give a number, e.g. {path}=0.5")
  if kind is str:
    if isinstance(value, (list, dict)):
      raise ConfigError(path, value, "expects a string", f"give one value, e.g. {path}=name")
    return value if isinstance(value, str) else str(value)
  if kind in (list, tuple):
    return list(value) if isinstance(value, (list, tuple)) else [value]
  if kind is ConfigDict:
    if isinstance(value, dict):
      return value
    raise ConfigError(path, value, "is a section, not a value", f"set one of its keys, e.g. {path}.KEY=VALUE")
  return value


def set_value(config: ConfigDict, path: str, value: Any) -> None:
  """Sets `path` to `value` (already parsed), checking key and type.

  Setting a field that follows another (`${...}` in verl) cuts the link:
  from then on it keeps its own value. An entry of one of verl's free-form
  dictionaries lands on the rljax key that holds it (`verl_free_form_path`);
  such a dictionary set whole to null (verl's default for some) sets nothing.
  """
  if _in_verl_free_form(path) and (isinstance(value, dict) or (value is None and path in VERL_FREE_FORM)):
    for sub_key, sub_value in (value or {}).items():
      set_value(config, f"{path}.{sub_key}", sub_value)
    return
  path = verl_free_form_path(config, path, value)
  *parents, key = path.split(".")
  node = config
  walked = []
  for part in parents:
    walked.append(part)
    if not isinstance(node, ConfigDict) or part not in node:
      if isinstance(node, ConfigDict) and is_open(".".join(walked[:-1])):
        with node.unlocked():
          node[part] = {}
      else:
        raise unknown_key_error(config, path)
    node = node[part]
  if not isinstance(node, ConfigDict):
    raise unknown_key_error(config, path)
  if key not in node:
    if is_open(".".join(parents)):
      with node.unlocked():
        node[key] = value
      return
    raise unknown_key_error(config, path)
  kind = _field_type(node, key)
  if kind is ConfigDict and isinstance(value, dict):
    for sub_key, sub_value in value.items():
      set_value(config, f"{path}.{sub_key}", sub_value)
    return
  value = _coerce(path, value, kind)
  raw = node._fields[key]  # pylint: disable=protected-access
  if isinstance(raw, FieldReference):
    raw.set(value, type_safe=False)
  else:
    node[key] = value


def _in_verl_free_form(path: str) -> bool:
  return any(path == root or path.startswith(root + ".") for root in VERL_FREE_FORM)


def _section(config: ConfigDict, path: str) -> ConfigDict | None:
  """The section at `path` (the root for ''), or None where the tree has no such section."""
  node = config
  for part in path.split(".") if path else ():
    node = node.get(part) if isinstance(node, ConfigDict) else None
  return node if isinstance(node, ConfigDict) else None


def _reward_kwargs_path(path: str, rest: str, value: Any) -> str:
  """`reward_model.reward_kwargs.REST` (DAPO's reward-manager arguments) as rljax's overlong-buffer key."""
  if rest == "max_resp_len":
    return "reward_model.overlong_buffer.max_resp_len"
  group, _, key = rest.partition(".")
  if group == "overlong_buffer_cfg" and key in _OVERLONG_BUFFER_KEYS:
    return f"reward_model.overlong_buffer.{key}"
  raise ConfigError(path, value, "is not a reward-manager argument rljax has",
                    "reward_model.reward_kwargs takes DAPO's overlong_buffer_cfg.{enable, len, penalty_factor, log} "
                    "and max_resp_len; give a custom reward function's arguments as "
                    "custom_reward_function.reward_kwargs.NAME")


def verl_free_form_path(config: ConfigDict, path: str, value: Any = NO_VALUE) -> str:
  """The rljax key holding `path` where it is an entry of one of verl's free-form dictionaries.

  `VERL_FREE_FORM` lists them: DAPO's `reward_model.reward_kwargs`, the HF
  fields of `actor_rollout_ref.model.override_config` (held in its
  `model_config`) and `*.optim.override_optimizer_config`. Other paths come
  back unchanged.

  Raises:
    ConfigError: naming an entry rljax has no key for (`value` is shown).
  """
  root = next((r for r in VERL_FREE_FORM if path.startswith(r + ".")), None)
  if root is None:
    return path
  rest = path[len(root) + 1:]
  if root == "reward_model.reward_kwargs":
    return _reward_kwargs_path(path, rest, value)
  if root == "actor_rollout_ref.model.override_config":
    own = rest.split(".", 1)[0] in (_section(config, root) or ())
    return path if own else f"{root}.model_config.{rest}"
  node = root.rsplit(".", 1)[0]
  if rest in _OPTIMIZER_KWARGS + _OPTIMIZER_MEMORY_HINTS:
    return f"{node}.{rest}"
  raise ConfigError(path, value, "is an optimizer argument rljax does not implement (its AdamW reads only lr and "
                    "weight_decay from the config)", f"drop it, or set {node}.lr or {node}.weight_decay")


def free_form_dicts() -> tuple[str, ...]:
  """Every path below which an override may add a key: rljax's open dictionaries and verl's mapped ones."""
  return tuple(p for p in OPEN_DICTS if not _in_verl_free_form(p)) + tuple(VERL_FREE_FORM)


# verl 0.9's keys that its earlier trees, and rljax's, keep elsewhere (its `reward` node and top-level
# `sandbox_fusion`, its critic engine, its Megatron router replay): (verl 0.9's key or prefix, rljax's), the first
# match wins.
VERL_09_PATHS = (
    ("reward.reward_model.model_path", "reward_model.model.path"),
    ("reward.reward_model.", "reward_model."),
    ("reward.custom_reward_function.", "custom_reward_function."),
    ("reward.reward_kwargs.", "reward_model.reward_kwargs."),
    ("reward.reward_manager.", "reward_manager."),
    ("reward.sandbox_fusion.", "reward_model.sandbox_fusion."),
    ("reward.num_workers", "reward_model.num_workers"),
    ("sandbox_fusion.", "reward_model.sandbox_fusion."),
    # verl 0.9's critic engine config, which its earlier trees (and rljax's) hold in critic.model.fsdp_config
    ("critic.fsdp.", "critic.model.fsdp_config."),
    # verl 0.9's only router replay switch (its Megatron engine's), rljax's actor.router_replay
    ("actor_rollout_ref.actor.megatron.router_replay.", "actor_rollout_ref.actor.router_replay."),
)


def rljax_path(path: str) -> str:
  """The key of rljax's tree that verl 0.9's `path` sets (`VERL_09_PATHS`); `path` itself otherwise."""
  for verl, ours in VERL_09_PATHS:
    if path == verl or (verl.endswith(".") and path.startswith(verl)):
      return ours + path[len(verl):]
  return path


def parse_override(text: str) -> tuple[str, str, Any]:
  """Splits one override: verl's `a.b.c=value` (also `--config.a.b.c=value`) or Hydra's spellings.

  Hydra's `+a.b=value` (add) and `++a.b=value` (add or override) set the
  key like `a.b=value`; `~a.b` (delete) resets it, and `~a.b=value` resets
  it only where it holds that value. verl 0.9's `reward.*` keys are read as
  the keys rljax's tree holds them under (`rljax_path`).

  Returns:
    (operation, key path, parsed value): operation is `set`, `add` or
    `reset`; a reset without `=value` has the value NO_VALUE.
  """
  if text.lstrip().startswith("~"):
    path, equals, raw = text.lstrip()[1:].partition("=")
    return "reset", rljax_path(path.strip()), _parse_scalar(raw) if equals else NO_VALUE
  if "=" not in text:
    raise ConfigError(text, NO_VALUE, "an override needs KEY=VALUE", f"write {text}=VALUE")
  path, raw = text.split("=", 1)
  path = path.strip()
  operation = "add" if path.startswith("+") else "set"
  path = path.lstrip("+")
  if path.startswith("--config."):
    path = path[len("--config."):]
  return operation, rljax_path(path), _parse_scalar(raw)


def add_value(config: ConfigDict, path: str, value: Any) -> None:
  """Hydra's `+KEY=VALUE`: sets a key of the tree, or adds one below a free-form dictionary.

  Raises:
    ConfigError: an unknown key elsewhere, naming the closest keys and where `+` may add one.
  """
  try:
    set_value(config, path, value)
  except ConfigError as error:
    if error.problem != "unknown key":
      raise
    raise ConfigError(error.key, error.value, error.problem,
                      f"{error.fix} (`+` adds keys only below the free-form dictionaries rljax knows: "
                      f"{', '.join(free_form_dicts())})") from None


def _plain_value(value: Any) -> Any:
  if isinstance(value, ConfigDict):
    return value.to_dict()
  return list(value) if isinstance(value, tuple) else value


def _reset(node: ConfigDict, default_node: ConfigDict | None, key: str) -> None:
  """`node[key]` back to `default_node[key]`; removed where the defaults lack it; a section key by key."""
  if not isinstance(default_node, ConfigDict) or key not in default_node:
    with node.unlocked():
      del node[key]
    return
  value, default = node[key], default_node[key]
  if isinstance(value, ConfigDict) and isinstance(default, ConfigDict):
    for sub_key in list(value.keys()):
      _reset(value, default, sub_key)
    return
  raw = node._fields[key]  # pylint: disable=protected-access
  if isinstance(raw, FieldReference):
    raw.set(default, type_safe=False)
  else:
    node[key] = default


def reset_value(config: ConfigDict, path: str, defaults: Callable[[], ConfigDict] = get_base_config,
                expected: Any = NO_VALUE) -> None:
  """Hydra's `~KEY`: `path` back to its value in `defaults()` (rljax's base config).

  A key added below a free-form dictionary is removed; a section resets
  every key below it. A key that follows another by default (verl's
  `${...}`, e.g. data.gen_batch_size) follows it again; inside a reset
  section such keys take the default's value.

  Args:
    config: the tree to change.
    path: the key (verl's free-form spellings map as in `set_value`).
    defaults: builds the tree holding the defaults.
    expected: with `~KEY=VALUE`, the value the key must hold (Hydra's rule).

  Raises:
    ConfigError: an unknown key, or a value other than `expected`.
  """
  path = verl_free_form_path(config, path)
  parent, _, key = path.rpartition(".")
  node = _section(config, parent)
  if node is None or key not in node:
    raise unknown_key_error(config, path)
  current = _plain_value(node[key])
  if expected is not NO_VALUE and current != expected:
    raise ConfigError(path, current, f"~{path}={expected!r} resets the key only where it holds that value",
                      f"write ~{path} to reset it whatever it holds")
  base = defaults()
  section = _section(base, parent)
  source = None if section is None else _followed_path(base, section._fields.get(key))  # pylint: disable=protected-access
  if source is not None:
    source_parent, _, source_key = source.rpartition(".")
    node[key] = follow(_section(config, source_parent), source_key)
    return
  _reset(node, _section(base, parent), key)


def _followed_path(root: ConfigDict, field: Any, prefix: str = "") -> str | None:
  """The path of the key that `field` (a raw field of `root`'s tree) follows by identity, or None."""
  target = field._value if isinstance(field, FieldReference) and field._ops else None  # pylint: disable=protected-access
  if not isinstance(target, FieldReference):
    return None
  for key, raw in root._fields.items():  # pylint: disable=protected-access
    if raw is target:
      return f"{prefix}{key}"
    if isinstance(raw, ConfigDict):
      found = _followed_path(raw, field, f"{prefix}{key}.")
      if found is not None:
        return found
  return None


def apply_overrides(config: ConfigDict, overrides: Iterable[str],
                    defaults: Callable[[], ConfigDict] = get_base_config) -> ConfigDict:
  """Applies overrides in order; both CLI syntaxes and Hydra's `+`, `++` and `~` land here.

  Args:
    config: the tree to change.
    overrides: `KEY=VALUE`, `+KEY=VALUE`, `++KEY=VALUE`, `~KEY` strings.
    defaults: builds the tree whose values `~KEY` restores (rljax.sft and
      rljax.generate/eval pass their own).

  Returns:
    The config.
  """
  for text in overrides:
    operation, path, value = parse_override(text)
    if operation == "reset":
      reset_value(config, path, defaults, value)
    elif operation == "add":
      add_value(config, path, value)
    else:
      set_value(config, path, value)
  return config


def held_at(path: str) -> str:
  """The key of the RL tree that holds `path`: itself, or for an entry of one of verl's free-form
  dictionaries the key it lands on (`verl_free_form_path`; `path` itself where rljax has none)."""
  if not _in_verl_free_form(path):
    return path
  try:
    return verl_free_form_path(get_base_config(), path)
  except ConfigError:
    return path


def ignored_overrides(overrides: Iterable[str], config: ConfigDict | None = None) -> list[str]:
  """`KEY=VALUE` for each override that sets a key rljax accepts and ignores (its value changes nothing).

  An entry of a verl free-form dictionary counts where the key it lands on is ignored
  (`+...optim.override_optimizer_config.optimizer_offload_fraction=1`); it is listed as written.
  With the overridden `config`, so do the keys of trainer.v1 modes other than the one it trains in (`MODE_KEYS`;
  verl's fully-async recipe trains in colocate_async), PF-PPO's under an estimator other than gae, and
  actor.calculate_sum_pi_squared under one that does not read the sum (not an optimal token baseline).
  """
  inert = set()
  if config is not None:
    mode = "colocate_async" if fully_async_recipe(config) else config.trainer.v1.trainer_mode
    inert = {key for key, modes in MODE_KEYS.items() if mode not in modes}
    from rljax.algos import pf_ppo  # pylint: disable=import-outside-toplevel
    if config.algorithm.adv_estimator != pf_ppo.ESTIMATOR:  # verl reweights (PF-PPO) under gae alone
      inert |= {"algorithm.use_pf_ppo", "algorithm.pf_ppo.reweight_method", "algorithm.pf_ppo.weight_pow"}
    if config.algorithm.adv_estimator not in kernel_names.sum_pi_squared_estimators():
      inert.add("actor_rollout_ref.actor.calculate_sum_pi_squared")
  found = []
  for text in overrides:
    operation, path, value = parse_override(text)
    if operation != "reset" and (ignored_reason(held_at(path)) is not None or path in inert):
      found.append(f"{path}={value}")
  return found


def _flatten(tree: dict, prefix: str = "") -> Iterable[tuple[str, Any]]:
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, dict) and value and not is_open(path) and path not in DICT_FIELDS:
      yield from _flatten(value, path + ".")
    else:
      yield path, value


def from_yaml(text: str, base: ConfigDict | None = None) -> ConfigDict:
  """Loads a verl-style YAML tree onto `base` (default: the base config).

  Every leaf is applied with the same checks as a command-line override, so
  an unknown key names the closest valid one.
  """
  config = base if base is not None else get_base_config()
  tree = parse_yaml(text) or {}
  if not isinstance(tree, dict):
    raise ConfigError("<yaml>", type(tree).__name__, "the top level must be a mapping", "write KEY: VALUE lines")
  for path, value in _flatten(tree):
    set_value(config, rljax_path(path), value)
  return config
