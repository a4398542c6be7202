"""Decode step time with the CPU dots in YNNPACK vs Eigen, per slot count.

    python benchmarks/decode_library.py [--model smollm2-135m-instruct] [--rows 1,2,4,8,16,32]
                                        [--prompt 64] [--new 128] [--reps 6]

What `actor_rollout_ref.rollout.cpu_dot_library=auto` is tuned from
(`rljax.rollout.factory.EIGEN_ROWS`). For each row count, two engines over
the same parameters compile their decode loop with the two libraries; each
gets the same prompts (32 to `--prompt` tokens, bucket `--prompt`, a cache of
prompt + new positions) prefilled into every slot. Then, alternating between
the two engines so that a slow spell of a shared machine hits both, each
runs 16 warm-up steps and 16 timed steps, `--reps` times (the slots are
refilled before each rep, so the cache never runs past its length). Prints
one JSON line per row count: median and best step time of each library,
and the YNNPACK / Eigen ratio of the medians.
"""

import argparse
import json
import time

import jax
import numpy as np
from flax import nnx

from rljax.models import from_pretrained
from rljax.rollout import SamplingParams, factory, make_engine

STEPS = 16


def right_padded_prompts(rows: int, length: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """[rows, length] random ids right-padded with 0, and the [rows] true lengths (length/2 .. length)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(length // 2, length + 1, rows).astype(np.int32)
  tokens = np.zeros((rows, length), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, :n] = rng.integers(100, vocab, n)
  return tokens, lengths


def filled_state(engine, params, tokens, lengths, state=None):
  """A decode state (the given one, donated, or a new one) with prompt i in slot i."""
  prefix = engine.prefill(params=params, padded_tokens=tokens, true_length=lengths)
  slots = list(range(tokens.shape[0]))
  return engine.insert_many(prefix, engine.init_decode_state() if state is None else state, slots, slots)


def timed_steps(engine, params, state):
  """(state, seconds per step) of STEPS steps after STEPS warm-up steps."""
  state, out = engine.generate_steps(params, state, STEPS)
  jax.block_until_ready(out)
  start = time.perf_counter()
  state, out = engine.generate_steps(params, state, STEPS)
  jax.block_until_ready(out)
  return state, (time.perf_counter() - start) / STEPS


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="smollm2-135m-instruct")
  parser.add_argument("--rows", default="1,2,4,8,16,32")
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=128)
  parser.add_argument("--reps", type=int, default=6)
  args = parser.parse_args()
  if args.reps < 1:
    parser.error("--reps must be at least 1")
  if args.new < 2 * STEPS:
    parser.error(f"--new must be at least {2 * STEPS}: each rep runs {2 * STEPS} steps")
  model = from_pretrained(args.model)
  params = nnx.state(model, nnx.Param)
  for rows in map(int, args.rows.split(",")):
    tokens, lengths = right_padded_prompts(rows, args.prompt, model.cfg.vocab_size)
    engines, states = {}, {}
    for library in ("ynnpack", "eigen"):
      engines[library] = make_engine(model, max_concurrent_decodes=rows, prefill_buckets=(args.prompt,),
                                     max_decode_length=args.new, ignore_eos=True,
                                     sampling_params=SamplingParams(greedy=True),
                                     decode_compiler_options=factory.cpu_dot_options(library, rows))
      states[library] = filled_state(engines[library], params, tokens, lengths)
    times = {library: [] for library in engines}
    for _ in range(args.reps):
      for library, engine in engines.items():
        state, seconds = timed_steps(engine, params, states[library])
        times[library].append(seconds)
        states[library] = filled_state(engine, params, tokens, lengths, state)
    medians = {library: float(np.median(t)) for library, t in times.items()}
    print(json.dumps({"bench": "decode_library", "model": args.model, "rows": rows,
                      "cache_length": engines["eigen"].cache_length,
                      "compiler_options": {library: e.decode_compiler_options for library, e in engines.items()},
                      **{f"{library}_step_ms": {"median": medians[library] * 1e3, "best": min(t) * 1e3}
                         for library, t in times.items()},
                      "ynnpack_over_eigen": medians["ynnpack"] / medians["eigen"]}), flush=True)


if __name__ == "__main__":
  main()
