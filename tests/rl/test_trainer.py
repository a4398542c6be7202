"""The RL loop end to end on a tiny model: every algorithm, determinism, sharding, faults."""

import json
import math
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax import sharding
from rljax import rl
from rljax.rl import layout
from rljax.training.loop import NonFiniteError
from tests import processes
from tests.rl import tiny_run

ALGORITHMS = ["grpo", "ppo", "rloo", "reinforce_plus_plus", "dapo", "gspo"]
CORE = ["critic/score/mean", "critic/advantages/mean", "response_length/mean", "timing_s/gen",
        "timing_s/update_actor", "timing_s/step", "perf/throughput", "actor/pg_loss", "actor/grad_norm", "actor/lr"]


def train(config, mesh=None):
  trainer = rl.RLTrainer(config, mesh=mesh or tiny_run.one_device())
  try:
    trainer.fit()
  finally:
    trainer.close()
  return [json.loads(line) for line in open(f"{trainer.run_dir}/metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_algorithm_runs_two_steps(name, model_dir, data_dir, tmp_path):
  # the random model scores 0 everywhere: DAPO's dynamic sampling would keep no group (its own tests give it a
  # scorer that varies, tests/rl/test_dynamic_sampling.py)
  extra = ["algorithm.filter_groups.enable=false", "data.gen_batch_size=4"] if name == "dapo" else []
  # PPO: verl's critic_warmup=2 trains only the critic at step 1 (its actor trains from global step 2); the actor's
  # Megatron scheduler decays by cosine over the run's 2 steps, and actor/lr is the rate after stepping it
  extra += ["trainer.critic_warmup=2", "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.optim.lr_decay_style=cosine", "actor_rollout_ref.actor.optim.lr=0.002"
            ] if name == "ppo" else []
  config = tiny_run.run_config(name, model_dir, data_dir, str(tmp_path / "run"), *extra)
  history = train(config)
  assert [m["step"] for m in history] == [1, 2]
  for step, metrics in enumerate(history):
    warming = name == "ppo" and step == 0
    for key in [k for k in CORE if not (warming and k.startswith(("actor/", "timing_s/update_actor")))] + (
        ["critic/vf_loss", "critic/values/mean"] if name == "ppo" else []):
      assert key in metrics and math.isfinite(metrics[key]), (key, metrics.get(key))
    assert not (warming and any(k.startswith("actor/") for k in metrics)), sorted(metrics)
  if name == "ppo":  # one actor update done: Megatron's cosine at 1 of 2 steps, 0.002 * (1 + cos(pi / 2)) / 2
    assert history[1]["actor/lr"] == pytest.approx(0.001, rel=1e-6)
  if name == "rloo":
    assert "actor/reward_kl_penalty" in history[0]
  if name in ("grpo", "reinforce_plus_plus"):
    assert "actor/kl_loss" in history[0]
  assert (tmp_path / "run" / "global_step_2").is_dir() and (tmp_path / "run" / "curves.png").is_file()


@pytest.mark.slow
def test_same_seed_same_metrics_also_streamed_at_threshold_one(model_dir, data_dir, tmp_path):
  # the second run streams its rollouts (colocate_async) at threshold 1 with wait, which keeps every group on the
  # policy that trains it: the same run as sync, step for step, bit for bit
  streamed = ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=1",
              "trainer.v1.sampler.max_off_policy_strategy=wait")
  runs = [train(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / f"run{i}"), *extra))
          for i, extra in enumerate([(), streamed])]
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/", "off_policy/"))}
  assert [drop(m) for m in runs[0]] == [drop(m) for m in runs[1]] and len(runs[0]) == 2
  assert all(m["off_policy/staleness/max"] == 1 and m["off_policy/evicted_samples"] == 0 for m in runs[1])


