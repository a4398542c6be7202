"""DAPO's dynamic sampling (algorithm.filter_groups): which groups are kept, how rounds join, and the trainer's
generation rounds on the tiny model."""

import logging

import numpy as np
import pytest

from rljax import config as config_lib
from rljax.rl import dynamic_sampling
from rljax.rl.experience import Experience
from tests.rl import tiny_run


def test_only_groups_whose_metric_varies_are_kept():
  # four prompts x 2 responses: all right, all wrong, mixed, mixed; then a prompt with a single response
  acc = np.array([1, 1, 0, 0, 1, 0, 0, 1, 1], np.float64)
  groups = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4])
  assert dynamic_sampling.kept_rows(acc, groups).tolist() == [False, False, False, False, True, True, True, True,
                                                             True]
  scores = np.array([0.5, 0.5 + 1e-9, 0.2, 0.2])  # any spread counts, as np.std > 0 does in verl
  assert dynamic_sampling.kept_rows(scores, np.array([7, 7, 9, 9])).tolist() == [True, True, False, False]


def test_metric_values_read_scores_or_the_reward_functions_extra_info():
  rows = Experience(token_level_scores=np.array([[0.0, 1.0], [0.5, -0.25]], np.float32),
                    reward_components={"acc": np.array([1.0, 0.0], np.float32)})
  np.testing.assert_allclose(dynamic_sampling.metric_values(rows, "seq_reward"), [1.0, 0.25])
  np.testing.assert_allclose(dynamic_sampling.metric_values(rows, "seq_final_reward"), [1.0, 0.25])
  np.testing.assert_allclose(dynamic_sampling.metric_values(rows, "acc"), [1.0, 0.0])
  with pytest.raises(ValueError, match=r"metric='pred'.*extra info: \['acc'\].*seq_reward"):
    dynamic_sampling.metric_values(rows, "pred")


def test_rounds_join_into_exactly_the_wanted_groups_renumbered():
  # a component only the first round's scorer returned ("format") is left out
  first = Experience(responses=np.array([[1], [2], [3], [4]]), group=np.array([3, 3, 4, 4]),
                     reward_components={"acc": np.array([1.0, 0.0, 1.0, 1.0]), "format": np.array([1.0, 0, 0, 0])})
  second = Experience(responses=np.array([[5], [6], [7], [8]]), group=np.array([0, 0, 2, 2]),
                      reward_components={"acc": np.array([0.0, 1.0, 1.0, 1.0])})
  keeps = [np.array([True, True, False, False]), np.array([True, True, True, True])]
  rows = dynamic_sampling.join_rounds([first, second], keeps, groups_wanted=2, group_size=2)
  assert rows.responses.ravel().tolist() == [1, 2, 5, 6] and rows.group.tolist() == [0, 0, 1, 1]
  assert rows.present() == ("responses", "group", "reward_components")
  assert list(rows.reward_components) == ["acc"] and rows.reward_components["acc"].tolist() == [1.0, 0.0, 0.0, 1.0]


def test_kept_rows_of_several_hosts_are_ordered_as_one_process_generates_them():
  # 2 hosts x 2 rounds x 2 rows, numbered host by host: round 0 is rows 0, 1 (host 0) then 4, 5 (host 1)
  keeps = np.array([[[True, False], [True, True]], [[False, True], [True, False]]])
  assert dynamic_sampling.kept_order(keeps).tolist() == [0, 5, 2, 3, 6]


@pytest.mark.parametrize("overrides,match", [
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=null"],
     "algorithm.filter_groups.metric=None"),
    (["data.gen_batch_size=3"], r"data.gen_batch_size=3: does not divide data.train_batch_size \(4\).*"
                                "trainer.use_v1=false to train on gen_batch_size prompts"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward",
      "algorithm.use_kl_in_reward=true"], "metric='seq_final_reward': the final reward with use_kl_in_reward"),
])
def test_bad_dynamic_sampling_settings_name_their_key(overrides, match):
  config = config_lib.load_config_file(str(tiny_run.ROOT / "configs" / "grpo.py"))
  config_lib.apply_overrides(config, overrides)
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(config_lib.finalize(config, device_count=1), 1)


@pytest.mark.parametrize("overrides,prompts", [
    (["data.gen_batch_size=2"], 4),  # V1 sync: a step's 4 prompts come in chunks of 2
    (["data.gen_batch_size=8", "trainer.v1.trainer_mode=colocate_async"], 4),  # verl streams prompt by prompt
    (["data.gen_batch_size=8", "trainer.use_v1=false"], 8),  # the legacy trainer trains every loaded prompt
    (["data.gen_batch_size=8", "trainer.use_v1=false", "algorithm.filter_groups.enable=true",
      "algorithm.filter_groups.metric=acc"], 4),  # dynamic sampling: rounds of 8 prompts, 4 groups kept
])
def test_gen_batch_size_without_dynamic_sampling_is_read_as_verl_0_9_1_reads_it(overrides, prompts):
  config = config_lib.load_config_file(str(tiny_run.ROOT / "configs" / "grpo.py"))
  config_lib.apply_overrides(config, ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                      *overrides])
  config = config_lib.validate(config_lib.finalize(config, device_count=1), 1)
  assert config.data.train_batch_size == prompts


