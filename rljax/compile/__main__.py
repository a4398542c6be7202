"""`python -m rljax.compile`: compile every step of a run for a TPU slice and say whether it fits.

    python -m rljax.compile --config=configs/grpo.py:PRESET --topology=v5p-8 [--num_slices=N] [KEY=VALUE ...]

With `--topology` the steps compile for that slice on any host (the `tpu`
extra brings libtpu); without it, for the devices JAX sees (a TPU VM's own
chips). Overrides are the trainer's (`rljax.launch`). Prints one row per
step (per-device GiB, TFLOP with loop iterations counted and the roofline
time `roof s` at the chip's peak rates, the compiler's TFLOP and time
estimate, which count each loop body once, collective GiB by kind, the bound
and measured/bound) and exits 1 when a step does not fit, with what to
change. `roof s` is max(FLOPs / peak FLOP/s, HBM traffic / HBM bandwidth)
+ collective bytes / ICI bandwidth: collectives not overlapped with
compute, every rate at its peak (`rljax.compile.report`); none for v4.
Loops whose trip count depends on the data (a mixture-of-experts update's
capacity chunks) count once, and a line under the table names the steps
that have them.
A vision-language run's passes hold one merged image patch per row unless `--image_patches=N` sizes each row's
images (N patches: a 448 x 448 image is 1,024 of Qwen2.5-VL's 14-pixel patches), and its rollout then also
compiles the prefill of prompts with images (`image_prefill`) at each bucket.
A step's `need` counts `state`: the trainer's arrays (weights, optimizer
moments, the reference's copy) that stay on each chip while a step that does
not take them runs (a rollout step, or the update beside the reference).

On a slice of several hosts the rollout is compiled as a multi-process job
runs it (each host decodes on its own chips, compiled on a one-host slice of
the same chips) and `x-host` is the GiB that reach the busiest host's chips
from other hosts' chips in one run of each step (`rljax.compile.hlo`);
`rollout_weights`, the copy that gives every host the weights once per
rollout (one array at a time), is bounded by the weights that host does not
hold.

Under trainer.v1.trainer_mode=separate_async the trainer's steps compile on
a slice of the trainer's chips and the engine's on a slice of the rollout's
(`v6e-8` with actor_rollout_ref.rollout.nnodes=1 n_gpus_per_node=4: a v6e-4
each, one process; `v5p-16`: a v5p-8 each, a host each, which run as two
processes, `rljax.rl.remote`, where validation and remax's baselines decode
on the trainer's chips: `validation_decode_step`), the rollout's steps beside
the weight versions its schedule holds and its cache;
`rollout_weights` is the cast before the weights are sent, and a last line
gives the bytes sent per weight sync, what one rollout chip receives and
that over the chip's ICI bandwidth (the copy is a device-to-device transfer
at run time, not a compiled program: the compiler has no estimate of it).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from absl import app, flags

from rljax import launch

_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice: v5p-8, v6e-8, v5litepod-16, v4-8 or v5p:2x2x1 "
                                "(default: the devices JAX sees).")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices joined over the data-center network.")
_ONLY = flags.DEFINE_list("only", [], "Compile only the steps whose names start with these (actor_update, decode, ...).")
_JSON = flags.DEFINE_string("json", None, "Also write the reports to this JSON file.")
_APPENDING = flags.DEFINE_integer("appending", None, "A multi-turn run: compile the append where this many slots "
                                  "append (spread over the slot shards) beside the append over all slots (default: "
                                  "the most that run over their own rows; none when this many run over all slots).",
                                  lower_bound=1)

_ROW_TOKENS = flags.DEFINE_integer("row_tokens", None, "Compile the packed passes as a step whose rows hold this many "
                                   "real tokens each runs them (the micro-batches their token budgets then take, "
                                   "the buffers each needs), not at their largest (one row per buffer).",
                                   lower_bound=1)
_IMAGE_PATCHES = flags.DEFINE_integer("image_patches", None, "A vision-language run: compile its passes and prefill "
                                      "for rows of this many image patches each (a 448 x 448 image: 1,024 of 14 "
                                      "pixels), not one merged patch.", lower_bound=1)

FIXES = ("to fit, try: a larger fsdp axis (actor_rollout_ref.actor.fsdp_config.fsdp_size=-1 over more chips), "
         "fewer rows per micro-batch (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, or "
         "use_dynamic_bsz with a smaller ppo_max_token_len_per_gpu; log_prob_micro_batch_size_per_gpu for the "
         "forward passes), gradient checkpointing (actor_rollout_ref.model.enable_gradient_checkpointing=true, "
         "remat_policy=full), bfloat16 compute (actor_rollout_ref.actor.fsdp_config.dtype=bfloat16), fewer decode "
         "slots or a bfloat16 cache (actor_rollout_ref.rollout.max_num_seqs, rollout.dtype=bfloat16)")


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    print(f"unexpected arguments {argv[1:]}: overrides are KEY=VALUE or --config.KEY=VALUE", file=sys.stderr)
    return 2
  if launch.CONFIG.value is None:
    print("--config is required, e.g. --config=configs/grpo.py:qwen2_5_7b_gsm8k --topology=v5p-8", file=sys.stderr)
    return 2
  if _TOPOLOGY.value:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # pylint: disable=import-outside-toplevel
  import jax

  if _TOPOLOGY.value:  # programs compiled for a slice this host lacks cannot be loaded back from a cache
    jax.config.update("jax_enable_compilation_cache", False)

  from rljax import config as config_lib, sharding
  from rljax.compile import plan, report, topology as topology_lib
  from rljax.rl import remote as remote_lib
  from rljax.sharding import hosts
  from rljax.train import resolve

  try:
    if _TOPOLOGY.value:
      target = topology_lib.parse(_TOPOLOGY.value, _NUM_SLICES.value)
      devices, hbm, where = topology_lib.devices(target), target.hbm_bytes, f"{target.topology_name} x{target.num_slices}"
      chip = target.chip
    else:
      devices = jax.devices()
      hbm = int((devices[0].memory_stats() or {}).get("bytes_limit", 0)) or (1 << 62)
      where = f"{len(devices)} x {devices[0].device_kind}"
      chip = topology_lib.chip_of(devices[0].device_kind)
    config = resolve(config_lib.load_config_file(launch.CONFIG.value), launch.overrides(), device_count=len(devices))
    rollout_devices = sharding.split_devices(config, devices)[1]
    remote = remote_lib.roles(config, devices) is not None  # each side on hosts of its own
    if rollout_devices and _TOPOLOGY.value:  # each side on a slice of its own chips (libtpu compiles whole slices)
      devices = [*topology_lib.devices(topology_lib.sub_slice(target, len(devices) - len(rollout_devices))),
                 *topology_lib.devices(topology_lib.sub_slice(target, len(rollout_devices)))]
      rollout_devices = sharding.split_devices(config, devices)[1]
    mesh = sharding.make_mesh(config, devices=devices)
    several_hosts = _TOPOLOGY.value and len({d.process_index for d in mesh.devices.flat}) > 1
    planned = plan.rl_steps(config, mesh, topology_lib.devices(topology_lib.one_host(target)) if several_hosts else None,
                            appending=_APPENDING.value, rollout_devices=rollout_devices, remote=remote,
                            row_tokens=_ROW_TOKENS.value, image_patches=_IMAGE_PATCHES.value)
    sent = plan.weights_sent(planned) if rollout_devices else None
  except (config_lib.ConfigError, ValueError) as error:
    print(f"config error: {error}", file=sys.stderr)
    return 2
  print(f"rljax.compile: {launch.CONFIG.value} on {where} ({len(devices)} devices), mesh {dict(mesh.shape)}", flush=True)
  reports = []
  for item in planned:
    if _ONLY.value and not any(item.step.name.startswith(p) for p in _ONLY.value):
      continue
    result, _ = plan.compile_step(item, hbm, chip)
    reports.append(result)
    status = "fits" if result.fits else f"does NOT fit: {result.error or 'over HBM'}"
    print(f"  {result.name}: {status} ({result.compile_seconds:.0f} s)", flush=True)
  print(report.table(reports))
  once = report.once_counted(reports)
  if once:
    print(once)
  packed = plan.packing_line([item for item in planned if any(r.name == item.step.name for r in reports)],
                             _ROW_TOKENS.value)
  if packed:
    print(packed)
  if sent is not None:
    print(report.sent_line(sent, len(rollout_devices), config.trainer.v1.separate_async.parameter_sync_step, chip,
                           len(hosts.processes(rollout_devices)) if remote else 1))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump({"config": launch.CONFIG.value, "topology": where, "mesh": dict(mesh.shape),
                 "steps": [r.as_dict() for r in reports],
                 **({"weights_sent": {"bytes": sent[0], "per_rollout_device": sent[1]}} if sent else {})}, f, indent=2)
  failed = [r.name for r in reports if not r.fits]
  if failed:
    print(f"\n{', '.join(failed)} do not fit in {report.gib(hbm)} GiB per device; {FIXES}.", file=sys.stderr)
    return 1
  return 0


def run() -> None:
  app.run(main, flags_parser=launch.parse_flags)


if __name__ == "__main__":
  run()
