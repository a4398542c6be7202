"""Does SFT help? Validation loss and greedy task reward before and after an SFT run.

    python benchmarks/sft_reward.py [--config configs/sft.py] [--prompts 128] [--response_length 32] [KEY=VALUE ...]

Runs the SFT trainer (`rljax.sft.trainer.SFTTrainer`) on the experiment file
(default: configs/sft.py, SmolLM2-135M-Instruct on the synthetic arithmetic
word problems) in a fresh run directory, so nothing is resumed. Before the
first step and after the last it measures

* `val/loss`: the trainer's own token-mean loss over `data.val_files`;
* the greedy task reward: the first --prompts rows of `data.val_files` (the
  held-out test split, in verl's RL schema: the prompt the SFT config names,
  data_source and reward_model.ground_truth) answered greedily with up to --response_length new
  tokens by the JetStream engine and `RolloutSampler` (the RL trainer's
  rollout, reading the trainer's parameters in place), each response scored
  by `rljax.rewards.default_compute_score` against its ground truth.

Overrides (`KEY=VALUE`, as on `python -m rljax.sft`) change the SFT config.
Prints one JSON object per line: the setup, `sft_val_loss`,
`sft_greedy_reward` (mean reward before and after, with a few responses) and
`sft_wall_s` (where the time went).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from rljax import config as config_lib
from rljax import rewards, sharding
from rljax.data import parquet
from rljax.evaluation import generation
from rljax.rollout import RolloutSampler, SamplingParams, factory, make_engine
from rljax.sft import config as sft_config
from rljax.sft import data as sft_data
from rljax.sft import trainer as trainer_lib


class GreedyScorer:
  """Greedy responses to fixed prompts through one JetStream engine, scored with rljax's reward."""

  def __init__(self, trainer: trainer_lib.SFTTrainer, rows: list[dict], response_length: int):
    self.trainer, self.rows = trainer, rows
    tokenizer, data = trainer.tokenizer, trainer.config.data
    self.messages = [sft_data.as_messages(sft_data.lookup(r, data.prompt_key, data.prompt_dict_keys,
                                                          f"data.val_files row {i}", "prompt"),
                                          f"data.val_files row {i}", data.prompt_key)
                     for i, r in enumerate(rows)]
    self.prompts = generation.encode_prompts(self.messages, tokenizer, data.prompt_key, int(data.max_length), "error",
                                             "data.val_files")
    model = self.model()
    engine = make_engine(model, max_concurrent_decodes=len(rows),
                         prefill_buckets=[max(len(p) for p in self.prompts)], max_decode_length=response_length,
                         sampling_params=SamplingParams(greedy=True), eos_ids=factory.stop_ids(tokenizer, model.cfg),
                         mesh=trainer.mesh, rules=trainer.rules)
    self.sampler = RolloutSampler(engine, pad_id=trainer.pad_id)

  def model(self):
    """The trainer's current model (its arrays, not copies)."""
    return nnx.merge(self.trainer.graphdef, self.trainer.trainable, self.trainer.frozen)

  def __call__(self) -> tuple[float, list[str]]:
    """(mean reward, responses) of the trainer's current parameters."""
    texts = generation.generate_responses(self.sampler, nnx.state(self.model()), self.prompts, 1, len(self.prompts),
                                          jax.random.key(0), self.trainer.tokenizer)
    responses = [t[0] for t in texts]
    scores = [rewards.default_compute_score(r["data_source"], text, r["reward_model"]["ground_truth"])
              for r, text in zip(self.rows, responses)]
    return float(np.mean(scores)), responses


def load_config(path: str, run_dir: str, overrides: list[str]):
  config = config_lib.load_config_file(path)
  config_lib.apply_overrides(config, [*overrides, f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]",
                                      "trainer.resume_mode=disable"])
  sft_config.finalize(config)
  return sft_config.validate(config, sharding.resolve_world_size(config))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/sft.py", help="SFT experiment file[:PRESET]")
  parser.add_argument("--prompts", type=int, default=128, help="held-out prompts scored (first rows of val_files)")
  parser.add_argument("--response_length", type=int, default=32, help="new tokens per greedy response")
  parser.add_argument("--examples", type=int, default=4, help="responses printed with the reward line")
  parser.add_argument("overrides", nargs="*", help="KEY=VALUE changes to the SFT config")
  args = parser.parse_args()

  start = time.perf_counter()
  run_dir = tempfile.mkdtemp(prefix="rljax_sft_reward_")
  try:
    config = load_config(args.config, run_dir, args.overrides)
    trainer = trainer_lib.SFTTrainer(config)
    reader = parquet.RowReader(parquet.read_parquet(parquet.as_file_list(config.data.val_files)))
    rows = [reader[i] for i in range(min(args.prompts, len(reader)))]
    print(json.dumps({
        "figure": "setup", "machine": platform.machine(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
        "devices": jax.device_count(), "load_average": os.getloadavg(), "config": args.config,
        "model": config.model.partial_pretrain, "train_files": config.data.train_files,
        "response": [config.data.response_key, *(config.data.response_dict_keys or [])],
        "steps": trainer.total_steps, "batch": config.data.train_batch_size, "lr": config.optim.lr,
        "max_length": config.data.max_length, "val_examples": config.data.val_max_samples, "prompts": len(rows),
        "response_length": args.response_length, "overrides": args.overrides}), flush=True)
    scorer = GreedyScorer(trainer, rows, args.response_length)
    setup_s = time.perf_counter() - start

    mark = time.perf_counter()
    reward_before, responses_before = scorer()
    loss_before = trainer.validate()["val/loss"]
    before_s = time.perf_counter() - mark

    mark = time.perf_counter()
    last = trainer.fit()
    trainer.close()
    train_s = time.perf_counter() - mark

    mark = time.perf_counter()
    reward_after, responses_after = scorer()
    loss_after = last["val/loss"]
    after_s = time.perf_counter() - mark

    with open(os.path.join(trainer.run_dir, "metrics.jsonl"), encoding="utf-8") as f:
      history = [json.loads(line) for line in f]
  finally:
    shutil.rmtree(run_dir, ignore_errors=True)

  print(json.dumps({"figure": "sft_val_loss", "before": loss_before, "after": loss_after,
                    "val_examples": config.data.val_max_samples,
                    "train_loss": [round(h["train/loss"], 4) for h in history]}), flush=True)
  examples = [{"prompt": m[-1]["content"], "truth": r["reward_model"]["ground_truth"], "before": b, "after": a}
              for m, r, b, a in zip(scorer.messages[:args.examples], rows, responses_before, responses_after)]
  print(json.dumps({"figure": "sft_greedy_reward", "before": reward_before, "after": reward_after,
                    "prompts": len(rows), "response_length": args.response_length, "examples": examples}), flush=True)
  print(json.dumps({"figure": "sft_wall_s", "setup": setup_s, "measure_before": before_s, "train": train_s,
                    "measure_after": after_s, "total": time.perf_counter() - start,
                    "step_median": float(np.median([h["timing_s/step"] for h in history])),
                    "load_average": os.getloadavg()}), flush=True)


if __name__ == "__main__":
  main()
