"""Cloud TPU slices as compile targets: names, devices and HBM, on any host.

`jax.experimental.topologies.get_topology_desc` describes the chips of a
TPU slice without one attached (it needs libtpu: the `tpu` extra); a mesh of
those devices compiles programs with the real TPU compiler. On a TPU VM the
same names can be checked against the devices JAX sees.

Names are the accelerator types `gcloud` takes (`v5p-8`, `v6e-8`,
`v5litepod-16` or `v5e-16`, `v4-8`: TensorCores for v4/v5p, chips for
v5e/v6e), or a generation and chip grid (`v5p:2x2x1`, `v5e:2x2`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

# generation -> (TensorCores per chip in the accelerator name, grid rank, HBM per JAX device in bytes,
#                chips per host of a multi-host slice)
_GiB = 1 << 30
GENERATIONS: dict[str, tuple[int, int, int, tuple[int, int, int]]] = {
    "v4": (2, 3, int(15.25 * _GiB), (2, 2, 1)),
    "v5p": (2, 3, int(95.74 * _GiB), (2, 2, 1)),
    "v5e": (1, 2, int(15.75 * _GiB), (2, 2, 1)),
    "v6e": (1, 2, int(31.25 * _GiB), (2, 2, 1)),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6litepod": "v6e"}


@dataclasses.dataclass(frozen=True)
class Chip:
  """Peak rates of one chip (one JAX device: a v5p or v4 chip's two TensorCores act as one).

  Attributes:
    peak_flops: bfloat16 matmul FLOP/s.
    hbm_bandwidth: HBM bytes/s.
    ici_bandwidth: inter-chip interconnect bytes/s one chip receives (or sends) over all its links: half the
      bidirectional figure Google gives.
  """

  peak_flops: float
  hbm_bandwidth: float
  ici_bandwidth: float


# Google's Cloud TPU system-architecture pages, "key specifications" per chip: peak compute (bf16), HBM
# bandwidth, bidirectional inter-chip interconnect (ICI) bandwidth.
#   v5e: https://docs.cloud.google.com/tpu/docs/v5e   197 TFLOP/s, 819 GB/s, 400 GB/s (earlier: "1600 Gbps")
#   v5p: https://docs.cloud.google.com/tpu/docs/v5p   459 TFLOP/s, 2765 GB/s, 1200 GB/s (earlier: "4800 Gbps")
#   v6e: https://docs.cloud.google.com/tpu/docs/v6e   918 TFLOP/s, 1638 GB/s, 800 GB/s
# v4's page gives no per-chip ICI bandwidth: no rates, no roofline.
CHIPS: dict[str, Chip] = {
    "v5e": Chip(peak_flops=197e12, hbm_bandwidth=819e9, ici_bandwidth=400e9 / 2),
    "v5p": Chip(peak_flops=459e12, hbm_bandwidth=2765e9, ici_bandwidth=1200e9 / 2),
    "v6e": Chip(peak_flops=918e12, hbm_bandwidth=1638e9, ici_bandwidth=800e9 / 2),
}
_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v5 lite": "v5e", "TPU v5e": "v5e",
                 "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def chip_of(device_kind: str) -> Chip | None:
  """The peak rates of a JAX device kind (`TPU v5 lite`); None for a kind without published rates here."""
  return CHIPS.get(_DEVICE_KINDS.get(device_kind, ""))


_GRIDS_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
             256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16)}
_GRIDS_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice (or several) to compile for.

  Attributes:
    name: as given (`v5p-8`).
    generation: v4, v5p, v5e or v6e.
    grid: chips along each axis of one slice.
    num_slices: slices joined over the data-center network.
    hbm_bytes: HBM of one JAX device.
  """

  name: str
  generation: str
  grid: tuple[int, ...]
  num_slices: int = 1

  @property
  def chips(self) -> int:
    return math.prod(self.grid) * self.num_slices

  @property
  def hbm_bytes(self) -> int:
    return GENERATIONS[self.generation][2]

  @property
  def chip(self) -> Chip | None:
    """Peak rates of one chip (None for v4)."""
    return CHIPS.get(self.generation)

  @property
  def topology_name(self) -> str:
    return f"{self.generation}:{'x'.join(map(str, self.grid))}"

  @property
  def accelerator_type(self) -> str:
    cores = GENERATIONS[self.generation][0]
    prefix = "v5litepod" if self.generation == "v5e" else self.generation
    return f"{prefix}-{math.prod(self.grid) * cores}"

  @property
  def host_bounds(self) -> tuple[int, int, int]:
    """Chips per host: a whole single-host slice (up to 8 chips of v5e/v6e, 4 of v4/v5p), else the usual 2x2x1."""
    chips = math.prod(self.grid)
    grid3 = tuple(self.grid) + (1,) * (3 - len(self.grid))
    if GENERATIONS[self.generation][1] == 2 and chips <= 8 or chips <= 4:
      return grid3
    return GENERATIONS[self.generation][3]


def one_host(topology: Topology) -> Topology:
  """The single-host slice of one host of `topology` (itself when it has one host): `v5e:2x2` for v5e-16."""
  grid = topology.host_bounds[:len(topology.grid)]
  return Topology(name=f"{topology.generation}:{'x'.join(map(str, grid))}", generation=topology.generation,
                  grid=grid)


def sub_slice(topology: Topology, chips: int) -> Topology:
  """The slice of `chips` chips of `topology`'s generation: separate_async's trainer or rollout side, compiled on a
  slice of its own (libtpu compiles a program for a whole slice, not for some of a slice's chips).

  Raises:
    ValueError: no slice of that generation has `chips` chips.
  """
  table = _GRIDS_3D if GENERATIONS[topology.generation][1] == 3 else _GRIDS_2D
  if chips not in table:
    raise ValueError(f"{chips} chips of {topology.name}: separate_async compiles each side as a "
                     f"{topology.generation} slice of its own, of {', '.join(map(str, table))} chips (set "
                     "actor_rollout_ref.rollout.nnodes x n_gpus_per_node and the trainer's devices to such sizes)")
  grid = table[chips]
  return Topology(name=f"{topology.generation}:{'x'.join(map(str, grid))}", generation=topology.generation, grid=grid)


def parse(name: str, num_slices: int = 1) -> Topology:
  """A Topology from `v5p-8`, `v5litepod-16`, `v6e-8` or `v5p:2x2x1`.

  Raises:
    ValueError: naming the accepted forms.
  """
  text = name.strip().lower()
  grid_form = re.fullmatch(r"(v\d+[a-z]*):(\d+(?:x\d+)*)", text)
  count_form = re.fullmatch(r"(v\d+[a-z]*?)(?:litepod|lite)?-(\d+)", text)
  generation = (grid_form or count_form).group(1) if (grid_form or count_form) else None
  if text.startswith(("v5litepod", "v5lite")):
    generation = "v5e"
  generation = _ALIASES.get(generation, generation)
  if generation not in GENERATIONS:
    raise ValueError(f"--topology={name!r}: expected an accelerator type such as v5p-8, v6e-8, v5litepod-16, "
                     f"v4-8, or a grid such as v5p:2x2x1 ({', '.join(GENERATIONS)})")
  cores, rank, _, _ = GENERATIONS[generation]
  if grid_form:
    grid = tuple(int(d) for d in grid_form.group(2).split("x"))
    if len(grid) != rank:
      raise ValueError(f"--topology={name!r}: {generation} slices have a {rank}-axis chip grid")
  else:
    count = int(count_form.group(2))
    chips, rest = divmod(count, cores)
    table = _GRIDS_3D if rank == 3 else _GRIDS_2D
    if rest or chips not in table:
      raise ValueError(f"--topology={name!r}: no {generation} slice of {count} "
                       f"{'TensorCores' if cores > 1 else 'chips'}; sizes: "
                       f"{', '.join(f'{generation}-{c * cores}' for c in table)}")
    grid = table[chips]
  if num_slices < 1:
    raise ValueError(f"--num_slices={num_slices}: must be at least 1")
  return Topology(name=name, generation=generation, grid=grid, num_slices=num_slices)


def devices(topology: Topology) -> list:
  """The JAX devices of `topology` (abstract TPU devices; compile with them, run nothing)."""
  os.environ["TPU_ACCELERATOR_TYPE"] = topology.accelerator_type
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # Compiling touches no chip: let several processes load libtpu (its lock file is for processes that
  # drive the TPU of a VM).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  desc = topologies.get_topology_desc(
      platform="tpu", topology_name=topology.topology_name, chip_config_name="default",
      chips_per_host_bounds=topology.host_bounds, num_slices=topology.num_slices)
  return list(desc.devices)
