"""One GRPO step on the google-tunix anchor's workload, for a same-machine comparison.

    python benchmarks/grpo_step.py --model smollm2 -P 4 -G 4 -L 64 -N 32 -S 3

Reproduces ../shared/anchors/tunix/README.md's workload: a Llama-architecture
model with every parameter ~ N(0, 0.02^2) (seed 0), float32 throughout;
P prompts of BOS + (L - 1) uniform ids, each sampled G times for exactly N
new tokens (eos ignored) at temperature 0.9 with a KV cache of L + N slots;
reward = fraction of even token ids; GRPO advantages; a reference copy of
the initial weights scored every step (KL "kl" estimator, beta 0.04, in the
loss); PPO clip 0.2; seq-mean-token-mean aggregation; one AdamW update
(lr 1e-6, b1 0.9, b2 0.99, weight decay 0.1, no clipping) on the whole batch
with no micro-batching and no remat. rljax's own pieces run it: the
JetStream engine and RolloutSampler (each prompt prefilled once for its G
samples), the trainer's step factory (rljax.rl.steps: the actor update
and the reference log-prob pass, on a one-device mesh), compute_advantage. As in
the trainer (actor_rollout_ref.model.share_prompt_forward, default on), the
reference and update passes run each prompt once for its G samples;
--no-share_prompt runs every row's prompt.

Prints JSON lines: `sampler` (tokens/s of a rollout call, median of
--sampler_reps after a warm-up) and `grpo` (steady step time = mean of steps
1..S-1, per phase; step 0 compiles).
"""

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from rljax import sharding
from rljax.algos import AdvantageInputs, compute_advantage
from rljax.config import CPU_DOT_LIBRARIES
from rljax.models import CausalLM, ModelConfig
from rljax.rollout import RolloutSampler, SamplingParams, factory, make_engine
from rljax.rl import steps as steps_lib
from rljax.rl import experience
from rljax.rl.sequences import make_sequences

MODELS = {
    "tiny": dict(num_layers=2, hidden_size=64, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=16,
                 vocab_size=256),
    "smollm2": dict(num_layers=30, hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3,
                    head_dim=64, vocab_size=49152),
}


def random_model(name: str, seed: int) -> CausalLM:
  cfg = ModelConfig(model_type="llama", rope_theta=1e5, rms_norm_eps=1e-5, tie_word_embeddings=True,
                    **MODELS[name])
  model = CausalLM(cfg, nnx.Rngs(seed))
  params = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  nnx.update(model, jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape, x.dtype) * 0.02
                                                 for k, x in zip(keys, leaves)]))
  return model


