"""The RL job as several processes (`jax.distributed` over gloo, each with its own CPU devices) logs the same
metrics as one process with the same devices."""

import json
import os
import re
import shutil
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import processes
from tests.rl import golden, tiny_run


PADDED = "actor_rollout_ref.model.use_remove_padding=false"


def job(config, model_dir, data_dir, tmp_path, *extra):
  """`python -m rljax.train` of 8 prompts x 2 responses over 8 devices in 2 mini-batches of 4 prompts, scored by
  the response's text, with `extra` overrides."""
  return ["-m", "rljax.train", f"--config=configs/{config}.py", *tiny_run.overrides(model_dir, data_dir, "unused"),
          "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.save_freq=-1",
          "trainer.n_gpus_per_node=auto", tiny_run.text_scorer(tmp_path), *extra]


OFFLOADED = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
             "actor_rollout_ref.ref.fsdp_config.param_offload=true", "critic.model.fsdp_config.param_offload=true",
             "critic.model.fsdp_config.optimizer_offload=true")


@pytest.mark.slow  # two 2-process trainer runs (30 s in CI)
def test_grpo_as_two_processes_logs_the_metrics_of_one(model_dir, data_dir, tmp_path):
  # 8 prompts x 2 responses over 2 devices, one a process; 2 shuffled mini-batches and balance_batch, so each
  # update's rows come from both hosts' rollouts; validation before training and after step 2. The rollouts stream
  # (colocate_async, verl's defaults: threshold 8, one batch read ahead, so old log-probs are recomputed), each
  # host over 8 decode slots, as many as its rows: the one process's 8 slots then decode the same waves.
  # The one process's metrics are the golden file's (tests/rl/golden.py: the same job on one process, padded);
  # the two processes pack their passes' tokens (`rl.packing`): the same numbers
  argv = job("grpo", model_dir, data_dir, tmp_path, "actor_rollout_ref.actor.shuffle=true", "trainer.balance_batch=true",
             "trainer.val_before_train=true", "trainer.test_freq=2", "trainer.v1.trainer_mode=colocate_async",
             "actor_rollout_ref.rollout.max_num_seqs=8")
  assert set(golden.TWO_PROCESS_JOB) <= set(argv)
  one = json.loads(golden.GOLDEN.read_text())["grpo_two_process_job_on_one"]
  two = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/two", "trainer.save_freq=1"], 2,
                              f"{tmp_path}/two", devices=2)
  trained = [m for m in two if m["step"] > 0]
  assert len(trained) == 2 and trained[0]["actor/grad_norm"] > 0 and 0 < trained[0]["critic/score/mean"] < 1
  assert any(k.startswith("val-core/") for k in trained[1]) and trained[1]["off_policy/staleness/max"] == 1
  golden.assert_golden(two, one, "grpo_two_process_job_on_one")
  # every host restarted after step 1's checkpoint: step 2 again, as the uninterrupted run logged it
  shutil.rmtree(tmp_path / "two" / "global_step_2")
  again = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/two", "trainer.save_freq=1"], 2,
                                f"{tmp_path}/two", devices=2)
  assert [m["step"] for m in again[len(two):]] == [2]  # one step trained after the restart
  processes.assert_same_metrics(two[-1:], again[-1:])


