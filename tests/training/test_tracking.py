"""Tracker backends (console, jsonl, tensorboard, wandb, mlflow) and plot_curves."""

import glob
import json
import math
import struct
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import config as config_lib
from rljax.training.tracking import Tracker, plot_curves


def _config(*loggers):
  config = config_lib.get_base_config()
  config.trainer.logger = list(loggers)
  config.trainer.project_name, config.trainer.experiment_name = "proj", "exp"
  return config


def _metrics(step):
  return {"critic/score/mean": jnp.asarray(0.25 * step), "response_length/mean": np.float32(10 + step),
          "timing_s/step": 1.5, "actor/pg_loss": float("nan"), "perf/total_num_tokens": np.int64(7)}


def test_jsonl_rows_are_floats_with_nan_as_null(tmp_path):
  with Tracker(_config("jsonl"), str(tmp_path)) as tracker:
    for step in (1, 2):
      tracker.log(_metrics(step), step)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [row["step"] for row in rows] == [1, 2]
  assert rows[1] == {"step": 2, "critic/score/mean": 0.5, "response_length/mean": 12.0,
                     "timing_s/step": 1.5, "actor/pg_loss": None, "perf/total_num_tokens": 7.0}
  assert all(isinstance(v, float) for row in rows for k, v in row.items() if k != "step" and v is not None)


def test_console_line_and_progress_bar(tmp_path, capsys):
  keys = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "timing_s/step")
  with Tracker(_config("console"), str(tmp_path), total_steps=4, console_keys=keys) as tracker:
    tracker.log(_metrics(2), 2)
  out, err = capsys.readouterr()
  assert out.strip() == ("step 2/4 | critic/score/mean 0.5 | response_length/mean 12 | "
                         "actor/pg_loss nan | timing_s/step 1.5")
  assert "2/4" in err and "training" in err
  assert not (tmp_path / "metrics.jsonl").exists()


def test_non_scalar_metric_is_named(tmp_path):
  with Tracker(_config("jsonl"), str(tmp_path)) as tracker:
    with pytest.raises(TypeError, match="metric 'actor/entropy' must be a numeric scalar"):
      tracker.log({"actor/entropy": jnp.ones(3)}, 1)


def test_generations_to_jsonl_and_console(tmp_path, capsys):
  samples = [{"input": "1+1=", "output": "2", "score": jnp.asarray(1.0)},
             {"input": "2+2=", "output": "5", "score": 0.0}]
  with Tracker(_config("console", "jsonl"), str(tmp_path)) as tracker:
    tracker.log_generations(samples, step=3)
  rows = [json.loads(line) for line in open(tmp_path / "generations.jsonl")]
  assert rows == [{"step": 3, "input": "1+1=", "output": "2", "score": 1.0},
                  {"step": 3, "input": "2+2=", "output": "5", "score": 0.0}]
  out = capsys.readouterr().out
  assert "[validation generations, step 3]" in out and "input: 2+2= | output: 5 | score: 0.0" in out


def _read_events(path):
  """(tag, step, value) of every scalar in a TFRecord event file (tensorboardX's protos)."""
  from tensorboardX.proto import event_pb2
  scalars, texts = [], []
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
    pos += 12 + length + 4
    for value in event.summary.value:
      if value.HasField("simple_value"):
        scalars.append((value.tag, event.step, value.simple_value))
      else:
        texts.append((value.tag, event.step))
  return scalars, texts


def test_tensorboard_event_files(tmp_path):
  with Tracker(_config("tensorboard"), str(tmp_path)) as tracker:
    tracker.log(_metrics(1), 1)
    tracker.log(_metrics(2), 2)
    tracker.log_generations([{"input": "q", "output": "a"}], 2)
  files = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
  assert len(files) == 1
  scalars, texts = _read_events(files[0])
  assert ("critic/score/mean", 2, 0.5) in scalars
  assert ("response_length/mean", 1, 11.0) in scalars
  assert any(tag == "actor/pg_loss" and math.isnan(v) for tag, _, v in scalars)
  assert any(tag.startswith("val/generations") and step == 2 for tag, step in texts)


class _FakeWandb(types.ModuleType):
  """Records what the Tracker asks of wandb."""

  def __init__(self):
    super().__init__("wandb")
    self.calls = []

  def init(self, **kwargs):
    self.calls.append(("init", kwargs))
    return self

  def log(self, values, step):
    self.calls.append(("log", values, step))

  def finish(self):
    self.calls.append(("finish",))

  def Table(self, columns, data):  # noqa: N802 (wandb's name)
    return {"columns": columns, "data": data}


def test_wandb_backend_calls(tmp_path, monkeypatch):
  fake = _FakeWandb()
  monkeypatch.setitem(sys.modules, "wandb", fake)
  with Tracker(_config("wandb"), str(tmp_path)) as tracker:
    tracker.log(_metrics(1), 1)
    tracker.log_generations([{"input": "q", "output": "a"}], 1)
  (_, init), (_, values, step), (_, table, _), finish = fake.calls
  assert init["project"] == "proj" and init["name"] == "exp" and init["dir"] == str(tmp_path)
  assert init["config"]["trainer"]["project_name"] == "proj"
  assert step == 1 and values["critic/score/mean"] == 0.25 and isinstance(values["timing_s/step"], float)
  assert table["val/generations"]["columns"] == ["step", "input", "output"]
  assert finish == ("finish",)


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_missing_backend_package_names_the_key_and_fix(backend, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, backend, None)
  with pytest.raises(ImportError, match=f"trainer.logger includes '{backend}'.*pip install {backend}"):
    Tracker(_config("console", backend), str(tmp_path))


