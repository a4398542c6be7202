"""verl's `ppo_trainer.yaml` files, loaded onto rljax's base config.

    python -m rljax.train --config=configs/verl_yaml.py:my_ppo_trainer.yaml \
        data.train_batch_size=64 --dry_run

A verl YAML file is a nested tree of verl keys. Each leaf is set with the same
checks as a command-line override (`rljax.config.set_value`), so an unknown
key is a `ConfigError` that names the key, the closest valid keys, the file
and the line. Overrides on the command line are applied afterwards, as in
verl.

OmegaConf interpolations are kept as links, so they follow later overrides
the way verl resolves them at run time:

* `${a.b.c}` (absolute) and `${.x}`, `${..x}` (relative to the key's node):
  the key follows `a.b.c` until it is set itself (a whole section is copied
  instead);
* a string with interpolations inside (`checkpoints/${trainer.project_name}`)
  follows every key it names;
* `${oc.select:a.b.c,DEFAULT}`: follows `a.b.c`, or takes DEFAULT when rljax
  has no such key (DEFAULT may be `{}` or `[]`, as in verl's generated
  Megatron config);
* `${oc.env:NAME}` / `${oc.env:NAME,DEFAULT}`: the environment variable's
  value, read once at load time.

Other resolvers are an error. Numbers such as `1e-6` are floats, as
OmegaConf reads them (PyYAML alone reads a string). Hydra's top-level `defaults:` list
composes verl's sub-files, and rljax's base config already holds every key
they define: of the list, rljax reads only the engine it picks
(`defaults_entries`: `ppo_megatron_trainer`, `override model_engine: megatron`
or a `megatron_actor`-style file sets the roles' `strategy` to megatron),
in Hydra's order around the file's own keys (`_self_`'s place; without it,
the file's keys last); a plain name of another file is an error, as is a
trainer config after `_self_`. Hydra's own
`hydra:` block (its search path, its output directory) configures no run:
its entries are listed with the ignored keys. `_target_` entries (Hydra's
dataclass hints) are skipped too, and so are `???` values (OmegaConf's "no
default, must be given"): the key keeps rljax's default.

`--config-name=ppo_trainer` or `ppo_megatron_trainer`, which Hydra finds in
verl's package, is rljax's base config (`TRAINER_CONFIGS`: with Megatron's
engines for the latter) where `--config-path` is verl's `config` (or absent)
and holds no such file.

Keys rljax accepts but ignores (`rljax.config.IGNORED_KEYS`) are reported in
one warning per file, listing those the file sets to something other than
verl's default, with the reason in docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Iterator

import yaml
from ml_collections import ConfigDict, FieldReference
from ml_collections.config_dict import MutabilityError

from rljax.config.errors import NO_VALUE, ConfigError
from rljax.config.fields import get_node
from rljax.config.keys import ignored_reason
from rljax.config.overrides import DICT_FIELDS, held_at, rljax_path, set_value
from rljax.config.tree import get_base_config, unknown_key_error
from rljax.config.yaml_io import YamlLoader, format_value, parse_yaml

DEFAULTS_KEY = "defaults"
HYDRA_KEY = "hydra"
SELF = "_self_"
TARGET_KEY = "_target_"
MISSING = "???"

# the roles a verl engine choice sets the strategy of (verl's generated Megatron config: these three)
ENGINE_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
MEGATRON = "megatron"
# verl's trainer configs (verl/trainer/config/NAME.yaml) as the entries they set beyond rljax's base config
TRAINER_CONFIGS = {"ppo_trainer": {}, "ppo_megatron_trainer": {f"{role}.strategy": MEGATRON for role in ENGINE_ROLES}}
# `--config-name` of one of `TRAINER_CONFIGS` no file stands for: what `load_config_file` reads as that config
TRAINER_CONFIG_PREFIX = "verl:"

_LOG = logging.getLogger("rljax.config.verl_yaml")
# a resolver call inside `${...}` (`interpolation_spans` finds them): `NAME:ARGS`
_RESOLVER = re.compile(r"^(?P<name>[A-Za-z_][\w.]*):(?P<args>.*)$")


@dataclasses.dataclass(frozen=True)
class Entry:
  """One leaf of a YAML file: dotted key path, parsed value, 1-based line; `chosen`: set by the defaults list's
  choice of a config (`defaults_entries`), not by a key of the file."""

  path: str
  value: Any
  line: int | None
  chosen: bool = False


@dataclasses.dataclass(frozen=True)
class Link:
  """An interpolated key: the key path whose value is followed."""

  source: str


def _where(source: str, line: int | None) -> str:
  return f"in {source}, line {line}" if line else f"in {source}"


def _key_lines(node: yaml.Node, prefix: str = "") -> Iterator[tuple[str, int]]:
  """(dotted key path, 1-based line) for every mapping key of a composed YAML node."""
  if not isinstance(node, yaml.MappingNode):
    return
  for key_node, value_node in node.value:
    path = f"{prefix}{key_node.value}"
    yield path, key_node.start_mark.line + 1
    yield from _key_lines(value_node, path + ".")


def _leaves(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """Dotted paths to the leaves of a parsed tree, skipping `_target_` entries and OmegaConf's `???`.

  A mapping stays whole where the key takes one dictionary as its value
  (`config.DICT_FIELDS`: regex keys may hold dots).
  """
  for key, value in tree.items():
    if key == TARGET_KEY or value == MISSING:
      continue
    path = f"{prefix}{key}"
    if isinstance(value, dict) and path not in DICT_FIELDS:
      yield from _leaves(value, path + ".")
    else:
      yield path, value


def defaults_entries(defaults: Any, line: int | None = None) -> list[Entry]:
  """The entries a Hydra defaults list sets in rljax: the engine it picks for each role (`ENGINE_ROLES`), by a
  trainer config's name (`TRAINER_CONFIGS`), verl 0.9's `override model_engine: megatron`, or a role's file
  (`actor@actor_rollout_ref.actor: megatron_actor`). Every other choice composes keys rljax's base config holds.

  Args:
    defaults: the list, as parsed; anything but a list sets nothing.
    line: the list's line, for messages.
  """
  entries = []
  for choice in defaults if isinstance(defaults, list) else ():
    if isinstance(choice, str):
      entries += [Entry(path, value, line, chosen=True) for path, value in TRAINER_CONFIGS.get(choice, {}).items()]
      continue
    for group, name in (choice.items() if isinstance(choice, dict) else ()):
      group = str(group).removeprefix("override ").strip()
      if group == "model_engine" and name == MEGATRON:
        entries += [Entry(f"{role}.strategy", MEGATRON, line, chosen=True) for role in ENGINE_ROLES]
      elif "@" in group and group.split("@", 1)[1] in ENGINE_ROLES and str(name).startswith(MEGATRON):
        entries.append(Entry(f"{group.split('@', 1)[1]}.strategy", MEGATRON, line, chosen=True))
  return entries


def _is_trainer_config(choice: Any) -> bool:
  return isinstance(choice, str) and choice in TRAINER_CONFIGS


def _check_choices(defaults: list, source: str) -> None:
  """A defaults list rljax can follow: its plain names are verl's trainer configs (`TRAINER_CONFIGS`), `_self_` or
  a group's default (`GROUP@PACKAGE`), and no trainer config comes after `_self_`.

  Raises:
    ConfigError: a name of another file (a config of the user's, which Hydra composes from its search path), or a
      trainer config after `_self_` (Hydra would let verl's defaults replace every key the file sets).
  """
  for choice in defaults:
    if isinstance(choice, str) and choice != SELF and choice not in TRAINER_CONFIGS and "@" not in choice:
      raise ConfigError(DEFAULTS_KEY, choice, f"in {source} composes another YAML file, which rljax does not read "
                        f"(it reads verl's {' and '.join(TRAINER_CONFIGS)} by name)",
                        "copy that file's keys into this one, or give them as KEY=VALUE overrides")
  after_self = defaults[defaults.index(SELF) + 1:] if SELF in defaults else []
  for choice in after_self:
    if _is_trainer_config(choice):
      raise ConfigError(DEFAULTS_KEY, choice, f"comes after _self_ in {source}: verl's defaults would replace every "
                        "key the file sets", "put _self_ last in the defaults list, as verl's files do")


def _ordered(defaults: Any, own: list[Entry], line: int | None) -> list[Entry]:
  """`own` (the file's keys) and the defaults list's entries in Hydra's order: the choices before `_self_` first,
  those after it last (no `_self_`: the file's keys last). An `override` changes a choice inside the trainer config,
  so it applies where that config does."""
  if not isinstance(defaults, list):
    return own
  at = defaults.index(SELF) if SELF in defaults else len(defaults)
  trainer = any(_is_trainer_config(choice) for choice in defaults)
  before, after = [], []
  for i, choice in enumerate(defaults):
    overrides = isinstance(choice, dict) and any(str(k).startswith("override ") for k in choice)
    (before if i < at or (overrides and trainer) else after).extend(defaults_entries([choice], line))
  return before + own + after


def hydra_settings(tree: dict) -> list[str]:
  """`key=value` for each leaf of a parsed verl YAML document's `hydra:` block (Hydra's own settings: they
  configure no run)."""
  block = tree.get(HYDRA_KEY)
  if not isinstance(block, dict):
    return [] if block is None else [f"{HYDRA_KEY}={format_value(block)}"]
  return [f"{path}={format_value(value)}" for path, value in _leaves(block, HYDRA_KEY + ".")]


def _parse(text: str, source: str) -> tuple[dict, dict[str, int]]:
  """(the document's top-level mapping, empty for an empty document; each dotted key's 1-based line).

  Raises:
    ConfigError: the text is not YAML, or its top level is not a mapping.
  """
  try:
    tree = parse_yaml(text)
    lines = dict(_key_lines(yaml.compose(text, Loader=YamlLoader)))
  except yaml.YAMLError as error:
    raise ConfigError(source, NO_VALUE, f"is not valid YAML ({error})",
                      "fix the YAML syntax at the position shown") from None
  if tree is not None and not isinstance(tree, dict):
    raise ConfigError(source, type(tree).__name__, "the top level must be a mapping of verl keys",
                      "write nested KEY: VALUE lines as in verl's ppo_trainer.yaml")
  return tree or {}, lines


def _entries(tree: dict, lines: dict[str, int], source: str) -> list[Entry]:
  """`read_entries` of a parsed document."""
  defaults = tree.get(DEFAULTS_KEY)
  if isinstance(defaults, list):
    _check_choices(defaults, source)
  body = {str(k): v for k, v in tree.items() if k not in (DEFAULTS_KEY, HYDRA_KEY)}
  leaves = list(_leaves(body))
  legacy_homes = {rljax_path(path) for path, value in leaves
                  if path.startswith(LEGACY_REWARD_SECTIONS) and value is not None}
  own = [Entry(rljax_path(path), value, lines.get(path)) for path, value in leaves
         if not legacy_unset(path, value) and not overridden_by_legacy(path, legacy_homes)]
  entries = _ordered(defaults, own, lines.get(DEFAULTS_KEY))
  if DEFAULTS_KEY in tree:
    _LOG.info("%s: of Hydra's defaults list, rljax reads the engine it picks (%s); its base config holds every key "
              "the list composes", source, ", ".join(f"{e.path}={e.value}" for e in entries if e.chosen) or "none")
  return entries


# verl 0.9's legacy reward sections: declared at null, and copied into its `reward` node only where set
# (migrate_legacy_reward_impl); rljax holds them in its own tree (`rljax.config.overrides.VERL_09_PATHS`)
LEGACY_REWARD_SECTIONS = ("reward_model.", "custom_reward_function.", "sandbox_fusion.")


def legacy_unset(path: str, value: Any) -> bool:
  """Whether a YAML file's `path: value` is one of verl 0.9's legacy reward keys left at null (unset: rljax's
  default stands, as verl 0.9 copies only the set ones)."""
  return value is None and path.startswith(LEGACY_REWARD_SECTIONS)


def overridden_by_legacy(path: str, legacy_homes: set[str]) -> bool:
  """Whether `path`, a key of verl 0.9's `reward` node, is one the same file also sets under its legacy name
  (`legacy_homes`: rljax's keys of the legacy ones the file sets to a value): verl 0.9's migration copies the legacy
  value over it."""
  return path.startswith("reward.") and rljax_path(path) in legacy_homes


def read_entries(text: str, source: str = "<yaml>") -> list[Entry]:
  """The leaves of a verl YAML document in the order they apply (`_ordered`: its defaults list's engine choices,
  `defaults_entries`, around its own keys in file order); without Hydra's `hydra:` block.

  Raises:
    ConfigError: the text is not YAML, its top level is not a mapping, or its defaults list is not one rljax can
      follow (`_check_choices`).
  """
  return _entries(*_parse(text, source), source)


def _relative(expression: str, path: str) -> str:
  """OmegaConf's `.x` (sibling of `path`) and `..x` (one node up) as an absolute path."""
  dots = len(expression) - len(expression.lstrip("."))
  node = path.split(".")[:-1]
  up = dots - 1
  if up > len(node):
    raise ValueError(f"${{{expression}}} climbs above the top of the tree from {path}")
  return ".".join(node[:len(node) - up] + [expression[dots:]])


def _has_key(config: ConfigDict, path: str) -> bool:
  try:
    get_node(config, path)
  except (KeyError, AttributeError, TypeError):
    return False
  return True


def _split_args(args: str) -> tuple[str, str | None]:
  """`a,b` -> ('a', 'b'); `a` -> ('a', None). The default may itself hold commas."""
  first, comma, rest = args.partition(",")
  return first.strip(), (rest.strip() if comma else None)


def _scalar(text: str | None) -> Any:
  """A resolver's default or an environment value, read as YAML (`8` -> 8, `null` -> None)."""
  if text is None:
    return None
  return parse_yaml(text) if text else ""


def _environment(entry: Entry, name: str, default: str | None) -> Any:
  """`${oc.env:NAME,DEFAULT}`: the variable's value now, else the default."""
  if name in os.environ:
    return _scalar(os.environ[name])
  if default is None:
    raise ConfigError(entry.path, entry.value, f"environment variable {name} is not set",
                      f"export {name}=VALUE or give a default: ${{oc.env:{name},VALUE}}")
  return _scalar(default)


def _key_path(entry: Entry, expression: str) -> str:
  """The absolute key an interpolation names (relative ones resolved from `entry.path`)."""
  if not expression.startswith("."):
    return rljax_path(expression.strip())
  try:
    return rljax_path(_relative(expression, entry.path))
  except ValueError as error:
    raise ConfigError(entry.path, entry.value, str(error),
                      "write an absolute key path such as ${data.max_response_length}") from None


def resolve_interpolation(config: ConfigDict, expression: str, entry: Entry) -> Link | Any:
  """One `${...}` of `entry`: a Link to the key it follows, or a value read now.

  Raises:
    ConfigError: naming the key and the interpolation, for an unknown key, a
      missing environment variable or an unsupported resolver.
  """
  resolver = _RESOLVER.match(expression)
  if resolver is None:
    target = _key_path(entry, expression)
    if not _has_key(config, target):
      near = unknown_key_error(config, target)
      raise ConfigError(entry.path, entry.value, f"interpolates {target}, which is not a key of rljax's config",
                        near.fix)
    return Link(target)
  name = resolver.group("name")
  first, default = _split_args(resolver.group("args"))
  if name == "oc.env":
    return _environment(entry, first, default)
  if name == "oc.select":
    target = _key_path(entry, first)
    if _has_key(config, target):
      return Link(target)
    nested = interpolation_spans(default or "")
    if nested == [(0, len(default or ""))]:  # a default that is itself one interpolation
      return resolve_interpolation(config, default[2:-1], entry)
    return _scalar(default)
  raise ConfigError(entry.path, entry.value, f"uses the resolver {name}, which rljax does not evaluate",
                    "write the value itself")


def interpolation_spans(text: str) -> list[tuple[int, int]]:
  """(start, end) of each outermost `${...}` of `text`, nested ones inside it included (verl 0.9 writes
  `${oc.select:A,${oc.select:B,null}}`)."""
  spans, depth, start = [], 0, 0
  for i, char in enumerate(text):
    if text.startswith("${", i):
      if depth == 0:
        start = i
      depth += 1
    elif char == "{" and depth and text[i - 1] != "$":  # a mapping inside, as in `${oc.select:A,{}}`
      depth += 1
    elif char == "}" and depth:
      depth -= 1
      if depth == 0:
        spans.append((start, i + 1))
  return spans


def interpolation_parts(config: ConfigDict, entry: Entry) -> list[Any]:
  """A string value cut into literal text and resolved `${...}` parts (Links or values)."""
  parts, position = [], 0
  for start, end in interpolation_spans(entry.value):
    if start > position:
      parts.append(entry.value[position:start])
    parts.append(resolve_interpolation(config, entry.value[start + 2:end - 1], entry))
    position = end
  if position < len(entry.value):
    parts.append(entry.value[position:])
  return parts


def _parent_and_key(config: ConfigDict, path: str) -> tuple[ConfigDict, str]:
  parent, _, key = path.rpartition(".")
  return (get_node(config, parent) if parent else config), key


def _source_ref(config: ConfigDict, link: Link) -> FieldReference | None:
  """The followed key as a reference (None for a null entry of a free-form mapping)."""
  node, key = _parent_and_key(config, link.source)
  try:
    return node.get_ref(key)
  except ValueError:
    return None


def _point(config: ConfigDict, entry: Entry, expression: FieldReference) -> None:
  """Makes the (already set) key `entry.path` follow `expression`.

  A null entry of a free-form mapping cannot hold a reference and keeps the
  value it was set to.
  """
  node, key = _parent_and_key(config, entry.path)
  try:
    target = node.get_ref(key)
  except ValueError:
    return
  if target.get_type() is float and expression.get_type() is int:
    expression = expression.to_float()
  try:
    target.set(expression)
  except TypeError:
    raise ConfigError(entry.path, entry.value, f"holds a {target.get_type().__name__} but would follow a "
                      f"{expression.get_type().__name__}", "write the value itself") from None
  except MutabilityError:
    raise ConfigError(entry.path, entry.value, "the interpolation makes keys follow each other in a cycle",
                      "write the value of one of them") from None


def _follow(config: ConfigDict, entry: Entry, link: Link) -> None:
  """Sets `entry.path` to the linked key's value now and makes it follow that key."""
  value = get_node(config, link.source)
  if isinstance(value, ConfigDict):
    set_value(config, entry.path, value.to_dict())
    return
  set_value(config, entry.path, value)
  reference = _source_ref(config, link)
  if reference is not None:
    _point(config, entry, reference)


def _concatenate(config: ConfigDict, parts: list[Any]) -> FieldReference | str:
  """Text and followed keys joined into one string; a reference when any key is followed."""
  joined: FieldReference | str = ""
  for part in parts:
    reference = _source_ref(config, part) if isinstance(part, Link) else None
    if reference is not None:
      joined = joined + reference.to_str()
    else:
      value = get_node(config, part.source) if isinstance(part, Link) else part
      joined = joined + format_scalar(value)
  return joined


def format_scalar(value: Any) -> str:
  """A value as OmegaConf writes it inside a string (`null`, `true`, `8`)."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def apply_entry(config: ConfigDict, entry: Entry) -> None:
  """Sets one YAML leaf on `config`, keeping `${...}` interpolations as links.

  Raises:
    ConfigError: for an unknown or mistyped key or interpolation.
  """
  if isinstance(entry.value, list) and any(isinstance(v, str) and "${" in v for v in entry.value):
    raise ConfigError(entry.path, entry.value, "interpolations inside a list are not evaluated",
                      "write the list's values themselves")
  if not (isinstance(entry.value, str) and interpolation_spans(entry.value)):
    set_value(config, entry.path, entry.value)
    return
  parts = interpolation_parts(config, entry)
  if len(parts) == 1 and isinstance(parts[0], Link):
    _follow(config, entry, parts[0])
    return
  if len(parts) == 1:
    set_value(config, entry.path, parts[0])
    return
  joined = _concatenate(config, parts)
  set_value(config, entry.path, joined if isinstance(joined, str) else joined.get())
  if isinstance(joined, FieldReference):
    _point(config, entry, joined)


def ignored_settings(config: ConfigDict, entries: list[Entry]) -> list[str]:
  """`key=value` for each ignored key the file sets to something other than verl's default.

  A key the base config lacks (a new entry of a free-form mapping such as
  `engine_kwargs.vllm`) has no default, so it is always listed. An entry of
  one of verl's free-form dictionaries that rljax holds on a key of its own
  (`override_optimizer_config.optimizer_offload_fraction`) is judged by that key.
  """
  base = get_base_config()
  settings = []
  for entry in entries:
    path = held_at(entry.path)
    if entry.chosen or ignored_reason(path) is None:
      continue
    value = get_node(config, path)
    if not _has_key(base, path) or value != get_node(base, path):
      settings.append(f"{entry.path}={format_value(value)}")
  return settings


def load_text(text: str, source: str = "<yaml>", base: ConfigDict | None = None) -> ConfigDict:
  """Applies a verl YAML document onto `base` (default: the base config).

  Args:
    text: the YAML text.
    source: the file name, for messages.
    base: the config to change in place.

  Returns:
    The config.

  Raises:
    ConfigError: naming the key, the file and the line, and how to fix it.
  """
  config = base if base is not None else get_base_config()
  tree, lines = _parse(text, source)
  entries = _entries(tree, lines, source)
  for entry in entries:
    try:
      apply_entry(config, entry)
    except ConfigError as error:
      raise ConfigError(error.key, error.value, f"{error.problem} ({_where(source, entry.line)})",
                        error.fix) from None
  ignored = ignored_settings(config, entries) + hydra_settings(tree)
  if ignored:
    _LOG.warning("%s sets %d verl key(s) that have no effect in rljax (docs/configuration.md says why): %s",
                 source, len(ignored), ", ".join(ignored))
  return config


def load_trainer_config(name: str) -> ConfigDict:
  """The base config as verl's trainer config `name` (one of `TRAINER_CONFIGS`) sets it.

  Raises:
    ConfigError: `name` is none of verl's trainer configs.
  """
  if name not in TRAINER_CONFIGS:
    raise ConfigError("--config-name", name, "is none of verl's trainer configs",
                      f"name one of {sorted(TRAINER_CONFIGS)}, or give --config-path the directory of your YAML file")
  _LOG.info("--config-name=%s: verl's trainer config, as rljax's base config%s", name,
            " with Megatron's engines" if TRAINER_CONFIGS[name] else "")
  return load_text(f"{DEFAULTS_KEY}:\n  - {name}\n", source=f"verl's {name}")


def load_file(path: str | None) -> ConfigDict:
  """Loads the verl YAML file at `path` onto the base config (`TRAINER_CONFIG_PREFIX` + NAME: verl's trainer config
  NAME, `load_trainer_config`).

  Raises:
    ConfigError: no path given, no such file, or a bad key in it.
  """
  if path and path.startswith(TRAINER_CONFIG_PREFIX):
    return load_trainer_config(path.removeprefix(TRAINER_CONFIG_PREFIX).rsplit(".", 1)[0])
  if not path:
    raise ConfigError("--config", "configs/verl_yaml.py", "needs the verl YAML file after a colon",
                      "pass --config=configs/verl_yaml.py:path/to/ppo_trainer.yaml")
  expanded = os.path.expanduser(path)
  if not os.path.isfile(expanded):
    raise ConfigError("--config", f"configs/verl_yaml.py:{path}", "no such YAML file",
                      "give the path of a verl ppo_trainer.yaml-style file")
  with open(expanded, encoding="utf-8") as handle:
    return load_text(handle.read(), source=path)