@pytest.mark.slow  # a 1-process and a 2-process run of one step (24 s in CI)
def test_packed_passes_under_a_token_budget_as_two_processes_log_the_metrics_of_one(model_dir, data_dir, tmp_path):
  # 16 prompts x 4 responses, 8 rows a device, prompts of 46-186 tokens in buffers of 208 and a budget of one
  # buffer a micro-batch: each device's micro-batches hold 1-3 of its rows, the rest of their slots empty, and a
  # host reads its own rows back from its own devices' slots. The one process prefills and decodes the 64 rows
  # together, each host its 32: their logits differ in the last bits, and inverse-CDF sampling turns a difference
  # in the cumulative probabilities into another token where the draw falls that close to a token's edge, which
  # with 1,280 tokens of near-equal probability happens about once in a few hundred tokens. Under data.seed=42
  # one of the 512 sampled tokens did (the neighbouring id), under seeds 1 and 2 none does
  tiny_run.ensure_synthetic_data(data_dir)
  tiny_run.prompts_of_many_lengths(data_dir, tmp_path / "varied.parquet")
  argv = job("grpo", model_dir, data_dir, tmp_path, f"data.train_files={tmp_path}/varied.parquet", "data.seed=1",
             "data.max_prompt_length=200", "data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.use_kl_loss=true",
             "actor_rollout_ref.model.share_prompt_forward=false", "actor_rollout_ref.actor.use_dynamic_bsz=true",
             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=208", "trainer.total_training_steps=1")
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one"], 1, f"{tmp_path}/one")
  two = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/two"], 2, f"{tmp_path}/two")
  padded_ratio = 208 / (one[0]["prompt_length/mean"] + one[0]["response_length/mean"])
  assert one[0]["perf/packed_compute_ratio"] < 0.9 * padded_ratio  # rows shared buffers (rows of 100+ cannot)
  processes.assert_same_metrics(one, two, atol=1e-6)


@pytest.mark.slow  # a 2-process run of 3 steps, then step 3 again after a restart (33 s in CI)
def test_hosts_that_streamed_apart_resume_each_from_its_own_position(model_dir, data_dir, tmp_path):
  # colocate_async with dynamic sampling: each host judges the groups of its own share of the data and reads on
  # until it has its 4 to train, so at a checkpoint the hosts stand at different positions (one had filtered more
  # of its prompts than the other), which the checkpoint holds for each host. W=0: nothing is generated ahead of
  # an update, so the restarted step 3 samples what the uninterrupted one did only if each host resumes exactly
  # where it was, losing and repeating no prompt (and its requests take the same decode slots: the slot's place in
  # the decode batch changes a logit's last bits, which can change a token the tiny model samples). 2 devices, one a
  # process
  argv = job("grpo", model_dir, data_dir, tmp_path, "trainer.v1.trainer_mode=colocate_async",
             "trainer.v1.colocate_async.num_warmup_batches=0", "algorithm.filter_groups.enable=true",
             "algorithm.filter_groups.metric=seq_reward", "trainer.total_training_steps=3", "trainer.save_freq=1",
             f"trainer.default_local_dir={tmp_path}/run")
  whole = processes.run_metrics(argv, 2, f"{tmp_path}/run", devices=2)
  assert [m["step"] for m in whole] == [1, 2, 3] and all(m["train/kept_groups"] == 8 for m in whole)
  assert sum(m["train/filtered_groups"] for m in whole) > 0
  extras = json.loads((tmp_path / "run" / "global_step_2" / "extras" / "metadata").read_text())
  assert "hosts" in extras["stream"], extras["stream"]  # else both hosts stood at one position
  hosts = extras["stream"]["hosts"]
  assert len(hosts) == 2 and hosts[0] != hosts[1], extras["stream"]
  shutil.rmtree(tmp_path / "run" / "global_step_3")
  again = processes.run_metrics(argv, 2, f"{tmp_path}/run", devices=2)
  assert [m["step"] for m in again[len(whole):]] == [3]
  processes.assert_same_metrics(whole[-1:], again[-1:])


@pytest.mark.slow  # two trainer runs of one step: one of 4 processes, one of 1 (43 s in CI)
def test_ppo_with_dynamic_sampling_as_four_processes_logs_the_metrics_of_one(model_dir, data_dir, tmp_path):
  # the parts whose statistics are over the whole batch: GAE's whitening (critic), the adaptive KL controller,
  # rollout correction; and dynamic sampling's rounds, agreed by 4 hosts and cut to 8 groups across them. Each
  # host decodes its 4 responses in 4 slots; the one process's 4 slots decode the same waves
  argv = job("ppo", model_dir, data_dir, tmp_path, "actor_rollout_ref.actor.shuffle=true",
             "actor_rollout_ref.rollout.max_num_seqs=4",
             "trainer.total_training_steps=1", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
             "algorithm.rollout_correction.rollout_is=token", "algorithm.filter_groups.enable=true",
             "algorithm.filter_groups.metric=seq_reward")
  # padded in one process; the actor's and the critic's passes packed in four, with the optimizers' state and the
  # reference's and the critic's weights in host memory between the steps that use them (`sharding.offload`)
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one", PADDED], 1, f"{tmp_path}/one")
  four = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/four",
                                "critic.model.use_remove_padding=true", *OFFLOADED], 4, f"{tmp_path}/four")
  assert one[0]["train/num_gen_batches"] >= 2 and one[0]["critic/vf_loss"] > 0
  assert one[0]["actor/reward_kl_penalty_coeff"] > 0 and "rollout_corr/rollout_is_mean" in one[0]
  # one step: the critic's forward and the gradients' all-reduce differ in their last bit between in-process
  # and cross-process collectives (summation order), and the next step's sampled tokens can follow them. The
  # spread of the IS weights (exp of the log-prob differences between the decode and the trainer) is 0 in one
  # process, whose decode runs on the trainer's 8-device mesh, and float noise (3e-4) where each host decodes its
  # 4 responses in 4 slots on its own 2 devices
  for metrics in (one, four):
    spread = [m.pop(k) for m in metrics for k in ("rollout_corr/rollout_is_std", "rollout_corr/rollout_is_seq_std")]
    assert max(spread) < 1e-3
  processes.assert_same_metrics(one, four, atol=1e-6)


