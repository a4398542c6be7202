"""MaxText's own train step compiled for a TPU slice, read as benchmarks/tpu_compile.py reads rljax's.

    # a Python >= 3.12 venv with MaxText (its tpu extra; jax >= 0.11.1) and this repository:
    python3.12 -m venv /tmp/maxtext && /tmp/maxtext/bin/pip install "maxtext[tpu]==0.2.5" -e .
    JAX_PLATFORMS=cpu /tmp/maxtext/bin/python benchmarks/maxtext_compile.py llama3.1-8b v5p-8 [num_vocab_tiling=4 ...]

MaxText's `train_compile` builds the compiled executable and drops it; this
repeats its steps with MaxText's own functions (config, topology mesh,
shaped inputs, shardings, `train_step`, its jit) and keeps it. Settings:
per_device_batch_size=2, max_target_length=1536, gradient_accumulation_steps=1,
remat_policy=full, scan_layers=true, dtype=bfloat16, weight_dtype=float32,
attention=flash, ici_fsdp_parallelism=-1, synthetic data; the rest is
MaxText's base.yml. Prints one JSON line: per-chip memory, TFLOP with loop
iterations counted and the roofline time rljax.compile prints (`roof s`),
the compiler's TFLOP and time estimate (a scanned layer counted once), HBM
traffic and collective GiB by kind (`rljax.compile.hlo`). Further arguments
`key=value` change or add MaxText settings (`num_vocab_tiling=4`: the
logits and the loss in 4 tiles of the batch-sequence axis).
"""

import importlib.metadata
import json
import os
import sys
import time

GiB = 1 << 30
SETTINGS = dict(per_device_batch_size=2, max_target_length=1536, gradient_accumulation_steps=1, remat_policy="full",
                scan_layers="true", dtype="bfloat16", weight_dtype="float32", attention="flash",
                ici_fsdp_parallelism=-1, dataset_type="synthetic", enable_checkpointing="false",
                compile_topology_num_slices=1)
# MaxText's topology names where they differ from gcloud's accelerator types
MAXTEXT_TOPOLOGY = {"v5litepod-16": "v5e-16", "v5litepod-8": "v5e-8"}


def compiled_train_step(model: str, accelerator: str, settings: dict):
  """(MaxText's compiled train step for `accelerator` with `settings`, compile seconds)."""
  import jax  # pylint: disable=import-outside-toplevel
  import maxtext  # pylint: disable=import-outside-toplevel
  from flax.core.spmd import logical_axis_rules  # pylint: disable=import-outside-toplevel
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel
  from maxtext.trainers.pre_train import train, train_compile  # pylint: disable=import-outside-toplevel
  from maxtext.utils import max_utils, maxtext_utils, sharding  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_default_prng_impl", "unsafe_rbg")  # as train_compile.main sets them
  os.environ["LIBTPU_INIT_ARGS"] = os.environ.get("LIBTPU_INIT_ARGS", "") + " --xla_tpu_spmd_rng_bit_generator_unsafe=true"
  base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
  settings = {**settings, "model_name": model, "compile_topology": MAXTEXT_TOPOLOGY.get(accelerator, accelerator),
              "base_output_directory": "/tmp/maxtext_compile", "run_name": f"{model}_{accelerator}"}
  config = pyconfig.initialize(["train_compile", base] + [f"{k}={v}" for k, v in settings.items()])
  train_compile.validate_config(config)
  mesh = train_compile.get_topology_mesh(config)
  args, kwargs, state_shardings, _, graphdef = train_compile.get_shaped_inputs(mesh, config)
  params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
  input_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
  fn, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
      train.train_step, sharding.get_input_data_sharding(config, mesh), input_shardings, graphdef, config,
      params_shardings)
  start = time.perf_counter()
  with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
    lowered = jax.jit(fn, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static,
                      donate_argnums=donate).lower(*args, **kwargs)
  compiled = lowered.compile(compiler_options=max_utils.parse_libtpu_flags_to_dict(config.compile_xla_flags))
  return compiled, time.perf_counter() - start


def main():
  model, accelerator = sys.argv[1], sys.argv[2]
  settings = {**SETTINGS, **dict(arg.split("=", 1) for arg in sys.argv[3:])}
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["TPU_ACCELERATOR_TYPE"] = accelerator
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  from rljax.compile import hlo, report, topology  # pylint: disable=import-outside-toplevel
  compiled, seconds = compiled_train_step(model, accelerator, settings)
  memory, cost = compiled.memory_analysis(), compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, list) else cost
  text = compiled.as_text()
  flops, traffic, summary = hlo.loop_flops(text), hlo.hbm_bytes(text), hlo.collectives(text)
  chip = topology.parse(accelerator).chip
  peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
          + memory.temp_size_in_bytes)
  versions = {p: importlib.metadata.version(p) for p in ("maxtext", "jax", "jaxlib", "libtpu", "flax")}
  print(json.dumps({
      "library": "maxtext", "model": model, "topology": accelerator, "versions": versions, "settings": settings,
      "argument_gib": memory.argument_size_in_bytes / GiB, "temp_gib": memory.temp_size_in_bytes / GiB,
      "peak_gib": peak / GiB, "loop_tflop": flops / 1e12,
      "roofline_s": None if chip is None else report.roofline_seconds(flops, traffic, sum(summary.by_kind.values()), chip),
      "tflop_loop_once": cost.get("flops", 0) / 1e12, "estimated_s_loop_once": cost.get("optimal_seconds"),
      "hbm_traffic_gib": traffic / GiB,
      "collectives_gib": {k: v / GiB for k, v in summary.by_kind.items() if v},
      "compile_s": round(seconds, 1)}), flush=True)


if __name__ == "__main__":
  main()
