"""Every jitted step of an RL run, built abstractly for a mesh, ready to lower and compile.

On a slice of several hosts the rollout runs as a multi-process job runs it:
each host decodes on its own chips, and `rollout_weights` is the all-gather
that brings the trainer's weights to every host once per rollout.

`rl_steps(config, mesh)` assembles the run with the trainer's own call
(`rljax.rl.assembly.build_run`, `abstract=True`): no weights are read and
nothing is allocated, and the steps are the ones the trainer runs. Each
step comes with the bound `rljax.compile.report` holds it to.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax.compile import engine_steps, report, topology
from rljax.models import vision
from rljax.rl import assembly, packing, run_models, staleness
from rljax.rl import experience as experience_lib
from rljax.rollout.sampler import RolloutSampler
from rljax.sharding import hosts, offload
from rljax.sharding.placement import Step


@dataclasses.dataclass
class PlannedStep:
  """A step to compile, the bound its figures are compared with (None: no bound), and the bytes per device
  that other arrays hold while it runs (a rollout step runs beside the trainer's state). `parts`: programs
  that run one after the other as this step, each with whether its output only feeds the next, when it is
  several."""

  step: Step
  bound: tuple[str, float] | None = None
  resident: int = 0
  parts: list[tuple[Step, bool]] = dataclasses.field(default_factory=list)


def rl_steps(config: ConfigDict, mesh: Mesh, host_devices: Sequence[jax.Device] | None = None,
             appending: int | None = None, rollout_devices: Sequence[jax.Device] = (),
             remote: bool = False, row_tokens: int | None = None,
             image_patches: int | None = None) -> list[PlannedStep]:
  """The steps of an RL run of `config` on `mesh`: updates, forward passes, the rollout's weight copy, prefill,
  insert and decode, each with the trainer's arrays it runs beside (under colocate_async the engine's decode
  state too, which lives across updates, and for the engine's own steps a second one where validation or remax's
  baselines decode beside the stream's). `host_devices`: where `mesh` spans several hosts, one host's slice (as many devices as a
  host of the mesh has) to compile the host-local rollout on. `appending`: the multi-turn append over that many
  appending slots (`engine_steps.engine_steps`). `rollout_devices`: separate_async's own, where the engine's steps
  run beside the weight versions its schedule holds (`Schedule.weight_versions`) and its cache, not the trainer's
  arrays, and `rollout_weights` is the cast before the weights are sent (`weights_sent`). `remote`: those devices
  are another process's (`rljax.rl.remote`): validation and remax's baselines decode on the trainer's devices
  instead (`validation_decode_step`, beside the trainer's arrays). `row_tokens`: the packed passes as a step of
  rows holding that many real tokens each runs them (`at_row_tokens`), not at their largest. `image_patches`: a
  vision-language run's passes and prefill with rows of that many image patches each (`with_image_patches`), not
  one merged patch."""
  run, state = assembly.build_run(config, mesh, abstract=True, tokenizer=None, batches_per_epoch=1,
                                  rollout_devices=rollout_devices, remote_rollout=remote)
  layout, steps = run.layout, run.steps
  engine = run.rollout_engine if remote else run.engine
  actor_params = run.actor_params(state)
  compute = run.model_config.dtype
  def sized(step: Step) -> Step:
    if row_tokens is not None and packed_buffers(step) is not None:
      step = at_row_tokens(step, layout, row_tokens)
    if image_patches is not None and run.model_config.vision is not None:
      step = with_image_patches(step, image_patches, run.model_config.vision, row_tokens)
    return step

  actor_update = sized(steps.actor_update)
  planned = [PlannedStep(actor_update, ("FSDP min", report.fsdp_minimum(
      actor_params, state.actor, update_micro_batches(actor_update, layout), compute, mesh.shape["data"])))]
  if steps.critic_update is not None:
    critic_update = sized(steps.critic_update)
    planned.append(PlannedStep(critic_update, ("FSDP min", report.fsdp_minimum(
        state.critic, state.critic, update_micro_batches(critic_update, layout), compute, mesh.shape["data"]))))
  bounded = (steps.actor_update, steps.critic_update)
  planned += [PlannedStep(sized(s)) for s in run.compiled_steps() if not any(s is b for b in bounded)]
  sampler_steps = RolloutSampler(engine, pad_id=0).steps_per_sync
  rollout_params = engine.compute_params(actor_params)
  weight_sync = engine.weights.sync_steps(actor_params)
  if weight_sync:
    fed = [False] + [feeds for _, feeds in weight_sync[:-1]]
    share = _host_share([s.args for (s, _), by_previous in zip(weight_sync, fed) if not by_previous])
    planned.append(PlannedStep(weight_sync[0][0], None if share is None else ("host share", share),
                               parts=weight_sync if len(weight_sync) > 1 else []))
  if host_devices is not None and engine.mesh is not mesh and len(hosts.processes(mesh.devices.flat)) > 1:
    engine = engine.on_devices(host_devices)
    rollout_params = engine.compute_params(actor_params)
  rollout = []
  for step in engine_steps.engine_steps(engine, actor_params, sampler_steps, samples_per_prompt=layout.n,
                                        appending=appending, image_patches=image_patches):
    bound = None
    if step.name.startswith("decode_step"):
      bound = ("param+cache", report.decode_minimum(rollout_params, engine.abstract_decode_state()))
    rollout.append(PlannedStep(step, bound))
  planned += rollout
  trainer, second = _trainer_arrays(config, run, state), []
  beside_stream = staleness.decodes_beside_the_stream(config)
  if remote and beside_stream:
    planned += [PlannedStep(dataclasses.replace(step, name=f"validation_{step.name}"), ("param+cache", report.decode_minimum(
        run.engine.compute_params(actor_params), run.engine.abstract_decode_state())))
                for step in engine_steps.engine_steps(run.engine, actor_params, sampler_steps,
                                                      samples_per_prompt=layout.n)
                if step.name.startswith("decode_step")]
  if staleness.policy_of(config, 1) is not None:  # colocate_async: the KV cache stays allocated across updates
    cache = [x for x in jax.tree.leaves(engine.abstract_decode_state())
             if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]  # its key: a few bytes
    trainer += cache
    second = cache if beside_stream and not remote else []
  if rollout_devices:
    # the rollout's devices hold no trainer array: the weight versions its schedule keeps (and, in one process,
    # the copy a validation or remax decode makes beside the stream), its cache (and that decode's)
    copies = staleness.schedule_of(config).weight_versions + int(beside_stream and not remote)
    on_rollout = copies * jax.tree.leaves(rollout_params) + cache + second
    trainer = _trainer_arrays(config, run, state)
  for item in planned:
    rolls = any(item is r for r in rollout)
    beside = (on_rollout if rollout_devices else trainer + second) if rolls else trainer
    item.resident = _beside(beside, [part.args for part, _ in item.parts] or item.step.args)
  return planned


def packed_buffers(step: Step) -> tuple[int, int, int, int] | None:
  """(micro-batches, data shards, buffers per shard, tokens per buffer) of a packed pass as `rljax.compile` lowers
  it (at its largest: one row per buffer); None for a step over padded rows."""
  index = _packed_arg(step)
  if index is None:
    return None
  micro, shards, buffers, tokens = _packed_of(step.args[index]).input_ids.shape
  return micro, shards, buffers, tokens


def _packed_of(arg: Any) -> Any:
  """The PackedRows an argument is or holds (None for padded rows and other arguments)."""
  packed = arg if isinstance(arg, packing.PackedRows) else getattr(arg, "packed", None)
  return packed if isinstance(packed, packing.PackedRows) else None


def _packed_arg(step: Step) -> int | None:
  """Which of `step`'s arguments holds its packed rows (None: a step over padded rows)."""
  return next((i for i, arg in enumerate(step.args) if _packed_of(arg) is not None), None)


def update_micro_batches(step: Step, layout: Any) -> int:
  """The micro-batches an update Step runs: its packed batch's, else the layout's."""
  shape = packed_buffers(step)
  return layout.micro_batches if shape is None else shape[0]


def at_row_tokens(step: Step, layout: Any, row_tokens: int) -> Step:
  """A packed pass `step` (lowered at its largest, one row per buffer) as a run packs rows of `row_tokens` real
  tokens each (at most a buffer's): the micro-batches its token budget then takes (`packing.budget_arrangement`;
  the layout's count without one) and the buffers each needs (`packing.make_plan`, on the grid)."""
  index = _packed_arg(step)
  batch = step.args[index]
  abstract = _packed_of(batch)
  micro, shards, per_shard, width = abstract.input_ids.shape
  rows = micro * shards * per_shard
  lengths = np.full(rows, min(row_tokens, width))
  budget = layout.budget_of(step.name)
  order = np.arange(rows)
  arrangement = (order.reshape(micro, -1) if budget is None
                 else packing.budget_arrangement(lengths, order, shards, budget, width))
  response = 0 if abstract.out_index is None else abstract.out_index.shape[-1]
  plan = packing.make_plan(np.zeros(rows, np.int64), lengths, arrangement, shards, width - response, response,
                           slice(0, shards), budget)
  new_micro, slots = arrangement.shape

  def resized(s: Any, buffers: bool) -> Any:
    if s is None:
      return None
    middle = (shards, plan.buffers) if buffers else (shards, slots // shards)
    return jax.ShapeDtypeStruct((new_micro, *middle, *s.shape[3:]), s.dtype, sharding=s.sharding)

  packed = packing.PackedRows(
      input_ids=resized(abstract.input_ids, True), positions=resized(abstract.positions, True),
      segment_ids=resized(abstract.segment_ids, True), out_index=resized(abstract.out_index, False),
      experts=resized(abstract.experts, True), row_index=resized(abstract.row_index, False),
      image_slots=resized(abstract.image_slots, True),
      images=jax.tree.map(lambda s: resized(s, True), abstract.images))
  if batch is not abstract:
    fields = jax.tree.map(lambda s: jax.ShapeDtypeStruct((new_micro, slots, *s.shape[2:]), s.dtype,
                                                         sharding=s.sharding), batch.replace(packed=None))
    packed = fields.replace(packed=packed)
  args = (*step.args[:index], packed, *step.args[index + 1:])
  return Step(step.name, step.fn, args)


def with_image_patches(step: Step, patches: int, cfg: Any, row_tokens: int | None = None) -> Step:
  """`step` (built with one merged image patch per row) for rows of `patches` image patches each: a padded batch's
  image fields [M, rows, Q, ...] at Q = the power of two `rljax.models.vision.row_images` pads them to; a packed
  buffer's at the patches of the rows it holds (one at its largest; with `row_tokens`, as many as fit its
  tokens)."""
  q = vision.patch_bucket(patches, cfg.merge_unit)

  def widened(s: Any, lead: int, width: int, merged: bool = False) -> Any:
    """`s` [*lead axes, patches, ...] with `width` patches (merged: [.., merged patches] with width / m^2)."""
    return jax.ShapeDtypeStruct((*s.shape[:lead], width // cfg.merge_unit if merged else width, *s.shape[lead + 1:]),
                                s.dtype, sharding=s.sharding)

  args = []
  for arg in step.args:
    packed = _packed_of(arg)
    if packed is not None and packed.images is not None:
      tokens = packed.input_ids.shape[-1]
      width = vision.patch_bucket(patches * max(1, tokens // row_tokens) if row_tokens else patches,
                                  cfg.merge_unit)
      images = packed.images
      layout = images.layout._replace(**{k: widened(getattr(images.layout, k), 3, width, k == "restore")
                                         for k in images.layout._fields})
      resized = packed.replace(images=images._replace(pixels=widened(images.pixels, 3, width), layout=layout))
      arg = resized if arg is packed else arg.replace(packed=resized)
    elif getattr(arg, "pixels", None) is not None:
      arg = arg.replace(**{k: widened(getattr(arg, k), 2, q, k == "merge_restore") for k in experience_lib.IMAGE_FIELDS})
    args.append(arg)
  return Step(step.name, step.fn, tuple(args))


def packing_line(planned: list[PlannedStep], row_tokens: int | None = None) -> str | None:
  """A line naming, for each packed pass of `planned`, its buffers per step and tokens per buffer (compiled at
  the largest, one row per buffer: a step of shorter rows runs fewer, `rljax.rl.packing.grid_ceil`; or for rows
  of `row_tokens` tokens, `at_row_tokens`)."""
  parts = []
  for item in planned:
    shape = packed_buffers(item.step)
    if shape is not None:
      micro, shards, buffers, tokens = shape
      parts.append(f"{item.step.name} {micro * shards * buffers} buffers of {tokens} tokens ({micro} micro-batches x "
                   f"{shards} data shards x {buffers})")
  how = ("compiled at their largest (one row per buffer; shorter rows share buffers and run fewer)" if row_tokens is None
         else f"compiled for rows of {row_tokens} real tokens each")
  return f"packed passes, {how}: " + "; ".join(parts) if parts else None


def weights_sent(planned: list[PlannedStep]) -> tuple[int, int]:
  """separate_async: (bytes the trainer sends at each weight sync, the most one rollout device receives): the
  weights the decode step of `planned` (`rl_steps`') computes with, in the engine's dtype and layout."""
  decode = next(p for p in planned if p.step.name.startswith("decode_step"))
  sent = decode.step.args[0]
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(sent)), report.shard_bytes(sent)


def _trainer_arrays(config: ConfigDict, run: assembly.RLRun, state: assembly.RunState) -> list[Any]:
  """The trainer's arrays, which stay on the devices through every step: the trained state and its
  optimizer's, frozen weights, the reward model's and the reference's (a copy of the actor's weights, or under
  LoRA the actor's own frozen arrays), each array once; not those offloaded to host memory."""
  kept = {id(leaf): leaf for leaf in jax.tree.leaves([state, run.frozen, None if run.reward_model is None
                                                      else run.reward_model.params])}
  reference = jax.tree.leaves(None if run.reference is None else run.reference.params)
  arrays = list(kept.values()) + (reference if run_models.lora_config(config) is None
                                  else [x for x in reference if id(x) not in kept])
  return [x for x in arrays if not offload.in_host(x)]


def _beside(trainer: list[Any], args: Any) -> int:
  """Per device: the bytes of the trainer's arrays a step does not take as arguments (one array for each
  argument of the same shape, dtype and sharding), which stay allocated while it runs."""
  left = collections.Counter((x.shape, x.dtype, x.sharding) for x in trainer)
  for x in jax.tree.leaves(args):
    key = (getattr(x, "shape", None), getattr(x, "dtype", None), getattr(x, "sharding", None))
    left[key] -= 1 if left[key] > 0 else 0
  return sum(report.shard_bytes([jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)]) * n
             for (shape, dtype, sharding), n in left.items() if n > 0)


def _host_share(args: Any) -> float | None:
  """The least the rollout's weight copy brings to a host from others: the weights (in the rollout dtype, as
  the copy's arguments `args` hold them) outside the busiest host's own shards; None on one host."""
  leaves = jax.tree.leaves(args)
  devices = list(leaves[0].sharding.mesh.devices.flat)
  if len(hosts.processes(devices)) < 2:
    return None
  total = sum(x.size * x.dtype.itemsize for x in leaves)
  return float(max(total - sum(_held_bytes(x, set(hosts.process_devices(p, devices))) for x in leaves)
                   for p in hosts.processes(devices)))


def _held_bytes(x: jax.ShapeDtypeStruct, devices: set) -> int:
  """Bytes of `x` that `devices` hold between them (each distinct block once)."""
  blocks = {tuple(s.indices(n) for s, n in zip(index, x.shape))
            for d, index in x.sharding.devices_indices_map(x.shape).items() if d in devices}
  return sum(math.prod(len(range(*r)) for r in block) for block in blocks) * x.dtype.itemsize


def compile_step(planned: PlannedStep, hbm: int,
                 chip: topology.Chip | None = None) -> tuple[report.StepReport, Any]:
  """(its report, the compiled executable or None when the compiler refused it; for a step of several parts,
  their combined report and the last part's executable). `chip`: the device's peak rates, for the report's
  roofline time (none without)."""
  if planned.parts:
    start = time.perf_counter()
    compiled = [compile_step(PlannedStep(part), hbm, chip) for part, _ in planned.parts]
    result = report.in_sequence(planned.step.name, [(r, feeds) for (r, _), (_, feeds) in zip(compiled, planned.parts)],
                                hbm).with_resident(planned.resident)
    result.bound = planned.bound
    result.compile_seconds = time.perf_counter() - start
    return result, compiled[-1][1]
  start = time.perf_counter()
  try:
    compiled = planned.step.lower().compile()
  except jax.errors.JaxRuntimeError as error:
    result = report.from_error(planned.step.name, error, hbm).with_resident(planned.resident)
    result.compile_seconds = time.perf_counter() - start
    return result, None
  result = report.from_compiled(planned.step.name, compiled, hbm, planned.step.args[0], planned.step.args, chip)
  result = result.with_resident(planned.resident)
  result.bound = planned.bound
  result.compile_seconds = time.perf_counter() - start
  return result, compiled
