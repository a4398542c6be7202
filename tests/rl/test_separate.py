"""separate_async (`rljax.rl.separate`): the rollout on devices of its own, on a thread of its own, equals
colocate_async on the same weight schedule; its picks ahead of the trainer resume losing and repeating nothing."""

import collections
import json
import threading
import time

import jax
import pytest

from rljax import rl, sharding
from rljax.config import ConfigError
from rljax.rl import cross_host_weights, remote, separate, staleness, streaming
from tests.rl import tiny_run
from tests.rl.test_dynamic_sampling import SCORE_BY_TEXT
from tests.rl.test_streaming import batches, rollout, scripted, tok  # noqa: F401  (fixtures)

SCHEDULE = staleness.Schedule(sync_every=2, lag=1)


def trained(config, mesh):
  trainer = rl.RLTrainer(config, mesh=mesh)
  try:
    trainer.fit()
  finally:
    trainer.close()
  return [json.loads(line) for line in open(f"{trainer.run_dir}/metrics.jsonl")]


@pytest.mark.slow
def test_separate_async_on_four_devices_equals_colocate_async_on_the_same_schedule(model_dir, data_dir, tmp_path,
                                                                                  monkeypatch):
  # DAPO with a score by the response's text: the rollout thread judges each group as it ends (dynamic
  # sampling), validation decodes beside it every 2 steps, and the weights go to the rollout after updates 2
  # and 4, batch b decoding under version 2 * floor((b - 1) / 2)
  scorer = tmp_path / "score.py"
  scorer.write_text(SCORE_BY_TEXT)
  common = [f"custom_reward_function.path={scorer}", "data.gen_batch_size=2", "trainer.total_training_steps=4",
            "trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "trainer.save_freq=-1", "trainer.test_freq=2", "algorithm.rollout_correction.rollout_is=token",
            "trainer.v1.separate_async.parameter_sync_step=2", "trainer.v1.separate_async.num_warmup_batches=1",
            "trainer.v1.colocate_async.num_warmup_batches=1"]
  config = tiny_run.run_config("dapo", model_dir, data_dir, str(tmp_path / "separate"), *common,
                               "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
                               "actor_rollout_ref.rollout.n_gpus_per_node=4")
  assert staleness.schedule_of(config) == SCHEDULE
  mesh = sharding.make_mesh(config)
  assert list(mesh.devices.flat) == jax.devices()[:4]
  apart = trained(config, mesh)
  config = tiny_run.run_config("dapo", model_dir, data_dir, str(tmp_path / "colocated"), *common,
                               "trainer.v1.trainer_mode=colocate_async")
  monkeypatch.setattr(staleness, "schedule_of", lambda config: SCHEDULE)  # the same schedule, on one mesh
  together = trained(config, sharding.make_mesh(config, jax.devices()[:4]))
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/"))}
  assert [drop(m) for m in apart] == [drop(m) for m in together] and len(apart) == 4
  # versions 0 (before the first update), 2 and 4 went to the rollout, each step records what it sent
  assert ["perf/weight_sync_bytes" in m for m in apart] == [True, True, False, False]
  assert max(m["off_policy/staleness/max"] for m in apart) > 2 and "val-core/rljax/arithmetic/reward/mean@1" in apart[1]
  assert all(m["train/kept_groups"] == 4 and m["critic/score/mean"] not in (0.0, 1.0) for m in apart)


def test_the_rollouts_devices_are_its_own(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), "trainer.n_gpus_per_node=4",
                               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                               "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
                               "actor_rollout_ref.rollout.n_gpus_per_node=4")
  with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.n_gpus_per_node=4: separate_async's rollout "
                                        r"needs actor_rollout_ref.rollout.nnodes x n_gpus_per_node = 4 devices beside "
                                        r"the training mesh's 8, and JAX sees 8"):
    rl.RLTrainer(config, mesh=sharding.build_mesh({"data": 1, "fsdp": 8, "tensor": 1, "sequence": 1},
                                                  jax.devices()))


