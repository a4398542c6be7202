"""8-bit rollouts (KV cache, weights) against full precision: greedy agreement, log-prob differences, step time.

    python benchmarks/quantized_rollout.py [--model smollm2-135m-instruct] [--new 96] [--dtypes int8,fp8]
                                           [--weights int8,fp8] [--computes bfloat16,float32] [--pairs 3]

Real chat prompts (`PROMPTS`, rendered with the model's chat template) are
decoded greedily by the same engine in each compute dtype (rollout.dtype)
unquantized, with each 8-bit `kv_cache_dtype` (`--dtypes`), with each
weight `quantization` (`--weights`), and with both in int8. Each run is
compared with the float32 engine's unquantized one (the reference; a
bfloat16 run unquantized shows how far bfloat16 alone moves greedy
decoding), and with its own compute dtype's unquantized run. Per run it
prints, over the prompts:

* `identical`: responses equal token for token to the reference's;
* `agreement`: the share of the reference's tokens before the first
  difference (1.0: every response identical);
* `mean_abs_dlogp` / `max_abs_dlogp`: |log-prob difference| of the sampled
  tokens over the common prefix of each pair (same context on both sides);
* the same three against the unquantized run of the same compute dtype
  (`*_vs_same_compute`);
* `cache_bytes`: the decode state's KV cache, `weight_bytes`: the weights
  the engine decodes with, and `step_ms`: one decode step over all slots,
  timed alternately with the full-precision engine (`--pairs` times each,
  median). On the CPU 8-bit arrays are converted before XLA's dots; the byte
  saving is a TPU (HBM-bound) figure, see `python -m rljax.compile ...
  actor_rollout_ref.rollout.kv_cache_dtype=int8 actor_rollout_ref.rollout.quantization=int8`.

One JSON object per line.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import from_pretrained, kv_quant, load_tokenizer, weight_quant
from rljax.rollout import RolloutSampler, SamplingParams, make_engine

from decode_library import filled_state, timed_steps

PROMPTS = [
    "What is the capital of France, and what is it known for?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "If I have 3 apples and buy 5 more, then eat 2, how many apples do I have? Think step by step.",
    "Give me three tips for learning a new programming language.",
    "Translate 'Good morning, how are you?' into Spanish.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
]


def chat_prompts(tokenizer, width: int) -> tuple[np.ndarray, np.ndarray]:
  """[B, width] left-padded ids and mask of `PROMPTS` as user turns with the generation prompt."""
  rows = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
          for p in PROMPTS]
  if max(map(len, rows)) > width:
    raise SystemExit(f"a prompt has {max(map(len, rows))} tokens; raise --prompt above it")
  ids = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
  return ids, mask


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  """How many leading entries of a and b are equal."""
  differ = np.flatnonzero(a != b)
  return int(differ[0]) if len(differ) else len(a)


def run(args) -> None:
  model = from_pretrained(args.model)
  tokenizer = load_tokenizer(args.model)
  params = nnx.state(model, nnx.Param)
  ids, mask = chat_prompts(tokenizer, args.prompt)
  engines, rollouts = {}, {}
  settings = ([("auto", None)] + [(name, None) for name in args.dtypes.split(",") if name]
              + [("auto", name) for name in args.weights.split(",") if name] + [("int8", "int8")])
  runs = [(compute, cache, weights) for compute in ("float32", *args.computes.split(",")) for cache, weights in settings]
  for run_key in dict.fromkeys(runs):
    compute, name, weights = run_key
    engine = make_engine(model, compute_dtype=jnp.dtype(compute), max_concurrent_decodes=len(PROMPTS),
                         prefill_buckets=(args.prompt,), max_decode_length=args.new, ignore_eos=True,
                         sampling_params=SamplingParams(greedy=True),
                         kv_cache_dtype=kv_quant.KV_CACHE_DTYPES[name],
                         quantization=weight_quant.QUANTIZATIONS.get(weights))
    out = RolloutSampler(engine, pad_id=0, steps_per_sync=16).generate(
        engine.compute_params(params), ids, mask, 1, jax.random.key(0))
    engines[run_key], rollouts[run_key] = engine, out
  lengths = mask.sum(axis=1).astype(np.int32)
  right = np.zeros_like(ids)
  for i, (row, m) in enumerate(zip(ids, mask)):
    right[i, :lengths[i]] = row[m.astype(bool)]
  times = {name: [] for name in engines}
  for _ in range(args.pairs):
    for name, engine in engines.items():
      compute = engine.compute_params(params)
      times[name].append(timed_steps(engine, compute, filled_state(engine, compute, right, lengths))[1])
  for (compute, name, weights), out in rollouts.items():
    engine = engines[compute, name, weights]
    state = engine.abstract_decode_state()
    print(json.dumps({
        "compute": compute, "kv_cache_dtype": name, "quantization": weights, "prompts": len(PROMPTS),
        "new_tokens": args.new, **compare(rollouts["float32", "auto", None], out, args.new),
        **{f"{k}_vs_same_compute": v
           for k, v in compare(rollouts[compute, "auto", None], out, args.new).items()},
        "cache_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((state.cache.k, state.cache.v)))),
        "weight_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(engine.compute_params(params)))),
        "step_ms": 1000 * statistics.median(times[compute, name, weights]),
        "first_response": tokenizer.decode(out.responses[0][:out.response_lengths[0]].tolist())[:160]}))


def compare(reference, out, new: int) -> dict:
  """identical, agreement and |log-prob differences| of `out`'s greedy responses against `reference`'s."""
  prefixes = [common_prefix(a, b) for a, b in zip(reference.responses, out.responses)]
  diffs = np.concatenate([np.abs(a[:n] - b[:n]) for a, b, n in zip(reference.log_probs, out.log_probs, prefixes)])
  return {"identical": int(sum(n == new for n in prefixes)), "agreement": sum(prefixes) / (new * len(prefixes)),
          "mean_abs_dlogp": float(diffs.mean()), "max_abs_dlogp": float(diffs.max())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="smollm2-135m-instruct")
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=96)
  parser.add_argument("--dtypes", default="int8,fp8", help="8-bit KV cache dtypes (kv_cache_dtype)")
  parser.add_argument("--weights", default="int8,fp8", help="weight quantizations (rollout.quantization)")
  parser.add_argument("--computes", default="bfloat16",
                      help="compute dtypes (rollout.dtype) beside float32, the reference's")
  parser.add_argument("--pairs", type=int, default=3)
  run(parser.parse_args())


if __name__ == "__main__":
  main()
