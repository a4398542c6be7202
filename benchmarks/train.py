"""The default training job, timed per phase, with its reward curve.

    python benchmarks/train.py [--config=configs/grpo.py] [KEY=VALUE ...]

Runs `python -m rljax.train`'s job in-process (same config resolution, same
overrides), into a fresh run directory unless trainer.default_local_dir is
given, then reads its metrics.jsonl and prints JSON lines:

- `step`: per step, the score, response length and phase times;
- `phases`: the mean seconds per step of each phase (gen, reward,
  old_log_prob, ref, values, adv, update_critic, update_actor, step) over
  the steps after the first (the first compiles), with tokens/s;
- `curve`: mean critic/score/mean over the first and the last 3 steps;
- `wall`: the job's wall time including model loading and compilation.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time

import jax

from rljax import config as config_lib
from rljax import train
from rljax import rl

PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step")


def phase_means(records: list[dict]) -> dict[str, float]:
  """Mean seconds per step of each phase over records[1:] (all records if only one)."""
  steady = records[1:] or records
  out = {}
  for phase in PHASES:
    values = [r[f"timing_s/{phase}"] for r in steady if f"timing_s/{phase}" in r]
    if values:
      out[phase] = statistics.mean(values)
  tokens = statistics.mean(r["perf/total_num_tokens"] for r in steady)
  out["tokens_per_s"] = tokens / out["step"]
  return out


def curve(records: list[dict], k: int = 3) -> dict[str, float]:
  scores = [r["critic/score/mean"] for r in records]
  return {"first": statistics.mean(scores[:k]), "last": statistics.mean(scores[-k:]),
          "gain": statistics.mean(scores[-k:]) - statistics.mean(scores[:k])}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/grpo.py")
  parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (verl spelling)")
  args = parser.parse_args()
  overrides = list(args.overrides)
  if not any(o.startswith("trainer.default_local_dir=") for o in overrides):
    overrides.append(f"trainer.default_local_dir={tempfile.mkdtemp(prefix='rljax-bench-')}")
  config = train.resolve(config_lib.load_config_file(args.config), overrides, jax.device_count())
  start = time.perf_counter()
  rl.run(config)
  wall = time.perf_counter() - start
  run_dir = config.trainer.default_local_dir
  records = [r for r in map(json.loads, open(f"{run_dir}/metrics.jsonl")) if "critic/score/mean" in r]
  for r in records:
    print(json.dumps({"bench": "step", "global_step": r["step"], "score": r["critic/score/mean"],
                      "response_length": r["response_length/mean"],
                      **{p: r[f"timing_s/{p}"] for p in PHASES if f"timing_s/{p}" in r}}))
  print(json.dumps({"bench": "phases", "steps": len(records), "devices": jax.device_count(),
                    **phase_means(records)}))
  print(json.dumps({"bench": "curve", **curve(records)}))
  print(json.dumps({"bench": "wall", "seconds": wall, "run_dir": run_dir}))
  sys.stdout.flush()


if __name__ == "__main__":
  main()
