"""rljax's actor update compiled for TPU slices at MaxText's train-step shapes, for a side-by-side.

    python benchmarks/tpu_compile.py [--presets llama3_1_8b_gsm8k,qwen2_5_7b_gsm8k] [--topologies v5p-8,v6e-8,v5e-16]
        [--num_slices N] [--overrides KEY=VALUE ...]

For each preset and topology: the preset's run (fp32 weights and Adam
state, bfloat16 compute, full remat, scanned layers, splash attention) with
one micro-batch of 2 rows x 1536 tokens (512 prompt + 1024 response) per
chip per update, every prompt run with its response (no shared-prompt pass):
the work of MaxText's `train_compile` with per_device_batch_size=2,
max_target_length=1536, gradient_accumulation_steps=1 (benchmarks/
maxtext_compile.py). Prints one JSON line per compile: per-chip memory,
TFLOP with loop iterations counted and the roofline time at the chip's peak
rates (`rljax.compile.report`), the compiler's TFLOP and time estimate
(both count a scanned layer once), HBM traffic, collective GiB by kind and
the FSDP minimum. Run it in the
same environment (jax / libtpu) as the MaxText side for a like-for-like
compiler.
"""

import argparse
import importlib.metadata
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rljax import config as config_lib, sharding  # noqa: E402
from rljax.compile import plan, topology  # noqa: E402
from rljax.train import resolve  # noqa: E402

GiB = 1 << 30


def maxtext_shapes(chips: int) -> list[str]:
  """Overrides giving 2 rows of 512 + 1024 tokens per chip in one micro-batch."""
  return ["actor_rollout_ref.rollout.n=2", f"data.train_batch_size={chips}",
          f"actor_rollout_ref.actor.ppo_mini_batch_size={chips}", "actor_rollout_ref.actor.use_dynamic_bsz=false",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.model.share_prompt_forward=false",
          "data.max_prompt_length=512", "data.max_response_length=1024"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--presets", default="llama3_1_8b_gsm8k,qwen2_5_7b_gsm8k")
  parser.add_argument("--topologies", default="v5p-8,v6e-8,v5e-16")
  parser.add_argument("--steps", default="actor_update", help="step name prefixes to compile")
  parser.add_argument("--num_slices", type=int, default=1, help="slices of each topology (multislice)")
  parser.add_argument("--overrides", nargs="*", default=[], help="KEY=VALUE config overrides after the shapes")
  args = parser.parse_args()
  versions = {p: importlib.metadata.version(p) for p in ("jax", "jaxlib", "libtpu", "flax")}
  for preset in args.presets.split(","):
    for name in args.topologies.split(","):
      target = topology.parse(name, num_slices=args.num_slices)
      devices = topology.devices(target)
      config = resolve(config_lib.load_config_file(f"configs/grpo.py:{preset}"),
                       maxtext_shapes(len(devices)) + args.overrides, device_count=len(devices))
      mesh = sharding.make_mesh(config, devices=devices)
      for item in plan.rl_steps(config, mesh):
        if not any(item.step.name.startswith(p) for p in args.steps.split(",")):
          continue
        result, _ = plan.compile_step(item, target.hbm_bytes, target.chip)
        print(json.dumps({
            "library": "rljax", "preset": preset, "topology": name, "num_slices": args.num_slices,
            "mesh": dict(mesh.shape), "overrides": args.overrides, "step": result.name, "versions": versions,
            "fits": result.fits, "argument_gib": result.arguments / GiB, "temp_gib": result.temporaries / GiB,
            "peak_gib": result.required / GiB, "hbm_gib": result.hbm / GiB,
            "loop_tflop": None if result.loop_flops is None else result.loop_flops / 1e12,
            "roofline_s": result.roofline_seconds,
            "tflop_loop_once": None if result.flops is None else result.flops / 1e12,
            "estimated_s_loop_once": result.seconds,
            "hbm_traffic_gib": None if result.hbm_traffic is None else result.hbm_traffic / GiB,
            "collectives_gib": {k: v / GiB for k, v in result.collectives.items()},
            "bound": None if result.bound is None else [result.bound[0], result.bound[1] / GiB],
            "activation_all_reduce_gib": result.activation_all_reduce / GiB,
            "ratio": result.ratio, "compile_s": round(result.compile_seconds, 1), "error": result.error}),
              flush=True)


if __name__ == "__main__":
  main()
