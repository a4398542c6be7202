"""SFT as two processes (`jax.distributed` over gloo) logs the losses of one process with the same devices."""

import pytest

from tests import processes
from tests.sft import helpers


@pytest.mark.slow  # two SFT runs: one of 2 processes, one of 1
def test_sft_as_two_processes_logs_the_metrics_of_one(tmp_path):
  model_dir = helpers.tiny_model_dir(tmp_path / "model")
  data = helpers.data_dir(tmp_path / "data")
  argv = ["-m", "rljax.sft", "--config=configs/sft.py", f"model.partial_pretrain={model_dir}",
          f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet", "data.prompt_key=question",
          "data.response_key=answer", "data.response_dict_keys=null", "data.max_length=24", "data.train_batch_size=16",
          "data.micro_batch_size_per_gpu=1", "optim.lr=1e-2", "optim.warmup_steps_ratio=0.0",
          "trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
          "trainer.n_gpus_per_node=auto"]
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one"], 1, f"{tmp_path}/one")
  two = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/two"], 2, f"{tmp_path}/two")
  assert [m["step"] for m in one] == [1, 2, 3] and "val/loss" in one[-1]
  processes.assert_same_metrics(one, two)
