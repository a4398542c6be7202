"""One device mesh per job, built from the config.

Axis style: every mesh axis is `AxisType.Auto`. jax 0.10's `jax.make_mesh`
defaults to Explicit axes (sharding in types), which would make every
operation's output sharding part of its type and every model line answer
for it. rljax instead places parameters, optimizer state and batches with
`NamedSharding`s at the jit boundary (`in_shardings` / `out_shardings`,
`jax.device_put`) and lets XLA's partitioner propagate them through the
model, adding `jax.lax.with_sharding_constraint` only where a layout must be
pinned. Every mesh in rljax is made by `make_mesh` / `build_mesh`, so this
choice holds everywhere.

Axes, in order: `data` (pure data parallel), `fsdp` (data parallel with
parameters and optimizer state sharded), `tensor` (tensor parallel),
`sequence` (sequence parallel), `expert` (expert parallel: a
mixture-of-experts layer's experts split over it; for everything else it is
more fsdp). Their sizes come from verl's keys:

* devices: `trainer.nnodes * trainer.n_gpus_per_node`, or every visible
  device when either says `auto`;
* tensor: `actor_rollout_ref.actor.tensor_model_parallel_size`;
* sequence: `actor_rollout_ref.actor.ulysses_sequence_parallel_size`;
* expert: `actor_rollout_ref.actor.megatron.expert_model_parallel_size`, over
  the `exp` rule's axes: where that rule spans the tensor (and sequence) axis
  too (the config maps a Megatron size that only tensor x context x data can
  hold onto it, as Megatron carves its expert groups), the expert axis is
  that size / their product;
* fsdp: `actor_rollout_ref.actor.fsdp_config.fsdp_size` (-1: every device
  left after tensor, sequence and expert, within one slice when the devices
  span several TPU slices); as in verl, its group holds the Ulysses groups,
  so the axis is fsdp_size / ulysses_sequence_parallel_size;
* data: whatever is left (across the slices, with fsdp_size=-1).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh
from ml_collections import ConfigDict

from rljax.config.errors import ConfigError
from rljax.sharding.rules import rule_axes, rules_from_config

AXES = ("data", "fsdp", "tensor", "sequence", "expert")

_TENSOR_KEY = "actor_rollout_ref.actor.tensor_model_parallel_size"
_SEQUENCE_KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
_FSDP_KEY = "actor_rollout_ref.actor.fsdp_config.fsdp_size"
EXPERT_KEY = "actor_rollout_ref.actor.megatron.expert_model_parallel_size"


def mesh_shape(config: ConfigDict, device_count: int, slices: int = 1) -> dict[str, int]:
  """Axis sizes {data, fsdp, tensor, sequence, expert} for `device_count` devices in `slices` TPU slices.

  fsdp_size=-1 takes the devices left after tensor x sequence in one slice
  (all of them when one slice cannot hold the rest evenly), so that the
  weight gathers and gradient reduce-scatters stay on a slice's own
  interconnect and only the data axis crosses the data-center network, as
  MaxText's multislice default does.

  Raises:
    ConfigError: naming the keys, when the sizes do not factor the devices.
  """
  actor = config.actor_rollout_ref.actor
  tensor, sequence = actor.tensor_model_parallel_size, actor.ulysses_sequence_parallel_size
  fsdp = actor.fsdp_config.fsdp_size
  model = tensor * sequence
  if tensor < 1 or sequence < 1 or device_count % model:
    raise ConfigError(
        _TENSOR_KEY, tensor,
        f"tensor ({tensor}) x sequence ({_SEQUENCE_KEY}={sequence}) does not divide the {device_count} devices",
        f"choose sizes whose product divides {device_count}")
  expert = expert_axis(actor.megatron.expert_model_parallel_size, {"tensor": tensor, "sequence": sequence},
                       device_count // model, expert_rule_axes(config))
  rest = device_count // (model * expert)
  if fsdp == -1:
    fsdp = rest // slices if rest % slices == 0 else rest
  else:
    fsdp = fsdp_axis(fsdp, sequence)
  if fsdp < 1 or rest % fsdp:
    raise ConfigError(
        _FSDP_KEY, actor.fsdp_config.fsdp_size,
        f"does not divide the {rest} devices left after tensor x sequence x expert "
        f"({device_count} devices / {model * expert})" + (f", in groups of {_SEQUENCE_KEY}={sequence}"
                                                           if sequence > 1 else ""),
        f"set {_FSDP_KEY}=-1 (all of them) or a divisor of {rest}"
        + (f" times {sequence} (verl's FSDP group holds the Ulysses groups)" if sequence > 1 else ""))
  return {"data": rest // fsdp, "fsdp": fsdp, "tensor": tensor, "sequence": sequence, "expert": expert}


def expert_rule_axes(config: ConfigDict) -> tuple[str, ...]:
  """The mesh axes `trainer.logical_axis_rules` splits the experts (`exp`) over: ("expert",) by default; with the
  tensor (and sequence) axis too where Megatron's expert groups span them (`carved_expert_axes`)."""
  return rule_axes(rules_from_config(config), "exp")


