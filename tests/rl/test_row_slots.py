"""Rows that do not divide the data-parallel devices: every pass runs over row slots, the rows rounded up to a
multiple of the devices (`rl.layout.slots_of`), the slots no row fills empty; the run logs the numbers of a run
whose devices divide its rows."""

import jax
import numpy as np
import pytest

from rljax import config as config_lib, sharding
from rljax.rl import experience, layout, packing
from tests import processes
from tests.rl import tiny_run
from tests.rl.test_multi_process import job


def test_rows_spread_over_equal_micro_batches_then_empty_slots():
  assert layout.slots_of(24, 48) == 48 and layout.slots_of(6, 4) == 8 and layout.slots_of(8, 4) == 8
  np.testing.assert_array_equal(layout.spread(np.arange(8), 2, 4), np.arange(8).reshape(2, 4))
  np.testing.assert_array_equal(layout.spread(np.arange(5), 2, 4), [[0, 1, 2, -1], [3, 4, -1, -1]])
  # 2 processes of 3 rows, 2 micro-batches of 4 slots: each process's rows in its own 2 columns
  np.testing.assert_array_equal(packing.forward_arrangement(3, 2, 2, 4), [[0, 1, 3, 4], [2, -1, 5, -1]])


def test_a_device_holds_its_share_of_the_slots(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path),
                               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
  # 8 rows of a mini-batch over 3 devices: 9 slots, 3 a device, one row each micro-batch
  assert layout.micro_batch_count(config, 8, 3, 104) == 3
  # a forward pass's 3 slots a device under a cap of 2: the largest divisor of 3 within 2 is 1, so 3 micro-batches
  assert layout.forward_micro_batches(8, 3, 104, 2, False, None) == 3
  uneven = layout.make_layout(config, 10, 3)
  assert (uneven.mini_slots, uneven.row_slots) == (9, 9)


def test_a_token_budget_packs_each_shard_s_rows_past_its_empty_slots():
  lengths = np.asarray([50, 60, 70, 80, 90])
  # 5 rows over 4 shards of 2 slots: shard 2 holds row 4, shard 3 none
  out = packing.budget_arrangement(lengths, packing.with_empty_slots(np.arange(5), 4), 4, 104, 104)
  assert sorted(out[out >= 0].tolist()) == [0, 1, 2, 3, 4]
  shards = out.reshape(out.shape[0], 4, -1)
  assert set(shards[:, 2].ravel()) == {4, -1} and set(shards[:, 3].ravel()) == {-1}


def test_a_host_s_rows_take_the_first_of_its_slots():
  mesh = sharding.build_mesh({"data": 1, "fsdp": 4, "tensor": 1, "sequence": 1}, jax.devices()[:4])
  on_device = experience.OnDevice(6, 4, 2, mesh, sharding.rules_from_config(config_lib.get_base_config()))
  # one process, 6 rows over 4 devices: 8 slots, rows in the first 6
  assert on_device.spec(("input_ids",)).input_ids.shape == (1, 8, 6)
  np.testing.assert_array_equal(on_device.slot_numbers(np.asarray([[0, 5, -1]])), [[0, 5, -1]])


def uneven_metrics(model_dir, data_dir, run_dir, name, devices, *extra):
  """A 2-step run of `name` with 3 prompts x 2 responses a mini-batch on the first `devices` devices."""
  config = tiny_run.run_config(name, model_dir, data_dir, str(run_dir), "trainer.save_freq=-1",
                               "trainer.balance_batch=false", tiny_run.text_scorer(run_dir.parent), *extra)
  mesh = sharding.build_mesh({"data": 1, "fsdp": devices, "tensor": 1, "sequence": 1}, jax.devices()[:devices])
  return tiny_run.fit_metrics(config, mesh)


MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
CASES = {
    # padded: 6 rows on 4 devices (8 slots), micro-batches of one slot a device (3 rows and an empty slot), two
    # epochs; a mixture of experts (its load-balancing loss is over a micro-batch's real tokens and weighed by its
    # real rows: one device takes the same 3-row micro-batches) and a loss averaged over rows (verl's global
    # batch size: the real rows)
    "grpo_padded_moe": ("grpo", "moe_dir", 4, (f"{MICRO}=1",), (f"{MICRO}=3",), (
        "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.model.use_remove_padding=false")),
    # packed under token budgets: PPO's 4-row mini-batches and its critic on 3 devices (6 slots)
    "ppo_packed_budget": ("ppo", "model_dir", 3, (), (), (
        "critic.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=220", "critic.use_dynamic_bsz=true",
        "critic.ppo_max_token_len_per_gpu=220")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rows_that_do_not_divide_the_devices_train_as_one_device_does(case, request, data_dir, tmp_path):
  name, model, devices, uneven_extra, one_extra, extra = CASES[case]
  model_dir = request.getfixturevalue(model)
  runs = [uneven_metrics(model_dir, data_dir, tmp_path / str(d), name, d, *extra, *own)
          for d, own in ((devices, uneven_extra), (1, one_extra))]
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/"))}  # noqa: E731
  uneven, one = ([drop(m) for m in run] for run in runs)
  assert len(uneven) == 2 and uneven[-1]["actor/grad_norm"] > 0
  for a, b in zip(uneven, one, strict=True):
    assert a == pytest.approx(b, rel=1e-4, abs=1e-6)


@pytest.mark.slow  # a 1-process and a 2-process run of 2 steps (about 25 s)
def test_each_host_s_rows_fill_the_first_of_its_slots_as_two_processes(model_dir, data_dir, tmp_path):
  # 2 prompts x 3 responses over 4 devices: 8 slots, each host's 3 rows in the first of its 4
  argv = job("grpo", model_dir, data_dir, tmp_path, "data.train_batch_size=2", "actor_rollout_ref.rollout.n=3",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.total_training_steps=2")
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one"], 1, f"{tmp_path}/one", devices=4)
  two = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/two"], 2, f"{tmp_path}/two", devices=4)
  assert two[-1]["actor/grad_norm"] > 0
  processes.assert_same_metrics(one, two, atol=1e-6)
