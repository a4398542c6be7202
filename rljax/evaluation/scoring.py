"""Offline evaluation: score every response of a parquet file, summarise per data source.

verl's `main_eval` on rljax's reward functions. Each row holds k responses
(`data.response_key`, a list of strings), a data source
(`data.data_source_key`) and a reference (`data.reward_model_key`, a dict
with "ground_truth"); `extra_info` is passed on when the column exists. Every
response is scored with `rljax.rewards.default_compute_score` or, when
`custom_reward_function.path` is set, the user's function (verl's signature,
`reward_kwargs` added), called as
`compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`. A
float or a dict with a "score" key is accepted.

Metrics of a data source with N prompts, prompt i having k responses with
scores s_i1..s_ik (every prompt of a source must have the same k), of which
c_i pass (s_ij >= t, t = `eval.pass_threshold`, default 1.0: a rule reward's
full score):

- mean@k = (1/N) sum_i (1/k) sum_j s_ij; also reported under verl
  main_eval's name `test_score/<source>`.
- std@k = (1/N) sum_i std_j(s_ij) (population std; k > 1 only).
- best@k = (1/N) sum_i max_j s_ij (verl's best@k, computed exactly rather
  than by bootstrap).
- pass@m, for m in 1, 2, 4, ... < k and m = k: the unbiased estimator of
  Chen et al. (2021), (1/N) sum_i [1 - C(k - c_i, m) / C(k, m)], the chance
  that m responses drawn without replacement from the k hold at least one
  pass. pass@1 is the fraction of passing responses; pass@k is the
  fraction of prompts with at least one passing response.

Flat metric names follow verl's validation metrics:
`val-core/<source>/reward/mean@k`, `val-aux/<source>/reward/std@k`,
`val-aux/<source>/reward/best@k/mean`, and `val-aux/<source>/reward/pass@m`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from ml_collections import ConfigDict

from rljax.evaluation import cli
from rljax.evaluation import table as table_lib
from rljax.rewards import default_compute_score, has_builtin_scorer, known_data_sources, load_compute_score
from rljax.sharding import distributed

EXTRA_INFO_COLUMN = "extra_info"
_LOG = logging.getLogger(cli.LOGGER_NAME)


@dataclasses.dataclass(frozen=True)
class Row:
  """One prompt's responses and what scores them."""

  data_source: str
  responses: list[str]
  ground_truth: Any
  extra_info: Any


def output_path(config: ConfigDict) -> str:
  """`data.output_path`, or `NAME-eval.json` beside `data.path`."""
  if config.data.output_path:
    return os.path.abspath(os.path.expanduser(config.data.output_path))
  return table_lib.beside(config.data.path, "-eval.json")


def _responses(value: Any, where: str, column: str) -> list[str]:
  if not isinstance(value, (list, tuple)) or not value:
    raise ValueError(f"{where}: column {column!r} (data.response_key) must be a non-empty list of response "
                     f"strings; got {value!r:.200}")
  bad = [j for j, r in enumerate(value) if not isinstance(r, str)]
  if bad:
    raise ValueError(f"{where}: column {column!r} (data.response_key) holds non-strings at positions {bad[:5]}")
  return list(value)


def _ground_truth(value: Any, where: str, column: str) -> Any:
  if isinstance(value, Mapping) and value.get("ground_truth") is not None:
    return value["ground_truth"]
  raise ValueError(f"{where}: column {column!r} (data.reward_model_key) must be a dict with a non-null "
                   f"'ground_truth'; got {value!r:.200}")


def _data_source(value: Any, where: str, column: str) -> str:
  if isinstance(value, str) and value:
    return value
  raise ValueError(f"{where}: column {column!r} (data.data_source_key) must be a non-empty string; got {value!r:.200}")


