"""Synchronous against colocate_async training on one job, side by side: samples/s, slot occupancy, reward.

    python benchmarks/async_rollout.py [--steps=12] [--rounds=1] [--seeds=1] [KEY=VALUE ...]

Runs the default job (`configs/grpo.py`, SmolLM2-135M on the arithmetic
task) with the given overrides once per mode, each in its own
`python -m rljax.train` process (nothing else running beside it), the modes
alternated round by round:

- `sync`: trainer.v1.trainer_mode=sync;
- `async_tT`: colocate_async with max_off_policy_threshold=T (T = 1, 2, 8;
  drop, num_warmup_batches=1);
- `separate`: separate_async, the rollout on the last JAX device and the
  trainer on the others (weights sent after every update, the rollout one
  batch ahead, threshold 8): it needs 2 devices or more
  (XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU host, where
  every mode then runs on those devices).

Prints one JSON line per run (`run`) and per mode (`mode`):

- samples_per_s: responses trained per second of step time, steps after the
  first (which compiles);
- slot_occupancy: the share of decode slot-steps that decoded a token (so
  tokens per decode step = slot_occupancy x slots);
- score: critic/score/mean per step, with the cumulative step time (the
  reward over wall time), and its mean over the last half of the steps;
- staleness: mean off_policy/staleness/mean, evicted: off_policy/evicted_samples summed;
- ratio: the mode's median samples/s over sync's, per round.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODES = {
    "sync": ["trainer.v1.trainer_mode=sync"],
    **{f"async_t{t}": ["trainer.v1.trainer_mode=colocate_async", f"trainer.v1.sampler.max_off_policy_threshold={t}"]
       for t in (1, 2, 8)},
    "separate": ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
                 "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.v1.separate_async.parameter_sync_step=1"],
}


def run_job(overrides: list[str]) -> list[dict]:
  """One training job in a fresh process; its metrics.jsonl records."""
  out = tempfile.mkdtemp(prefix="rljax-async-")
  command = [sys.executable, "-m", "rljax.train", "--config=configs/grpo.py", "trainer.logger=[jsonl]", "trainer.save_freq=-1",
             f"trainer.default_local_dir={out}", *overrides]
  subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
  with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def rows_per_step(overrides: list[str]) -> int:
  """Responses each step trains (data.train_batch_size x rollout.n of the default job under `overrides`)."""
  from rljax import config as config_lib  # pylint: disable=import-outside-toplevel
  config = config_lib.load_config_file("configs/grpo.py")
  config_lib.apply_overrides(config, overrides)
  return config.data.train_batch_size * config.actor_rollout_ref.rollout.n


def summary(records: list[dict], rows: int) -> dict:
  """A run's figures (the first step, which compiles, left out of the rates)."""
  steady = records[1:]
  tokens = [r["perf/total_num_tokens"] for r in steady]
  elapsed = 0.0
  curve = []
  for r in records:
    elapsed += r["timing_s/step"]
    curve.append([round(elapsed, 2), round(r["critic/score/mean"], 4)])
  step_time = sum(r["timing_s/step"] for r in steady)
  half = records[len(records) // 2:]
  return {
      "samples_per_s": len(steady) * rows / step_time,
      "tokens_per_s": sum(tokens) / step_time,
      "slot_occupancy": statistics.mean(r["perf/slot_occupancy"] for r in steady),
      "score_last_half": statistics.mean(r["critic/score/mean"] for r in half),
      "response_length": statistics.mean(r["response_length/mean"] for r in records),
      "staleness": statistics.mean(r.get("off_policy/staleness/mean", 1.0) for r in records),
      "evicted": sum(r.get("off_policy/evicted_samples", 0.0) for r in records),
      "score": curve,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--seeds", type=int, default=1)
  parser.add_argument("--modes", default="sync,async_t1,async_t2,async_t8")
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  modes = args.modes.split(",")
  rows = rows_per_step(args.overrides)
  ratios: dict[str, list[float]] = {m: [] for m in modes}
  results: dict[str, list[dict]] = {m: [] for m in modes}
  for round_index in range(args.rounds):
    for seed in range(1, args.seeds + 1):
      order = modes if round_index % 2 == 0 else modes[::-1]
      rates = {}
      for mode in order:
        records = run_job([f"trainer.total_training_steps={args.steps}", f"trainer.seed={seed}", *args.overrides,
                           *MODES[mode]])
        figures = summary(records, rows)
        rates[mode] = figures["samples_per_s"]
        results[mode].append(figures)
        print(json.dumps({"run": mode, "round": round_index, "seed": seed, **figures}), flush=True)
      for mode in modes:
        ratios[mode].append(rates[mode] / rates["sync"])
  for mode in modes:
    runs = results[mode]
    print(json.dumps({"mode": mode, "ratio_to_sync": statistics.median(ratios[mode]),
                      "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
                      "slot_occupancy": statistics.mean(r["slot_occupancy"] for r in runs),
                      "score_last_half": statistics.mean(r["score_last_half"] for r in runs),
                      "staleness": statistics.mean(r["staleness"] for r in runs),
                      "evicted": statistics.mean(r["evicted"] for r in runs)}), flush=True)


if __name__ == "__main__":
  main()
