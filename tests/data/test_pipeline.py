"""Grain batches: shuffling, epochs, checkpointable state, multi-process shares."""

import numpy as np
import pytest

from rljax import data
from rljax.config import get_base_config
from tests.data.conftest import prompt_row, write_rows


class Items:
  """A dataset whose item i is just its index (and a padded row)."""

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return {"input_ids": np.full((2,), i), "attention_mask": np.ones(2),
            "position_ids": np.arange(2), "index": i, "tag": f"row{i}"}


def epoch_indices(batches, start, count):
  return np.concatenate([batches[k]["index"] for k in range(start, start + count)])


def test_batches_shapes_and_types():
  batches = data.batch_dataset(Items(10), 4, num_epochs=1, seed=0)
  batch = batches[0]
  assert batch["input_ids"].shape == (4, 2) and batch["input_ids"].dtype == np.int32
  assert batch["index"].dtype == np.int64
  assert batch["tag"].dtype == object and batch["tag"].shape == (4,)


def test_shuffle_is_a_permutation_per_epoch_and_reproducible():
  batches = data.batch_dataset(Items(12), 4, num_epochs=3, seed=7)
  assert len(batches) == 9
  epochs = [epoch_indices(batches, 3 * e, 3) for e in range(3)]
  for order in epochs:
    assert sorted(order) == list(range(12))
  assert not np.array_equal(epochs[0], epochs[1])  # reshuffled each epoch
  assert not np.array_equal(epochs[0], np.arange(12))
  again = data.batch_dataset(Items(12), 4, num_epochs=3, seed=7)
  np.testing.assert_array_equal(epoch_indices(again, 0, 9),
                                np.concatenate(epochs))
  other = data.batch_dataset(Items(12), 4, num_epochs=1, seed=8)
  assert not np.array_equal(epoch_indices(other, 0, 3), epochs[0])


def test_no_shuffle_and_drop_remainder():
  batches = data.batch_dataset(Items(10), 4, num_epochs=2, shuffle=False)
  assert len(batches) == 4  # 2 full batches per epoch; 2 prompts dropped
  np.testing.assert_array_equal(epoch_indices(batches, 0, 4),
                                [0, 1, 2, 3, 4, 5, 6, 7] * 2)


def test_shuffled_epochs_drop_different_remainders():
  batches = data.batch_dataset(Items(10), 4, num_epochs=2, seed=1)
  first, second = epoch_indices(batches, 0, 2), epoch_indices(batches, 2, 2)
  assert len(set(first)) == 8 and len(set(second)) == 8


def test_state_restore_gives_identical_next_batches():
  batches = data.batch_dataset(Items(20), 4, num_epochs=3, seed=3)
  iterator = iter(batches.to_iter_dataset())
  for _ in range(6):  # into the second epoch
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator)["index"] for _ in range(5)]
  resumed = iter(data.batch_dataset(Items(20), 4, num_epochs=3,
                                    seed=3).to_iter_dataset())
  resumed.set_state(state)
  for want in expected:
    np.testing.assert_array_equal(next(resumed)["index"], want)


@pytest.mark.parametrize("count", [2, 4])
def test_processes_read_disjoint_shares_of_each_global_batch(count):
  single = data.batch_dataset(Items(16), 8, num_epochs=2, seed=5)
  shards = [data.batch_dataset(Items(16), 8, num_epochs=2, seed=5,
                               process_index=p, process_count=count)
            for p in range(count)]
  for k in range(len(single)):
    parts = [s[k]["index"] for s in shards]
    assert all(len(p) == 8 // count for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts), single[k]["index"])


def test_batch_errors():
  with pytest.raises(ValueError, match="empty"):
    data.batch_dataset(Items(0), 4)
  with pytest.raises(ValueError, match="larger than the dataset"):
    data.batch_dataset(Items(3), 4)
  with pytest.raises(ValueError, match="multiple of the process count"):
    data.batch_dataset(Items(8), 4, process_count=3)


def test_eval_batches_cover_everything_once():
  batches = data.eval_batch_dataset(Items(10), 4)
  assert [len(b["index"]) for b in batches] == [4, 4, 2]
  np.testing.assert_array_equal(np.concatenate([b["index"] for b in batches]),
                                np.arange(10))
  whole = data.eval_batch_dataset(Items(10))
  assert len(whole) == 1
  shares = [np.concatenate([b["index"] for b in data.eval_batch_dataset(
      Items(10), 4, process_index=p, process_count=2)]) for p in range(2)]
  assert sorted(np.concatenate(shares)) == list(range(10))


def run_config(tmp_path, **data_overrides):
  rows = [prompt_row(i, i % 4 + 1) for i in range(24)]
  config = get_base_config()
  config.data.update(
      train_files=write_rows(tmp_path / "train.parquet", rows),
      val_files=write_rows(tmp_path / "test.parquet", rows[:5]),
      train_batch_size=8, max_prompt_length=8, **data_overrides)
  config.trainer.total_epochs = 2
  return config


def test_make_train_iterator_resumes_exactly(tmp_path, tokenizer):
  config = run_config(tmp_path)
  iterator = data.make_train_iterator(config, tokenizer)
  assert len(iterator) == 6 and iterator.batches_per_epoch == 3
  first = next(iterator)
  assert first["input_ids"].shape == (8, 8)
  assert set(first) >= {"input_ids", "attention_mask", "position_ids",
                        "data_source", "reward_model", "extra_info", "index",
                        "raw_prompt_ids"}
  next(iterator)
  state = iterator.get_state()
  rest = list(iterator)
  assert len(rest) == 4 and iterator.batches_read == 6 and iterator.epoch == 1
  resumed = data.make_train_iterator(config, tokenizer)
  resumed.set_state(state)
  assert resumed.batches_read == 2 and resumed.epoch == 0
  next(resumed)
  assert resumed.epoch == 0  # the third batch closes the first epoch
  next(resumed)
  assert resumed.epoch == 1
  resumed.set_state(state)
  again = list(resumed)
  for a, b in zip(rest, again):
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    np.testing.assert_array_equal(a["index"], b["index"])
    assert list(a["reward_model"]) == list(b["reward_model"])


def test_make_train_iterator_multi_process_and_max_samples(tmp_path, tokenizer):
  config = run_config(tmp_path, train_max_samples=16)
  whole = next(data.make_train_iterator(config, tokenizer))["index"]
  parts = [next(data.make_train_iterator(config, tokenizer, p, 2))["index"]
           for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(parts), whole)
  assert len(data.make_train_iterator(config, tokenizer)) == 4


def test_make_val_batches(tmp_path, tokenizer):
  batches = data.make_val_batches(run_config(tmp_path), tokenizer)
  assert len(batches) == 1
  assert batches[0]["input_ids"].shape == (5, 8)


@pytest.mark.slow
def test_state_restore_with_worker_processes():
  def iterator():
    batches = data.batch_dataset(Items(24), 4, num_epochs=2, seed=3)
    return data.BatchIterator(batches, None, 6, num_workers=1)

  expected = [b["index"] for b in data.batch_dataset(Items(24), 4,
                                                     num_epochs=2, seed=3)]
  with iterator() as first:
    got = [next(first)["index"].copy() for _ in range(4)]
    state = first.get_state()
  with iterator() as resumed:
    resumed.set_state(state)
    got += [b["index"].copy() for b in resumed]
  assert len(got) == len(expected)
  for want, have in zip(expected, got):
    np.testing.assert_array_equal(have, want)
