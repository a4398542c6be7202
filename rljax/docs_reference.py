"""Generates docs/configuration.md from the config tree.

    python -m rljax.docs_reference > docs/configuration.md
    python -m rljax.docs_reference --write      # the same, in place

Every key of `rljax.config.get_base_config()` becomes one table row: its
default (and the key it follows, verl's `${...}`), its type, and from its
record in `rljax.config.keys.KEYS` its meaning and what rljax does with it.
`tests/test_docs.py` fails when the checked-in page differs from
`render_config_reference()`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any, Iterable

from ml_collections import ConfigDict, FieldReference

from rljax import config as config_lib
from rljax.config import keys
from rljax.config.yaml_io import format_value

DOC_PATH = pathlib.Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
REGENERATE = "python -m rljax.docs_reference --write"
# The status of a key accepted at verl's default only.
DEFAULT_ONLY = "verl's default only"

# Table groups, in the order of verl's ppo_trainer.yaml; a key belongs to the
# longest group that prefixes it.
GROUPS = (
    "data",
    "actor_rollout_ref",
    "actor_rollout_ref.model",
    "actor_rollout_ref.actor",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.rollout",
    "critic",
    "reward_model",
    "reward_manager",
    "custom_reward_function",
    "algorithm",
    "trainer",
    "global_profiler",
    "transfer_queue",
    "ray_kwargs",
    "ray_init",
)

_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", tuple: "list"}


def reference_paths(config: ConfigDict) -> list[str]:
  """Every documented key: leaves, and empty (free-form) mappings, in tree order.

  Unlike `config.leaf_paths`, the defaults inside free-form mappings
  (`engine_kwargs.vllm.swap_space`) get their own rows.
  """
  paths = []
  for key in config.keys():
    value = config[key]
    if isinstance(value, ConfigDict) and len(value):
      paths.extend(f"{key}.{sub}" for sub in reference_paths(value))
    else:
      paths.append(key)
  return paths


def group_of(path: str) -> str:
  """The longest entry of `GROUPS` that prefixes `path`.

  Raises:
    KeyError: no group holds the key (a new top-level section needs one).
  """
  matches = [g for g in GROUPS if path == g or path.startswith(g + ".")]
  if not matches:
    raise KeyError(f"{path} belongs to no group of rljax.docs_reference.GROUPS; add its section there")
  return max(matches, key=len)


def _split(path: str) -> tuple[str, str]:
  parent, _, key = path.rpartition(".")
  return parent, key


def _raw_field(config: ConfigDict, path: str) -> Any:
  """The stored field at `path`: a FieldReference for linked or typed-null keys."""
  parent, key = _split(path)
  node = config_lib.get_node(config, parent) if parent else config
  return node._fields[key]  # pylint: disable=protected-access


def _reference_ids(config: ConfigDict) -> dict[int, str]:
  """id(FieldReference) -> key path, for every key stored as a reference."""
  ids = {}
  for path in reference_paths(config):
    raw = _raw_field(config, path)
    if isinstance(raw, FieldReference):
      ids[id(raw)] = path
  return ids


def _sources(ref: FieldReference, known: dict[int, str]) -> list[str]:
  """The keys a reference is computed from (verl's `${...}`), in order.

  Walks the reference's pointer and the arguments of its operations
  (ml_collections keeps them in `_value` and `_ops`) until it meets a
  reference that is itself a key.
  """
  found = []
  pending = [ref._value] + [a for op in ref._ops for a in op.args]  # pylint: disable=protected-access
  for item in pending:
    if not isinstance(item, FieldReference):
      continue
    if id(item) in known:
      found.append(known[id(item)])
    else:
      found.extend(_sources(item, known))
  return found


def followed_keys(config: ConfigDict) -> dict[str, list[str]]:
  """key -> the keys its default follows, for every linked key."""
  known = _reference_ids(config)
  links = {}
  for path in reference_paths(config):
    raw = _raw_field(config, path)
    if isinstance(raw, FieldReference):
      sources = [s for s in _sources(raw, known) if s != path]
      if sources:
        links[path] = sources
  return links


def type_name(config: ConfigDict, path: str) -> str:
  """The key's type as the reference shows it (`int or null`, `mapping`)."""
  record = keys.KEYS.get(path)
  if record is not None and record.type_note is not None:
    return record.type_note
  parent, key = _split(path)
  node = config_lib.get_node(config, parent) if parent else config
  kind = node.get_type(key)
  if kind is ConfigDict:
    return "mapping (free-form)"
  name = _TYPE_NAMES.get(kind, "any")
  return f"{name} or null" if config_lib.get_node(config, path) is None else name


def rljax_status(path: str) -> str:
  """What rljax does with the key, from its record (`rljax.config.keys`)."""
  record = keys.KEYS.get(path, keys.Key(""))
  if record.deprecated is not None:
    new, how = record.deprecated
    return f"deprecated: read as `{new}` ({how})" if new else f"deprecated: {how}"
  if record.default_only is not None:
    problem, _ = record.default_only
    return f"{DEFAULT_ONLY}: {problem}; another value is an error"
  reason = keys.ignored_reason(path)
  if reason is not None:
    return f"accepted, ignored: {reason}"
  if record.mapped is not None:
    return f"mapped: {record.mapped}"
  if record.added is not None:
    return f"rljax key: {record.added}"
  return "as in verl"


def _cell(text: str) -> str:
  """Table-cell text: pipes escaped, no line breaks."""
  return text.replace("|", "\\|").replace("\n", " ")


def _default_cell(config: ConfigDict, path: str, links: dict[str, list[str]]) -> str:
  cell = f"`{format_value(config_lib.get_node(config, path))}`"
  if path in links:
    cell += " (follows " + ", ".join(f"`{s}`" for s in links[path]) + ")"
  return cell


def render_row(config: ConfigDict, path: str, links: dict[str, list[str]]) -> str:
  """One Markdown table row for `path`.

  Raises:
    KeyError: the key has no record in `rljax.config.keys.KEYS`.
  """
  if path not in keys.KEYS:
    raise KeyError(f"{path} has no description: add it to rljax/config/keys.py KEYS")
  cells = (f"`{path}`", _default_cell(config, path, links), type_name(config, path),
           keys.KEYS[path].meaning, rljax_status(path))
  return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _count(paths: Iterable[str], prefix: str) -> int:
  return sum(rljax_status(p).startswith(prefix) for p in paths)


def _header(paths: list[str]) -> list[str]:
  return [
      "# Configuration reference",
      "",
      f"Generated from `rljax/config/` (the tree, and `keys.py`: a record per key) by `{REGENERATE}`;",
      "edit those files, not this page (`tests/test_docs.py` checks that it is current).",
      "",
      "rljax reads verl's `ppo_trainer.yaml` tree: every key below can be set on the command line",
      "as `--config.KEY=VALUE` or verl's `KEY=VALUE`, in an experiment file (`configs/*.py`), or in",
      "a verl YAML file (`--config=configs/verl_yaml.py:FILE.yaml`, or Hydra's `--config-path DIR",
      "--config-name NAME`). Hydra's `+KEY=VALUE` and `++KEY=VALUE` set a key like `KEY=VALUE`, and",
      "`~KEY` resets it to the default below. The tree is locked: a key that is not listed here is",
      "an error that names the closest one. Keys typed `mapping (free-form)` take any sub-keys; `+`",
      "adds keys only there and in verl's free-form mappings rljax maps onto its own keys (DAPO's",
      "`reward_kwargs`, HF fields of `override_config`, `override_optimizer_config`).",
      "",
      "Columns: **Default** is verl's default (`follows` marks verl's `${...}`: the key copies the",
      "other one until it is set itself); **In rljax** says what rljax does with the key:",
      "",
      "- `as in verl`: the key means what verl's documents say.",
      "- `mapped`: verl's key, with the meaning it takes on a JAX device mesh.",
      "- `rljax key`: a key rljax adds, named in verl's style.",
      "- `accepted, ignored`: a key for PyTorch, Ray, vLLM, SGLang or Nsight; it is accepted so a",
      "  verl launch line pastes over, and does nothing.",
      "- `deprecated`: still read, mapped onto its replacement with a warning.",
      "- `verl's default only`: a verl feature rljax does not implement; any other value is an",
      "  error before the run starts, so it never runs something other than asked.",
      "",
      f"{len(paths)} keys: {_count(paths, 'as in verl')} as in verl, {_count(paths, 'mapped')} mapped, "
      f"{_count(paths, 'rljax key')} added by rljax, {_count(paths, 'accepted, ignored')} accepted and ignored, "
      f"{_count(paths, 'deprecated')} deprecated, {_count(paths, DEFAULT_ONLY)} accepted at verl's default only.",
      "",
  ]


def render_config_reference(config: ConfigDict | None = None) -> str:
  """The whole configuration reference page as Markdown.

  Args:
    config: the tree to document (default: `get_base_config()`).
  """
  config = config if config is not None else config_lib.get_base_config()
  paths = reference_paths(config)
  links = followed_keys(config)
  by_group = {group: [] for group in GROUPS}
  for path in paths:
    by_group[group_of(path)].append(path)
  lines = _header(paths)
  for group, members in by_group.items():
    if not members:
      continue
    lines += [f"## `{group}`", "", keys.SECTIONS[group], "",
              "| Key | Default | Type | Meaning | In rljax |", "| --- | --- | --- | --- | --- |"]
    lines += [render_row(config, path, links) for path in members]
    lines.append("")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  """Prints the reference, or writes it to docs/configuration.md with --write."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write", action="store_true", help=f"write {DOC_PATH} instead of printing")
  args = parser.parse_args(argv)
  text = render_config_reference()
  if args.write:
    DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
    DOC_PATH.write_text(text)
    print(f"wrote {DOC_PATH}", file=sys.stderr)
  else:
    sys.stdout.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
