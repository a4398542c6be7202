"""python -m rljax.eval: scores, per-source metrics and pass@k against hand-computed values; bad input."""

import itertools
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import config as config_lib
from rljax import eval as eval_cli
from rljax.evaluation import config as eval_config
from rljax.evaluation import scoring

ROOT = pathlib.Path(__file__).resolve().parents[2]
EVAL_CONFIG = f"--config={ROOT / 'configs' / 'eval.py'}"
ARITH, GSM8K = "rljax/arithmetic", "openai/gsm8k"


def row(source, truth, responses, **extra):
  return {"data_source": source, "prompt": [{"role": "user", "content": "q"}],
          "reward_model": {"style": "rule", "ground_truth": truth}, "responses": responses, **extra}


# Scores by the rules (arithmetic: last number equals the truth; gsm8k strict: "#### N" equals it).
HAND_ROWS = [
    row(ARITH, "5", ["the answer is 5", "7", "no number"]),   # 1, 0, 0
    row(GSM8K, "12", ["#### 12", "#### 13"]),                 # 1, 0
    row(ARITH, "5", ["5", "5.0", "3"]),                       # 1, 1, 0
    row(GSM8K, "12", ["so 12", "then #### 12"]),              # 0, 1 (strict needs ####)
    row(ARITH, "-4", ["x", "y", "z"]),                        # 0, 0, 0
]
HAND_SCORES = [[1, 0, 0], [1, 0], [1, 1, 0], [0, 1], [0, 0, 0]]


def write(rows, path):
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)


def eval_config_for(path, *overrides):
  config = config_lib.load_config_file(str(ROOT / "configs" / "eval.py"))
  config_lib.apply_overrides(config, [f"data.path={path}", *overrides])
  return eval_config.validate_eval(config)


def pass_by_enumeration(passed, m):
  """Fraction of the m-subsets of one prompt's responses holding a pass (no formula)."""
  subsets = list(itertools.combinations(passed, m))
  return sum(any(s) for s in subsets) / len(subsets)


def test_scores_and_metrics_match_hand_values(tmp_path):
  path = write(HAND_ROWS, tmp_path / "hand.parquet")
  report = scoring.evaluate(eval_config_for(path))
  assert report["scores"] == HAND_SCORES
  arith, gsm = report["data_sources"][ARITH], report["data_sources"][GSM8K]
  assert (arith["prompts"], arith["k"], gsm["prompts"], gsm["k"]) == (3, 3, 2, 2)
  # arithmetic: per-prompt means 1/3, 2/3, 0; bests 1, 1, 0; passes c = 1, 2, 0 of 3.
  assert arith["mean@3"] == pytest.approx(1 / 3)
  assert arith["std@3"] == pytest.approx(2 * np.sqrt(2 / 9) / 3)
  assert arith["best@3"] == pytest.approx(2 / 3)
  assert arith["pass@1"] == pytest.approx(1 / 3)
  assert arith["pass@2"] == pytest.approx((2 / 3 + 1 + 0) / 3)
  assert arith["pass@3"] == pytest.approx(2 / 3)
  assert sorted(k for k in arith if k.startswith("pass@")) == ["pass@1", "pass@2", "pass@3"]
  # gsm8k: [1, 0] and [0, 1].
  assert (gsm["mean@2"], gsm["std@2"], gsm["best@2"], gsm["pass@1"], gsm["pass@2"]) == pytest.approx(
      (0.5, 0.5, 1.0, 0.5, 1.0))
  metrics = report["metrics"]
  assert metrics[f"test_score/{ARITH}"] == pytest.approx(1 / 3)
  assert metrics[f"val-core/{GSM8K}/reward/mean@2"] == pytest.approx(0.5)
  assert metrics[f"val-aux/{ARITH}/reward/best@3/mean"] == pytest.approx(2 / 3)
  assert metrics[f"val-aux/{ARITH}/reward/pass@2"] == pytest.approx(5 / 9)


def test_pass_at_m_is_the_subset_fraction():
  rng = np.random.default_rng(0)
  scores = rng.choice([0.0, 0.5, 1.0], size=(7, 6))
  got = scoring.source_metrics(scores, threshold=0.5)
  for m in (1, 2, 4, 6):
    expected = np.mean([pass_by_enumeration(list(r >= 0.5), m) for r in scores])
    assert got[f"pass@{m}"] == pytest.approx(expected), m
  assert "pass@3" not in got and "pass@5" not in got


