"""Trainer variants whose per-step metrics a restructuring must keep: tests/rl/test_golden.py compares them with
tests/rl/golden_metrics.json.

    python -m tests.rl.golden OUT.json [VARIANT ...]   # writes the variants' metrics (all of them by default)

Regenerate the JSON only for a change meant to move the numbers, and say so in its commit.
"""

if __name__ == "__main__":
  import tests.conftest  # noqa: F401  (the suite's XLA flags and matmul precision, before JAX starts)

import json
import pathlib
import sys
import tempfile

import jax
import pytest

from rljax import sharding
from tests.rl import tiny_run

GOLDEN = pathlib.Path(__file__).with_name("golden_metrics.json")
STREAMED = ("trainer.v1.trainer_mode=colocate_async",)
SEPARATE = ("trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=4", "trainer.v1.separate_async.num_warmup_batches=1")
EIGHT = ("trainer.n_gpus_per_node=auto", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
# tests/rl/test_multi_process.py's GRPO job as 2 processes of one device each must log this 1-process run's metrics
# on 2 devices: 8 prompts x 2 responses, 2 shuffled and balanced mini-batches, streamed, validated before step 1 and
# after 2
TWO_PROCESS_JOB = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "data.train_batch_size=8",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                   "actor_rollout_ref.actor.shuffle=true", "trainer.balance_batch=true",
                   "trainer.val_before_train=true", "trainer.test_freq=2", *STREAMED,
                   "actor_rollout_ref.rollout.max_num_seqs=8")

# name: (configs/<name>.py, model fixture, overrides); every variant scores by the response's text
VARIANTS = {
    "grpo": ("grpo", "model", ()),
    "ppo": ("ppo", "model", ()),
    "rloo": ("rloo", "model", ()),
    "reinforce_plus_plus": ("reinforce_plus_plus", "model", ()),
    "gspo": ("gspo", "model", ()),
    "dapo_dynamic_sampling": ("dapo", "model", ("data.gen_batch_size=2",)),
    "remax": ("grpo", "model", ("algorithm.adv_estimator=remax",)),
    "lora": ("grpo", "model", ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")),
    "off_policy_shuffled": ("grpo", "model", ("actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                              "actor_rollout_ref.actor.ppo_epochs=2",
                                              "actor_rollout_ref.actor.shuffle=true")),
    "rollout_is_padded": ("grpo", "model", ("algorithm.rollout_correction.rollout_is=token",
                                            "actor_rollout_ref.model.use_remove_padding=false")),
    "adaptive_kl_in_reward": ("grpo", "model", ("algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                                                "actor_rollout_ref.actor.use_kl_loss=false")),
    "positive_nll_validated": ("grpo", "model", ("actor_rollout_ref.actor.positive_nll_coef=0.1",
                                                 "trainer.test_freq=1", "trainer.val_before_train=true")),
    "reward_model": ("grpo", "reward_model", ()),
    "moe_r2": ("grpo", "moe", ("actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_epochs=2",
                               "actor_rollout_ref.actor.router_replay.mode=R2")),
    "moe_r3": ("grpo", "moe", ("actor_rollout_ref.actor.ppo_mini_batch_size=2",
                               "actor_rollout_ref.actor.router_replay.mode=R3",
                               "actor_rollout_ref.rollout.enable_rollout_routing_replay=true")),
    "grpo_eight_devices_rollout_tp2": ("grpo", "model", (*EIGHT,
                                                         "actor_rollout_ref.rollout.tensor_model_parallel_size=2")),
    "ppo_four_devices": ("ppo", "model", ("trainer.n_gpus_per_node=4",
                                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")),
    "colocate_async": ("grpo", "model", (*STREAMED, "trainer.v1.sampler.max_off_policy_threshold=2",
                                         "trainer.total_training_steps=3")),
    "colocate_async_dapo_remax": ("dapo", "model", (*STREAMED, "data.gen_batch_size=2",
                                                    "algorithm.adv_estimator=remax")),
    "separate_async": ("grpo", "model", (*SEPARATE, "trainer.total_training_steps=3", "trainer.test_freq=2")),
    "grpo_two_process_job_on_one": ("grpo", "model", (*TWO_PROCESS_JOB, "trainer.n_gpus_per_node=2",
                                                      "actor_rollout_ref.model.use_remove_padding=false")),
}
DROPPED = ("timing_s/", "perf/")


def variant_metrics(name: str, model_dirs: dict[str, str], data_dir: str, run_dir: pathlib.Path) -> list[dict]:
  """Variant `name`'s per-step metrics (timings and throughputs aside), trained in `run_dir`."""
  config_name, model, extra = VARIANTS[name]
  extra = list(extra)
  if model == "reward_model":
    model, extra = "model", ["reward_model.enable=true", f"reward_model.model.path={model_dirs['reward_model']}",
                             *extra]
  config = tiny_run.run_config(config_name, model_dirs[model], data_dir, str(run_dir), "trainer.save_freq=-1",
                               tiny_run.text_scorer(run_dir.parent), *extra)
  mesh = None
  if name == "separate_async":  # the first 4 devices train, the last 4 decode
    mesh = sharding.make_mesh(config)
    assert list(mesh.devices.flat) == jax.devices()[:4]
  elif any(e.startswith("trainer.n_gpus_per_node") for e in extra):
    count = config.trainer.n_gpus_per_node
    mesh = sharding.make_mesh(config, jax.devices()[:jax.device_count() if count == "auto" else int(count)])
  return [{k: v for k, v in m.items() if not k.startswith(DROPPED)} for m in tiny_run.fit_metrics(config, mesh)]


def assert_golden(got: list[dict], want: list[dict], name: str) -> None:
  """`got` (a run's metrics.jsonl records) logs the golden records `want`: the same steps and names, each value
  within 1e-4 relative or 1e-5 absolute (another CPU, or another order of a float32 sum, rounds otherwise: a
  metric near zero that is a mean of differences of O(1) float32 values, actor/ppo_kl or rollout_corr/chi2_seq,
  moved by 3.5e-6 between the AMD machine the records come from and an Intel one, and by 1.1e-6 between one
  process and two); timings and throughputs aside."""
  got = [{k: v for k, v in m.items() if not k.startswith(DROPPED)} for m in got]
  assert [sorted(m) for m in got] == [sorted(m) for m in want], name
  for step, (a, b) in enumerate(zip(got, want, strict=True)):
    assert a == pytest.approx(b, rel=1e-4, abs=1e-5), (name, step)


def model_dirs(root: pathlib.Path) -> dict[str, str]:
  """The tiny models the variants train (as tests/rl/conftest.py's fixtures build them)."""
  from tests.rl import conftest  # pylint: disable=import-outside-toplevel
  model = tiny_run.tiny_model_dir(root / "model")
  return {"model": model, "moe": conftest.tiny_moe_dir(root / "moe"),
          "reward_model": conftest.tiny_reward_model_dir(root / "reward_model", model)}


def main(argv: list[str]) -> None:
  out, names = argv[0], argv[1:] or list(VARIANTS)
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    dirs = model_dirs(root)
    results = {}
    for name in names:
      (root / "runs" / name).mkdir(parents=True)
      results[name] = variant_metrics(name, dirs, str(root / "data"), root / "runs" / name / "run")
      print(name, "done", flush=True)
  pathlib.Path(out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
  main(sys.argv[1:])
