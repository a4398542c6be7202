"""The offline arithmetic task: schema, determinism, difficulty, scoring."""

import ast
import operator
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from rljax import data
from rljax import rewards
from rljax import config as C
from rljax import train
from rljax.config import get_base_config
from rljax.sft.config import get_sft_config
from rljax.data import synthetic
from rljax.data.synthetic import arithmetic
from rljax.sft import data as sft_data
from rljax.rl import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression):
  """An independent evaluator for +, -, * and parentheses over integers."""

  def value(node):
    if isinstance(node, ast.BinOp):
      return _OPS[type(node.op)](value(node.left), value(node.right))
    assert isinstance(node, ast.Constant) and isinstance(node.value, int)
    return node.value

  return value(ast.parse(expression, mode="eval").body)


SCHEMA_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def test_cli_writes_verl_schema(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "rljax.data.synthetic", "arithmetic",
       "--local_dir", str(tmp_path), "--train_size", "30", "--test_size", "7",
       "--difficulty", "1,2", "--seed", "3"],
      check=True, capture_output=True, text=True)
  assert out.stdout.split() == [str(tmp_path / "train.parquet"),
                                str(tmp_path / "test.parquet")]
  train = pq.read_table(tmp_path / "train.parquet")
  assert train.num_rows == 30 and pq.read_table(tmp_path / "test.parquet").num_rows == 7
  assert train.column_names == SCHEMA_COLUMNS
  row = train.to_pylist()[0]
  assert row["data_source"] == synthetic.DATA_SOURCE
  assert [set(m) for m in row["prompt"]] == [{"role", "content"}]
  assert set(row["reward_model"]) == {"style", "ground_truth"}
  assert row["extra_info"]["split"] == "train"
  assert set(row["extra_info"]) == {"split", "index", "difficulty", "expression",
                                    "question", "answer", "solution"}


def test_deterministic_for_a_seed():
  a = synthetic.make_rows("train", 50, (1, 3, 5), "mixed", seed=1)
  assert a == synthetic.make_rows("train", 50, (1, 3, 5), "mixed", seed=1)
  assert a != synthetic.make_rows("train", 50, (1, 3, 5), "mixed", seed=2)
  assert a != synthetic.make_rows("test", 50, (1, 3, 5), "mixed", seed=1)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_ground_truth_is_the_expression_value(level):
  for row in synthetic.make_rows("train", 40, (level,), "arithmetic"):
    info = row["extra_info"]
    assert info["difficulty"] == level
    value = calculate(info["expression"])
    assert str(value) == row["reward_model"]["ground_truth"]
    assert value >= 0
    assert row["prompt"][0]["content"].startswith(f"What is {info['expression']}?")


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_solution_works_the_expression_to_the_answer(level):
  for row in synthetic.make_rows("train", 40, (level,), "mixed"):
    info = row["extra_info"]
    steps = info["solution"].split(" = ")
    assert steps[0] == info["expression"] and steps[-1] == info["answer"]
    # one step per operation: a + b = c; a * b + c = ab + c = d
    assert len(steps) == 1 + len(info["expression"].split()) // 2
    assert all(calculate(step) == int(info["answer"]) for step in steps)


def test_existing_fields_keep_their_values():
  row = synthetic.make_rows("test", 1, (1, 2), "word")[0]
  assert row["prompt"][0]["content"] == (
      "Priya has 6 coins. Priya gets 9 more coins. How many coins does Priya "
      "have now? Reply with just the final number.")
  assert row["extra_info"] == {
      "split": "test", "index": 0, "difficulty": 2, "expression": "6 + 9",
      "question": row["prompt"][0]["content"].removesuffix(
          " " + arithmetic.INSTRUCTION),
      "answer": "15", "solution": "6 + 9 = 15"}


def test_level_one_is_one_digit_addition():
  for row in synthetic.make_rows("train", 200, (1,)):
    a, op, b = row["extra_info"]["expression"].split()
    assert op == "+" and 1 <= int(a) <= 9 and 1 <= int(b) <= 9


def test_word_problems_contain_the_operands():
  for row in synthetic.make_rows("train", 20, (2,), "word"):
    numbers = row["extra_info"]["expression"].replace("-", " ").replace("+", " ").split()
    question = row["extra_info"]["question"]
    assert question.endswith("?") and not question.startswith("What is")
    assert all(n in question for n in numbers)


def test_scorer_accepts_the_ground_truth():
  for row in synthetic.make_rows("test", 20, (1, 2, 3, 4, 5), "mixed"):
    truth = row["reward_model"]["ground_truth"]
    assert rewards.default_compute_score(row["data_source"], truth, truth) == 1.0
    assert rewards.default_compute_score(
        row["data_source"], str(int(truth) + 1), truth) == 0.0


