"""What the compiler says of one step: memory against HBM, flops, time, collectives, and the bound to meet.

Per device, from the compiled executable:

* memory: `memory_analysis()` (arguments, outputs, aliased buffers,
  temporaries); a step needs arguments + outputs - aliased + temporaries.
  A step that does not fit fails to compile (RESOURCE_EXHAUSTED); its
  requirement is read from the compiler's message.
* flops and the compiler's time estimate: `cost_analysis()`. XLA counts a
  loop body once (a scan over layers or micro-batches), so for scanned
  programs these are per-iteration figures and say nothing of a step's
  time; the time estimate of libtpu 0.0.42 is negative on v5e and v6e.
  Both are printed as given ("loop once").
* loop FLOPs: the matmul FLOPs of the HLO with loop iterations counted
  (`rljax.compile.hlo.loop_flops`).
* roofline time: from the loop FLOPs, the HBM traffic and the collective
  bytes at the chip's peak rates (`rljax.compile.topology.CHIPS`):

      roofline_seconds = max(loop_flops / peak_flops, hbm_traffic / hbm_bandwidth)
                         + collective_bytes / ici_bandwidth

  Compute and HBM traffic overlap (the larger counts); collectives are
  assumed NOT to overlap them (their time adds). Each term is at peak rate,
  so this is a lower bound on a step whose collectives run apart from its
  compute; a step that hid its collectives under compute entirely could
  take as little as the largest of the three terms. Collective bytes (all
  kinds, data-center-network sends included) are charged at the chip's
  whole ICI bandwidth, every link busy, which no single ring uses;
  elementwise work is not counted. The HBM term is `hbm_bytes`'s count,
  which charges a Pallas kernel its whole operands (it can exceed what the
  kernel reads). Nothing here is a measured time.
* collectives: bytes each device sends or receives, per kind, from the
  HLO, loop iterations counted (`rljax.compile.hlo`); "act-AR" is the part
  of the all-reduces whose arrays have no parameter's shape: activations
  (a gradient all-reduced whole has its parameter's shape).

* HBM traffic: what the program reads and writes in HBM, from the HLO
  (`rljax.compile.hlo.hbm_bytes`). The compiler's own "bytes accessed" also
  counts traffic to on-chip memory (XLA prefetches small weights there) and
  is printed beside it.

Bounds. An update's collectives are compared with the FSDP minimum
(`fsdp_minimum`); one decode step's HBM traffic with the device's
parameter shard plus its KV-cache shard (`decode_minimum`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any

import jax
import numpy as np

from rljax.compile import hlo, topology


@dataclasses.dataclass
class StepReport:
  """One compiled step, per device."""

  name: str
  hbm: int
  fits: bool = True
  arguments: int = 0
  outputs: int = 0
  aliased: int = 0
  temporaries: int = 0
  required: int = 0
  resident: int = 0
  flops: float | None = None
  seconds: float | None = None
  loop_flops: float | None = None
  roofline_seconds: float | None = None
  bytes_accessed: float | None = None
  hbm_traffic: float | None = None
  collectives: dict[str, int] = dataclasses.field(default_factory=dict)
  activation_all_reduce: int = 0
  cross_host: float | None = None
  bound: tuple[str, float] | None = None
  error: str | None = None
  compile_seconds: float = 0.0
  unknown_loops: int = 0

  @property
  def ratio(self) -> float | None:
    """Measured / bound: collective bytes of an update, bytes accessed of a decode step, what reaches the
    busiest host of the rollout's weight copy."""
    if self.bound is None or not self.bound[1]:
      return None
    measured = {"param+cache": self.hbm_traffic, "host share": self.cross_host}.get(
        self.bound[0], sum(self.collectives.values()))
    return None if measured is None else measured / self.bound[1]

  def with_resident(self, resident: int) -> "StepReport":
    """This report with `resident` bytes per device that stay allocated while the step runs (the trainer's
    state during a rollout step): they count towards the fit."""
    self.resident = resident
    self.fits = self.fits and self.required + resident <= self.hbm
    return self

  def as_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["ratio"] = self.ratio
    return out


_AMOUNT = r"([\d.]+)([GMK])"
_REQUIRED = (re.compile(r"Used " + _AMOUNT), re.compile(r"required[^(]*\(" + _AMOUNT))
_UNITS = {"G": 1 << 30, "M": 1 << 20, "K": 1 << 10}


