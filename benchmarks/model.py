"""SmolLM2-135M shapes: forward and train-step throughput, compile time, peak memory.

Prints one JSON object per line:
  matmul      GFLOP/s of a 2048^3 float32 matmul (the machine's reference rate)
  forward     tokens/s and GFLOP/s of the forward pass (to final hidden
              states) at --batch x --seq
  fwd_bwd     the same for the train step: token log-prob loss + gradient
              w.r.t. all parameters (3x forward FLOPs), and
              fraction_of_matmul = its GFLOP/s / the matmul's GFLOP/s, each
              call timed between two matmuls (target >= 0.5)
  compile     compile seconds and XLA peak temp MiB of the train step for
              unrolled / scanned layers, with and without remat, at 10 and
              30 layers
  logprob_memory  compiled temp MiB of token log-probs + entropy (value and
              gradient) at V=152k, B*T=16k: chunked vs full float32 logits

Run: python benchmarks/model.py [--batch 8 --seq 256 --iters 3]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
from flax import nnx

import rljax.models as M

SMOLLM2_135M = dict(
    model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=True,
)


def _time(fn, iters: int) -> float:
  """Median seconds per call after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def _matmul(n: int = 2048):
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  return lambda: f(a, b), 2 * n**3


def _paired(fn, flops: float, iters: int) -> tuple[float, float, float]:
  """(median seconds of fn, median matmul GFLOP/s, median rate ratio).

  Each call of fn is timed between two 2048^3 matmuls and compared with
  their mean rate, so load from other processes on a shared machine
  mostly cancels.
  """
  mm, mm_flops = _matmul()

  def timed(f) -> float:
    start = time.perf_counter()
    jax.block_until_ready(f())
    return time.perf_counter() - start

  timed(mm)
  timed(fn)
  secs, refs, ratios = [], [], []
  before = timed(mm)
  for _ in range(iters):
    dt = timed(fn)
    after = timed(mm)
    ref = mm_flops / ((before + after) / 2)
    secs.append(dt)
    refs.append(ref / 1e9)
    ratios.append(flops / dt / ref)
    before = after
  median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
  return median(secs), median(refs), median(ratios)


def forward_flops(cfg: M.ModelConfig, b: int, t: int) -> float:
  """Matmul FLOPs of one forward pass (projections, attention scores/values, LM head)."""
  d, f, h, k, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  per_token_layer = 2 * (d * h * hd * 2 + d * k * hd * 2 + 3 * d * f)
  attention = 2 * 2 * t * h * hd  # q.k and p.v against t keys (full square, as computed).
  per_token = cfg.num_layers * (per_token_layer + attention) + 2 * d * cfg.vocab_size
  return float(per_token * b * t)


def _loss_fn(graphdef):
  def loss(state, ids, mask):
    model = nnx.merge(graphdef, state)
    hidden = model.hidden_states(ids[:, :-1], mask[:, :-1])
    logp, _ = M.token_log_probs(hidden, model.lm_head_weight(), ids[:, 1:], chunk_size=1024,
                                with_entropy=False)
    return -jnp.sum(logp * mask[:, 1:]) / jnp.sum(mask[:, 1:])
  return loss


def _model(cfg: M.ModelConfig):
  return nnx.split(M.CausalLM(cfg, nnx.Rngs(0)))


def run(batch: int, seq: int, iters: int) -> None:
  emit = lambda **kw: print(json.dumps(kw), flush=True)  # noqa: E731
  base = M.ModelConfig(**SMOLLM2_135M)
  ids = jax.random.randint(jax.random.key(2), (batch, seq + 1), 0, base.vocab_size)
  mask = jnp.ones_like(ids)
  tokens = batch * seq
  fwd_flops = forward_flops(base, batch, seq)
  mm, mm_flops = _matmul()
  emit(name="matmul", n=2048, gflops=round(mm_flops / _time(mm, iters) / 1e9, 1),
       device=jax.devices()[0].device_kind)

  graphdef, state = _model(base.replace(scan_layers=True))
  fwd = jax.jit(lambda s, i, m: nnx.merge(graphdef, s).hidden_states(i, m))
  flops = fwd_flops - 2 * base.hidden_size * base.vocab_size * tokens  # no LM head here.
  dt, ref, ratio = _paired(lambda: fwd(state, ids[:, :-1], mask[:, :-1]), flops, iters)
  emit(name="forward", batch=batch, seq=seq, tokens_per_s=round(tokens / dt, 1),
       gflops=round(flops / dt / 1e9, 1), matmul_gflops=round(ref, 1),
       fraction_of_matmul=round(ratio, 3))
  step = jax.jit(jax.value_and_grad(_loss_fn(graphdef)))
  dt, ref, ratio = _paired(lambda: step(state, ids, mask), 3 * fwd_flops, iters)
  emit(name="fwd_bwd", batch=batch, seq=seq, tokens_per_s=round(tokens / dt, 1),
       gflops=round(3 * fwd_flops / dt / 1e9, 1), matmul_gflops=round(ref, 1),
       fraction_of_matmul=round(ratio, 3), scan_layers=True, loss="token_log_probs")

  for layers in (10, base.num_layers):
    for scan in (False, True):
      for remat in (False, True):
        cfg = base.replace(num_layers=layers, scan_layers=scan, remat=remat)
        graphdef, abstract = nnx.split(nnx.eval_shape(lambda c=cfg: M.CausalLM(c, nnx.Rngs(0))))
        start = time.perf_counter()
        compiled = jax.jit(jax.value_and_grad(_loss_fn(graphdef))).lower(
            abstract, ids, mask).compile()
        seconds = time.perf_counter() - start
        mem = compiled.memory_analysis()
        emit(name="compile", layers=layers, scan_layers=scan, remat=remat,
             compile_s=round(seconds, 2), temp_mb=round(mem.temp_size_in_bytes / 2**20, 1))
  logprob_memory()


def logprob_memory(tokens: int = 16384, vocab: int = 152064, width: int = 896) -> None:
  """Compiled temp memory of log-prob + entropy value-and-grad: chunked vs full logits."""
  shapes = (jax.ShapeDtypeStruct((1, tokens, width), jnp.float32),
            jax.ShapeDtypeStruct((vocab, width), jnp.float32),
            jax.ShapeDtypeStruct((1, tokens), jnp.int32))
  for name, fn in (("chunked", lambda h, w, y: M.token_log_probs(h, w, y, chunk_size=512)),
                   ("naive", M.naive_token_log_probs)):
    loss = lambda h, w, y, fn=fn: sum(jnp.sum(x) for x in fn(h, w, y))  # noqa: E731
    grad = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*shapes).compile()
    fwd = jax.jit(fn).lower(*shapes).compile()
    print(json.dumps(dict(
        name="logprob_memory", impl=name, tokens=tokens, vocab=vocab, width=width,
        fwd_temp_mb=round(fwd.memory_analysis().temp_size_in_bytes / 2**20, 1),
        fwd_bwd_temp_mb=round(grad.memory_analysis().temp_size_in_bytes / 2**20, 1))),
          flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--iters", type=int, default=3)
  args = parser.parse_args()
  run(args.batch, args.seq, args.iters)


if __name__ == "__main__":
  main()
