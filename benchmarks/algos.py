"""Benchmark: one jitted GRPO step's loss-kernel work, with and without chunking.

Workload (one "step", the loss side of a GRPO actor update):

  logits   = hidden @ lm_head                        [B, T, V]  (a stand-in LM head)
  log_prob = log_softmax(logits)[labels],  entropy = entropy_from_logits(logits)
  adv      = GRPO advantages (rljax.algos.advantages, groups of `--group`)
  loss     = ppo_loss: vanilla dual-clip PPO, token-mean
             - 1e-3 · entropy + 1e-3 · low_var_kl(log_prob, ref_log_prob)
  output   = loss, metrics and d loss / d hidden     (value_and_grad, jitted)

Variants:
  full             logits materialised; entropy_from_logits on them.
  chunked_entropy  logits materialised; entropy_from_logits_with_chunking.
  fused_chunked    logits never materialised: lax.map over `--chunk` tokens
                   computes (hidden_chunk @ lm_head) -> log_prob, entropy per
                   chunk, rematerialised in the backward pass.

Size decision. The issue's size, B=256, T=1024, V=32768, has 2.7e8 tokens x
32768 float32 logits = 32 GiB for the logits alone (the backward pass needs
about twice that), more than this 24 GB machine. So logits are generated
inside the jitted step from a small hidden state (`--hidden`, default 64) and
a [H, V] LM head: the inputs are small, and the `fused_chunked` variant runs
at full size. The two variants that materialise logits are only compiled at
full size (XLA's `memory_analysis()` gives their temp bytes without running
them) and are run at the largest batch that fits (`--fit_batch`, default 16,
i.e. 2 GiB of logits), with the same T and V. The matmul is part of the timed
work; with H=64 it is 2·N·H·V FLOPs forward, comparable to the softmax work.

Each variant runs in its own subprocess so `ru_maxrss` (peak resident memory)
is its own. Prints one JSON object per line: variant, shapes, compile time,
best-of-`--repeats` step time, XLA temp/argument/output bytes, peak RSS.

  python benchmarks/algos.py            # full size (several minutes on 2 cores)
  python benchmarks/algos.py --small    # B=16, T=128, V=4096, seconds
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from rljax.algos.advantages import compute_grpo_outcome_advantage
from rljax.algos.entropy import entropy_from_logits
from rljax.algos.entropy import entropy_from_logits_with_chunking
from rljax.algos.entropy import logprobs_from_logits
from rljax.algos.entropy import map_token_chunks
from rljax.algos.policy_loss import PolicyInputs, ppo_loss

VARIANTS = ("full", "chunked_entropy", "fused_chunked")


def actor_config() -> ConfigDict:
  """verl actor defaults, with entropy and KL terms switched on."""
  return ConfigDict({
      "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
      "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
      "loss_scale_factor": None, "entropy_coeff": 1e-3, "use_kl_loss": True,
      "kl_loss_coef": 1e-3, "kl_loss_type": "low_var_kl",
      "policy_loss": {"loss_mode": "vanilla"},
  })


def make_inputs(batch, seq, vocab, hidden, group, seed=0):
  """Random step inputs (small: no [B, T, V] array among them)."""
  keys = jax.random.split(jax.random.key(seed), 7)
  lengths = jax.random.randint(keys[0], (batch,), seq // 2, seq + 1)
  mask = (jnp.arange(seq)[None, :] < lengths[:, None]).astype(jnp.float32)
  scores = jax.random.bernoulli(keys[1], 0.5, (batch,)).astype(jnp.float32)
  last = jax.nn.one_hot(lengths - 1, seq)
  return {
      "hidden": jax.random.normal(keys[2], (batch, seq, hidden)) / hidden**0.5,
      "lm_head": jax.random.normal(keys[3], (hidden, vocab)),
      "labels": jax.random.randint(keys[4], (batch, seq), 0, vocab),
      "old_log_prob": -jnp.abs(jax.random.normal(keys[5], (batch, seq))) * 3,
      "ref_log_prob": -jnp.abs(jax.random.normal(keys[6], (batch, seq))) * 3,
      "rewards": last * scores[:, None],
      "group_ids": jnp.arange(batch, dtype=jnp.int32) // group,
      "response_mask": mask,
  }


def logprob_entropy_fused(hidden, lm_head, labels, chunk):
  """`(log_prob, entropy)` `[B, T]` without materialising `[B, T, V]` logits."""
  b, t, h = hidden.shape

  def one_chunk(x, y):
    logits = x @ lm_head
    return logprobs_from_logits(logits, y), entropy_from_logits(logits)

  lp, ent = map_token_chunks(
      one_chunk, (hidden.reshape(b * t, h), labels.reshape(b * t)), chunk)
  return lp.reshape(b, t), ent.reshape(b, t)


def make_step(variant, group, chunk):
  """The jitted step for one variant."""
  cfg = actor_config()

  def step(inp):
    batch = inp["response_mask"].shape[0]
    adv, _ = compute_grpo_outcome_advantage(
        inp["rewards"], inp["response_mask"], inp["group_ids"],
        num_groups=batch // group)

    def loss_fn(hidden):
      if variant == "fused_chunked":
        lp, ent = logprob_entropy_fused(hidden, inp["lm_head"], inp["labels"], chunk)
      else:
        logits = hidden @ inp["lm_head"]
        lp = logprobs_from_logits(logits, inp["labels"])
        if variant == "full":
          ent = entropy_from_logits(logits)
        else:
          ent = entropy_from_logits_with_chunking(logits, chunk)
      return ppo_loss(cfg, PolicyInputs(lp, inp["old_log_prob"], adv, inp["response_mask"], entropy=ent,
                                        ref_log_prob=inp["ref_log_prob"]))

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(inp["hidden"])
    return loss, metrics, grad

  return jax.jit(step)


def run_variant(args) -> dict:
  """Compiles (and, if it fits, runs) one variant; returns its figures."""
  batch = args.batch
  if args.variant != "fused_chunked" and not args.small:
    batch = args.fit_batch
  inp = make_inputs(batch, args.seq, args.vocab, args.hidden, args.group)
  step = make_step(args.variant, args.group, args.chunk)
  result = {"bench": "algos_grpo_step", "variant": args.variant, "B": batch,
            "T": args.seq, "V": args.vocab, "H": args.hidden, "chunk": args.chunk,
            "device": jax.devices()[0].device_kind}
  if batch != args.batch:
    spec = jax.eval_shape(lambda: make_inputs(
        args.batch, args.seq, args.vocab, args.hidden, args.group))
    mem = step.lower(spec).compile().memory_analysis()
    result["full_size_B"] = args.batch
    result["full_size_temp_bytes"] = int(mem.temp_size_in_bytes)
  t0 = time.perf_counter()
  compiled = step.lower(inp).compile()
  result["compile_s"] = round(time.perf_counter() - t0, 3)
  mem = compiled.memory_analysis()
  result["temp_bytes"] = int(mem.temp_size_in_bytes)
  result["argument_bytes"] = int(mem.argument_size_in_bytes)
  result["output_bytes"] = int(mem.output_size_in_bytes)
  times = []
  for _ in range(args.repeats):
    t0 = time.perf_counter()
    loss, metrics, grad = compiled(inp)
    jax.block_until_ready((loss, metrics, grad))
    times.append(time.perf_counter() - t0)
  result["step_s"] = round(min(times), 4)
  result["step_s_all"] = [round(t, 4) for t in times]
  result["tokens_per_s"] = round(batch * args.seq / min(times), 1)
  result["loss"] = float(loss)
  result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return result


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--small", action="store_true", help="B=16, T=128, V=4096, H=32")
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--group", type=int, default=8, help="responses per prompt")
  p.add_argument("--chunk", type=int, default=4096, help="tokens per chunk")
  p.add_argument("--fit_batch", type=int, default=16,
                 help="batch for the variants that materialise logits")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--variant", choices=VARIANTS, default=None,
                 help="run one variant in this process (default: each in a subprocess)")
  args = p.parse_args(argv)
  if args.small:
    args.batch, args.seq, args.vocab, args.hidden = 16, 128, 4096, 32
    args.chunk, args.fit_batch, args.repeats = 512, 16, 3
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.variant is not None:
    print(json.dumps(run_variant(args)), flush=True)
    return
  base = list(argv if argv is not None else sys.argv[1:])
  for variant in VARIANTS:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *base, "--variant", variant],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      print(json.dumps({"bench": "algos_grpo_step", "variant": variant,
                        "error": proc.stderr.strip().splitlines()[-1:]}), flush=True)
    else:
      print(proc.stdout.strip(), flush=True)


if __name__ == "__main__":
  main()
