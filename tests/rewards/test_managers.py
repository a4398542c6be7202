"""Reward managers: placement, user functions from files, errors, timeouts."""

import logging
import textwrap
import time

import ml_collections
import numpy as np
import pytest

from rljax import rewards
from rljax.rewards import managers

USER_FN = textwrap.dedent("""
    import os
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None,
                      bonus=0.0):
      if solution_str == "sleep":
        time.sleep(60)
      if solution_str == "raise":
        raise RuntimeError("scorer exploded")
      if solution_str == "exit":
        os._exit(3)
      right = solution_str.strip() == ground_truth
      return {"score": float(right) + bonus, "acc": right,
              "source": data_source}

    def plain(data_source, solution_str, ground_truth, extra_info=None):
      return 0.25

    def batched(data_sources, solution_strs, ground_truths, extra_infos):
      return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

    def batched_wrong_length(data_sources, solution_strs, ground_truths,
                             extra_infos):
      return [1.0]
""")


def reward_config(manager="naive", path=None, name="compute_score", **extra):
  return ml_collections.ConfigDict({
      "data": {"reward_fn_key": "data_source", "max_response_length": 8},
      "reward_model": {
          "enable": False, "reward_manager": manager,
          "overlong_buffer": {"enable": False, "len": 0,
                              "penalty_factor": 1.0, "log": False},
          "prime": {"num_workers": 2, "timeout_s": 300.0},
      },
      "custom_reward_function": {"path": path, "name": name,
                                 "reward_kwargs": extra},
  })


def make_batch(texts, truths, lengths, width=8, source="rljax/arithmetic"):
  b = len(texts)
  mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
  return {
      "responses": np.ones((b, width), np.int32),
      "response_mask": mask,
      "response_text": list(texts),
      "data_source": np.array([source] * b, dtype=object),
      "reward_model": np.array([{"style": "rule", "ground_truth": t}
                                for t in truths], dtype=object),
      "extra_info": np.array([{"index": i} for i in range(b)], dtype=object),
  }


@pytest.fixture
def user_file(tmp_path):
  path = tmp_path / "my_reward.py"
  path.write_text(USER_FN)
  return str(path)


def test_naive_places_score_on_last_valid_token():
  manager = rewards.make_reward_manager(reward_config())
  result = manager(make_batch(["7", "3 + 4 = 8", "so 12"], ["7", "7", "12"],
                              lengths=[1, 5, 0]))
  expected = np.zeros((3, 8), np.float32)
  expected[0, 0] = 1.0
  expected[2, 0] = 1.0  # empty response: token 0
  np.testing.assert_array_equal(result.reward_tensor, expected)
  assert result.metrics["reward/scorer_errors"] == 0


def test_results_of_several_groups_join_in_order():
  """colocate_async's update reads its groups' judged scores as one result: rows in order, a key one group's scorer
  did not return is NaN there, the counts summed."""
  first = managers.RewardResult(np.array([[0.0, 1.0]]), {"acc": [1.0]}, {"reward/scorer_errors": 1.0})
  second = managers.RewardResult(np.array([[0.5, 0.0], [0.0, 0.0]]), {"pred": ["a", "b"]},
                                 {"reward/scorer_errors": 0.0})
  joined = managers.concat_results([first, second])
  np.testing.assert_array_equal(joined.reward_tensor, [[0.0, 1.0], [0.5, 0.0], [0.0, 0.0]])
  assert joined.reward_extra_info["pred"][1:] == ["a", "b"] and np.isnan(joined.reward_extra_info["pred"][0])
  assert joined.reward_extra_info["acc"][0] == 1.0 and np.isnan(joined.reward_extra_info["acc"][1:]).all()
  assert joined.metrics == {"reward/scorer_errors": 1.0}