def expert_axis(expert: int, model: dict[str, int], left: int, rule_axes: Sequence[str]) -> int:
  """The mesh's expert axis for verl's `expert_model_parallel_size` = `expert`: the experts split `expert` ways
  over the `exp` rule's axes, so where that rule spans model axes too (`model`: {tensor, sequence} sizes), the
  expert axis holds expert / their product of the `left` devices after them (Megatron carves its expert groups out of
  tensor x context x data).

  Raises:
    ConfigError: naming the key, when the size does not factor the devices.
  """
  spans = math.prod(size for name, size in model.items() if name in rule_axes)
  axis = expert // spans if expert % spans == 0 else 0
  if expert < 1 or axis < 1 or left % axis:
    spanned = " x ".join(name for name in model if name in rule_axes and model[name] > 1)
    fix = (f"choose a divisor of {left} times {spanned} ({spans})" if spans > 1 else
           f"choose a divisor of {left}, or a multiple of tensor ({model['tensor']}) whose quotient divides {left}"
           if model["tensor"] > 1 else f"choose a divisor of {left}")
    raise ConfigError(EXPERT_KEY, expert, f"does not divide the {left} devices left after tensor x sequence"
                      + (f" (the exp rule spans {spanned})" if spans > 1 else ""), fix)
  return axis


