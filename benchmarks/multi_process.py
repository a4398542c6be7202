"""The same RL job as 1 process x 8 CPU devices and as 2 processes x 4: wall time per phase, alternated.

Usage: python benchmarks/multi_process.py [--pairs 2] [--steps 4] [--model DIR] [overrides ...]

Without --model it trains a tiny random 2-layer Llama with SmolLM2's tokenizer on the synthetic arithmetic
data (8 prompts x 2 responses of 8 tokens per step). Each run is `python -m rljax.train` started as every host
of a pod starts it (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`); the figures are the
medians over the steps after the first (which compiles) of process 0's `timing_s/*` metrics.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import processes  # noqa: E402  (the tests' multi-process launcher)
from tests.rl import tiny_run  # noqa: E402

PHASES = ("gen", "reward", "ref", "adv", "update_actor", "step")


def run(count: int, run_dir: str, overrides: list[str]) -> dict[str, float]:
  """Median seconds per phase over the steps after the first, for the job as `count` processes."""
  records = processes.run_metrics(["-m", "rljax.train", "--config=configs/grpo.py", *overrides,
                                   f"trainer.default_local_dir={run_dir}"], count, run_dir)
  steady = [r for r in records if r["step"] > 1]
  return {p: statistics.median(r[f"timing_s/{p}"] for r in steady) for p in PHASES if f"timing_s/{p}" in steady[0]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=2)
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--model", default=None)
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  work = tempfile.mkdtemp(prefix="rljax_multi_process_")
  model = args.model or tiny_run.tiny_model_dir(pathlib.Path(work) / "model")
  scorer = pathlib.Path(work) / "score.py"
  scorer.write_text("import zlib\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "  return float(zlib.crc32(solution_str.encode()) % 3) / 2.0\n")
  overrides = [*tiny_run.overrides(model, os.path.join(work, "data"), "unused"), "data.train_batch_size=8",
               "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
               f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=100", "trainer.save_freq=-1",
               "trainer.n_gpus_per_node=auto", f"custom_reward_function.path={scorer}", *args.overrides]
  print("| pair | layout | " + " | ".join(PHASES) + " |")
  print("| --- | --- | " + " | ".join("---" for _ in PHASES) + " |")
  for pair in range(args.pairs):
    for count in (1, 2):
      times = run(count, os.path.join(work, f"run_{pair}_{count}"), overrides)
      layout = f"{count} x {8 // count}"
      print(f"| {pair + 1} | {layout} | " + " | ".join(f"{times.get(p, float('nan')):.3f}" for p in PHASES) + " |",
            flush=True)


if __name__ == "__main__":
  main()