@pytest.mark.slow  # two trainer runs: one of 2 processes, one of 1 (40 s in CI)
def test_lora_moe_router_replay_and_a_reward_model_as_two_processes_log_the_metrics_of_one(
    moe_dir, reward_model_dir, data_dir, tmp_path):
  # LoRA adapters on a mixture of experts, each token's rollout routing replayed in every actor pass (R3),
  # and a reward model scoring each host's rows; 2 devices, one a process
  argv = job("grpo", moe_dir, data_dir, tmp_path, "actor_rollout_ref.model.lora_rank=4",
             "actor_rollout_ref.model.lora_alpha=8", "actor_rollout_ref.actor.router_replay.mode=R3",
             "actor_rollout_ref.rollout.enable_rollout_routing_replay=true", "reward_model.enable=true",
             f"reward_model.model.path={reward_model_dir}",
             "data.max_prompt_length=200")  # buffers of 208 tokens hold several rows of the synthetic prompts
  # the one process runs padded rows, the two pack the actor's passes (with the replayed experts) and the reward
  # model's
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one",
                               "actor_rollout_ref.model.use_remove_padding=false"], 1, f"{tmp_path}/one", devices=2)
  two = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/two",
                               "reward_model.model.use_remove_padding=true"], 2, f"{tmp_path}/two", devices=2)
  assert len(one) == 2 and one[0]["actor/grad_norm"] > 0 and "actor/moe_aux_loss" in one[0]
  assert "perf/packed_compute_ratio" not in one[0]
  padded_ratio = 208 / (two[0]["prompt_length/mean"] + two[0]["response_length/mean"])
  assert two[0].pop("perf/packed_compute_ratio") < 0.6 * padded_ratio  # rows really shared buffers
  two[1].pop("perf/packed_compute_ratio")
  # step 2's actor/ppo_kl (about -5e-5) is a mean of differences of log-probs of magnitude 1-10, whose float32
  # rounding (1e-7 to 1e-6) follows the gradients' summation order: in-process or across processes. On an AMD
  # EPYC host the two runs' values differ by 1.04e-7
  processes.assert_same_metrics(one, two, atol=1e-6)


# The tests of failures and ends run each process on one device (a job of 2 processes over 2 devices, its rollout
# processes decoding on one device each): what they show is how processes stop. The 2-process GRPO job took 11.9 s
# on 4 devices a process and 8.1 s on one (warm compilation cache): its collectives over gloo gather each device's
# shards
ONE_EACH = "actor_rollout_ref.rollout.n_gpus_per_node=1"

# JAX's coordination service declares a process lost after this many seconds without its heartbeat (60 by default)
HEARTBEAT_S = 15


def assert_killing_a_process_stops_the_others(argv, metrics, count=2, killed=1):
  """Runs `argv` as `count` processes of one device each (`ONE_EACH`), whose heartbeat timeout is HEARTBEAT_S, kills
  process `killed` once `metrics` (the run's metrics.jsonl) has 2 records, and checks that every other process fails
  within 50 s (less than the default timeout, so the environment's was used), JAX's coordination service (process
  0's) naming the lost process."""
  procs = processes.start(argv, count, devices=count, RLJAX_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_S))
  others = [p for i, p in enumerate(procs) if i != killed]
  try:
    start = time.monotonic()
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
      assert time.monotonic() - start < 300 and procs[0].poll() is None, "the job did not log 2 records"
      time.sleep(0.5)
    procs[killed].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    logs = processes.finish(others, timeout=120)
    assert time.monotonic() - killed_at < 50, f"the others stopped {time.monotonic() - killed_at:.0f} s after the kill"
  finally:
    processes.finish(procs, timeout=1)
  assert all(p.returncode != 0 for p in others), [p.returncode for p in procs]
  assert re.search(rf"stopped sending heartbeats\):\s*{killed}\b|Task {killed} heartbeat timeout", logs[0]), \
      logs[0][-2000:]