def read_rows(table: pa.Table, config: ConfigDict, source: str) -> list[Row]:
  """The table's rows, checked.

  Raises:
    KeyError: a column the config names is missing (names the key).
    ValueError: a bad value (names the file, row and column).
  """
  data = config.data
  columns = {"data.response_key": data.response_key, "data.data_source_key": data.data_source_key,
             "data.reward_model_key": data.reward_model_key}
  table_lib.require_columns(table, columns, source)
  if table.num_rows == 0:
    raise ValueError(f"{source} has no rows to evaluate (data.path).")
  responses = table.column(data.response_key).to_pylist()
  sources = table.column(data.data_source_key).to_pylist()
  references = table.column(data.reward_model_key).to_pylist()
  extras = (table.column(EXTRA_INFO_COLUMN).to_pylist() if EXTRA_INFO_COLUMN in table.column_names
            else [None] * table.num_rows)
  rows = []
  for i in range(table.num_rows):
    where = table_lib.describe_row(source, i)
    rows.append(Row(data_source=_data_source(sources[i], where, data.data_source_key),
                    responses=_responses(responses[i], where, data.response_key),
                    ground_truth=_ground_truth(references[i], where, data.reward_model_key),
                    extra_info=extras[i]))
  return rows


def check_same_k(rows: Sequence[Row], source: str, column: str) -> None:
  """Every prompt of a data source has the same number of responses, or a ValueError names the row."""
  first: dict[str, tuple[int, int]] = {}
  for i, row in enumerate(rows):
    k, at = first.setdefault(row.data_source, (len(row.responses), i))
    if len(row.responses) != k:
      raise ValueError(
          f"{table_lib.describe_row(source, i)}: column {column!r} has {len(row.responses)} responses, but row {at} "
          f"of data source {row.data_source!r} has {k}; pass@k and mean@k need the same k for every prompt of a "
          "data source.")


def check_known_sources(rows: Sequence[Row], source: str, column: str) -> None:
  """Without a custom reward, every data source needs a built-in scorer, or a ValueError names the row."""
  for i, row in enumerate(rows):
    if not has_builtin_scorer(row.data_source):
      raise ValueError(
          f"{table_lib.describe_row(source, i)}: column {column!r} is {row.data_source!r}, which has no built-in "
          f"reward (built-in: {known_data_sources()}). Set custom_reward_function.path to a file defining "
          "compute_score(data_source, solution_str, ground_truth, extra_info=None).")


def load_scorer(config: ConfigDict) -> Callable[..., Any]:
  """The custom function (custom_reward_function.*) or default_compute_score."""
  try:
    custom = load_compute_score(config)
  except (AttributeError, TypeError) as e:
    raise ValueError(f"custom_reward_function.name={config.custom_reward_function.name!r}: {e}") from e
  return custom if custom is not None else default_compute_score


def score_value(value: Any, where: str) -> float:
  """A scorer's float, or a dict's "score", as a finite float."""
  score = value["score"] if isinstance(value, Mapping) and "score" in value else value
  if isinstance(score, (bool, int, float, np.number)) and np.isfinite(float(score)):
    return float(score)
  raise ValueError(f"{where}: the reward function returned {value!r:.200}; expected a finite number or a dict "
                   "with a 'score' key")


def score_rows(rows: Sequence[Row], compute_score: Callable[..., Any], source: str) -> list[list[float]]:
  """Scores of every response: one list of k floats per row.

  Raises:
    ValueError: naming the row and response, when the function raises or
      returns something that is not a score.
  """
  scores = []
  for i, row in enumerate(rows):
    row_scores = []
    for j, response in enumerate(row.responses):
      where = f"{table_lib.describe_row(source, i)}, response {j} (data source {row.data_source!r})"
      try:
        value = compute_score(data_source=row.data_source, solution_str=response, ground_truth=row.ground_truth,
                              extra_info=row.extra_info)
      except Exception as e:  # pylint: disable=broad-except
        raise ValueError(f"{where}: the reward function raised {type(e).__name__}: {e}") from e
      row_scores.append(score_value(value, where))
    scores.append(row_scores)
  return scores


def pass_at(k: int, passed: int, m: int) -> float:
  """1 - C(k - c, m) / C(k, m): the chance that m of k responses (c passing), drawn without replacement, hold a pass."""
  return 1.0 - math.comb(k - passed, m) / math.comb(k, m)


def pass_sizes(k: int) -> list[int]:
  """1, 2, 4, ... below k, then k."""
  sizes, m = [], 1
  while m < k:
    sizes.append(m)
    m *= 2
  return sizes + [k]