def run(model_dir, data_dir, run_dir, *extra):
  return tiny_run.fit_metrics(tiny_run.run_config("dapo", model_dir, data_dir, run_dir, *extra))


SCORE_BY_TEXT = """
import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  return float(zlib.crc32(solution_str.encode()) % 2)
"""


@pytest.mark.slow
def test_dapo_trains_on_kept_groups_of_generation_rounds(model_dir, data_dir, tmp_path):
  # a score that is 0 or 1 by the response's text: some groups mixed (kept), some not (dropped); the dapo
  # manager reports the plain score as "acc", the experiment's filter metric
  scorer = tmp_path / "score.py"
  scorer.write_text(SCORE_BY_TEXT)
  history = run(model_dir, data_dir, str(tmp_path / "run"), f"custom_reward_function.path={scorer}",
                "data.gen_batch_size=2", "data.train_max_samples=6", "trainer.total_epochs=10")
  assert [m["step"] for m in history] == [1, 2]
  read = np.cumsum([m["train/num_gen_batches"] for m in history])
  # 3 batches of 2 prompts an epoch: step 2 has read at least 4 batches, so it is in the second epoch
  assert [m["training/epoch"] for m in history] == [(r - 1) // 3 for r in read] and history[1]["training/epoch"] >= 1
  for m in history:
    assert m["train/num_gen_batches"] >= 2 and m["train/kept_groups"] >= 4
    assert m["train/kept_groups"] + m["train/filtered_groups"] == 2 * m["train/num_gen_batches"]
    assert m["critic/score/mean"] not in (0.0, 1.0) and np.isfinite(m["actor/pg_loss"])


def test_too_many_rounds_stop_with_verls_error(model_dir, data_dir, tmp_path):
  with pytest.raises(ValueError, match="num_gen_batches=2 >= max_num_gen_batches=2"):
    run(model_dir, data_dir, str(tmp_path / "run"), "algorithm.filter_groups.max_num_gen_batches=2",
        "trainer.total_training_steps=1")


def test_data_ending_inside_a_step_stops_the_run_with_a_warning(model_dir, data_dir, tmp_path, caplog):
  # the random model scores 0 everywhere, so no group is ever kept: with no round limit the first step reads
  # all 3 batches of 2 prompts and then finds the data ended
  with caplog.at_level(logging.WARNING, logger="rljax.training.loop"):
    history = run(model_dir, data_dir, str(tmp_path / "run"), "data.gen_batch_size=2", "data.train_max_samples=6",
                  "trainer.total_epochs=1", "trainer.total_training_steps=null",
                  "algorithm.filter_groups.max_num_gen_batches=0")
  assert history == []
  assert any("the training data ended inside step 1" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_dapo_streams_under_colocate_async_judging_each_group_as_it_ends(model_dir, data_dir, tmp_path):
  # the same scorer, streamed: groups are scored as they finish, the uniform ones give their slots to the next
  # prompts, and each update trains a batch of mixed groups
  scorer, calls = tmp_path / "score.py", tmp_path / "calls"
  scorer.write_text(SCORE_BY_TEXT.replace("  return", f"  open({str(calls)!r}, 'a').write('.')\n  return"))
  history = run(model_dir, data_dir, str(tmp_path / "run"), f"custom_reward_function.path={scorer}",
                "data.gen_batch_size=2", "data.train_max_samples=6", "trainer.total_epochs=10",
                "trainer.v1.trainer_mode=colocate_async")
  assert [m["step"] for m in history] == [1, 2]
  kept, filtered = (sum(m[f"train/{k}_groups"] for m in history) for k in ("kept", "filtered"))
  assert filtered >= 1
  # each judged response is scored once, the update reading the judge's scores: 2 per trained or dropped group,
  # and fewer than 2 x 4 more for the kept groups judged past the last update (scoring again would add 2 x kept)
  assert 2 * (kept + filtered) <= len(calls.read_text()) < 2 * (kept + filtered + 4)
  for m in history:
    assert m["train/kept_groups"] == 4 and "train/num_gen_batches" not in m and "off_policy/staleness/mean" in m
    assert m["critic/score/mean"] not in (0.0, 1.0) and np.isfinite(m["actor/pg_loss"])
  # the one-group score spread is what kept each: GRPO's advantages are nowhere all zero
  assert all(m["critic/advantages/max"] > 0 for m in history)