def required_from_error(message: str) -> int | None:
  """The bytes a RESOURCE_EXHAUSTED compile error says the step needs (None when it says none).

  libtpu says either "Used 50.1G of 31.25G hbm" or "memory required for HLO
  temporaries (400.00G) exceeds available HBM".
  """
  for pattern in _REQUIRED:
    match = pattern.search(message)
    if match:
      return int(float(match.group(1)) * _UNITS[match.group(2)])
  return None


def parameter_shapes(params: Any) -> set[tuple[int, ...]]:
  """Every shape a parameter (or its gradient) can take on one device: each axis whole or split as its sharding
  splits it (a weight gathered over FSDP but split by tensor parallelism has one of these too), and a stacked
  parameter's per-layer slice (the gradient a scanned layer's loop body reduces)."""
  shapes = set()
  for leaf in jax.tree.leaves(params):
    whole = tuple(leaf.shape)
    split = tuple(leaf.sharding.shard_shape(whole)) if leaf.sharding is not None else whole
    for choice in itertools.product(*[{w, s} for w, s in zip(whole, split)]):
      shapes.add(choice)
      if len(choice) >= 2:  # a stacked vector's slice is a vector: no activation is one
        shapes.add(choice[1:])
  return shapes


def _gradient_block(dims: tuple[int, ...], shapes: set[tuple[int, ...]]) -> bool:
  """Whether `dims` is a block of an LM-head weight gradient as rljax.models.logprobs reduces it: [D, vocab
  block] or [D, parts, block] for a [V, D] weight with V > D (activations lead with their batch axis)."""
  return len(dims) >= 2 and any(
      len(s) == 2 and s[0] > s[1] == dims[0] and math.prod(dims[1:]) <= s[0] for s in shapes)


def activation_all_reduce(summary: hlo.CollectiveSummary, params: Any, smallest: int = 1 << 16) -> int:
  """Bytes of all-reduces whose arrays are no parameter's shape nor gradient block (activations), ignoring
  those under `smallest`."""
  shapes = parameter_shapes(params)
  squeeze = lambda dims: tuple(d for d in dims if d != 1)  # noqa: E731
  known = {squeeze(s) for s in shapes}
  total = 0
  for collective in summary.collectives:
    if collective.kind != "all-reduce" or collective.bytes < smallest:
      continue
    if any(squeeze(dims) not in known and math.prod(dims) > 1 and not _gradient_block(squeeze(dims), known)
           for dims in collective.arrays()):
      total += collective.total
  return total


def partition_hosts(args: Any) -> list[int]:
  """[partitions] the process (host) of each device of a program jitted on `args`, in its device assignment
  (that of its first sharded argument, as jit assigns devices)."""
  first = next(x.sharding for x in jax.tree.leaves(args) if getattr(x, "sharding", None) is not None)
  return [d.process_index for d in first._device_assignment]  # pylint: disable=protected-access


def roofline_seconds(flops: float, hbm_traffic: float, collective_bytes: float, chip: topology.Chip) -> float:
  """Seconds of a step at the chip's peak rates, collectives not overlapped (see the module docstring).

  Args:
    flops: FLOPs per device, loop iterations counted.
    hbm_traffic: HBM bytes read and written per device.
    collective_bytes: bytes each device sends or receives over the interconnect.
    chip: the chip's peak rates.
  """
  return max(flops / chip.peak_flops, hbm_traffic / chip.hbm_bandwidth) + collective_bytes / chip.ici_bandwidth