def test_decodes_with_tokenizer_when_no_text():

  class Tok:
    def decode(self, ids, skip_special_tokens=True):
      return " ".join(str(i) for i in ids)

  manager = rewards.NaiveRewardManager(tokenizer=Tok())
  batch = make_batch(["", ""], ["5 6", "5"], lengths=[2, 3])
  del batch["response_text"]
  batch["responses"] = np.array([[5, 6, 0, 0, 0, 0, 0, 0],
                                 [5, 6, 5, 0, 0, 0, 0, 0]], np.int32)
  result = manager(batch)
  # "5 6" -> last number 6 != 56; "5 6 5" -> last number 5 == 5.
  assert result.reward_tensor[0, 1] == 0.0
  assert result.reward_tensor[1, 2] == 1.0


def test_custom_function_from_file_with_dict_result(user_file):
  manager = rewards.make_reward_manager(
      reward_config(path=user_file, bonus=0.5))
  result = manager(make_batch(["7", "8"], ["7", "7"], lengths=[2, 3]))
  assert result.reward_tensor[0, 1] == 1.5
  assert result.reward_tensor[1, 2] == 0.5
  assert result.reward_extra_info["acc"] == [True, False]
  assert result.reward_extra_info["source"] == ["rljax/arithmetic"] * 2


def test_custom_function_errors_name_path_and_function(tmp_path, user_file):
  missing = str(tmp_path / "nope.py")
  with pytest.raises(FileNotFoundError, match="nope.py"):
    rewards.make_reward_manager(reward_config(path=missing))
  with pytest.raises(AttributeError, match="'absent'.*batched"):
    rewards.make_reward_manager(reward_config(path=user_file, name="absent"))


def test_raising_scorer_scores_zero_counts_and_logs_once(user_file, caplog):
  manager = rewards.make_reward_manager(reward_config(path=user_file))
  batch = make_batch(["raise", "7", "raise"], ["7", "7", "7"], lengths=[1, 1, 1])
  with caplog.at_level(logging.ERROR, logger=managers.__name__):
    result = manager(batch)
    manager(batch)
  np.testing.assert_array_equal(result.reward_tensor[:, 0], [0.0, 1.0, 0.0])
  assert result.metrics["reward/scorer_errors"] == 2
  assert np.isnan(result.reward_extra_info["acc"][0])
  tracebacks = [r for r in caplog.records if "scorer exploded" in r.getMessage()]
  assert len(tracebacks) == 1


@pytest.mark.parametrize("value", ["'high'", "float('nan')", "{'acc': 1}",
                                   "{'score': float('inf')}", "[1.0]"])
def test_bad_result_counts_as_error(tmp_path, value):
  path = tmp_path / "bad.py"
  path.write_text(f"def compute_score(**kw):\n  return {value}\n")
  manager = rewards.make_reward_manager(reward_config(path=str(path)))
  result = manager(make_batch(["7"], ["7"], lengths=[1]))
  assert result.reward_tensor[0, 0] == 0.0
  assert result.metrics["reward/scorer_errors"] == 1


def test_plain_float_function(user_file):
  manager = rewards.make_reward_manager(reward_config(path=user_file, name="plain"))
  result = manager(make_batch(["a"], ["b"], lengths=[4]))
  assert result.reward_tensor[0, 3] == 0.25
  assert result.reward_extra_info == {}


def test_batch_manager(user_file):
  manager = rewards.make_reward_manager(
      reward_config("batch", path=user_file, name="batched"))
  assert isinstance(manager, rewards.BatchRewardManager)
  result = manager(make_batch(["7", "6"], ["7", "7"], lengths=[1, 2]))
  np.testing.assert_array_equal(result.reward_tensor.sum(1), [1.0, 0.0])
  bad = rewards.make_reward_manager(
      reward_config("batch", path=user_file, name="batched_wrong_length"))
  result = bad(make_batch(["7", "6"], ["7", "7"], lengths=[1, 2]))
  assert result.metrics["reward/scorer_errors"] == 2
  assert not result.reward_tensor.any()
  with pytest.raises(ValueError, match="custom_reward_function.path"):
    rewards.make_reward_manager(reward_config("batch"))


