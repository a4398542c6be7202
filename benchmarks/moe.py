"""A small Qwen3-MoE against the dense Qwen3 with the same activated parameters: forward + backward time.

    python benchmarks/moe.py [--hidden 256 --layers 4 --experts 16 --top_k 2 --expert_width 256 --batch 8 --length 256]

Both models are built locally (random weights, nothing downloaded) on one
device. The MoE layer routes each token to top_k of `experts` SwiGLU experts
of width `expert_width`; the dense model's SwiGLU is top_k x expert_width
wide, so each token meets the same number of MLP weights in both. Each step
is one jitted value-and-gradient of the token cross-entropy of a random
[batch, length] batch. The two models alternate, `--repeats` timed steps
each after one untimed (compiling) step; the median times and their ratio
are printed.

Prints one JSON object per line: the setup, each model's median seconds
and parameter count, then `moe_over_dense` (the ratio of medians).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import CausalLM, ModelConfig


def configs(args: argparse.Namespace) -> dict[str, ModelConfig]:
  """The MoE model and its dense twin (same attention, MLP width = top_k x expert width)."""
  base = ModelConfig(model_type="qwen3", vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                     num_heads=8, num_kv_heads=4, head_dim=args.hidden // 8, qk_norm=True,
                     intermediate_size=args.top_k * args.expert_width)
  moe = base.replace(model_type="qwen3_moe", num_experts=args.experts, num_experts_per_tok=args.top_k,
                     moe_intermediate_size=args.expert_width, norm_topk_prob=True)
  return {"dense": base, "moe": moe}


def train_step(model: CausalLM):
  """A jitted (state, ids) -> (loss, grads) of the next-token cross-entropy."""
  graphdef, state = nnx.split(model)

  def loss(state, ids):
    logits = nnx.merge(graphdef, state)(ids)[:, :-1].astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1))

  return jax.jit(jax.value_and_grad(loss)), state


def run(args: argparse.Namespace) -> None:
  print(json.dumps({"setup": vars(args), "machine": platform.machine(), "devices": str(jax.devices()[0]),
                    "jax": jax.__version__}))
  ids = jnp.asarray(np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.length)), jnp.int32)
  steps = {}
  for name, cfg in configs(args).items():
    step, state = train_step(CausalLM(cfg, nnx.Rngs(0)))
    jax.block_until_ready(step(state, ids))
    params = sum(x.size for x in jax.tree.leaves(state))
    steps[name] = (step, state, params)
  times = {name: [] for name in steps}
  for _ in range(args.repeats):
    for name, (step, state, _) in steps.items():
      start = time.perf_counter()
      jax.block_until_ready(step(state, ids))
      times[name].append(time.perf_counter() - start)
  medians = {name: statistics.median(t) for name, t in times.items()}
  for name, (_, _, params) in steps.items():
    print(json.dumps({"model": name, "median_s": round(medians[name], 4), "params": params,
                      "tokens_per_s": round(args.batch * args.length / medians[name], 1)}))
  print(json.dumps({"moe_over_dense": round(medians["moe"] / medians["dense"], 3)}))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--experts", type=int, default=16)
  parser.add_argument("--top_k", type=int, default=2)
  parser.add_argument("--expert_width", type=int, default=256)
  parser.add_argument("--vocab", type=int, default=4096)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=10)
  run(parser.parse_args())


if __name__ == "__main__":
  main()