def actor_config(beta: float):
  return ml_collections.ConfigDict({
      "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
      "loss_agg_mode": "seq-mean-token-mean", "loss_scale_factor": None, "entropy_coeff": 0.0,
      "use_kl_loss": beta > 0, "kl_loss_coef": beta, "kl_loss_type": "kl", "positive_nll_coef": None,
      "policy_loss": {"loss_mode": "vanilla"}})


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
  parser.add_argument("-P", "--batch_prompts", type=int, default=4)
  parser.add_argument("-G", "--num_generations", type=int, default=4)
  parser.add_argument("-L", "--prompt_len", type=int, default=64)
  parser.add_argument("-N", "--max_new_tokens", type=int, default=32)
  parser.add_argument("-S", "--steps", type=int, default=3)
  parser.add_argument("--sampler_reps", type=int, default=5)
  parser.add_argument("--temperature", type=float, default=0.9)
  parser.add_argument("--beta", type=float, default=0.04)
  parser.add_argument("--lr", type=float, default=1e-6)
  parser.add_argument("--steps_per_sync", type=int, default=8)
  parser.add_argument("--share_prompt", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--cpu_dot_library", default="auto", choices=CPU_DOT_LIBRARIES,
                      help="what runs the decode loop's dots on the CPU (actor_rollout_ref.rollout.cpu_dot_library)")
  args = parser.parse_args()
  P, G, L, N = args.batch_prompts, args.num_generations, args.prompt_len, args.max_new_tokens
  B = P * G
  rng = np.random.default_rng(0)
  model = random_model(args.model, 0)
  graphdef, params = nnx.split(model)
  vocab = model.cfg.vocab_size
  mesh = sharding.build_mesh((1, 1, 1, 1), jax.devices()[:1])
  params = sharding.shard_like(params, sharding.param_shardings(params, mesh, None))
  engine = make_engine(model, max_concurrent_decodes=B, prefill_buckets=(L,), max_decode_length=N, ignore_eos=True,
                       sampling_params=SamplingParams(temperature=args.temperature),
                       decode_compiler_options=factory.cpu_dot_options(args.cpu_dot_library, B))
  sampler = RolloutSampler(engine, pad_id=0, steps_per_sync=args.steps_per_sync)
  common = {"model": args.model, "P": P, "G": G, "B": B, "L": L, "N": N, "kv_cache_size": engine.cache_length,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "devices": jax.device_count(),
            "share_prompt": args.share_prompt, "decode_compiler_options": engine.decode_compiler_options}

  def prompts():
    ids = np.concatenate([np.ones((P, 1), np.int32), rng.integers(3, vocab, (P, L - 1), dtype=np.int32)], axis=1)
    return ids, np.ones_like(ids)

  seed = iter(range(10**6))
  start = time.perf_counter()
  sampler.generate(params, *prompts(), G, jax.random.key(next(seed)))
  warm = time.perf_counter() - start
  calls = []
  for _ in range(args.sampler_reps):
    ids, mask = prompts()
    start = time.perf_counter()
    out = sampler.generate(params, ids, mask, G, jax.random.key(next(seed)))
    calls.append(time.perf_counter() - start)
    assert int(out.response_mask.sum()) == B * N
  median = statistics.median(calls)
  print(json.dumps({"kind": "sampler", "library": "rljax", **common, "warmup_call_s": round(warm, 2),
                    "call_s_median": round(median, 3), "gen_tokens_per_s": round(B * N / median, 1)}), flush=True)

  ref_params = jax.tree.map(jnp.copy, params)
  tx = optax.adamw(args.lr, b1=0.9, b2=0.99, weight_decay=0.1)
  opt_state, opt_shardings = sharding.init_optimizer(tx, params, steps_lib.shardings_of(params), mesh)
  group = G if args.share_prompt else 1
  fields = experience.MODEL_FIELDS + ("advantages", "ref_log_prob")
  update = steps_lib.make_update(
      "actor_update", steps_lib.actor_loss(graphdef, actor_config(args.beta), args.temperature, group), tx, mesh, None,
      params, opt_shardings, experience.spec(fields, 1, B, L, N, mesh, None), B)
  ref_fn = steps_lib.make_forward("ref", steps_lib.log_prob_fn(graphdef, args.temperature, False, group), mesh, None,
                                  params, experience.spec(experience.MODEL_FIELDS, 1, B, L, N, mesh, None))
  algorithm = ml_collections.ConfigDict({"norm_adv_by_std_in_grpo": True})
  steps, phases = [], []
  for step in range(args.steps):
    t0 = time.perf_counter()
    ids, mask = prompts()
    rollout = sampler.generate(params, ids, mask, G, jax.random.key(next(seed)))
    t1 = time.perf_counter()
    rows = make_sequences(ids[rollout.prompt_index], mask[rollout.prompt_index], rollout.responses,
                          rollout.response_mask)
    scores = (rollout.responses % 2 == 0).mean(-1).astype(np.float32)
    token_scores = np.zeros_like(rollout.log_probs)
    token_scores[:, -1] = scores
    t2 = time.perf_counter()
    ref, _ = ref_fn(ref_params, experience.place(rows, ref_fn.args[1]))
    ref = np.asarray(ref)[0]
    t3 = time.perf_counter()
    adv, _ = compute_advantage("grpo", AdvantageInputs(token_scores, rows.response_mask,
                                                       group_ids=rollout.prompt_index.astype(np.int32), num_groups=P),
                               algorithm)
    t4 = time.perf_counter()
    mini = experience.place(rows.replace(advantages=np.asarray(adv), ref_log_prob=ref), update.args[2])
    params, opt_state, metrics = update(params, opt_state, mini, jax.random.key(step))
    jax.block_until_ready(params)
    t5 = time.perf_counter()
    steps.append(t5 - t0)
    phases.append({"rollout": t1 - t0, "reward": t2 - t1, "ref": t3 - t2, "adv": t4 - t3, "update": t5 - t4})
  steady = steps[1:]
  mean = statistics.mean(steady)
  print(json.dumps({"kind": "grpo", "library": "rljax", **common, "first_step_s": round(steps[0], 2),
                    "steady_step_s_mean": round(mean, 3), "step_s": [round(s, 3) for s in steps],
                    "phases_steady_mean_s": {k: round(statistics.mean(p[k] for p in phases[1:]), 3) for k in phases[0]},
                    "tokens_per_s": round(B * (L + N) / mean, 1), "pg_loss": float(metrics["actor/pg_loss"])}),
        flush=True)


if __name__ == "__main__":
  main()
