"""Does a tiny vision-language model learn the shapes task? SFT warm start, then GRPO on images, on CPU.

    python benchmarks/visual_task.py --workdir /tmp/visual_task [--sft_steps 200] [--grpo_steps 300]

1. Writes the shapes task (`rljax.data.synthetic.shapes`: name a drawn shape's colour and kind, 12 answers).
2. Builds a tiny Qwen2.5-VL with random weights (SmolLM2's tokenizer with Qwen-VL's vision tokens, 2 text layers
   of width 128, a 2-block vision tower of 4-pixel patches; images kept within 56 x 56 pixels).
3. SFT (`rljax.sft`) on the task's answers for --sft_steps steps, saved as a model directory.
4. GRPO (`configs/grpo_vl.py`: 16 prompts x 8 responses a step, actor lr --grpo_lr after 10 warm-up steps) from it
   for --grpo_steps steps, validating on the 128 test prompts every 25 (verl's val_kwargs: greedy, one response per
   prompt). --sft_model DIR starts here.

Prints the validation reward (accuracy) of the random model, after SFT (GRPO's step 0) and along GRPO, and the
training reward of each GRPO step.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import tokenizers  # noqa: E402
from flax import nnx  # noqa: E402

from rljax import config as config_lib  # noqa: E402
from rljax import models, rl, sharding  # noqa: E402
from rljax.data.synthetic import shapes  # noqa: E402
from rljax.models.config import from_hf_dict  # noqa: E402
from rljax.sft import config as sft_config  # noqa: E402
from rljax.sft import trainer as sft_trainer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
REWARD = "val-core/rljax/shapes/reward/mean@1"


def tiny_vl(path: pathlib.Path, seed: int) -> str:
  """Writes the tiny Qwen2.5-VL (random weights), its tokenizer and preprocessor_config.json into `path`."""
  tokenizer = copy.copy(models.load_tokenizer("smollm2-135m-instruct"))
  tokenizer.tok = tokenizers.Tokenizer.from_str(tokenizer.tok.to_str())
  tokenizer.tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in VISION_TOKENS])
  ids = {t: tokenizer.tok.token_to_id(t) for t in VISION_TOKENS}
  cfg = from_hf_dict({
      "model_type": "qwen2_5_vl", "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
      "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
      "text_config": dict(vocab_size=-(-tokenizer.vocab_size // 128) * 128, hidden_size=128, intermediate_size=256,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                          max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
                          rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}, bos_token_id=1,
                          eos_token_id=2, pad_token_id=2),
      "vision_config": dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                            patch_size=4, spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                            fullatt_block_indexes=[1], in_channels=3)})
  models.save_pretrained(models.CausalLM(cfg, nnx.Rngs(seed)), str(path), tokenizer=tokenizer)
  (path / "preprocessor_config.json").write_text(json.dumps(
      {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 64, "max_pixels": 56 * 56}))
  return str(path)


def sft(model_dir: str, data_dir: str, out: pathlib.Path, steps: int) -> tuple[str, list[dict]]:
  """SFT on the task's answers; returns the trained model's directory and the SFT metrics."""
  config = config_lib.load_config_file(str(ROOT / "configs" / "sft.py"))
  config_lib.apply_overrides(config, [
      f"model.partial_pretrain={model_dir}", f"data.train_files={data_dir}/sft_train.parquet",
      f"data.val_files={data_dir}/sft_test.parquet", "data.prompt_key=prompt", "data.response_key=answer",
      "data.response_dict_keys=null", "data.max_length=128", "data.image_patch_size=4", "data.train_batch_size=32",
      "data.micro_batch_size_per_gpu=4", "data.val_max_samples=64", "optim.lr=1e-3", "optim.warmup_steps_ratio=0.0",
      "model.fsdp_config.model_dtype=fp32", f"trainer.total_training_steps={steps}", "trainer.total_epochs=100",
      f"trainer.test_freq={steps}", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
      f"trainer.default_local_dir={out / 'sft_run'}", "trainer.n_gpus_per_node=auto"])
  sft_config.finalize(config, 8)
  trainer = sft_trainer.SFTTrainer(sft_config.validate(config, 8))
  try:
    trainer.fit()
    model = nnx.merge(trainer.graphdef, trainer.trainable, trainer.frozen)
  finally:
    trainer.close()
  target = out / "sft_model"
  models.save_pretrained(model, str(target), tokenizer=models.load_tokenizer(model_dir))
  (target / "preprocessor_config.json").write_text((pathlib.Path(model_dir) / "preprocessor_config.json").read_text())
  return str(target), [json.loads(line) for line in open(out / "sft_run" / "metrics.jsonl")]


def grpo(model_dir: str, data_dir: str, out: pathlib.Path, steps: int, name: str, *extra: str) -> list[dict]:
  """GRPO (configs/grpo_vl.py) from `model_dir` for `steps` steps (0: validation alone); returns its metrics
  records."""
  config = config_lib.load_config_file(str(ROOT / "configs" / "grpo_vl.py"))
  config_lib.apply_overrides(config, [
      f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data_dir}/train.parquet",
      f"data.val_files={data_dir}/test.parquet", f"trainer.total_training_steps={max(steps, 1)}",
      f"trainer.val_only={str(not steps).lower()}", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
      f"trainer.default_local_dir={out / name}", *extra])
  config_lib.finalize(config, device_count=8)
  config = config_lib.validate(config, 8)
  trainer = rl.RLTrainer(config, mesh=sharding.make_mesh(config))
  try:
    trainer.fit()
  finally:
    trainer.close()
  return [json.loads(line) for line in open(pathlib.Path(trainer.run_dir) / "metrics.jsonl")]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/visual_task")
  parser.add_argument("--sft_steps", type=int, default=200)
  parser.add_argument("--grpo_steps", type=int, default=300)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--grpo_lr", type=float, default=3e-4, help="actor_rollout_ref.actor.optim.lr of GRPO")
  parser.add_argument("--grpo_override", action="append", default=[], help="a further GRPO config override "
                      "(key=value; repeatable)")
  parser.add_argument("--sft_model", default=None, help="a warm-started model directory: skip the random model's "
                      "validation and SFT")
  args = parser.parse_args(argv)
  out = pathlib.Path(args.workdir)
  out.mkdir(parents=True, exist_ok=True)
  data_dir = str(out / "data")
  shapes.generate(data_dir, train_size=2000, test_size=128, seed=args.seed)
  start = time.perf_counter()
  model_dir = args.sft_model
  if model_dir is None:
    base = tiny_vl(out / "base_model", args.seed)
    random_run = grpo(base, data_dir, out, 0, "random")
    print(json.dumps({"stage": "random model", "val_reward": random_run[0].get(REWARD)}), flush=True)
    model_dir, sft_metrics = sft(base, data_dir, out, args.sft_steps)
    print(json.dumps({"stage": "sft", "steps": args.sft_steps, "first_loss": sft_metrics[0]["train/loss"],
                      "last_loss": sft_metrics[-1]["train/loss"],
                      "val_loss": next((m["val/loss"] for m in reversed(sft_metrics) if "val/loss" in m), None)}),
          flush=True)
  records = grpo(model_dir, data_dir, out, args.grpo_steps, f"grpo_lr{args.grpo_lr:g}",
                 f"actor_rollout_ref.actor.optim.lr={args.grpo_lr}", *args.grpo_override)
  for m in records:
    print(json.dumps({"stage": "grpo", "step": m["step"], "val_reward": m.get(REWARD),
                      "train_reward": m.get("critic/score/mean"), "step_s": m.get("timing_s/step")}), flush=True)
  print(json.dumps({"total_s": round(time.perf_counter() - start, 1)}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
