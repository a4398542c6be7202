"""A run whose data file is missing or not parquet, whose data lack a column it reads, or whose tokenizer does not
load ends before any work as a config error does: one line naming the key, the file, what is there and the fix,
with status 2, and no traceback (`rljax.data.preflight`, `rljax.rl.trainer.load_tokenizer`)."""


import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import config as config_lib
from rljax.data import ensure_synthetic_data, preflight
from tests import processes
from tests.rl import tiny_run


def rl_config(data_dir, *overrides):
  config = config_lib.load_config_file(str(tiny_run.ROOT / "configs" / "grpo.py"))
  config_lib.apply_overrides(config, [f"data.train_files={data_dir}/train.parquet",
                                      f"data.val_files={data_dir}/test.parquet", *overrides])
  return config


def test_data_files_are_there_parquet_and_hold_the_columns_the_run_reads(data_dir, tmp_path):
  ensure_synthetic_data(data_dir)
  preflight.check_rl_data(rl_config(data_dir))
  pq.write_table(pa.table({"data_source": ["a"], "prompt": [[{"role": "user", "content": "hi"}]]}),
                 tmp_path / "no_reward.parquet")
  (tmp_path / "notes.parquet").write_text("not parquet")
  cases = [
      ([f"data.train_files={tmp_path}/missing.parquet"],
       f"data.train_files='{tmp_path}/missing.parquet': {tmp_path}/missing.parquet does not exist. Fix: point "
       "data.train_files at parquet files"),
      ([f"data.val_files=[{data_dir}/test.parquet,{tmp_path}/notes.parquet]"],
       f"data.val_files=.*: {tmp_path}/notes.parquet is not a parquet file"),
      (["data.prompt_key=question"],
       f"data.prompt_key='question': {data_dir}/train.parquet has no such column; its columns: \\['data_source', "
       "'prompt'.*Fix: set data.prompt_key to one of its columns"),
      ([f"data.train_files={tmp_path}/no_reward.parquet"],
       f"data.train_files=.*: {tmp_path}/no_reward.parquet has no column 'reward_model' \\(verl's format needs it\\)"),
  ]
  for overrides, match in cases:
    with pytest.raises(config_lib.ConfigError, match=match):
      preflight.check_rl_data(rl_config(data_dir, *overrides))


@pytest.mark.parametrize("override,told", [
    ("data.train_files=/nonexistent/train.parquet", "config error: data.train_files='/nonexistent/train.parquet': "
                                                    "/nonexistent/train.parquet does not exist"),
    ("data.prompt_key=question", "config error: data.prompt_key='question': "),
    ("data.tokenizer=/nonexistent", "config error: data.tokenizer='/nonexistent': its tokenizer does not load"),
])
def test_a_bad_input_ends_the_run_in_one_line_with_status_2(model_dir, data_dir, override, told):
  ensure_synthetic_data(data_dir)
  result = processes.run(["-m", "rljax.train", "--config=configs/grpo.py", f"actor_rollout_ref.model.path={model_dir}",
                          f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
                          override], devices=1, cwd=tiny_run.ROOT, timeout=300)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1].startswith(told), result.stderr[-3000:]


def test_sft_data_hold_the_columns_the_sft_run_reads(tmp_path):
  pq.write_table(pa.table({"question": ["1+1"], "extra_info": [{"answer": "2"}]}), tmp_path / "sft.parquet")
  config = config_lib.load_config_file(str(tiny_run.ROOT / "configs" / "sft.py"))
  config.data.train_files, config.data.val_files = str(tmp_path / "sft.parquet"), None
  with pytest.raises(config_lib.ConfigError, match=f"data.prompt_key='prompt': {tmp_path}/sft.parquet has no such "
                                                   "column; its columns: \\['question', 'extra_info'\\]"):
    preflight.check_sft_data(config)
  config.data.prompt_key = "question"
  preflight.check_sft_data(config)
  config.data.multiturn.enable = True
  with pytest.raises(config_lib.ConfigError, match="data.multiturn.messages_key='messages'"):
    preflight.check_sft_data(config)