@pytest.mark.slow  # a 2-process run killed after its second step, then restarted (36 s in CI)
def test_a_killed_process_stops_the_job_and_a_restart_resumes(model_dir, data_dir, tmp_path):
  run_dir = tmp_path / "run"
  argv = ["-m", "rljax.train", "--config=configs/grpo.py", *tiny_run.overrides(model_dir, data_dir, str(run_dir)),
          "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.n_gpus_per_node=auto",
          "trainer.total_epochs=50"]
  metrics = run_dir / "metrics.jsonl"
  assert_killing_a_process_stops_the_others([*argv, "trainer.total_training_steps=50"], metrics)
  saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in run_dir.glob("global_step_*") if "tmp" not in p.name)
  assert saved and saved[-1] >= 1
  # every host restarted: the job resumes after the last complete checkpoint
  logged = len(metrics.read_text().splitlines())
  processes.run_metrics([*argv, f"trainer.total_training_steps={saved[-1] + 1}"], 2, str(run_dir), devices=2)
  resumed = [json.loads(line) for line in metrics.read_text().splitlines()[logged:]]
  assert [m["step"] for m in resumed] == [saved[-1] + 1]
  assert os.path.isdir(run_dir / f"global_step_{saved[-1] + 1}")


# process FAILING fails: its first scoring raises (the other process goes on into the step's next collective, which
# never ends), or its model directory is missing (the other goes on to build the trainer)
FAILING_RUN = """
import os
import runpy
import sys

from rljax.rl import scoring


def fails(self, *args, **kwargs):
  raise RuntimeError("the scoring failed here")


if os.environ["JAX_PROCESS_ID"] == os.environ["FAILING"]:
  if os.environ["WHERE"] == "score":
    scoring.Scorer.__call__ = fails
  else:
    sys.argv = [a.split("=")[0] + "=/nowhere/model" if a.startswith("actor_rollout_ref.model.path=") else a
                for a in sys.argv]
sys.argv[0] = "rljax.train"
runpy.run_module("rljax.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("failing,where", [(0, "score"), (1, "model")])
def test_a_process_of_a_synchronous_job_failing_stops_every_process_within_seconds(
    model_dir, data_dir, tmp_path, failing, where):
  # before, the other process waited in its collective and the failed one in JAX's shutdown barrier until it timed
  # out; then both aborted on lost heartbeats (measured: 323 s, exit -6 each, the error among their stack traces)
  script = tmp_path / "failing_run.py"
  script.write_text(FAILING_RUN)
  argv = job("grpo", model_dir, data_dir, tmp_path, f"trainer.default_local_dir={tmp_path}/run")
  started = time.monotonic()
  procs = processes.start([str(script), *argv[2:]], 2, devices=2, FAILING=str(failing), WHERE=where)
  logs = processes.finish(procs, timeout=150)
  failed, other = logs[failing], logs[1 - failing]
  assert [procs[failing].returncode, procs[1 - failing].returncode] == [1 if where == "score" else 2, 1], other[-3000:]
  assert time.monotonic() - started < 120
  told = ("RuntimeError: the scoring failed here" if where == "score" else
          "actor_rollout_ref.model.path='/nowhere/model'")
  assert told in failed
  assert "another process of this job failed" in other and told in other


# on-policy, the IS weights (exp of the differences between the decode's log-probs and the trainer's) are 1 up to
# float noise that differs with each process's own CPU thread pools: their spread, 0 to 4e-4, and the chi-square
# statistics over them, about 1e-6
IS_NOISE = ("rollout_corr/rollout_is_std", "rollout_corr/rollout_is_seq_std", "rollout_corr/chi2_token",
            "rollout_corr/chi2_seq")


def pop_is_noise(records):
  """`records` (on-policy steps' metrics) without IS_NOISE's metrics, each checked to be noise (under 1e-3)."""
  noise = [abs(m.pop(k, 0.0)) for m in records for k in IS_NOISE]
  assert max(noise) < 1e-3, noise
  return records


def restarted_step_3(argv, tmp_path, runs, devices):
  """Each (run directory, processes) of `runs` run again from step 2's checkpoint on `devices` devices; their
  step 3 metrics, checked equal across the runs (the IS weights' noise popped)."""
  restarts = []
  for run, count in runs:
    shutil.rmtree(tmp_path / run / "global_step_3")
    again = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/{run}"], count, f"{tmp_path}/{run}",
                                  devices)
    assert [m["step"] for m in again[-2:]] == [3, 3]  # step 3 logged twice: once more after the restart
    restarts.append(pop_is_noise(again[-1:]))
  processes.assert_same_metrics(*restarts, atol=1e-6)
  return restarts


def separate_job(model_dir, data_dir, tmp_path, *extra):
  """`job` under separate_async, the rollout on one device a process (`ONE_EACH`) after the trainer's devices: 3
  steps of DAPO's dynamic sampling (the rollout judges each group as it ends), validation before and after step 2
  on the trainer's devices, token rollout IS, and the weights of updates 0 and 2 sent, batch b decoding under
  version 2 * floor((b - 1) / 2)."""
  return job("grpo", model_dir, data_dir, tmp_path, "trainer.v1.trainer_mode=separate_async",
             "actor_rollout_ref.rollout.nnodes=1", ONE_EACH,
             "trainer.total_training_steps=3", "trainer.v1.separate_async.parameter_sync_step=2",
             "trainer.v1.separate_async.num_warmup_batches=1", "trainer.v1.sampler.max_off_policy_threshold=3",
             "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
             "data.gen_batch_size=4", "trainer.val_before_train=true", "trainer.test_freq=2",
             "algorithm.rollout_correction.rollout_is=token", *extra)


@pytest.mark.slow  # four runs of 3 steps or 1: two of 1 process, two of 4 (59 s in CI)
def test_separate_async_with_trainer_and_rollout_on_two_processes_each_logs_the_metrics_of_one_process(
    model_dir, data_dir, tmp_path):
  # 4 devices, one a process: processes 0 and 1 train on theirs and checkpoint together; processes 2 and 3 each
  # roll out their share of the data on their own device, each sending its groups to its trainer process (0 with 2,
  # 1 with 3), and every weight sync reaches both. Dynamic sampling is off: each rollout process judges its own
  # groups, so which groups an update keeps would depend on how far each read ahead
  argv = separate_job(model_dir, data_dir, tmp_path, "algorithm.filter_groups.enable=false", "data.gen_batch_size=8",
                      "trainer.save_freq=1",
                      "actor_rollout_ref.rollout.nnodes=2")
  # padded in one process; the actor's and the critic's passes packed in four, with the optimizers' state and the
  # reference's and the critic's weights in host memory between the steps that use them (`sharding.offload`)
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one", PADDED], 1, f"{tmp_path}/one",
                              devices=4)
  four = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/four",
                                "critic.model.use_remove_padding=true", *OFFLOADED], 4, f"{tmp_path}/four", devices=4)
  assert [m["step"] for m in one] == [0, 1, 2, 3] and one[3]["off_policy/staleness/max"] == 3
  assert "val-core/rljax/arithmetic/reward/mean@1" in one[2] and one[1]["perf/weight_sync_bytes"] > 0
  for metrics in (one, four):
    pop_is_noise(metrics[:2])
  processes.assert_same_metrics(one, four, atol=1e-6)
  # both restart from step 2's checkpoint (the trainer's two processes wrote it together): each rollout process
  # resumes where its share of the data was
  restarted_step_3(argv, tmp_path, (("one", 1), ("four", 4)), devices=4)


