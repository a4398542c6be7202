"""Generates docs/configuration.md and docs/configuration_sft_eval.md from the config trees.

    python -m rljax.docs_reference > docs/configuration.md
    python -m rljax.docs_reference configuration_sft_eval.md > docs/configuration_sft_eval.md
    python -m rljax.docs_reference --write      # both, in place

Every key of `rljax.config.get_base_config()` becomes one table row of
docs/configuration.md: its default (and the key it follows, verl's
`${...}`), its type, and from its record in `rljax.config.keys.KEYS` its
meaning and what rljax does with it. docs/configuration_sft_eval.md has the
same rows for the trees of `rljax.sft`, `rljax.generate` and `rljax.eval`
(`TOOLS`), from their records (`rljax.sft.keys`, `rljax.evaluation.keys`).
`tests/test_docs.py` fails when a checked-in page differs from its
renderer (`PAGES`).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from typing import Any, Callable, Iterable

from ml_collections import ConfigDict, FieldReference

from rljax import config as config_lib
from rljax.config import keys
from rljax.config.yaml_io import format_value
from rljax.evaluation import config as eval_config
from rljax.evaluation import keys as eval_keys
from rljax.sft import config as sft_config
from rljax.sft import keys as sft_keys

DOC_PATH = pathlib.Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
SFT_EVAL_DOC_PATH = DOC_PATH.parent / "configuration_sft_eval.md"
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
    "distillation",
    "skip",
    "ray_kwargs",
    "ray_init",
    "async_training",
    "rollout",
)

_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list", tuple: "list"}


@dataclasses.dataclass(frozen=True)
class Described:
  """A config tree's key records, the table of its ignored keys, and where the records are written.

  Attributes:
    records: key -> its `rljax.config.keys.Key` record.
    ignored: the tree's `IGNORED_KEYS` (`rljax.config.keys.ignored_table`).
    home: the file and dictionary holding `records`, named when a key has none.
  """

  records: dict[str, keys.Key]
  ignored: dict[str, str]
  home: str


RL_RECORDS = Described(keys.KEYS, keys.IGNORED_KEYS, "rljax/config/keys.py KEYS")


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


def type_name(config: ConfigDict, path: str, described: Described = RL_RECORDS) -> str:
  """The key's type as the reference shows it (`int or null`, `mapping`)."""
  record = described.records.get(path)
  if record is not None and record.type_note is not None:
    return record.type_note
  parent, key = _split(path)
  node = config_lib.get_node(config, parent) if parent else config
  kind = node.get_type(key)
  if kind is ConfigDict:
    return "mapping (free-form)"
  name = _TYPE_NAMES.get(kind, "any")
  return f"{name} or null" if config_lib.get_node(config, path) is None else name


def rljax_status(path: str, described: Described = RL_RECORDS) -> str:
  """What rljax does with the key, from its record (`rljax.config.keys.Key`)."""
  record = described.records.get(path, keys.Key(""))
  if record.deprecated is not None:
    new, how = record.deprecated
    return f"deprecated: read as `{new}` ({how})" if new else f"deprecated: {how}"
  if record.alias_of is not None:
    return f"alias of `{record.alias_of}`: when set, its value replaces that key's"
  if record.default_only is not None:
    problem, _ = record.default_only
    return f"{DEFAULT_ONLY}: {problem}; another value is an error"
  reason = keys.ignored_reason(path, described.ignored)
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


def render_row(config: ConfigDict, path: str, links: dict[str, list[str]], described: Described = RL_RECORDS) -> str:
  """One Markdown table row for `path`.

  Raises:
    KeyError: the key has no record in `described`.
  """
  if path not in described.records:
    raise KeyError(f"{path} has no description: add it to {described.home}")
  cells = (f"`{path}`", _default_cell(config, path, links), type_name(config, path, described),
           described.records[path].meaning, rljax_status(path, described))
  return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _count(paths: Iterable[str], prefix: str, described: Described) -> int:
  """How many of `paths` have a status that starts with `prefix`."""
  return sum(rljax_status(p, described).startswith(prefix) for p in paths)


# Each status a key's row can start with, and how the summary line counts it.
_STATUS_COUNTS = (
    ("as in verl", "as in verl"),
    ("mapped", "mapped"),
    ("rljax key", "added by rljax"),
    ("accepted, ignored", "accepted and ignored"),
    ("deprecated", "deprecated"),
    ("alias of", "read as another key"),
    (DEFAULT_ONLY, "accepted at verl's default only"),
)
_TABLE_HEAD = ["| Key | Default | Type | Meaning | In rljax |", "| --- | --- | --- | --- | --- |"]


