"""Packed against padded training passes on the default job's long-tailed responses.

    python benchmarks/packed_passes.py [--rollouts 2] [--reps 3] [KEY=VALUE ...]

Two trainers of configs/grpo.py (SmolLM2-135M on the arithmetic task), one
with actor_rollout_ref.model.use_remove_padding=true and one with false, the
same weights and config otherwise (data.max_response_length=512 unless
overridden: the model's own lengths, long-tailed under that cap), both with
verl's use_dynamic_bsz token budget (ppo_max_token_len_per_gpu=2304, four
padded rows; log-probs follow it), which the packed passes count in real
tokens and the padded ones in rows of the caps. Each
rollout of the packed trainer's gives rows that both trainers then run
through the step's training passes (old and reference log-probs where the
run has them, advantages, the actor update), once untimed (compiling their
programs) and then `--reps` times alternated. Both start from the same
weights and see the same rows in the same order, so their metrics must agree.

Prints JSON lines: `rows` per rollout (real tokens, the caps' tokens, the
packed passes' computed tokens over real ones), `time` per repetition
(seconds of each mode, their ratio), and `summary` (the median ratio, the
largest metric difference).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from rljax import config as config_lib
from rljax import rl, train
from rljax.rl import stages

# the metrics that do not depend on how a mini-batch splits into micro-batches (each micro-batch's loss is
# its share of the mini-batch's); under use_dynamic_bsz the two modes split it differently
METRICS = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm")


def trainer_for(overrides: list[str], packed: bool) -> rl.RLTrainer:
  flag = f"actor_rollout_ref.model.use_remove_padding={str(packed).lower()}"
  run_dir = f"trainer.default_local_dir={tempfile.mkdtemp(prefix='rljax-packed-')}"
  config = train.resolve(config_lib.load_config_file("configs/grpo.py"),
                         ["data.max_response_length=512", "trainer.logger=[jsonl]", "actor_rollout_ref.actor.use_dynamic_bsz=true",
                          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2304", *overrides, flag, run_dir],
                         jax.device_count())
  return rl.RLTrainer(config)


def training_passes(trainer: rl.RLTrainer, rows) -> tuple[float, dict[str, float], object]:
  """(seconds, metrics with the phases' seconds, packer) of the step's passes after the rollout: packing,
  log-probs, advantages, update."""
  metrics, timing = {}, {}
  start = time.perf_counter()
  data = stages.place_step(trainer.parts, rows)
  rows, state = stages.experience(trainer.parts, trainer.state, rows, timing, metrics, data)
  trainer.state = stages.update(trainer.parts, state, rows, timing, metrics, data)
  return time.perf_counter() - start, {**metrics, **timing}, data.packer


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rollouts", type=int, default=2)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (verl spelling)")
  args = parser.parse_args()
  packed, padded = trainer_for(args.overrides, True), trainer_for(args.overrides, False)
  layout = packed.run.layout
  ratios, worst = [], 0.0
  try:
    for r in range(args.rollouts):
      rows = packed.source.rows(next(packed.train_iter), packed.step, {}, {})
      real = int(rows.attention_mask.sum())
      _, _, packer = training_passes(packed, rows)  # compiles, and counts the packed passes' tokens
      training_passes(padded, rows)
      print(json.dumps({"rows": r, "n": len(rows.response_mask), "real_tokens": real,
                        "padded_tokens": int(rows.attention_mask.size),
                        "response_length_mean": float(rows.response_mask.sum(-1).mean()),
                        "response_length_max": int(rows.response_mask.sum(-1).max()),
                        "padded_compute_ratio": rows.attention_mask.size / real,
                        # None: every pass found its padded twin cheaper (shared prompts, short responses)
                        "packed_compute_ratio": packer.computed / packer.real if packer.real else None}),
            flush=True)
      for rep in range(args.reps):
        t_packed, m_packed, _ = training_passes(packed, rows)
        t_padded, m_padded, _ = training_passes(padded, rows)
        diff = max(abs(m_packed[k] - m_padded[k]) / max(abs(m_padded[k]), 1e-3) for k in METRICS if k in m_padded)
        worst = max(worst, diff)
        ratios.append(t_padded / t_packed)
        phases = {f"{mode}_{k}": round(m[f"timing_s/{k}"], 3) for mode, m in (("packed", m_packed), ("padded", m_padded))
                  for k in ("old_log_prob", "ref", "update_actor") if f"timing_s/{k}" in m}
        print(json.dumps({"time": rep, "rows": r, "packed_s": round(t_packed, 3), "padded_s": round(t_padded, 3),
                          "speedup": round(ratios[-1], 3), "max_metric_rel_diff": diff, **phases}), flush=True)
  finally:
    packed.close()
    padded.close()
  print(json.dumps({"summary": {"median_speedup": statistics.median(ratios), "runs": len(ratios),
                                "max_metric_rel_diff": worst, "devices": jax.device_count(),
                                "prompt_cap": layout.prompt_length, "response_cap": layout.response_length,
                                "rows": layout.rows}}), flush=True)
  sys.stdout.flush()


if __name__ == "__main__":
  np.set_printoptions(precision=4)
  main()
