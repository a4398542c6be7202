"""SFT training throughput with and without sequence packing on length-skewed data.

    python benchmarks/sft.py [--max_length 256 --batch 16 --micro 4 --steps 5]

Builds a small Llama locally (random weights, nothing downloaded) and a
length-skewed set of examples: lengths log-normal around --median_length,
clipped to [8, --max_length], the second half of each example trained on
(about 85% of a max_length row is padding at the defaults). Both layouts run
the SFT trainer's own step functions (`rljax.sft.step`) on the same batches
over every visible device: one example per row (`use_remove_padding=false`)
and first-fit-decreasing packing (`use_remove_padding=true`). Each layout
runs one untimed step (compilation), then --steps timed steps; the time
includes building the rows on the host.

Prints one JSON object per line: the setup, one line per layout
(`sft_tokens_per_s`: real, non-padding tokens per second, rows and padding
share per step), then `sft_packing_speedup` (packed tokens/s over unpacked,
and the two losses, which must agree).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rljax import models, sharding
from rljax.sft import packing
from rljax.sft import step as step_lib


def length_skewed_examples(count: int, max_length: int, median: int, vocab: int, seed: int) -> list[packing.Example]:
  """`count` (ids, mask) pairs; lengths ~ lognormal(log median, 0.9) clipped to [8, max_length]."""
  rng = np.random.default_rng(seed)
  lengths = np.clip(rng.lognormal(np.log(median), 0.9, count).astype(int), 8, max_length)
  return [(rng.integers(1, vocab, n).astype(np.int32), (np.arange(n) >= n // 2).astype(np.int32)) for n in lengths]


def model_config(args) -> models.ModelConfig:
  return models.ModelConfig(model_type="llama", vocab_size=args.vocab, hidden_size=args.width,
                            intermediate_size=4 * args.width, num_layers=args.layers, num_heads=8, num_kv_heads=4,
                            head_dim=args.width // 8, rope_theta=10000.0, tie_word_embeddings=True)


class Steps:
  """The SFT trainer's jitted steps for one model on a mesh of every device."""

  def __init__(self, cfg: models.ModelConfig, micro_rows: int):
    self.mesh = sharding.build_mesh({"data": 1, "fsdp": jax.device_count(), "tensor": 1, "sequence": 1})
    rules = [("batch", ("data", "fsdp")), ("embed", "fsdp")]
    model = models.CausalLM(cfg, nnx.Rngs(0))
    graphdef, params, frozen = models.split_trainable(model)
    self.params_sh = sharding.param_shardings(params, self.mesh, rules)
    self.params = sharding.shard_like(params, self.params_sh)
    self.frozen = frozen
    frozen_sh = jax.tree.map(lambda x: x.sharding, frozen)
    self.rows_sh = {k: sharding.batch_sharding(self.mesh, rules, ndim=2) for k in packing.ROW_KEYS}
    self.tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, b1=0.9, b2=0.95))
    self.opt, opt_sh = sharding.init_optimizer(self.tx, self.params, self.params_sh, self.mesh)
    self.zeros = step_lib.make_zeros(self.params_sh)
    self.grad = step_lib.make_grad_step(graphdef, self.mesh, self.params_sh, frozen_sh, self.rows_sh)
    self.apply = step_lib.make_apply_step(self.tx, self.mesh, self.params_sh, opt_sh)
    self.micro_rows = micro_rows

  def run(self, examples: list[packing.Example], max_length: int, packed: bool) -> dict[str, float]:
    """One optimizer step on `examples`; returns loss, rows and token counts."""
    groups = packing.group_examples([len(e[0]) for e in examples], max_length, packed)
    rows = packing.build_rows(examples, groups, max_length, packing.padded_row_count(len(groups), self.micro_rows),
                              pad_id=0)
    normaliser = jnp.float32(packing.trained_tokens(rows))
    grads = self.zeros(self.params)
    losses = []
    for micro in packing.micro_batches(rows, self.micro_rows):
      grads, loss = self.grad(self.params, self.frozen, sharding.global_batch(micro, self.rows_sh), grads, normaliser,
                              jax.random.key(0))
      losses.append(loss)
    self.params, self.opt, _ = self.apply(self.params, self.opt, grads)
    jax.block_until_ready(self.params)
    return {"loss": float(sum(jax.device_get(losses))), "rows": len(rows["input_ids"]),
            "tokens": packing.real_tokens(rows), "slots": rows["input_ids"].size}


def measure(args, examples: list[packing.Example], packed: bool) -> dict:
  """Tokens/s of `--steps` timed steps after one warm-up step, from the same initial weights."""
  steps = Steps(model_config(args), args.micro * jax.device_count())
  batches = [examples[i * args.batch:(i + 1) * args.batch] for i in range(args.steps + 1)]
  first = steps.run(batches[0], args.max_length, packed)
  start = time.perf_counter()
  results = [steps.run(batch, args.max_length, packed) for batch in batches[1:]]
  seconds = time.perf_counter() - start
  tokens = sum(r["tokens"] for r in results)
  slots = sum(r["slots"] for r in results)
  return {"figure": "sft_tokens_per_s", "packing": packed, "tokens_per_s": tokens / seconds,
          "step_s": seconds / args.steps, "rows_per_step": float(np.mean([r["rows"] for r in results])),
          "pad_ratio": 1.0 - tokens / slots, "first_loss": first["loss"]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--max_length", type=int, default=256)
  parser.add_argument("--median_length", type=int, default=40)
  parser.add_argument("--batch", type=int, default=16, help="examples per step (data.train_batch_size)")
  parser.add_argument("--micro", type=int, default=4, help="rows per device per micro-batch")
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--width", type=int, default=128)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--vocab", type=int, default=4096)
  args = parser.parse_args()
  examples = length_skewed_examples(args.batch * (args.steps + 1), args.max_length, args.median_length, args.vocab, 0)
  lengths = [len(e[0]) for e in examples]
  print(json.dumps({"figure": "setup", "machine": platform.machine(), "devices": jax.device_count(),
                    "backend": jax.default_backend(), **vars(args), "mean_length": float(np.mean(lengths)),
                    "max_seen_length": int(np.max(lengths))}), flush=True)
  unpacked = measure(args, examples, packed=False)
  print(json.dumps(unpacked), flush=True)
  packed = measure(args, examples, packed=True)
  print(json.dumps(packed), flush=True)
  print(json.dumps({"figure": "sft_packing_speedup", "ratio": packed["tokens_per_s"] / unpacked["tokens_per_s"],
                    "first_loss_unpacked": unpacked["first_loss"], "first_loss_packed": packed["first_loss"]}))


if __name__ == "__main__":
  main()