def summary(paths: list[str], described: Described = RL_RECORDS) -> str:
  """`N keys: A as in verl, B mapped, ...`, naming each status some key has."""
  counts = [(_count(paths, status, described), words) for status, words in _STATUS_COUNTS]
  return f"{len(paths)} keys: " + ", ".join(f"{n} {words}" for n, words in counts if n) + "."


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
      summary(paths),
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
    lines += [f"## `{group}`", "", keys.SECTIONS[group], "", *_TABLE_HEAD]
    lines += [render_row(config, path, links) for path in members]
    lines.append("")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Tool:
  """A command with a config tree of its own, and how docs/configuration_sft_eval.md documents it.

  Attributes:
    command: the command line that reads the tree.
    verl_file: the verl config file the tree follows.
    intro: the text introducing the tree.
    build: the tree with its defaults.
    described: its key records.
  """

  command: str
  verl_file: str
  intro: str
  build: Callable[[], ConfigDict]
  described: Described


TOOLS = (
    Tool("python -m rljax.sft", "sft_trainer.yaml",
         "Supervised fine-tuning: the examples (single-turn prompt and response columns, or multi-turn "
         "messages), the model and its LoRA adapters, the optimizer, and the run's length, logging and checkpoints.",
         sft_config.get_sft_config, Described(sft_keys.KEYS, sft_keys.IGNORED_KEYS, "rljax/sft/keys.py KEYS")),
    Tool("python -m rljax.generate", "generation.yaml",
         "Offline generation (verl's main_generation): `data.n_samples` responses to every prompt of a parquet "
         "file, by a model or an rljax run's actor, written to a parquet file that `rljax.eval` scores.",
         eval_config.get_generate_config,
         Described(eval_keys.GENERATE_KEYS, eval_keys.GENERATE_IGNORED_KEYS, "rljax/evaluation/keys.py GENERATE_KEYS")),
    Tool("python -m rljax.eval", "evaluation.yaml",
         "Offline evaluation (verl's main_eval): scores the responses `rljax.generate` wrote with the rule "
         "rewards or your function, and reports mean@k and pass@k per data source in a JSON file.",
         eval_config.get_eval_config,
         Described(eval_keys.EVAL_KEYS, eval_keys.EVAL_IGNORED_KEYS, "rljax/evaluation/keys.py EVAL_KEYS")),
)


def render_tool(tool: Tool) -> list[str]:
  """One tool's section of docs/configuration_sft_eval.md: its intro, a summary and a row per key."""
  config = tool.build()
  paths = reference_paths(config)
  links = followed_keys(config)
  return [f"## `{tool.command}`: verl's `{tool.verl_file}`", "", tool.intro, "", summary(paths, tool.described), "",
          *_TABLE_HEAD, *(render_row(config, path, links, tool.described) for path in paths), ""]


def render_sft_eval_reference() -> str:
  """The configuration reference of `TOOLS` (SFT, offline generation and evaluation) as Markdown."""
  lines = [
      "# SFT, generation and evaluation configuration reference",
      "",
      "Generated from the trees of `rljax/sft/config.py` and `rljax/evaluation/config.py` and their",
      "records (`rljax/sft/keys.py`, `rljax/evaluation/keys.py`: a record per key) by",
      f"`{REGENERATE}`; edit those files, not this page",
      "(`tests/test_docs.py` checks that it is current).",
      "",
      "Each command below reads its own verl tree, on the command line of `python -m rljax.train`",
      "(`--config=configs/FILE.py`, overrides as `--config.KEY=VALUE` or `KEY=VALUE`, `--dry_run`);",
      "each tree is locked, so a key not listed under its command is an error naming the closest one.",
      "The columns and the **In rljax** statuses are those of [configuration.md](configuration.md),",
      "and one more: `alias of`, verl's other spelling of a key, whose value replaces that key's",
      "when it is set.",
      "",
  ]
  for tool in TOOLS:
    lines += render_tool(tool)
  return "\n".join(lines)


# Each generated page and its renderer.
PAGES = {DOC_PATH: render_config_reference, SFT_EVAL_DOC_PATH: render_sft_eval_reference}


def main(argv: list[str] | None = None) -> int:
  """Prints one page (docs/configuration.md by default), or writes every page with --write."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("page", nargs="?", default=DOC_PATH.name, choices=[path.name for path in PAGES],
                      help="the page to print")
  parser.add_argument("--write", action="store_true", help="write every page under docs/ instead of printing")
  args = parser.parse_args(argv)
  if not args.write:
    sys.stdout.write(PAGES[DOC_PATH.parent / args.page]())
    return 0
  for path, render in PAGES.items():
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