def carved_expert_axes(expert: int, tensor: int, sequence: int, left: int) -> tuple[str, ...]:
  """The model axes Megatron's expert groups must span: none where `expert` divides the `left` devices after
  tensor x sequence; else tensor, or tensor and sequence (context), the fewest whose product `expert` is a multiple
  of with the quotient dividing `left` (Megatron with expert_tensor_parallel_size=1 carves them out of tensor x
  context x data: expert 4 with tensor 4 on 24 devices, 6 left; expert 8 with tensor 2 and context 2 on 8).
  Empty too where no choice fits (the mesh then names the key)."""
  if left % expert == 0:
    return ()
  for axes, span in ((("tensor",), tensor), (("tensor", "sequence"), tensor * sequence)):
    if span > 1 and expert % span == 0 and left % (expert // span) == 0:
      return tuple(a for a in axes if (tensor if a == "tensor" else sequence) > 1)
  return ()


def fsdp_axis(fsdp_size: int, sequence: int) -> int:
  """The fsdp axis of verl's `fsdp_size`: its FSDP group holds the Ulysses (sequence) groups inside it, so a
  group of fsdp_size devices is fsdp_size / sequence along fsdp times sequence (0 when that does not divide)."""
  return fsdp_size // sequence if fsdp_size % sequence == 0 else 0


def device_tokens(row_tokens: int, sequence: int) -> int:
  """The tokens of a row of `row_tokens` one device holds when the sequence axis (Ulysses) splits it over
  `sequence` devices: verl's per-GPU token budgets (`*_max_token_len_per_gpu`) count these, so a
  sequence-parallel group holds budget x sequence tokens."""
  return -(-row_tokens // sequence)


def build_mesh(shape: dict[str, int] | Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh with rljax's five Auto axes; `shape` as a dict or in AXES order (`expert` may be left out: 1)."""
  sizes = tuple(shape.get(a, 1) if a == "expert" else shape[a] for a in AXES) if isinstance(shape, dict) \
      else tuple(shape)
  if len(sizes) == len(AXES) - 1:
    sizes = (*sizes, 1)
  if len(sizes) != len(AXES):
    raise ValueError(f"a mesh shape has {len(AXES)} sizes ({', '.join(AXES)}), got {sizes}")
  devices = list(devices) if devices is not None else jax.devices()
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh {dict(zip(AXES, sizes))} needs {int(np.prod(sizes))} devices, {len(devices)} given")
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices == 1:
    return _one_slice_mesh(sizes, devices)
  dcn = slice_shape(sizes, slices)
  ici = tuple(size // across for size, across in zip(sizes, dcn))
  return Mesh(mesh_utils.create_hybrid_device_mesh(ici, dcn, devices), AXES, axis_types=(AxisType.Auto,) * len(AXES))


def _one_slice_mesh(sizes: tuple[int, ...], devices: list[jax.Device]) -> Mesh:
  """`jax.make_mesh`'s layout, or where its axis sizes are no products of the chips' physical axes (a v5p-64's
  2x4x4 for data 1 x fsdp 2 x tensor 2 x expert 8) one that splits physical axes."""
  auto = (AxisType.Auto,) * len(AXES)
  try:
    return jax.make_mesh(sizes, AXES, axis_types=auto, devices=devices)
  except NotImplementedError:
    grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
    return Mesh(grid, AXES, axis_types=auto)


def slice_shape(sizes: Sequence[int], slices: int) -> tuple[int, ...]:
  """How many slices each axis spans: the slices go to the outermost axes they divide (data, then fsdp).

  Several TPU slices (`--num_slices`, multislice) talk over the data-center
  network, much slower than a slice's own interconnect, so the axes that
  communicate least (data parallel, then the fsdp gathers) span them; the
  default fsdp_size=-1 leaves fsdp within a slice (`mesh_shape`).

  Raises:
    ValueError: naming the axis sizes when the slices do not factor over them.
  """
  across, left = [], slices
  for size in sizes:
    across.append(math.gcd(size, left))
    left //= across[-1]
  if left != 1:
    raise ValueError(f"{slices} slices do not factor over the mesh axes {dict(zip(AXES, sizes))}")
  return tuple(across)


def rollout_device_count(config: ConfigDict) -> int:
  """Devices of the rollout's own under trainer.v1.trainer_mode=separate_async:
  actor_rollout_ref.rollout.nnodes x n_gpus_per_node (0 otherwise: the rollout shares the trainer's devices).

  Raises:
    ConfigError: separate_async with a count that is not a positive integer.
  """
  v1 = config.trainer.get("v1")  # an SFT config has none
  if v1 is None or v1.trainer_mode != "separate_async":
    return 0
  rollout = config.actor_rollout_ref.rollout
  for key, value in (("nnodes", rollout.nnodes), ("n_gpus_per_node", rollout.n_gpus_per_node)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(f"actor_rollout_ref.rollout.{key}", value,
                        "trainer.v1.trainer_mode=separate_async generates on devices of its own, "
                        "actor_rollout_ref.rollout.nnodes x n_gpus_per_node of them: a positive integer",
                        f"set actor_rollout_ref.rollout.{key} (e.g. nnodes=1 n_gpus_per_node=4)")
  return rollout.nnodes * rollout.n_gpus_per_node


def resolve_world_size(config: ConfigDict, device_count: int | None = None) -> int:
  """Devices that train: trainer.nnodes * n_gpus_per_node, or for 'auto' JAX's count less the rollout's own
  devices (`rollout_device_count`; `device_count`: the devices seen, default JAX's)."""
  nodes, per_node = config.trainer.nnodes, config.trainer.n_gpus_per_node
  if nodes == "auto" or per_node == "auto":
    return (jax.device_count() if device_count is None else device_count) - rollout_device_count(config)
  for key, value in (("trainer.nnodes", nodes), ("trainer.n_gpus_per_node", per_node)):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ConfigError(key, value, "must be a positive integer or 'auto'", f"set {key}=auto to use every visible device")
  return nodes * per_node


def split_devices(config: ConfigDict,
                  devices: Sequence[jax.Device] | None = None) -> tuple[list[jax.Device], list[jax.Device]]:
  """(the trainer's devices, the rollout's own) of `devices` (default: every device JAX sees): the rollout's are
  the last `rollout_device_count` (none unless separate_async), the trainer's the rest, checked against
  trainer.nnodes x trainer.n_gpus_per_node.

  Raises:
    ConfigError: the configured device counts differ from the devices given.
  """
  devices = list(devices) if devices is not None else jax.devices()
  rollout = rollout_device_count(config)
  wanted = resolve_world_size(config, len(devices))
  if wanted < 1 or wanted + rollout != len(devices):
    beside = f" and actor_rollout_ref.rollout.nnodes x n_gpus_per_node = {rollout} for the rollout" if rollout else ""
    raise ConfigError(
        "trainer.n_gpus_per_node", config.trainer.n_gpus_per_node,
        f"trainer.nnodes x trainer.n_gpus_per_node = {wanted} devices{beside}, but JAX sees {len(devices)}",
        "set trainer.n_gpus_per_node=auto (and trainer.nnodes=auto) to use every visible device"
        + (" the rollout does not take" if rollout else ""))
  return devices[:wanted], devices[wanted:]


def job_devices(config: ConfigDict, devices: Sequence[jax.Device] | None = None) -> list[jax.Device]:
  """The trainer's devices of `devices` (`split_devices`).

  Raises:
    ConfigError: the configured device counts differ from the devices given.
  """
  return split_devices(config, devices)[0]


def make_mesh(config: ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The job's mesh from `config` (see the module docstring for the keys).

  Raises:
    ConfigError: the configured device count differs from the devices JAX
      sees, or the axis sizes do not factor it.
  """
  devices = job_devices(config, devices)
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  return build_mesh(mesh_shape(config, len(devices), slices), devices)


def data_parallel_size(mesh: Mesh) -> int:
  """Devices that each hold different rows of a batch: data x fsdp x expert."""
  return mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]


def check_model_fits(mesh: Mesh, num_heads: int, num_kv_heads: int, key: str = _TENSOR_KEY,
                     num_experts: int = 0, expert_axes: Sequence[str] = ("expert",)) -> None:
  """Tensor parallelism splits attention heads: it must divide both head counts; the experts' axes
  (`expert_rule_axes`) the experts."""
  expert = math.prod(mesh.shape.get(axis, 1) for axis in expert_axes)
  if expert > 1 and (num_experts == 0 or num_experts % expert):
    what = "a dense model has no experts" if num_experts == 0 else f"it must divide num_experts ({num_experts})"
    raise ConfigError(EXPERT_KEY, expert, f"the expert axis splits experts, but {what}",
                                 f"set {EXPERT_KEY}=1" if num_experts == 0 else f"choose a divisor of {num_experts}")
  tensor = mesh.shape["tensor"]
  for what, count in (("num_key_value_heads", num_kv_heads), ("num_attention_heads", num_heads)):
    if count % tensor:
      raise ConfigError(
          key, tensor, f"the tensor axis must divide the model's {what} ({count})",
          f"choose a divisor of {count} for {key}")