@pytest.mark.slow  # two runs of 3 steps: one of 1 process, one of 3 (19 s in CI)
def test_separate_async_with_one_trainer_process_and_two_rollout_processes_logs_the_metrics_of_one_process(
    model_dir, data_dir, tmp_path):
  # 3 devices, one a process: process 0 trains on its own; processes 1 and 2 each roll out their share of the data
  # on theirs and send it to process 0, which trains their groups in process order; each weight sync goes to
  # one rollout process after the other (the trainer lays them out on its own device first)
  argv = separate_job(model_dir, data_dir, tmp_path, "algorithm.filter_groups.enable=false", "data.gen_batch_size=8",
                      "trainer.val_before_train=false", "actor_rollout_ref.rollout.nnodes=2")
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one"], 1, f"{tmp_path}/one", devices=3)
  three = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/three"], 3, f"{tmp_path}/three",
                                devices=3)
  assert [m["step"] for m in one] == [1, 2, 3] and one[2]["off_policy/staleness/max"] == 3
  assert one[0]["perf/weight_sync_bytes"] > 0 and all(0 < m["critic/score/mean"] < 1 for m in one)
  for metrics in (one, three):
    pop_is_noise(metrics[:1])
  # the trainer packs its rows per host, into other buffers in each layout: their log-probs differ in the last
  # bits, and rollout_corr/chi2_seq (a statistic of their differences with the decode's, about -0.014) by 1e-6
  processes.assert_same_metrics(one, three, atol=3e-6)