def from_compiled(name: str, compiled: Any, hbm: int, params: Any = None, args: Any = None,
                  chip: topology.Chip | None = None) -> StepReport:
  """A report of a compiled executable (`params`: the step's parameters, to tell activation all-reduces;
  `args`: its abstract arguments, to tell what crosses hosts; `chip`: its peak rates, for the roofline)."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, list):
    cost = cost[0] if cost else {}
  text = compiled.as_text()
  summary = hlo.collectives(text)
  required = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
              + memory.temp_size_in_bytes)
  flops, traffic = hlo.loop_flops(text), hlo.hbm_bytes(text)
  return StepReport(
      name=name, hbm=hbm, fits=required <= hbm, arguments=memory.argument_size_in_bytes,
      outputs=memory.output_size_in_bytes, aliased=memory.alias_size_in_bytes,
      temporaries=memory.temp_size_in_bytes, required=required, flops=cost.get("flops"),
      seconds=cost.get("optimal_seconds"), loop_flops=flops,
      roofline_seconds=None if chip is None else roofline_seconds(flops, traffic, sum(summary.by_kind.values()), chip),
      bytes_accessed=cost.get("bytes accessed"), hbm_traffic=traffic,
      collectives={k: v for k, v in summary.by_kind.items() if v},
      activation_all_reduce=0 if params is None else activation_all_reduce(summary, params),
      cross_host=None if args is None else _cross_host(summary, partition_hosts(args)),
      unknown_loops=len(set(summary.unknown_loops)))


def in_sequence(name: str, parts: list[tuple[StepReport, bool]], hbm: int) -> StepReport:
  """One report of programs that run one after the other, each with whether its output only feeds the next
  (freed once that has run; else kept until the last has run). Arguments not fed by a part stay allocated
  throughout; the peak is the largest of what is alive during each part. Flops, traffic, collectives and
  roofline seconds add up, and so does what reaches each part's busiest host."""
  reports = [r for r, _ in parts]
  failed = next((r for r in reports if r.error), None)
  if failed is not None:
    return StepReport(name=name, hbm=hbm, fits=False, required=failed.required, error=failed.error)
  fed = [False] + [feeds for _, feeds in parts[:-1]]
  arguments = sum(r.arguments for r, by_previous in zip(reports, fed) if not by_previous)
  kept = peak = carried = 0
  for (r, feeds) in parts:
    kept += 0 if feeds else r.outputs
    peak = max(peak, arguments + kept + carried + r.temporaries + (r.outputs if feeds else 0))
    carried = r.outputs if feeds else 0
  total = lambda field: sum(getattr(r, field) or 0 for r in reports)  # noqa: E731
  kinds = {k for r in reports for k in r.collectives}
  hosts_apart = [r.cross_host for r in reports]
  roofs = [r.roofline_seconds for r in reports]
  return StepReport(
      name=name, hbm=hbm, fits=peak <= hbm, arguments=arguments, outputs=kept, aliased=0,
      temporaries=peak - arguments - kept, required=peak, flops=total("flops"), seconds=total("seconds"),
      loop_flops=total("loop_flops"), roofline_seconds=None if None in roofs else sum(roofs),
      bytes_accessed=total("bytes_accessed"), hbm_traffic=total("hbm_traffic"),
      collectives={k: sum(r.collectives.get(k, 0) for r in reports) for k in kinds},
      activation_all_reduce=total("activation_all_reduce"),
      cross_host=None if any(c is None for c in hosts_apart) else sum(hosts_apart),
      unknown_loops=total("unknown_loops"))


def _cross_host(summary: hlo.CollectiveSummary, hosts: list[int]) -> float | None:
  """What reaches the busiest host from others per run (None on one host, or when a group is unreadable)."""
  return hlo.cross_host_bytes(summary, hosts) if len(set(hosts)) > 1 else None


def from_error(name: str, error: Exception, hbm: int) -> StepReport:
  """A report of a step the compiler refused (out of memory, or another error)."""
  message = str(error)
  required = required_from_error(message) if "RESOURCE_EXHAUSTED" in message else None
  first = next((line for line in message.splitlines() if line.strip()), message)[:300]
  return StepReport(name=name, hbm=hbm, fits=False, required=required or 0, error=first)


def sent_line(sent: tuple[int, int], devices: int, every: int, chip: Any, hosts: int = 1) -> str:
  """separate_async's weight transfer: (bytes of the weights, the most one of the rollout's `devices` receives)
  every `every` updates, to each of the rollout's `hosts` (each decodes with a copy of its own), and that share
  over the chip's ICI bandwidth (`chip`: its peak rates, or None)."""
  weights, per_device = sent
  at_peak = f", {per_device / chip.ici_bandwidth * 1e3:.1f} ms at its ICI bandwidth" if chip is not None else ""
  copies = f" ({hosts} hosts, a copy of {gib(weights)} GiB each)" if hosts > 1 else ""
  return (f"separate_async: every {every} update(s) the trainer sends {gib(weights * hosts)} GiB of weights to the "
          f"rollout's {devices} devices{copies}; each receives {gib(per_device)} GiB{at_peak} (a device-to-device "
          "copy at run time, not a compiled program: no compiler estimate)")