def test_unknown_logger_is_an_error(tmp_path):
  with pytest.raises(ValueError, match="trainer.logger=.*'swanlab'"):
    Tracker(_config("console", "swanlab"), str(tmp_path))


def test_real_mlflow_logs_verls_run_params_metrics_and_generations(tmp_path, monkeypatch, caplog):
  """The mlflow package itself on a local store (MLFLOW_TRACKING_URI): the experiment trainer.project_name, the
  run trainer.experiment_name, the config as '/'-joined parameters (lists as list_len and items), metric names
  mlflow rejects renamed as verl renames them (once warned), NaN kept, and a validation's generations as
  val_step{N}.json; MLFLOW_RUN_ID then resumes that run."""
  import mlflow  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
  monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no database store
  monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
  extra = {"val-core/gsm8k/reward/mean@4": 0.5, "a//b (c)": 1.0}
  with Tracker(_config("mlflow"), str(tmp_path / "run")) as tracker:
    run_id = mlflow.active_run().info.run_id
    for step in (1, 2):
      tracker.log({**_metrics(step), **extra}, step)
    tracker.log_generations([{"input": "q", "output": "a", "score": np.float32(1.0)}], 2)
  assert mlflow.active_run() is None
  client = mlflow.tracking.MlflowClient()
  run = client.get_run(run_id)
  assert run.info.run_name == "exp" and client.get_experiment(run.info.experiment_id).name == "proj"
  params = run.data.params
  assert params["trainer/project_name"] == "proj" and params["trainer/total_epochs"] == "30"
  assert params["trainer/logger/list_len"] == "1" and params["trainer/logger/0"] == "mlflow"
  assert [(m.step, m.value) for m in client.get_metric_history(run_id, "critic/score/mean")] == [(1, 0.25), (2, 0.5)]
  assert math.isnan(client.get_metric_history(run_id, "actor/pg_loss")[0].value)
  assert client.get_metric_history(run_id, "val-core/gsm8k/reward/mean_at_4")[0].value == 0.5
  assert client.get_metric_history(run_id, "a/b _c_")[0].value == 1.0
  assert sum("is logged as" in r.getMessage() for r in caplog.records) == 2  # once per renamed metric
  generations = json.loads(open(client.download_artifacts(run_id, "val_step2.json", str(tmp_path))).read())
  assert generations == [{"input": "q", "output": "a", "score": 1.0}]
  monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
  with Tracker(_config("mlflow"), str(tmp_path / "run")) as tracker:
    tracker.log({"critic/score/mean": 0.75}, 3)
  assert [m.step for m in client.get_metric_history(run_id, "critic/score/mean")] == [1, 2, 3]


def test_only_process_zero_writes(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with Tracker(_config("console", "jsonl", "tensorboard"), str(tmp_path / "run"), 3) as tracker:
    tracker.log(_metrics(1), 1)
    tracker.log_generations([{"input": "q"}], 1)
  assert not (tmp_path / "run").exists()
  assert capsys.readouterr() == ("", "")


def test_plot_curves_png(tmp_path):
  with Tracker(_config("jsonl"), str(tmp_path)) as tracker:
    for step in range(1, 21):
      tracker.log({"critic/score/mean": 1 - 0.9 ** step, "response_length/mean": 100 + 3 * step,
                   "timing_s/step": 1.0}, step)
  out = plot_curves(str(tmp_path / "metrics.jsonl"), str(tmp_path / "plots" / "curves.png"))
  with open(out, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  from PIL import Image
  image = np.asarray(Image.open(out).convert("L"))
  assert image.shape == (360, 1000)
  left, right = image[:, :500], image[:, 500:]
  # Each panel has a coloured (non-white, non-black) curve.
  colour = np.asarray(Image.open(out).convert("RGB")).astype(int)
  blue = (colour[..., 2] - colour[..., 0]) > 80
  assert blue[:, :500].sum() > 100 and blue[:, 500:].sum() > 100
  assert left.min() < 128 and right.min() < 128


def test_plot_curves_errors_name_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.jsonl"):
    plot_curves(str(tmp_path / "missing.jsonl"), str(tmp_path / "x.png"))
  path = tmp_path / "m.jsonl"
  path.write_text(json.dumps({"step": 1, "actor/pg_loss": 0.1}) + "\n")
  with pytest.raises(ValueError, match="m.jsonl has no values"):
    plot_curves(str(path), str(tmp_path / "x.png"))


def test_real_wandb_in_offline_mode_writes_a_local_run(tmp_path, monkeypatch):
  """The wandb package itself, WANDB_MODE=offline, no network: the run lands under run_dir/wandb/."""
  import wandb  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  with Tracker(_config("wandb"), str(tmp_path)) as tracker:
    run = tracker._wandb  # pylint: disable=protected-access
    tracker.log(_metrics(1), 1)
    tracker.log(_metrics(2), 2)
    tracker.log_generations([{"input": "q", "output": "a"}], 2)
    assert run.offline and run.project == "proj" and run.name == "exp"
    # wandb commits a step's row when a later step arrives: step 1's values are in.
    assert run.summary["critic/score/mean"] == pytest.approx(0.25)
    assert run.summary["perf/total_num_tokens"] == 7
  runs = list((tmp_path / "wandb").glob("offline-run-*"))
  assert len(runs) == 1 and list(runs[0].glob("*.wandb")), runs
  assert wandb.run is None  # finished