@pytest.mark.slow  # four runs of 3 steps or 1: two of 1 process, two of 3 (55 s in CI)
def test_separate_async_with_two_trainer_processes_and_one_rollout_process_logs_the_metrics_of_one_process(
    model_dir, data_dir, tmp_path):
  # 3 devices, one a process: processes 0 and 1 train on their 2; process 2 rolls out all the data on its own,
  # judging each group as it ends (dynamic sampling), and sends each half of a step's groups to one trainer
  # process. Process 0 starts and ends it; both take part in every weight sync (laid out on process 0's devices);
  # validation after step 2 decodes on the trainer's 2 devices
  argv = separate_job(model_dir, data_dir, tmp_path, "trainer.val_before_train=false", "trainer.save_freq=1")
  one = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/one"], 1, f"{tmp_path}/one", devices=3)
  three = processes.run_metrics([*argv, f"trainer.default_local_dir={tmp_path}/three"], 3, f"{tmp_path}/three",
                                devices=3)
  assert [m["step"] for m in one] == [1, 2, 3] and one[2]["off_policy/staleness/max"] == 3
  assert one[0]["perf/weight_sync_bytes"] > 0 and all(m["train/kept_groups"] == 8 for m in one)
  assert any(m["train/filtered_groups"] > 0 for m in one) and "val-core/rljax/arithmetic/reward/mean@1" in one[1]
  # the trainer's two processes all-reduce on gloo: the log-probs' last bits differ, and so IS weights' extremes
  for metrics in (one, three):
    pop_is_noise(metrics[:1])
  processes.assert_same_metrics(one, three, atol=1e-5)
  # both restarted after step 2's checkpoint (the trainer's two processes wrote it, with the one rollout
  # process's stream position): process 0 starts the rollout from there, under the checkpoint's weights (older
  # versions are not saved, so step 3 is not the uninterrupted run's)
  restarts = restarted_step_3(argv, tmp_path, (("one", 1), ("three", 3)), devices=3)
  assert restarts[0][0]["off_policy/staleness/max"] == 1


@pytest.mark.slow  # a 4-process run whose last rollout process is killed after step 1 (28 s in CI)
def test_killing_one_rollout_process_of_two_stops_both_trainer_processes_and_the_other_rollout_process(
    model_dir, data_dir, tmp_path):
  argv = separate_job(model_dir, data_dir, tmp_path, "algorithm.filter_groups.enable=false", "data.gen_batch_size=8",
                      "trainer.total_training_steps=50", "trainer.total_epochs=50", "trainer.val_before_train=false",
                      "actor_rollout_ref.rollout.nnodes=2", f"trainer.default_local_dir={tmp_path}/run")
  assert_killing_a_process_stops_the_others(argv, tmp_path / "run" / "metrics.jsonl", count=4, killed=3)


@pytest.mark.slow
def test_a_separate_async_run_that_trains_no_step_ends_its_rollout_process(model_dir, data_dir, tmp_path):
  # trainer.val_only: the trainer validates on its devices and never starts the rollout, which then ends too
  argv = separate_job(model_dir, data_dir, tmp_path, "trainer.val_only=true",
                      f"trainer.default_local_dir={tmp_path}")
  logged = processes.run_metrics(argv, 2, str(tmp_path), devices=2)
  assert [m["step"] for m in logged] == [0] and "val-core/rljax/arithmetic/reward/mean@1" in logged[0]