@pytest.mark.slow
@pytest.mark.parametrize("mode, steps", [("sync", 1), ("colocate_async", 2)])
def test_eight_devices_equal_one(model_dir, data_dir, tmp_path, mode, steps):
  # one device: 8 micro-batches of 1 row; eight devices: 1 micro-batch of 1 row each, and a rollout mesh
  # of its own (fsdp 4 x tensor 2: the sampler reshards the weights for it); streamed (colocate_async), the
  # engine has a slot for each of two batches' responses, and the second step trains the batch read ahead
  # during the first, its tokens sampled by the first step's weights
  common = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", f"trainer.total_training_steps={steps}",
            f"trainer.v1.trainer_mode={mode}"]
  one = train(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "one"), *common))
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "eight"), *common,
                               "trainer.n_gpus_per_node=auto", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
  eight = train(config, mesh=sharding.make_mesh(config))
  keys = ["critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
          "actor/entropy"]
  if mode == "colocate_async":
    keys += ["off_policy/staleness/mean", "off_policy/token_lag/mean", "perf/slot_occupancy"]
  assert mode == "sync" or one[1]["off_policy/token_lag/mean"] == 1
  for step in range(steps):
    for key in keys:
      assert eight[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.mark.slow
def test_nan_stops_the_run_naming_step_and_metric(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"))
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  trainer.state = trainer.state.replace(actor=jax.tree.map(lambda x: x * np.nan, trainer.state.actor))
  try:
    with pytest.raises(NonFiniteError, match=r"step 1.*actor/"):
      trainer.fit()
  finally:
    trainer.close()
  assert not (tmp_path / "run" / "global_step_1").exists()


def test_balance_order_evens_token_counts():
  lengths = np.array([10, 1, 9, 2, 8, 3, 7, 4])
  order = layout.balance_order(lengths, 2)
  assert sorted(order.tolist()) == list(range(8))
  halves = lengths[order].reshape(2, 4).sum(1)
  assert abs(halves[0] - halves[1]) <= 2


def metrics_by_step(path):
  """The last logged metrics of each step (a resumed run appends after the killed one)."""
  out = {}
  for line in open(path):
    record = json.loads(line)
    out[record["step"]] = {k: v for k, v in record.items() if not k.startswith(("timing_s", "perf/"))}
  return out


def cli(args):
  """`python -m rljax.train --config=configs/grpo.py args...` started on one CPU device, its output in stdout."""
  return processes.start(["-m", "rljax.train", "--config=configs/grpo.py", *args], 1, devices=1)[0]


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(model_dir, data_dir, tmp_path):
  steps = "trainer.total_training_steps=3"
  whole = cli(tiny_run.overrides(model_dir, data_dir, str(tmp_path / "whole"), steps))
  assert whole.wait(timeout=300) == 0, whole.communicate()[0][-3000:]
  args = tiny_run.overrides(model_dir, data_dir, str(tmp_path / "killed"), steps)
  victim = cli(args)
  marker = tmp_path / "killed" / "global_step_1" / "commit_success.txt"
  deadline = time.time() + 300
  while not marker.exists() and victim.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  assert marker.exists()
  resumed = cli(args)
  output = resumed.communicate(timeout=300)[0]
  assert resumed.returncode == 0, output[-3000:]
  assert "resumed from" in output or metrics_by_step(tmp_path / "killed" / "metrics.jsonl").keys() == {1, 2, 3}
  expected = metrics_by_step(tmp_path / "whole" / "metrics.jsonl")
  got = metrics_by_step(tmp_path / "killed" / "metrics.jsonl")
  assert got.keys() == expected.keys() == {1, 2, 3}
  for step in (2, 3):
    assert got[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


@pytest.mark.slow
def test_truncated_checkpoint_is_skipped_and_export_loads_in_transformers(model_dir, data_dir, tmp_path):
  run_dir = tmp_path / "run"
  first = train(tiny_run.run_config("grpo", model_dir, data_dir, str(run_dir)))
  (run_dir / "global_step_2" / "commit_success.txt").unlink()
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(run_dir))
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    trainer.fit()
    params = trainer.actor_params
  finally:
    trainer.close()
  again = metrics_by_step(run_dir / "metrics.jsonl")
  assert again[2] == pytest.approx({k: v for k, v in first[1].items() if not k.startswith(("timing_s", "perf/"))})
  out = tmp_path / "hf"
  exported = processes.run(["-m", "rljax.export", "--checkpoint", str(run_dir), "--out", str(out)], timeout=300)
  assert exported.returncode == 0, exported.stderr[-3000:]
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  ids = np.array([[1, 520, 931, 198, 1017, 1276]], np.int32)
  with torch.no_grad():
    theirs = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  model = nnx.merge(trainer.run.graphdef, params)
  ours = np.asarray(model(jnp.asarray(ids)))
  np.testing.assert_allclose(theirs, ours, atol=1e-4)