def test_bad_arguments():
  with pytest.raises(ValueError, match="levels"):
    arithmetic.parse_levels("0,9")
  with pytest.raises(ValueError, match="style"):
    synthetic.make_rows("train", 1, (1,), "poetry")
  with pytest.raises(ValueError, match="unknown synthetic task"):
    synthetic.generate("/tmp/unused", task="chess")


def test_ensure_generates_only_when_absent(tmp_path):
  paths = data.ensure_synthetic_data(str(tmp_path), train_size=10, test_size=5)
  stamps = [os.stat(p).st_mtime_ns for p in paths]
  assert data.ensure_synthetic_data(str(tmp_path), train_size=99) == paths
  assert [os.stat(p).st_mtime_ns for p in paths] == stamps
  assert pq.read_table(paths[0]).num_rows == 10


def test_word_default_directory_generates_on_first_use(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  path = os.path.join(synthetic.WORD_LOCAL_DIR, "test.parquet")
  synthetic.maybe_generate_default(path)
  rows = pq.read_table(os.path.expanduser(path)).to_pylist()
  assert {r["extra_info"]["difficulty"] for r in rows} == {1, 2}
  assert all(not r["extra_info"]["question"].startswith("What is") for r in rows)
  synthetic.maybe_generate_default(str(tmp_path / "elsewhere" / "test.parquet"))
  assert not os.path.exists(tmp_path / "elsewhere")


def test_sft_on_a_file_without_solution_says_how_to_regenerate(tmp_path,
                                                                tokenizer):
  rows = synthetic.make_rows("train", 2, (1,))
  for row in rows:
    del row["extra_info"]["solution"]
  path = str(tmp_path / "old" / "train.parquet")
  arithmetic.write_parquet(rows, path)
  config = get_sft_config().data
  config.update(prompt_key="prompt", response_key="extra_info",
                response_dict_keys=["solution"])
  with pytest.raises(KeyError, match=(
      r"old/train\.parquet row \d: extra_info has no key 'solution' .*Fix: .*"
      r"python -m rljax\.data\.synthetic arithmetic --local_dir DIR")):
    sft_data.SFTDataset(path, tokenizer, config)[0]


def test_default_paths_generate_on_first_use(tmp_path, monkeypatch, tokenizer):
  monkeypatch.setenv("HOME", str(tmp_path))
  config = get_base_config()
  config.data.update(train_files="~/data/rljax/arithmetic/train.parquet",
                     val_files="~/data/rljax/arithmetic/test.parquet",
                     train_batch_size=4, max_prompt_length=32,
                     truncation="left")
  batches = data.make_val_batches(config, tokenizer)
  assert os.path.isfile(tmp_path / "data/rljax/arithmetic/train.parquet")
  assert batches[0]["input_ids"].shape == (500, 32)


def test_the_trainers_job_check_writes_the_default_data_before_reading_it(tmp_path, monkeypatch):
  """A fresh machine: `python -m rljax.train --config=configs/grpo.py` checks the data sources of files the
  synthetic task writes on first use."""
  monkeypatch.setenv("HOME", str(tmp_path))
  config = train.resolve(C.load_config_file(os.path.join(ROOT, "configs", "grpo.py")), [], device_count=1)
  trainer.check_job(config)
  assert os.path.isfile(tmp_path / "data/rljax/arithmetic/train.parquet")


def test_the_shapes_task_draws_what_its_answer_names_and_scores_the_two_words(tmp_path):
  import io

  import pyarrow.parquet as pq
  from PIL import Image

  from rljax.data.synthetic import shapes
  from rljax.rewards.default import scorer_for
  paths = shapes.generate(str(tmp_path / "a"), train_size=24, test_size=4, seed=3)
  again = shapes.generate(str(tmp_path / "b"), train_size=24, test_size=4, seed=3)
  assert all(pq.read_table(p).equals(pq.read_table(q)) for p, q in zip(paths, again))  # the same seed, the same files
  rows = pq.read_table(paths[0]).to_pylist()
  assert len({r["reward_model"]["ground_truth"] for r in rows}) > 6
  for row in rows:
    colour, shape = row["reward_model"]["ground_truth"].split()
    image = Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")
    pixels = {p for p in image.getdata() if p != (255, 255, 255)}
    assert pixels == {shapes.COLOURS[colour]}, row["extra_info"]  # one colour on white, the named one
    assert row["prompt"][0]["content"].count("<image>") == 1 and row["data_source"] == "rljax/shapes"
  sft = pq.read_table(paths[2]).to_pylist()
  assert [r["answer"] for r in sft] == [r["reward_model"]["ground_truth"] for r in rows]
  score = scorer_for("rljax/shapes")
  assert score("Red circle.", "red circle") == 1.0
  assert score("a red circle", "red circle") == score("red square", "red circle") == score("", "red circle") == 0.0