def test_custom_reward_dict_scores_kwargs_and_threshold(tmp_path):
  reward = tmp_path / "reward.py"
  reward.write_text(
      "def my_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
      "  return {'score': scale * len(solution_str) / 10, 'source': data_source, 'idx': extra_info['index']}\n")
  rows = [row("my/task", "-", ["a", "abcde", "ab"], extra_info={"index": 0}),
          row("my/task", "-", ["abcd", "abc", "abcdef"], extra_info={"index": 1})]
  path = write(rows, tmp_path / "custom.parquet")
  out = tmp_path / "report.json"
  status = eval_cli.main([EVAL_CONFIG, f"data.path={path}", f"data.output_path={out}",
                          f"custom_reward_function.path={reward}", "custom_reward_function.name=my_score",
                          "+custom_reward_function.reward_kwargs.scale=2.0", "--config.eval.pass_threshold=0.7"])
  assert status == 0
  report = json.loads(out.read_text())
  scores = [[0.2, 1.0, 0.4], [0.8, 0.6, 1.2]]
  np.testing.assert_allclose(report["scores"], scores)
  group = report["data_sources"]["my/task"]
  assert group["mean@3"] == pytest.approx(np.mean(scores))
  assert group["best@3"] == pytest.approx((1.0 + 1.2) / 2)
  assert group["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
  assert group["pass@3"] == pytest.approx(1.0)


def test_table_prints_one_line_per_source(tmp_path, capsys):
  path = write(HAND_ROWS, tmp_path / "hand.parquet")
  assert eval_cli.main([EVAL_CONFIG, f"data.path={path}"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0].split() == ["data_source", "prompts", "k", "mean@k", "best@k", "pass@1", "pass@k"]
  assert lines[1].split() == [GSM8K, "2", "2", "0.5000", "1.0000", "0.5000", "1.0000"]
  assert lines[2].split() == [ARITH, "3", "3", "0.3333", "0.6667", "0.3333", "0.6667"]
  assert (tmp_path / "hand-eval.json").is_file()


@pytest.mark.parametrize("rows, drop, needles", [
    (HAND_ROWS, "reward_model", ["'reward_model' (data.reward_model_key)", "not found"]),
    ([HAND_ROWS[0], row(ARITH, "5", [])], None, ["row 1", "'responses'", "non-empty list"]),
    ([HAND_ROWS[0], HAND_ROWS[2], row("my/task", "1", ["1", "2", "3"])], None,
     ["row 2", "'data_source'", "'my/task'", "custom_reward_function.path"]),
    ([HAND_ROWS[0], row(ARITH, "5", ["5", "5"])], None, ["row 1", "2 responses", "row 0", "has 3"]),
    ([HAND_ROWS[0], {**HAND_ROWS[2], "reward_model": {"style": "rule"}}], None,
     ["row 1", "'reward_model'", "ground_truth"]),
])
def test_bad_rows_name_row_and_column(tmp_path, rows, drop, needles):
  table = pa.Table.from_pylist(rows)
  if drop:
    table = table.drop_columns([drop])
  path = tmp_path / "bad.parquet"
  pq.write_table(table, path)
  with pytest.raises((KeyError, ValueError)) as info:
    scoring.evaluate(eval_config_for(str(path)))
  message = str(info.value)
  assert str(path) in message
  for needle in needles:
    assert needle in message


def test_cli_reports_bad_input_and_bad_keys(tmp_path, capsys):
  path = write([HAND_ROWS[0], row(ARITH, "5", [])], tmp_path / "bad.parquet")
  assert eval_cli.main([EVAL_CONFIG, f"data.path={path}"]) == 1
  assert "row 1" in capsys.readouterr().err
  assert eval_cli.main([EVAL_CONFIG, "data.respons_key=out"]) == 2
  assert "did you mean data.response_key" in capsys.readouterr().err
  assert eval_cli.main([EVAL_CONFIG, "data.response_key="]) == 2
  assert "data.response_key" in capsys.readouterr().err
  assert not (tmp_path / "bad-eval.json").exists()
