"""The trainer's numbers across restructurings: each variant of `tests/rl/golden.py` logs the per-step metrics
recorded in tests/rl/golden_metrics.json (timings and throughputs aside).

The JSON was written by `python -m tests.rl.golden tests/rl/golden_metrics.json` before the trainer was split
into rollout sources, scoring and stages, and that split reproduced it bit for bit on the machine that wrote it.
It was written again when the advantage stage became one jitted program (XLA fuses its sums: 178 of the 1,609
numbers moved in their last bits, 3 near-zero rollout_corr diagnostics by up to 3.5e-4); placing a step's rows
once then reproduced that file bit for bit. Here the values compare at rtol 1e-4: another CPU may round a float32
sum in another order.
"""

import json
import pathlib

import pytest

from tests.rl import golden


@pytest.fixture(scope="module")
def expected():
  return json.loads(golden.GOLDEN.read_text())


@pytest.fixture(scope="module")
def model_dirs(model_dir, moe_dir, reward_model_dir):
  return {"model": model_dir, "moe": moe_dir, "reward_model": reward_model_dir}


# each variant is 2-3 tiny steps (about 5 s); together they are what a restructuring of the trainer must keep
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(golden.VARIANTS))
def test_each_trainer_variant_logs_its_golden_metrics(name, expected, model_dirs, data_dir, tmp_path):
  golden.assert_golden(golden.variant_metrics(name, model_dirs, data_dir, tmp_path / "run"), expected[name], name)


def test_the_golden_file_holds_every_variant():
  assert sorted(json.loads(pathlib.Path(golden.GOLDEN).read_text())) == sorted(golden.VARIANTS)