@pytest.mark.slow
def test_a_bad_row_the_rollout_process_reads_stops_both_processes_naming_it(model_dir, data_dir, tmp_path):
  # the rollout process reads the data; its error reaches the trainer's process, which names it and fails too
  tiny_run.ensure_synthetic_data(data_dir)
  rows = pq.read_table(f"{data_dir}/train.parquet")
  bad = rows.to_pylist()
  bad[12]["prompt"] = [dict(m, content=m["content"] + " pad" * 400) for m in bad[12]["prompt"]]
  pq.write_table(pa.Table.from_pylist(bad, schema=rows.schema), tmp_path / "train.parquet")
  argv = separate_job(model_dir, data_dir, tmp_path, f"data.train_files={tmp_path}/train.parquet",
                      "data.shuffle=false", "trainer.val_before_train=false",
                      f"trainer.default_local_dir={tmp_path}/run")
  procs = processes.start(argv, 2, devices=2)
  trainer, rollout = processes.finish(procs, timeout=300)
  assert procs[0].returncode != 0 and procs[1].returncode != 0
  named = f"{tmp_path}/train.parquet row 12: prompt is"
  assert "another process of this job failed: the rollout process, at step" in trainer and named in trainer \
      and named in rollout, trainer[-3000:]


@pytest.mark.slow  # a 2-process run whose rollout process is killed after step 1 (18 s in CI)
def test_a_killed_rollout_process_stops_the_trainer(model_dir, data_dir, tmp_path):
  argv = separate_job(model_dir, data_dir, tmp_path, "trainer.total_training_steps=50", "trainer.total_epochs=50",
                      f"trainer.default_local_dir={tmp_path}/run")
  assert_killing_a_process_stops_the_others(argv, tmp_path / "run" / "metrics.jsonl")


# process FAILING's first weight send or receive fails, after process 0 announced the weights: the other side waits
# inside the cross-host transfer, and any other trainer process inside the sync's collectives, whose failed side
# never comes
FAILING_SYNC = """
import os
import runpy
import sys

import jax

from rljax.rl import cross_host_weights


def failing(call):
  def fails(self, *args):
    if jax.process_index() == int(os.environ["FAILING"]):
      raise RuntimeError("the weight sync failed here")
    return call(self, *args)
  return fails


cross_host_weights.CrossHostSend.__call__ = failing(cross_host_weights.CrossHostSend.__call__)
cross_host_weights.CrossHostReceive.__call__ = failing(cross_host_weights.CrossHostReceive.__call__)
sys.argv[0] = "rljax.train"
runpy.run_module("rljax.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("count,failing", [(2, 0), (3, 1), (2, 1)])
def test_a_process_failing_inside_a_weight_sync_stops_every_process_within_seconds(
    model_dir, data_dir, tmp_path, count, failing):
  # 1+1 with the trainer's send or the rollout's receive failing, or 2+1 (processes 0 and 1 train)
  # with the second trainer process's send failing: before, the processes waiting inside the transfer or its
  # collectives stayed there for minutes, until JAX's shutdown barrier timed out and heartbeats were lost. (1+1
  # with the receive failing: the trainer, told by the rollout's message, may abort the job before the rollout
  # process does; its error names the rollout's all the same)
  script = tmp_path / "failing_sync.py"
  script.write_text(FAILING_SYNC)
  argv = separate_job(model_dir, data_dir, tmp_path, "trainer.val_before_train=false",
                      f"trainer.default_local_dir={tmp_path}/run")
  assert argv[:2] == ["-m", "rljax.train"]
  started = time.monotonic()
  procs = processes.start([str(script), *argv[2:]], count, devices=count, FAILING=str(failing))
  logs = processes.finish(procs, timeout=150)
  assert [p.returncode for p in procs] == [1] * count, logs[-1][-3000:]
  assert time.monotonic() - started < 120
  assert "the weight sync failed here" in logs[failing]
  for log in logs[:failing] + logs[failing + 1:]:
    assert "another process of this job failed" in log and "the weight sync failed here" in log