def shard_bytes(tree: Any, dtype: Any = None) -> int:
  """Bytes one device holds of `tree` (ShapeDtypeStructs or arrays with shardings), in `dtype` if given."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * np.dtype(dtype or leaf.dtype).itemsize
  return total


def _full_bytes(leaf: Any, dtype: Any) -> int:
  return math.prod(leaf.shape) * np.dtype(dtype or leaf.dtype).itemsize


def _shards(leaf: Any) -> int:
  """Devices a parameter is split over (1: replicated)."""
  if leaf.sharding is None:
    return 1
  return math.prod(leaf.shape) // max(1, math.prod(leaf.sharding.shard_shape(leaf.shape)))


def fsdp_minimum(gathered: Any, trainable: Any, micro_batches: int, compute_dtype: Any,
                 data_parallel: int = 1) -> float:
  """Interconnect bytes per device an FSDP update cannot avoid, counted as `hlo` counts them.

  Per micro-batch, for each parameter split over n devices: the passes
  all-gather it for the forward and again for the backward pass (2 x its
  full size in the compute dtype x (n - 1) / n), and a trained one's
  gradient is reduce-scattered ((n - 1) / n of its full size). With a
  `data` axis of d devices each gradient shard is then all-reduced across
  it (2 x shard x (d - 1) / d).

  Args:
    gathered: every parameter the passes read (trained and frozen).
    trainable: the parameters that get gradients.
    micro_batches: micro-batches per update.
    compute_dtype: the dtype of the passes.
    data_parallel: size of the mesh's `data` axis.
  """
  def moved(leaf):
    n = _shards(leaf)
    return _full_bytes(leaf, compute_dtype) * (n - 1) / n

  per_micro = sum(2 * moved(x) for x in jax.tree.leaves(gathered))
  per_micro += sum(moved(x) for x in jax.tree.leaves(trainable))
  if data_parallel > 1:
    per_micro += sum(2 * _full_bytes(x, compute_dtype) / _shards(x) * (data_parallel - 1) / data_parallel
                     for x in jax.tree.leaves(trainable))
  return float(micro_batches * per_micro)


def decode_minimum(params: Any, state: Any) -> float:
  """Bytes one decode step must read per device: its parameter shard and its KV-cache shard."""
  return float(shard_bytes(params) + shard_bytes((state.cache.k, state.cache.v)))


def gib(value: float | None) -> str:
  return "-" if value is None else f"{value / (1 << 30):.2f}"


def once_counted(reports: list[StepReport]) -> str | None:
  """A line naming the steps whose figures count one iteration of loops that run as the data says, or None."""
  steps = [f"{r.name} ({r.unknown_loops})" for r in reports if r.unknown_loops]
  if not steps:
    return None
  return (f"{', '.join(steps)}: TFLOP, roof s, traffic and collectives count one iteration of each loop whose "
          "trip count depends on the data (a mixture-of-experts chunk loop runs once unless a chip is routed more "
          "than its capacity, rljax.models.moe.capacity)")


def table(reports: list[StepReport]) -> str:
  """The reports as a text table (GiB per device: memory, HBM traffic, collective bytes by kind). `state` is
  what the trainer keeps on each device while a rollout step runs; `need` counts it. `TFLOP` and `roof s` count
  loop iterations (the roofline, see the module docstring); the compiler's `TFLOP (loop once)` and
  `est s (loop once)` count each loop body once."""
  header = ("step", "fits", "args", "temp", "state", "need", "HBM", "TFLOP", "roof s", "TFLOP (loop once)",
            "est s (loop once)", "traffic", "all-gath", "red-scat", "all-red", "act-AR", "all2all", "permute", "dcn",
            "x-host", "bound", "ratio")
  rows = [header]
  for r in reports:
    c = r.collectives
    rows.append((
        r.name, "yes" if r.fits else "NO", gib(r.arguments), gib(r.temporaries),
        gib(r.resident) if r.resident else "-", gib(r.required + r.resident), gib(r.hbm),
        "-" if r.loop_flops is None else f"{r.loop_flops / 1e12:.2f}",
        "-" if r.roofline_seconds is None else f"{r.roofline_seconds:.3g}",
        "-" if r.flops is None else f"{r.flops / 1e12:.2f}", "-" if r.seconds is None else f"{r.seconds:.3f}",
        gib(r.hbm_traffic), gib(c.get("all-gather")), gib(c.get("reduce-scatter")), gib(c.get("all-reduce")),
        gib(r.activation_all_reduce),
        gib(c.get("all-to-all")), gib(c.get("collective-permute")), gib(c.get("dcn")), gib(r.cross_host),
        "-" if r.bound is None else f"{r.bound[0]} {gib(r.bound[1])}",
        "-" if r.ratio is None else f"{r.ratio:.2f}"))
  widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
  lines = ["  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
           for row in rows]
  return "\n".join(lines)
