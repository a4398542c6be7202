"""Sharded train-step time and per-device memory, 1 vs 8 CPU devices.

    python benchmarks/sharding.py [--models tiny,smollm2] [--steps 3] [--batch 8] [--length 256]

For each model and device count a child process starts JAX with that many
host devices (XLA_FLAGS), builds the mesh from the config (fsdp over every
device), and times a jitted AdamW step (forward, loss, backward, update) on
random tokens. Prints one JSON object per line. On a 2-core machine eight
"devices" share two cores, so this measures the partitioning overhead, not a
speed-up.
"""

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = {
    "tiny": dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                 num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8),
    "smollm2": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                    tie_word_embeddings=True),
}


def child(model: str, devices: int, steps: int, batch: int, length: int) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx

  from rljax import config as config_lib
  from rljax import sharding
  from rljax.models import CausalLM, ModelConfig
  from rljax.training import updates as steps_lib

  config = config_lib.get_base_config()
  config_lib.apply_overrides(config, ["trainer.n_gpus_per_node=auto"])
  mesh = sharding.make_mesh(config)
  rules = sharding.rules_from_config(config)
  cfg = ModelConfig(**MODELS[model])
  graphdef, params = nnx.split(CausalLM(cfg, nnx.Rngs(0)), nnx.Param)
  param_sh = sharding.param_shardings(params, mesh, rules)
  params = sharding.shard_like(params, param_sh)
  optimizer = optax.adamw(1e-5)
  opt_state, opt_sh = sharding.init_optimizer(optimizer, params, param_sh, mesh)
  batch_sh = sharding.batch_sharding(mesh, rules)
  ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, length), dtype=np.int32)
  data = sharding.global_batch({"input_ids": ids}, batch_sh)

  def loss_fn(p, b):
    logits = nnx.merge(graphdef, p)(b["input_ids"])[:, :-1].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, b["input_ids"][:, 1:, None], -1)), ()

  step = steps_lib.make_train_step(loss_fn, optimizer, mesh, rules, param_sh, opt_sh, batch_sh)
  state_bytes = sharding.addressable_bytes((params, opt_state))
  start = time.perf_counter()
  compiled = step.lower(params, opt_state, data).compile()
  compile_s = time.perf_counter() - start
  temp = compiled.memory_analysis().temp_size_in_bytes
  params, opt_state, loss, _ = step(params, opt_state, data)
  loss.block_until_ready()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    params, opt_state, loss, _ = step(params, opt_state, data)
    loss.block_until_ready()
    times.append(time.perf_counter() - start)
  return {"bench": "sharding", "model": model, "devices": devices, "mesh": dict(mesh.shape),
          "tokens": batch * length, "compile_s": round(compile_s, 2),
          "step_s_median": round(float(np.median(times)), 3),
          "param_opt_bytes_per_device": state_bytes, "temp_bytes_per_device": int(temp),
          "loss": float(loss)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="tiny,smollm2")
  parser.add_argument("--devices", default="1,8")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=256)
  parser.add_argument("--child", nargs=2, metavar=("MODEL", "DEVICES"))
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, args.batch, args.length)))
    return
  for model in args.models.split(","):
    for devices in map(int, args.devices.split(",")):
      env = dict(os.environ, JAX_PLATFORMS="cpu",
                 XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
      out = subprocess.run([sys.executable, __file__, "--child", model, str(devices),
                            "--steps", str(args.steps), "--batch", str(args.batch),
                            "--length", str(args.length)],
                           env=env, capture_output=True, text=True, check=True)
      print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
  main()