def test_on_several_processes_the_trainer_and_the_rollout_each_take_whole_processes(model_dir, data_dir, tmp_path):
  device = collections.namedtuple("Device", "id process_index")
  two_by_four = [device(i, i // 4) for i in range(8)]  # 2 processes of 4 devices
  def config(*extra):
    return tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "trainer.n_gpus_per_node=auto",
                               "trainer.nnodes=auto", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                               "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1", *extra)
  assert remote.roles(config("actor_rollout_ref.rollout.n_gpus_per_node=4"), two_by_four) == ((0,), (1,))
  assert remote.roles(config("actor_rollout_ref.rollout.n_gpus_per_node=4"), two_by_four[:4]) is None  # one process
  with pytest.raises(ConfigError, match=r"rollout.n_gpus_per_node=2: the rollout's 2 devices share process 1 with "
                                        r"the trainer's.*n_gpus_per_node=4"):
    remote.roles(config("actor_rollout_ref.rollout.n_gpus_per_node=2"), two_by_four)
  four_by_two = [device(i, i // 2) for i in range(8)]
  assert remote.roles(config("actor_rollout_ref.rollout.nnodes=2", "actor_rollout_ref.rollout.n_gpus_per_node=2"),
                      four_by_two) == ((0, 1), (2, 3))
  # a trainer process trains the groups of as many rollout processes as every other
  six = ("data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6")  # prompts for 3 processes
  assert remote.roles(config("actor_rollout_ref.rollout.nnodes=3", "actor_rollout_ref.rollout.n_gpus_per_node=2",
                             *six), four_by_two) == ((0,), (1, 2, 3))
  # or an equal part of one's groups
  assert remote.roles(config("actor_rollout_ref.rollout.n_gpus_per_node=2", *six), four_by_two) == ((0, 1, 2), (3,))
  with pytest.raises(ConfigError, match=r"data.train_batch_size=4: does not split over separate_async's 3 trainer "
                                        r"and 1 rollout processes.*a multiple of 3"):
    remote.roles(config("actor_rollout_ref.rollout.n_gpus_per_node=2", "data.train_batch_size=4"), four_by_two)
  five_by_two = [device(i, i // 2) for i in range(10)]
  with pytest.raises(ConfigError, match=r"rollout.nnodes=2: separate_async on several processes gives each trainer "
                                        r"process .*trainer spans 3 processes, its rollout 2.*a multiple or a divisor"):
    remote.roles(config("actor_rollout_ref.rollout.nnodes=2", "actor_rollout_ref.rollout.n_gpus_per_node=2"),
                 five_by_two)
  with pytest.raises(ConfigError, match=r"trainer spans 2 processes, its rollout 3"):
    remote.roles(config("actor_rollout_ref.rollout.nnodes=3", "actor_rollout_ref.rollout.n_gpus_per_node=2"),
                 five_by_two)
  with pytest.raises(ConfigError, match=r"the trainer's 2 devices send the weights laid out as a rollout process's 6 "
                                        r"devices hold them.*at least 6 devices"):
    remote.roles(config("actor_rollout_ref.rollout.n_gpus_per_node=6"), four_by_two[:2] + [device(i, 1) for i in range(2, 8)])


def test_a_weight_sync_sends_to_as_many_rollout_processes_at_once_as_the_trainer_has_devices_for():
  device = collections.namedtuple("Device", "id process_index")
  rollout = [device(i, 1 + i // 2) for i in range(6)]  # 3 processes of 2 devices
  ids = lambda runs: [[d.id for d in run] for run in runs]  # noqa: E731
  assert ids(cross_host_weights.batches([device(10 + i, 0) for i in range(2)], rollout)) == [[0, 1], [2, 3], [4, 5]]
  assert ids(cross_host_weights.batches([device(10 + i, 0) for i in range(5)], rollout)) == [[0, 1, 2, 3], [4, 5]]
  assert ids(cross_host_weights.batches([device(10 + i, 0) for i in range(6)], rollout)) == [[0, 1, 2, 3, 4, 5]]


@pytest.mark.parametrize("trainers, rollouts, index, expected", [
    (1, 3, 0, (range(0, 3), 0, 1)), (2, 4, 1, (range(2, 4), 0, 1)), (2, 2, 1, (range(1, 2), 0, 1)),
    (3, 1, 2, (range(0, 1), 2, 3)), (4, 2, 1, (range(0, 1), 1, 2)), (4, 2, 2, (range(1, 2), 0, 2))])
def test_each_trainer_process_trains_a_run_of_rollout_processes_or_a_part_of_ones_groups(
    monkeypatch, trainers, rollouts, index, expected):
  monkeypatch.setattr(remote.hosts, "index", lambda: index)
  assert remote.served(trainers, rollouts) == expected


def picked_tags(driver, steps):
  return [list(driver.next().columns["tag"]) for _ in range(steps)]


def test_a_threaded_driver_picks_what_an_inline_one_does_and_resumes_losing_and_repeating_nothing(scripted):
  engine, params = scripted
  policy = staleness.StalenessPolicy(groups=1, threshold=8, strategy="drop", ahead=2)
  data = ("LS", "SS", "SL", "SS")
  every = sorted(f"{b}{letter}{r}" for b, kind in enumerate(data) for r, letter in enumerate(kind))

  def driver(threaded, consumed=(), first_step=0, first_batch=0):
    stream = rollout(engine, policy, batches(*data), consumed, first_batch)
    stream.holds_weights = True
    return separate.RolloutDriver(stream, SCHEDULE, first_step, 20, lambda p: p, threaded)

  def publish_through(d, step):  # the trainer's weights after each update, as the trainer sends them
    for version in range(d.first_step, step + 1):
      d.publish(version, params[min(version, len(params) - 1)])

  inline = driver(False)
  publish_through(inline, 0)
  inline_tags = picked_tags(inline, 1)
  publish_through(inline, 6)
  inline_tags += picked_tags(inline, 7)
  with pytest.raises(StopIteration):
    inline.next()
  assert sorted(sum(inline_tags, [])) == every

  threaded = driver(True)
  publish_through(threaded, 0)
  first = picked_tags(threaded, 1)
  deadline = time.monotonic() + 60
  while threaded.next_step < 3 and time.monotonic() < deadline:  # it picks steps 1 and 2 under version 0, ahead
    time.sleep(0.01)
  assert threaded.next_step == 3  # and waits for version 2
  position = threaded.rollout.position(1)  # step 0 trained; steps 1 and 2 picked, untrained
  assert position["batch"] == 0  # 0L0 is still generating
  publish_through(threaded, 6)
  rest = picked_tags(threaded, 7)
  with pytest.raises(StopIteration):
    threaded.next()
  threaded.close()
  assert first + rest == inline_tags

  resumed = driver(True, position["consumed"], 1, position["batch"])
  publish_through(resumed, 6)
  again = []
  while True:
    try:
      again += picked_tags(resumed, 1)
    except StopIteration:
      break
  resumed.close()
  assert sorted(sum(first + again, [])) == every  # nothing lost, nothing trained twice
  picked_ahead = set(sum(inline_tags[1:3], []))
  assert picked_ahead and picked_ahead <= set(sum(again, []))


def test_closing_the_device_turns_stops_whoever_waits_behind_a_turn_that_never_ends():
  # a rollout process's weights arrive in the receiving thread's turn; where the trainer failed inside that
  # transfer, the turn never ends, and the watchdog closes the turns so that whoever waits behind it stops
  for held, wanted in (("exclusive", "chunk"), ("chunk", "exclusive")):
    turns, stopped = separate.DeviceTurns(), []

    def wait(wanted=wanted, turns=turns, stopped=stopped):
      try:
        with getattr(turns, wanted)():
          pass
      except separate.Closed:
        stopped.append(wanted)

    with getattr(turns, held)():
      waiter = threading.Thread(target=wait)
      waiter.start()
      waiter.join(0.2)
      assert waiter.is_alive()
      turns.close()
      waiter.join(5)
    assert stopped == [wanted] and not waiter.is_alive()
    with pytest.raises(separate.Closed):
      with turns.chunk():
        pass
