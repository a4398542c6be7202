"""The default job's own sizes on 8 devices: `trainer.n_gpus_per_node=auto` finds them and the unset micro-batch
splits the mini-batch (a Colab TPU, a v5e-8 / v6e-8 VM, or 8 virtual CPU devices), with the tiny model in place of
SmolLM2-135M so that the run takes seconds."""

import json

import pytest
import yaml

from rljax.data import ensure_synthetic_data
from tests import processes
from tests.rl import tiny_run


@pytest.mark.slow
def test_default_job_trains_on_eight_devices(model_dir, data_dir, tmp_path):
  ensure_synthetic_data(data_dir)
  run_dir = tmp_path / "run"
  result = processes.run(
      ["-m", "rljax.train", "--config=configs/grpo.py", f"actor_rollout_ref.model.path={model_dir}",
       f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
       "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.logger=[console,jsonl]",
       f"trainer.default_local_dir={run_dir}"], devices=8, cwd=tiny_run.ROOT, timeout=600, merged=True)
  assert result.returncode == 0, result.stdout[-3000:]
  config = yaml.safe_load((run_dir / "config.yaml").read_text())
  assert config["trainer"]["n_gpus_per_node"] == "auto"
  assert config["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] == 4 * 4 // 8
  steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [s["step"] for s in steps] == [1, 2] and all(s["actor/grad_norm"] > 0 for s in steps)
  # the console: the bar, the step lines and what rljax says where the run went, none of the libraries' INFO logs
  # (orbax's checkpointing printed 64 lines before and between them); a checkpoint was written
  assert (run_dir / "global_step_2").is_dir()
  lines = [line for line in result.stdout.replace("\r", "\n").splitlines() if line.strip()]
  assert [line for line in lines if line.startswith("step ")][:1] and not [
      line for line in lines if line[:1] == "I" and line[1:5].isdigit()], "\n".join(lines)
