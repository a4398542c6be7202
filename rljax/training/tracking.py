"""Experiment tracking for `trainer.logger`: console, jsonl, tensorboard, wandb, mlflow.

Each backend receives the same flat `{metric name: float}` dict per step,
under verl's metric names. Only process 0 writes. `plot_curves` draws the
score and response-length curves of a `metrics.jsonl` file as a PNG.

Files under the run directory::

  metrics.jsonl       one {"step": N, name: value|null, ...} per step
  generations.jsonl   one {"step": N, ...sample} per validation generation (with jsonl)
  tensorboard/        event files (tensorboardX; no TensorFlow or torch)
  wandb/              wandb's local files (WANDB_MODE=offline honoured)

mlflow logs as verl's tracker does: to `MLFLOW_TRACKING_URI` (verl's default
sqlite:////tmp/mlruns.db), into the run `MLFLOW_RUN_ID` names or a new run
`trainer.experiment_name` of the experiment `trainer.project_name`, with the
config flattened into its parameters (`mlflow_params`), metric names made
valid for mlflow (`mlflow_metric_name`) and each validation's generations as
an artifact `val_step{N}.json`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import tempfile
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import tqdm
from ml_collections import ConfigDict

from rljax.sharding.distributed import is_main_process
from rljax import config as config_lib

LOGGERS = config_lib.LOGGERS
MLFLOW_DEFAULT_URI = "sqlite:////tmp/mlruns.db"  # verl's, where MLFLOW_TRACKING_URI is not set
METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "generations.jsonl"


def to_float(name: str, value: Any) -> float:
  """A Python float from a Python/numpy/jax scalar; errors name the metric."""
  array = np.asarray(jax.device_get(value))
  if array.size != 1 or array.dtype.kind in "USOV":
    raise TypeError(
        f"metric {name!r} must be a numeric scalar, got {array.dtype} of shape {array.shape}.")
  return float(array.reshape(()))


def _json_value(value: float) -> float | None:
  return value if math.isfinite(value) else None


def _logger_names(config: ConfigDict) -> list[str]:
  names = config.trainer.logger
  names = [names] if isinstance(names, str) else list(names or [])
  unknown = [n for n in names if n not in LOGGERS]
  if unknown:
    raise ValueError(f"trainer.logger={names}: unknown logger(s) {unknown}; choose from {list(LOGGERS)}.")
  return names


def _import_backend(name: str) -> Any:
  """The module of logger `name` (its package's name too), or an ImportError saying what to install."""
  try:
    return __import__(name)
  except ImportError as e:
    raise ImportError(
        f"trainer.logger includes '{name}' but the {name} package is not installed: "
        f"pip install {name} (or remove {name} from trainer.logger, e.g. trainer.logger=[console,jsonl])."
    ) from e


def mlflow_metric_name(name: str) -> str:
  """`name` as mlflow accepts it, as verl renames it: '@' as '_at_', runs of '/' as one, and any character
  other than letters, digits, '_', '.', '-', ':', ' ' and '/' as '_'."""
  name = re.sub(r"/+", "/", name.replace("@", "_at_"))
  return re.sub(r"[^/\w.\- :]", "_", name)


def mlflow_params(tree: Any, prefix: str = "") -> dict[str, Any]:
  """A nested config (dicts and lists of plain values) as mlflow parameters, as verl flattens it: keys joined by
  '/', a list as its length (`KEY/list_len`) and its items (`KEY/0`, ...)."""
  if isinstance(tree, (list, tuple)):
    tree = {"list_len": len(tree), **{str(i): v for i, v in enumerate(tree)}}
  if not isinstance(tree, dict):
    return {prefix: tree}
  if not tree and prefix:
    return {prefix: {}}
  out = {}
  for key, value in tree.items():
    out.update(mlflow_params(value, f"{prefix}/{key}" if prefix else str(key)))
  return out


class Tracker:
  """Writes per-step metrics and validation generations to `trainer.logger`'s backends.

  Args:
    config: the run config (`trainer.logger`, `trainer.project_name`,
      `trainer.experiment_name`).
    run_dir: directory for metrics.jsonl, generations.jsonl, tensorboard/
      and wandb/.
    total_steps: length of the console progress bar (None: unbounded).
    console_keys: the metrics the console line shows, when logged (the RL and
      SFT trainers' CONSOLE_KEYS).
  """

  def __init__(self, config: ConfigDict, run_dir: str, total_steps: int | None = None,
               console_keys: Sequence[str] = ()):
    self.names = _logger_names(config)
    self.run_dir = run_dir
    self.console_keys = tuple(console_keys)
    self.active = is_main_process()
    self._bar = self._metrics = self._tb = self._wandb = self._wandb_lib = self._mlflow = None
    self._renamed: set[str] = set()
    if not self.active:
      return
    os.makedirs(run_dir, exist_ok=True)
    if "console" in self.names:
      self._bar = tqdm.tqdm(total=total_steps, desc="training", unit="step", dynamic_ncols=True,
                            file=sys.stderr)
    if "jsonl" in self.names:
      self._metrics = open(os.path.join(run_dir, METRICS_FILE), "a", encoding="utf-8")
    if "tensorboard" in self.names:
      self._tb = self._tensorboard_writer()
    if "wandb" in self.names:
      self._wandb = self._wandb_run(config)
    if "mlflow" in self.names:
      self._mlflow = self._mlflow_run(config)

  def _tensorboard_writer(self) -> Any:
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(
          "trainer.logger includes 'tensorboard' but tensorboardX is not installed: "
          "pip install tensorboardX."
      ) from e
    return SummaryWriter(logdir=os.path.join(self.run_dir, "tensorboard"))

  def _mlflow_run(self, config: ConfigDict) -> Any:
    """mlflow, with verl's run started (see the module docstring)."""
    mlflow = _import_backend("mlflow")
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", MLFLOW_DEFAULT_URI))
    if os.environ.get("MLFLOW_RUN_ID"):
      mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"])
    else:
      experiment = mlflow.set_experiment(config.trainer.project_name)
      mlflow.start_run(experiment_id=experiment.experiment_id, run_name=config.trainer.experiment_name)
    mlflow.log_params(mlflow_params(config_lib.to_plain(config)))
    return mlflow

  def _mlflow_metrics(self, values: Mapping[str, float]) -> dict[str, float]:
    """`values` under mlflow's names, each renaming warned of once."""
    out = {}
    for name, value in values.items():
      out[valid := mlflow_metric_name(name)] = value
      if valid != name and name not in self._renamed:
        self._renamed.add(name)
        logging.warning("mlflow: metric %r is logged as %r (mlflow does not accept its characters)", name, valid)
    return out

  def _wandb_run(self, config: ConfigDict) -> Any:
    self._wandb_lib = wandb = _import_backend("wandb")
    return wandb.init(
        project=config.trainer.project_name,
        name=config.trainer.experiment_name,
        config=config_lib.to_plain(config),
        dir=self.run_dir,
    )

  def log(self, metrics: Mapping[str, Any], step: int) -> None:
    """Writes one step's metrics (scalars of any kind) to every backend."""
    if not self.active:
      return
    values = {name: to_float(name, value) for name, value in metrics.items()}
    if self._bar is not None:
      self._bar.update(max(0, step - self._bar.n))
      tqdm.tqdm.write(self._console_line(values, step), file=sys.stdout)
    if self._metrics is not None:
      row = {"step": step, **{k: _json_value(v) for k, v in values.items()}}
      self._metrics.write(json.dumps(row) + "\n")
      self._metrics.flush()
    if self._tb is not None:
      for name, value in values.items():
        self._tb.add_scalar(name, value, step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(values, step=step)
    if self._mlflow is not None:
      self._mlflow.log_metrics(self._mlflow_metrics(values), step=step)

  def _console_line(self, values: Mapping[str, float], step: int) -> str:
    total = f"/{self._bar.total}" if self._bar is not None and self._bar.total else ""
    parts = [f"step {step}{total}"]
    parts += [f"{name} {values[name]:.4g}" for name in self.console_keys if name in values]
    return " | ".join(parts)

  def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
    """Writes validation generations (dicts such as input/output/score) as text."""
    if not self.active or not samples:
      return
    plain = [{k: _text_value(v) for k, v in sample.items()} for sample in samples]
    rows = [{"step": step, **sample} for sample in plain]
    if self._metrics is not None:
      with open(os.path.join(self.run_dir, GENERATIONS_FILE), "a", encoding="utf-8") as f:
        for row in rows:
          f.write(json.dumps(row, ensure_ascii=False) + "\n")
    text = "\n".join(_format_sample(sample) for sample in plain)
    if self._bar is not None:
      tqdm.tqdm.write(f"[validation generations, step {step}]\n{text}", file=sys.stdout)
    if self._tb is not None:
      self._tb.add_text("val/generations", text.replace("\n", "  \n"), step)
    if self._wandb is not None:
      self._wandb.log({"val/generations": _wandb_table(self._wandb_lib, rows)}, step=step)
    if self._mlflow is not None:
      with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"val_step{step}.json")
        with open(path, "w", encoding="utf-8") as f:
          json.dump(plain, f, ensure_ascii=False)
        self._mlflow.log_artifact(path)

  def close(self) -> None:
    """Flushes and closes every backend."""
    if self._bar is not None:
      self._bar.close()
    if self._metrics is not None:
      self._metrics.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()
    if self._mlflow is not None:
      self._mlflow.end_run()
    self._bar = self._metrics = self._tb = self._wandb = self._mlflow = None

  def __enter__(self) -> "Tracker":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def _text_value(value: Any) -> Any:
  """Strings and Python numbers as they are; array scalars as floats; the rest as str."""
  if value is None or isinstance(value, (str, bool, int, float)):
    return value
  if hasattr(value, "shape") and np.size(value) == 1:
    return to_float("sample", value)
  return str(value)


def _format_sample(sample: Mapping[str, Any]) -> str:
  return " | ".join(f"{key}: {value}" for key, value in sample.items())


def _wandb_table(wandb: Any, rows: Sequence[Mapping[str, Any]]) -> Any:
  columns = list(dict.fromkeys(key for row in rows for key in row))
  return wandb.Table(columns=columns, data=[[str(row.get(c, "")) for c in columns] for row in rows])


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl file."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"metrics file {path} does not exist (trainer.logger needs 'jsonl').")
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _series(rows: Sequence[Mapping[str, Any]], name: str) -> tuple[list[int], list[float]]:
  points = [(row["step"], row[name]) for row in rows if row.get(name) is not None]
  return [p[0] for p in points], [p[1] for p in points]


def local_run_dir(default_local_dir: str, project_name: str, experiment_name: str) -> str:
  """The directory for metrics, generations and plots.

  `trainer.default_local_dir` itself, unless it is a remote URI (gs://...,
  where orbax writes checkpoints but files are not opened as local paths):
  then ~/rljax_runs/<project_name>/<experiment_name> on this host.
  """
  if "://" in default_local_dir:
    return os.path.join(os.path.expanduser("~/rljax_runs"), project_name, experiment_name)
  return os.path.expanduser(default_local_dir)


def plot_curves(
    metrics_jsonl_path: str,
    out_png: str,
    names: Sequence[str] = ("critic/score/mean", "response_length/mean"),
) -> str:
  """Draws each metric in `names` against step, one panel each, into `out_png`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = read_metrics(metrics_jsonl_path)
  if not any(row.get(name) is not None for row in rows for name in names):
    raise ValueError(f"{metrics_jsonl_path} has no values for {list(names)}.")
  fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), squeeze=False)
  for ax, name in zip(axes[0], names):
    steps, values = _series(rows, name)
    ax.plot(steps, values, marker="." if len(steps) < 50 else None)
    ax.set_title(name if steps else f"{name} (not logged)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  fig.savefig(out_png, dpi=100)
  plt.close(fig)
  return out_png