def source_metrics(scores: np.ndarray, threshold: float) -> dict[str, float]:
  """Metrics of one data source (module docstring).

  Args:
    scores: [N, k] scores, row i the k responses to prompt i.
    threshold: t; a response passes when its score >= t.

  Returns:
    mean@k, std@k (k > 1), best@k and pass@m for m in `pass_sizes(k)`.
  """
  k = scores.shape[1]
  out = {f"mean@{k}": float(scores.mean(axis=1).mean())}
  if k > 1:
    out[f"std@{k}"] = float(scores.std(axis=1).mean())
  out[f"best@{k}"] = float(scores.max(axis=1).mean())
  passed = (scores >= threshold).sum(axis=1)
  for m in pass_sizes(k):
    out[f"pass@{m}"] = float(np.mean([pass_at(k, int(c), m) for c in passed]))
  return out


def group_metrics(sources: Sequence[str], scores: Sequence[Sequence[float]],
                  threshold: float) -> dict[str, dict[str, float]]:
  """data source -> {prompts, k, and `source_metrics`}, sources sorted.

  Args:
    sources: N data sources, one per row.
    scores: N lists of scores; rows of one source have the same length k.
    threshold: the pass threshold.
  """
  out = {}
  for name in sorted(set(sources)):
    rows = np.asarray([s for src, s in zip(sources, scores) if src == name], np.float64)
    out[name] = {"prompts": int(rows.shape[0]), "k": int(rows.shape[1]), **source_metrics(rows, threshold)}
  return out


def flat_metrics(groups: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  """verl's names: test_score/<s>, val-core/<s>/reward/mean@k, val-aux/<s>/reward/{std@k, best@k/mean, pass@m}."""
  out = {}
  for name, group in groups.items():
    k = group["k"]
    out[f"test_score/{name}"] = group[f"mean@{k}"]
    out[f"val-core/{name}/reward/mean@{k}"] = group[f"mean@{k}"]
    if k > 1:
      out[f"val-aux/{name}/reward/std@{k}"] = group[f"std@{k}"]
    out[f"val-aux/{name}/reward/best@{k}/mean"] = group[f"best@{k}"]
    for m in pass_sizes(k):
      out[f"val-aux/{name}/reward/pass@{m}"] = group[f"pass@{m}"]
  return out


def format_table(groups: Mapping[str, Mapping[str, float]]) -> str:
  """One line per data source: prompts, k, mean@k, best@k, pass@1, pass@k."""
  header = ("data_source", "prompts", "k", "mean@k", "best@k", "pass@1", "pass@k")
  lines = [header]
  for name, g in groups.items():
    k = g["k"]
    lines.append((name, str(g["prompts"]), str(k), f"{g[f'mean@{k}']:.4f}", f"{g[f'best@{k}']:.4f}",
                  f"{g['pass@1']:.4f}", f"{g[f'pass@{k}']:.4f}"))
  widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
  return "\n".join("  ".join(cell.ljust(w) if c == 0 else cell.rjust(w)
                             for c, (cell, w) in enumerate(zip(line, widths))) for line in lines)


def evaluate(config: ConfigDict) -> dict[str, Any]:
  """Reads, checks and scores `data.path`; returns the report (what `run` writes as JSON).

  Returns:
    {"data_path", "pass_threshold", "data_sources": group_metrics,
     "metrics": flat_metrics, "scores": one list of k scores per row}.
  """
  source = os.path.abspath(os.path.expanduser(config.data.path))
  rows = read_rows(table_lib.read_table(source), config, source)
  check_same_k(rows, source, config.data.response_key)
  if not config.custom_reward_function.path:
    check_known_sources(rows, source, config.data.data_source_key)
  scores = score_rows(rows, load_scorer(config), source)
  threshold = float(config.eval.pass_threshold)
  groups = group_metrics([r.data_source for r in rows], scores, threshold)
  return {"data_path": source, "pass_threshold": threshold, "data_sources": groups,
          "metrics": flat_metrics(groups), "scores": scores}


def run(config: ConfigDict) -> str:
  """Evaluates `data.path`, prints the table, writes the JSON report; returns its path.

  Launched on several hosts (`JAX_PROCESS_ID` set), process 0 scores every row and writes the report once;
  the others return its path.
  """
  if distributed.launch_index() > 0:
    return output_path(config)
  report = evaluate(config)
  print(format_table(report["data_sources"]))
  path = output_path(config)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(report, f, indent=1)
  os.replace(path + ".tmp", path)
  _LOG.info("wrote %s", path)
  return path
