"""Rollout throughput: rljax's JetStream engine vs transformers' generate, same weights, same run.

    python benchmarks/rollout.py [--model smollm2-135m-instruct] [--batches 32,128]
                                 [--prompt 64] [--new 128] [--modes greedy,sampled] [--pairs 3]
                                 [--hf] [--cpu_dot_library auto|ynnpack|eigen]

For each batch size and mode: generated tokens/s of `RolloutSampler.generate`
(continuous batching, slots = batch, every response forced to `--new` tokens
with ignore_eos) and of transformers' `generate(min_new_tokens=max_new_tokens)`
on the same weights (exported with `save_pretrained`) and the same prompts.
Both are warmed up, then timed `--pairs` times alternately (rljax, then
transformers), so that a slow spell of a shared machine hits both sides;
`speedup` is the median of the pairs' ratios and each side's tokens/s is
taken at the median of its calls (use an odd `--pairs`). Also the decode step time and the fraction of
memory bandwidth it reaches: bytes read per decode step (parameters + the
whole preallocated KV cache, which every step reads) / step time, over the
copy bandwidth of a 256 MiB numpy copy measured in the same run. Prints
one JSON object per line.
"""

import argparse
import json
import os
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from rljax.config import CPU_DOT_LIBRARIES
from rljax.models import from_pretrained, save_pretrained
from rljax.rollout import RolloutSampler, SamplingParams, factory, make_engine

from decode_library import filled_state, timed_steps


def copy_bandwidth(bytes_: int = 256 << 20, repeats: int = 5) -> float:
  """Bytes moved per second (read + write) by a large numpy copy."""
  src = np.ones(bytes_ // 4, np.float32)
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - start)
  return 2 * bytes_ / best


def prompts(batch: int, length: int, vocab: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(length // 2, length + 1, batch)
  ids = np.zeros((batch, length), np.int32)
  mask = np.zeros((batch, length), np.int32)
  for i, n in enumerate(lengths):
    ids[i, length - n:] = rng.integers(100, vocab, n)
    mask[i, length - n:] = 1
  return ids, mask


def rljax_runner(model, ids, mask, new, greedy, cpu_dot_library):
  """A warmed-up timed call of `RolloutSampler.generate`, and the decode step's time."""
  params = nnx.state(model, nnx.Param)
  engine = make_engine(model, max_concurrent_decodes=ids.shape[0], prefill_buckets=(ids.shape[1],),
                       max_decode_length=new, ignore_eos=True,
                       sampling_params=SamplingParams(temperature=1.0, greedy=greedy),
                       decode_compiler_options=factory.cpu_dot_options(cpu_dot_library, ids.shape[0]))
  sampler = RolloutSampler(engine, pad_id=0, steps_per_sync=16)
  start = time.perf_counter()
  sampler.generate(params, ids, mask, 1, jax.random.key(0))
  warmup_s = time.perf_counter() - start
  lengths = mask.sum(axis=1).astype(np.int32)
  right_padded = np.zeros_like(ids)
  for i, (row, m) in enumerate(zip(ids, mask)):
    right_padded[i, :lengths[i]] = row[m.astype(bool)]
  _, step_s = timed_steps(engine, params, filled_state(engine, params, right_padded, lengths))
  info = {"warmup_call_s": warmup_s, "decode_step_s": step_s,
          "decode_compiler_options": engine.decode_compiler_options, "cache_length": engine.cache_length}

  def run(seed: int) -> float:
    start = time.perf_counter()
    out = sampler.generate(params, ids, mask, 1, jax.random.key(seed))
    elapsed = time.perf_counter() - start
    assert out.response_lengths.min() == new
    return elapsed

  return run, info


def hf_runner(path, ids, mask, new, greedy):
  """A warmed-up timed call of transformers' `generate` on the exported weights."""
  import torch
  import transformers
  torch.set_num_threads(os.cpu_count())
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  kwargs = dict(attention_mask=torch.tensor(mask), max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                do_sample=not greedy)
  if not greedy:
    kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
  with torch.no_grad():
    hf.generate(torch.tensor(ids[:, -8:]), attention_mask=torch.tensor(mask[:, -8:]), max_new_tokens=2, pad_token_id=0)

  def run(seed: int) -> float:
    torch.manual_seed(seed)
    with torch.no_grad():
      start = time.perf_counter()
      out = hf.generate(torch.tensor(ids, dtype=torch.long), **kwargs)
      elapsed = time.perf_counter() - start
    assert out.shape[1] == ids.shape[1] + new
    return elapsed

  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="smollm2-135m-instruct")
  parser.add_argument("--batches", default="32,128")
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--modes", default="greedy,sampled")
  parser.add_argument("--pairs", type=int, default=3,
                      help="timed calls of each side, alternating rljax and transformers")
  parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--cpu_dot_library", default="auto", choices=CPU_DOT_LIBRARIES,
                      help="what runs the decode loop's dots on the CPU (actor_rollout_ref.rollout.cpu_dot_library)")
  args = parser.parse_args()
  if args.pairs < 1:
    parser.error("--pairs must be at least 1")
  model = from_pretrained(args.model)
  cfg = model.cfg
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  bandwidth = copy_bandwidth()
  tmp = tempfile.mkdtemp()
  if args.hf:
    save_pretrained(model, tmp)
  for batch in map(int, args.batches.split(",")):
    ids, mask = prompts(batch, args.prompt, cfg.vocab_size)
    for mode in args.modes.split(","):
      greedy = mode == "greedy"
      ours, info = rljax_runner(model, ids, mask, args.new, greedy, args.cpu_dot_library)
      theirs = hf_runner(tmp, ids, mask, args.new, greedy) if args.hf else None
      pairs = []
      for seed in range(1, args.pairs + 1):
        pairs.append((ours(seed), theirs(seed) if theirs else None))
      tokens = batch * args.new
      kv_bytes = 2 * cfg.num_layers * batch * info["cache_length"] * cfg.num_kv_heads * cfg.head_dim * 4
      record = {"bench": "rollout", "model": args.model, "batch": batch, "prompt": args.prompt, "new": args.new,
                "mode": mode, "rljax": {**info, "call_s": [a for a, _ in pairs],
                                        "tokens_per_s": tokens / float(np.median([a for a, _ in pairs]))},
                "bandwidth_fraction": (param_bytes + kv_bytes) / info["decode_step_s"] / bandwidth,
                "copy_bandwidth_GBps": bandwidth / 1e9}
      if theirs:
        record["transformers"] = {"call_s": [b for _, b in pairs],
                                  "tokens_per_s": tokens / float(np.median([b for _, b in pairs]))}
        record["speedup_per_pair"] = [b / a for a, b in pairs]
        record["speedup"] = float(np.median(record["speedup_per_pair"]))
      print(json.dumps(record), flush=True)


if __name__ == "__main__":
  main()
