"""Router replay (verl's R2 and R3) on a tiny Qwen3-MoE: the update's actor/ppo_kl with and without it.

    python benchmarks/router_replay.py [--steps 3 --lr 1e-3 --epochs 2 --minis 2]

Builds a random 2-layer Qwen3-MoE (8 experts, top 2) with SmolLM2's
tokenizer (offline), then runs GRPO on the synthetic arithmetic task three
times from the same seed: router_replay.mode=disabled, R2 (the update
replays the old-log-prob pass's experts) and R3 (every actor pass replays
the rollout's). With `--epochs` x
`--minis` updates per step, every update after the first sees old
log-probs from parameters it has moved away from; without replay it also
routes tokens to other experts than the old pass did. Prints one JSON
object per line: each run's per-step actor/ppo_kl, actor/pg_clipfrac and
actor/grad_norm, then their means side by side (and the mean of |ppo_kl|:
the metric is signed).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile

from flax import nnx

from rljax import config as config_lib
from rljax.data import ensure_synthetic_data
from rljax.models import CausalLM, ModelConfig, load_tokenizer, save_pretrained
from rljax import rl

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEYS = ("actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm")


def tiny_moe(path: pathlib.Path) -> str:
  cfg = ModelConfig(model_type="qwen3_moe", vocab_size=49152, hidden_size=128, intermediate_size=256, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=100000.0, tie_word_embeddings=True,
                    qk_norm=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                    norm_topk_prob=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
  save_pretrained(CausalLM(cfg, nnx.Rngs(0)), str(path), tokenizer=load_tokenizer("smollm2-135m-instruct"))
  return str(path)


def run_mode(model: str, data: str, run_dir: str, mode: str, args: argparse.Namespace) -> list[dict]:
  config = config_lib.load_config_file(str(ROOT / "configs" / "grpo.py"))
  batch = 8
  config_lib.apply_overrides(config, [
      f"actor_rollout_ref.model.path={model}", f"data.train_files={data}/train.parquet",
      f"data.val_files={data}/test.parquet", f"data.train_batch_size={batch}", "data.max_prompt_length=96",
      "data.max_response_length=16", "actor_rollout_ref.rollout.n=4",
      f"actor_rollout_ref.actor.ppo_mini_batch_size={batch // args.minis}",
      f"actor_rollout_ref.actor.ppo_epochs={args.epochs}", f"actor_rollout_ref.actor.optim.lr={args.lr}",
      f"actor_rollout_ref.actor.router_replay.mode={mode}", f"trainer.total_training_steps={args.steps}",
      f"actor_rollout_ref.rollout.enable_rollout_routing_replay={mode == 'R3'}",
      "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
      f"trainer.default_local_dir={run_dir}", "trainer.n_gpus_per_node=1"])
  config_lib.finalize(config, device_count=1)
  trainer = rl.RLTrainer(config_lib.validate(config))
  try:
    trainer.fit()
  finally:
    trainer.close()
  return [json.loads(line) for line in open(f"{trainer.run_dir}/metrics.jsonl")]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--minis", type=int, default=2)
  args = parser.parse_args()
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="router_replay"))
  model, data = tiny_moe(tmp / "model"), str(tmp / "data")
  ensure_synthetic_data(data)
  means = {}
  for mode in ("disabled", "R2", "R3"):
    history = run_mode(model, data, str(tmp / mode), mode, args)
    for metrics in history:
      print(json.dumps({"mode": mode, "step": metrics["step"], **{k: round(metrics[k], 6) for k in KEYS}}))
    means[mode] = {k: round(statistics.mean(m[k] for m in history), 6) for k in KEYS}
    means[mode]["abs_ppo_kl"] = round(statistics.mean(abs(m["actor/ppo_kl"]) for m in history), 6)
  print(json.dumps({"setup": vars(args), "mean": means}))


if __name__ == "__main__":
  main()