def test_overlong_penalty_formula():
  # L_max = 8, buffer 4: free up to 4 tokens, then -1/4 per token to -1.
  penalty = rewards.overlong_penalty(np.array([0, 4, 5, 6, 8]), 8, 4, 1.0)
  np.testing.assert_allclose(penalty, [0, 0, -0.25, -0.5, -1.0])
  np.testing.assert_allclose(
      rewards.overlong_penalty(np.array([6]), 8, 4, 0.5), [-0.25])


def test_dapo_manager_adds_penalty_and_logs():
  config = reward_config("dapo")
  config.reward_model.overlong_buffer.update(enable=True, len=4, log=True)
  manager = rewards.make_reward_manager(config)
  result = manager(make_batch(["7", "7", "8"], ["7", "7", "7"],
                              lengths=[3, 6, 8]))
  np.testing.assert_allclose(result.reward_tensor[0, 2], 1.0)
  np.testing.assert_allclose(result.reward_tensor[1, 5], 0.5)
  np.testing.assert_allclose(result.reward_tensor[2, 7], -1.0)
  assert result.reward_extra_info["overlong"] == [False, True, True]
  np.testing.assert_allclose(result.reward_extra_info["overlong_reward"],
                             [0, -0.5, -1.0])
  off = rewards.make_reward_manager(reward_config("dapo"))
  result = off(make_batch(["7"], ["7"], lengths=[8]))
  assert result.reward_tensor[0, 7] == 1.0
  config.reward_model.overlong_buffer.len = 9
  with pytest.raises(ValueError, match="overlong_buffer.len"):
    rewards.make_reward_manager(config)


def test_dapo_manager_reports_a_plain_score_as_acc_as_verl_does():
  result = rewards.make_reward_manager(reward_config("dapo"))(make_batch(["7", "8"], ["7", "7"], lengths=[3, 3]))
  assert result.reward_extra_info["acc"] == [1.0, 0.0]
  assert "acc" not in rewards.make_reward_manager(reward_config("naive"))(
      make_batch(["7"], ["7"], lengths=[3])).reward_extra_info


def test_unknown_manager_lists_names():
  with pytest.raises(ValueError, match="batch.*dapo.*naive.*prime"):
    rewards.make_reward_manager(reward_config("fancy"))


@pytest.mark.slow
def test_prime_timeout_crash_and_error_do_not_stop_the_batch(user_file):
  config = reward_config("prime", path=user_file)
  config.reward_model.prime.update(num_workers=2, timeout_s=3.0)
  manager = rewards.make_reward_manager(config)
  try:
    texts = ["7", "sleep", "raise", "8", "exit", "7"]
    start = time.monotonic()
    result = manager(make_batch(texts, ["7"] * 6, lengths=[1] * 6))
    elapsed = time.monotonic() - start
    np.testing.assert_array_equal(result.reward_tensor[:, 0],
                                  [1, 0, 0, 0, 0, 1])
    assert result.metrics["reward/scorer_timeouts"] == 1
    assert result.metrics["reward/scorer_errors"] == 3  # sleep, raise, exit
    assert elapsed < 40  # the 60 s sleep was cut off
    again = manager(make_batch(["7", "6"], ["7", "7"], lengths=[1, 1]))
    np.testing.assert_array_equal(again.reward_tensor[:, 0], [1, 0])
    assert again.metrics["reward/scorer_errors"] == 0
  finally:
    manager.close()


def test_prime_default_scorer_matches_naive():
  config = reward_config("prime")
  config.reward_model.prime.num_workers = 1
  prime = rewards.make_reward_manager(config)
  naive = rewards.make_reward_manager(reward_config())
  batch = make_batch(["7", "3 + 4 = 7", "8"], ["7", "7", "7"], lengths=[1, 2, 3])
  try:
    np.testing.assert_array_equal(prime(batch).reward_tensor,
                                  naive(batch).reward_tensor)
  finally:
    prime.close()
