"""Collectives of a compiled XLA program, read from its HLO text.

`jax.stages.Compiled.as_text()` is the per-device program after SPMD
partitioning. This module parses it into computations and instructions and
adds up the bytes each kind of collective moves, walking the call graph from
the entry computation so that an instruction inside a loop counts once per
iteration (a `lax.scan` over layers or micro-batches becomes a `while` whose
condition compares the counter with a constant: that constant is the trip
count; where the comparison is hidden in a fusion, as XLA's CPU backend
writes it, the `known_trip_count` the compiler wrote on the loop).

Bytes of a collective are what one device sends or receives over the
interconnect, for a group of n devices: an all-gather receives the other
n - 1 shards (its operand's size each), a reduce-scatter and an all-to-all
move (n - 1) / n of their input, a ring all-reduce twice that, a
collective-permute its operand. TPU programs implement some reduce-scatters
as an all-reduce inside a fusion whose computation is named
`all-reduce-scatter...` (the all-reduce of a padded input, then each
device's slice); those count as reduce-scatters. Across TPU slices
(multislice) a collective's data-center-network part is a `send` to the
megascale runtime: `dcn` counts the bytes each device sends that way. One collective split over
several fusions (TPU's asynchronous collective fusions) shares a
channel_id and replica groups and counts once; collectives that share a
channel_id over other groups (a `psum_scatter` per device subgroup) or in
another loop (a rematerialised layer's gather, cloned into the backward
loop) each count.

On a slice of several hosts (`cross_host_bytes`), each collective's replica
groups, mapped through the program's device assignment to the devices'
processes, say what must arrive at a host's chips from other hosts' chips,
the least any algorithm moves (a host's chips first reduce or share among
themselves): an all-gather brings each shard held elsewhere in once, a
reduce-scatter one partial sum of each of the host's output shards from
every other host of the group, an all-reduce both, an all-to-all each
remote chip's block for each of the host's chips, a collective-permute the
pairs whose ends lie on different hosts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Callable, Sequence

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute", "dcn")

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
    "c64": 8, "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_ARRAY_LAYOUT = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"\b(calls|body|condition|to_apply|branch_computations|async_execution_thread)=\{?%?([\w.\-, %]+)\}?")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_KNOWN_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass
class Instruction:
  """One HLO instruction: `name = shape opcode(operands), attributes`."""

  name: str
  shape: str
  opcode: str
  operands: list[str]
  attributes: str
  arguments: str = ""

  @property
  def bytes(self) -> int:
    """Bytes of the result (every array of a tuple result)."""
    return shape_bytes(self.shape)

  @property
  def op_name(self) -> str:
    """The JAX source operation in the metadata (empty when absent)."""
    match = _OP_NAME.search(self.attributes)
    return match.group(1) if match else ""

  def called(self) -> list[str]:
    """Names of the computations this instruction calls (fusion, while, call, async, ...)."""
    names = []
    for match in _CALLED.finditer(self.attributes):
      if match.group(1) == "async_execution_thread":
        continue
      names += [n.strip().lstrip("%") for n in match.group(2).split(",") if n.strip()]
    return names


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  is_entry: bool = False
  _table: dict[str, Instruction] | None = dataclasses.field(default=None, repr=False, compare=False)

  def by_name(self) -> dict[str, Instruction]:
    """name -> instruction (built once)."""
    if self._table is None:
      self._table = {i.name: i for i in self.instructions}
    return self._table


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape string: `bf16[4,8]{1,0}` or a tuple `(f32[2], s32[])`."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape):
    if dtype not in _DTYPE_BYTES:
      continue
    total += _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return int(total)


def hbm_shape_bytes(shape: str) -> int:
  """Bytes of the arrays of an HLO shape that live in HBM (not in an alternate memory space, `S(n)` with n > 0)."""
  total = 0.0
  for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape):
    if dtype not in _DTYPE_BYTES or re.search(r"S\([1-9]\d*\)", layout or ""):
      continue
    total += _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return int(total)


def _split_operands(text: str) -> tuple[list[str], str, str]:
  """`%a, %b), attrs` -> (['a', 'b'], 'attrs', '%a, %b'): operands up to the matching parenthesis."""
  depth, end = 1, len(text)
  for i, ch in enumerate(text):
    if ch in "({[":
      depth += 1
    elif ch in ")}]":
      depth -= 1
      if depth == 0:
        end = i
        break
  names = re.findall(r"%([\w.\-]+)", text[:end])
  return names, text[end + 1:], text[:end]


def parse(text: str) -> dict[str, Computation]:
  """Computations of an HLO module's text, by name."""
  computations: dict[str, Computation] = {}
  current: Computation | None = None
  for line in text.splitlines():
    if current is None:
      header = _HEADER.match(line)
      if header:
        current = Computation(header.group(2), [], is_entry=bool(header.group(1)))
      continue
    if line.strip() == "}":
      computations[current.name] = current
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if match:
      operands, attributes, arguments = _split_operands(match.group(5))
      current.instructions.append(
          Instruction(match.group(2), match.group(3), match.group(4), operands, attributes, arguments))
  return computations


def _int_constant(computation: Computation, name: str) -> int | None:
  inst = computation.by_name().get(name)
  if inst is not None and inst.opcode == "constant" and re.fullmatch(r"-?\d+", inst.arguments.strip()):
    return int(inst.arguments)
  return None


def _tuple_index(inst: Instruction) -> int | None:
  match = re.search(r"index=(\d+)", inst.attributes)
  return int(match.group(1)) if match else None


def _counter(condition: Computation) -> tuple[Instruction, int] | None:
  """(the counter's get-tuple-element, the limit) of a condition `counter < constant`."""
  table = condition.by_name()
  for inst in condition.instructions:
    if inst.opcode != "compare" or "direction=LT" not in inst.attributes or len(inst.operands) != 2:
      continue
    limit = _int_constant(condition, inst.operands[1])
    counter = table.get(inst.operands[0])
    if limit is not None and counter is not None:
      return counter, limit
  return None


def trip_count(condition: Computation, body: Computation | None = None, init: int = 0) -> int | None:
  """Iterations of a `while` whose condition is `counter < constant` (JAX's scans and fori_loops).

  The counter's step is read from the body (`counter + constant`: XLA may
  unroll a loop and step by 2); it starts at `init`.
  """
  found = _counter(condition)
  if found is None:
    return None
  counter, limit = found
  step = 1
  index = _tuple_index(counter) if counter.opcode == "get-tuple-element" else None
  if body is not None and index is not None and body.instructions:
    root = body.instructions[-1]
    update = body.by_name().get(root.operands[index]) if root.opcode == "tuple" and index < len(root.operands) else None
    if update is not None and update.opcode == "add":
      step = next((v for v in (_int_constant(body, o) for o in update.operands) if v), 1)
  return max(0, -(-(limit - init) // step))


def _loop_start(loop: Instruction, computation: Computation, condition: Computation) -> int:
  """The counter's value when the loop starts: the matching element of its init tuple, if a constant (else 0)."""
  found = _counter(condition)
  init = computation.by_name().get(loop.operands[0]) if loop.operands else None
  if found is None or init is None or init.opcode != "tuple":
    return 0
  index = _tuple_index(found[0]) if found[0].opcode == "get-tuple-element" else None
  if index is None or index >= len(init.operands):
    return 0
  return _int_constant(computation, init.operands[index]) or 0


def _loop(inst: Instruction, computation: Computation,
          computations: dict[str, Computation]) -> tuple[str | None, int | None]:
  """(body computation, iterations or None when unknown) of a `while` instruction."""
  body = re.search(r"body=%?([\w.\-]+)", inst.attributes)
  cond = re.search(r"condition=%?([\w.\-]+)", inst.attributes)
  condition = computations.get(cond.group(1)) if cond else None
  trips = None if condition is None else trip_count(
      condition, computations.get(body.group(1)) if body else None, _loop_start(inst, computation, condition))
  if trips is None:
    known = _KNOWN_TRIPS.search(inst.attributes)
    trips = int(known.group(1)) if known else None
  return (body.group(1) if body else None), trips


# what one instruction contributes to a reading of the program: (instruction, its computation, how many times one
# run of the program executes it, the enclosing loop bodies "/"-joined) -> a number
Own = Callable[[Instruction, Computation, int, str], float]


def fold(text_or_computations: str | dict[str, Computation], own: Own, enters: Callable[[Instruction], bool]) -> float:
  """The one walk of a compiled program's call graph, from its entry, with loop trip counts: the sum of `own` over
  every instruction it reaches.

  A `while` enters its body, run its trip count times the loop (once when the
  count is not read); a `conditional` enters every branch and counts the
  costliest; any other instruction enters the computations it calls where
  `enters(instruction)` (a fusion's body, a call, an async computation...).
  The collective, HBM-traffic and FLOP readers are this walk with their own
  `own` and `enters`.
  """
  computations = (parse(text_or_computations) if isinstance(text_or_computations, str)
                  else text_or_computations)
  entry = next((c.name for c in computations.values() if c.is_entry), None)
  return _fold(computations, entry, own, enters, 1, (), "") if entry else 0.0


def _fold(computations: dict[str, Computation], name: str, own: Own, enters: Callable[[Instruction], bool],
          count: int, seen: tuple[str, ...], loops: str) -> float:
  """`fold` from computation `name`, which one run executes `count` times inside `loops`."""
  computation = computations.get(name)
  if computation is None or name in seen:
    return 0.0
  seen = seen + (name,)
  total = 0.0
  for inst in computation.instructions:
    total += own(inst, computation, count, loops)
    if inst.opcode == "while":
      body, trips = _loop(inst, computation, computations)
      if body:
        total += _fold(computations, body, own, enters, count * (1 if trips is None else trips), seen,
                       f"{loops}/{body}")
    elif inst.opcode == "conditional":  # one branch runs: the costliest
      total += max([_fold(computations, c, own, enters, count, seen, loops) for c in inst.called()], default=0.0)
    elif enters(inst):
      total += sum(_fold(computations, c, own, enters, count, seen, loops) for c in inst.called())
  return total


@dataclasses.dataclass
class Collective:
  """A collective instruction and how many times one run of the program executes it (bytes: per device, each)."""

  kind: str
  bytes: int
  count: int
  op_name: str
  shape: str
  channel: str = ""
  groups: list[list[int]] | None = None
  unit: int = 0

  @property
  def total(self) -> int:
    return self.bytes * self.count

  def arrays(self) -> list[tuple[int, ...]]:
    """The dimensions of each array the collective works on."""
    return [tuple(int(d) for d in dims.split(",") if d) for _, dims in _ARRAY.findall(self.shape)]


def _kind(inst: Instruction, computation: Computation) -> str | None:
  """The collective kind of an instruction (None for other instructions and for async halves not counted)."""
  op = inst.opcode
  if op in ("all-gather", "all-gather-done"):
    return "all-gather"
  if op in ("reduce-scatter", "reduce-scatter-done"):
    return "reduce-scatter"
  if op in ("all-reduce", "all-reduce-start"):
    return "reduce-scatter" if computation.name.startswith("all-reduce-scatter") else "all-reduce"
  if op in ("all-to-all", "ragged-all-to-all"):
    return "all-to-all"
  if op in ("collective-permute", "collective-permute-done"):
    return "collective-permute"
  if op == "send" and "xla_megascale" in inst.attributes:
    return "dcn"
  return None


def group_size(attributes: str) -> int:
  """Devices in one replica group of a collective (1 when the groups are not spelled in a known form)."""
  mesh = _MESH_GROUPS.search(attributes)
  if mesh:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", mesh.group(3)) if a in sizes)
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
  if iota:
    return int(iota.group(2))
  listed = re.search(r"replica_groups=\{\{([\d,]*)\}", attributes)
  if listed:
    return len([x for x in listed.group(1).split(",") if x])
  return 1


_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((.*?)\))?\s*\{([^}]*)\}")


def _device_ids(text: str | None, count: int) -> np.ndarray | None:
  """[count] the device at each position of a mesh-form group's mesh: in order, or as its `device_ids`
  (`[4,4]T(1,0)`: an iota reshaped and transposed, or listed ids); None for a form not known here."""
  if not text:
    return np.arange(count)
  iota = re.fullmatch(r"\s*\[([\d,]+)\](?:T\(([\d,]+)\))?\s*", text)
  if iota:
    ids = np.arange(count).reshape([int(d) for d in iota.group(1).split(",")])
    return (ids.transpose([int(d) for d in iota.group(2).split(",")]) if iota.group(2) else ids).reshape(-1)
  listed = re.fullmatch(r"\s*\{?([\d,\s]+)\}?\s*", text)
  return np.array([int(x) for x in listed.group(1).split(",") if x.strip()]) if listed else None


def replica_groups(attributes: str) -> list[list[int]] | None:
  """The partitions of each group of a collective (`source_target_pairs` for a collective-permute), in the
  mesh, iota or listed forms of HLO text; None for a form not known here."""
  mesh = _MESH_GROUPS.search(attributes)
  if mesh:
    axes = re.findall(r"'(\w+)'=(\d+)", mesh.group(1))
    names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
    grouped = [names.index(a) for a in re.findall(r"'(\w+)'", mesh.group(3)) if a in names]
    ids = _device_ids(mesh.group(2), math.prod(sizes))
    if ids is None:
      return None
    ids = ids.reshape(sizes)
    kept = [i for i in range(len(sizes)) if i not in grouped]
    return ids.transpose(kept + grouped).reshape(-1, math.prod(sizes[i] for i in grouped) or 1).tolist()
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes)
  if iota:
    dims = [int(d) for d in iota.group(3).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(4):
      ids = ids.transpose([int(d) for d in iota.group(4).split(",")])
    return ids.reshape(int(iota.group(1)), int(iota.group(2))).tolist()
  listed = re.search(r"(?:replica_groups|source_target_pairs)=\{((?:\{[\d,]*\},?)*)\}", attributes)
  if listed:
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", listed.group(1))]
  return None


def _operand_bytes(inst: Instruction, computation: Computation) -> int | None:
  """Bytes of the collective's input (for an async `-done`, the input of its `-start`)."""
  table = computation.by_name()
  source = table.get(inst.operands[0]) if inst.operands else None
  if source is not None and inst.opcode.endswith("-done") and source.opcode.endswith("-start"):
    source = table.get(source.operands[0]) if source.operands else None
  return source.bytes if source is not None else None


def _start(inst: Instruction, computation: Computation) -> Instruction:
  """The `-start` half of an asynchronous `-done` (which carries the groups); else `inst`."""
  source = computation.by_name().get(inst.operands[0]) if inst.operands and inst.opcode.endswith("-done") else None
  return source if source is not None and source.opcode.endswith("-start") else inst


def _unit_bytes(kind: str, inst: Instruction, computation: Computation) -> int:
  """The per-device block a collective works in: an all-gather's or collective-permute's operand, a
  reduce-scatter's output, an all-reduce's or all-to-all's whole array."""
  if kind in ("all-gather", "collective-permute", "dcn"):
    return _operand_bytes(inst, computation) or inst.bytes
  if kind == "reduce-scatter" and not inst.opcode.startswith("reduce-scatter"):
    return inst.bytes // max(group_size(inst.attributes), 1)
  return inst.bytes


def _collective_bytes(kind: str, inst: Instruction, computation: Computation) -> int:
  """What one device sends or receives for one execution of `inst` (see the module docstring)."""
  if kind in ("collective-permute", "dcn"):
    return _operand_bytes(inst, computation) or inst.bytes
  n = group_size(inst.attributes)
  if n <= 1:
    return 0
  if kind == "all-gather":
    operand = _operand_bytes(inst, computation)
    return operand * (n - 1) if operand is not None else inst.bytes * (n - 1) // n
  if kind == "reduce-scatter":
    size = _operand_bytes(inst, computation) if inst.opcode.startswith("reduce-scatter") else inst.bytes
    return (size or inst.bytes) * (n - 1) // n
  if kind == "all-reduce":
    return 2 * inst.bytes * (n - 1) // n
  return inst.bytes * (n - 1) // n


@dataclasses.dataclass
class CollectiveSummary:
  """Bytes moved per device by each collective kind in one run of a program."""

  by_kind: dict[str, int]
  collectives: list[Collective]
  unknown_loops: list[str]

  def largest(self, kind: str, top: int = 5) -> list[Collective]:
    return sorted((c for c in self.collectives if c.kind == kind), key=lambda c: -c.total)[:top]


def collectives(text: str) -> CollectiveSummary:
  """Collectives of a compiled program's HLO text, loop iterations counted (every branch of a conditional), each
  channel once."""
  computations = parse(text)
  unknown: list[str] = []
  found, channels = [], set()

  def own(inst: Instruction, computation: Computation, count: int, loops: str) -> float:
    if inst.opcode == "while" and _loop(inst, computation, computations)[1] is None:
      unknown.append(inst.name)
    kind = _kind(inst, computation)
    if kind is None:
      return 0.0
    channel = re.search(r"channel_id=(\d+)", inst.attributes)
    groups = re.search(r"replica_groups=(mesh\[[^\]]*\]\s*\{[^}]*\}|\S+)", inst.attributes)
    key = f"{loops} {channel.group(1)} {groups.group(1) if groups else ''}" if channel else ""
    if key and key in channels:
      return 0.0
    channels.add(key)
    found.append(Collective(kind, _collective_bytes(kind, inst, computation), count, inst.op_name, inst.shape, key,
                            replica_groups(_start(inst, computation).attributes),
                            _unit_bytes(kind, inst, computation)))
    return 0.0

  fold(computations, own, enters=lambda inst: True)
  by_kind = {k: 0 for k in KINDS}
  for c in found:
    by_kind[c.kind] += c.total
  return CollectiveSummary(by_kind, found, unknown)


def _arriving(kind: str, unit: int, group: Sequence[int], hosts: np.ndarray) -> np.ndarray:
  """[hosts] bytes one execution of a collective over `group` (partitions) must bring to each host's chips
  from other hosts' (see the module docstring); `hosts[p]` is partition p's host."""
  out = np.zeros(hosts.max() + 1)
  if kind == "collective-permute":
    source, target = group
    if hosts[source] != hosts[target]:
      out[hosts[target]] += unit
    return out
  members = np.bincount(hosts[list(group)], minlength=len(out))
  n, spanned = len(group), int((members > 0).sum())
  here = members[members > 0]
  if kind == "all-gather":
    out[members > 0] = (n - here) * unit
  elif kind == "reduce-scatter":
    out[members > 0] = (spanned - 1) * here * unit
  elif kind == "all-reduce":
    out[members > 0] = ((spanned - 1) * here + n - here) * unit / n
  elif kind == "all-to-all":
    out[members > 0] = here * (n - here) * unit / n
  elif kind == "dcn":
    out[members > 0] = here * unit
  return out


def cross_host_bytes(summary: CollectiveSummary, hosts: Sequence[int]) -> float | None:
  """Bytes the busiest host's chips receive from other hosts' chips in one run of the program.

  Args:
    summary: the program's collectives.
    hosts: [partitions] the host (process index) of each partition, in the program's device assignment.

  Returns:
    None when a collective's groups are in a form `replica_groups` does not read.
  """
  hosts = np.asarray(hosts)
  total = np.zeros(hosts.max() + 1)
  for c in summary.collectives:
    if c.kind == "dcn":
      total += _arriving("dcn", c.unit, range(len(hosts)), hosts) * c.count
      continue
    if c.groups is None:
      return None
    for group in c.groups:
      if len(group) > 1:
        total += _arriving(c.kind, c.unit, group, hosts) * c.count
  return float(total.max())


_NO_TRAFFIC = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call", "conditional",
               "after-all", "partition-id", "replica-id", "iota"}


# Updates of a buffer in place: a dynamic-update-slice (operand, update, offsets...) and a scatter (operands...,
# indices, updates...) read and write their updates, not the buffer they update.
_IN_PLACE = ("dynamic-update-slice", "scatter")


def _updated(inst: Instruction) -> list[str]:
  """The buffers an in-place update `inst` writes into."""
  return inst.operands[:1] if inst.opcode == "dynamic-update-slice" else inst.operands[:(len(inst.operands) - 1) // 2]


def _updates(inst: Instruction) -> list[str]:
  """What an in-place update `inst` writes."""
  return inst.operands[1:2] if inst.opcode == "dynamic-update-slice" else inst.operands[(len(inst.operands) + 1) // 2:]


def _updates_a_parameter(root: Instruction, fused: Computation) -> bool:
  """Whether a fusion's `root` updates buffers the fusion takes (in place) rather than ones it builds (a
  scatter into fused zeros writes its whole output)."""
  inner = fused.by_name()
  return root.opcode in _IN_PLACE and all(
      u in inner and inner[u].opcode == "parameter" for u in _updated(root))


def _read_bytes(fused: Computation, index: int, full: int, computations: dict[str, Computation]) -> int:
  """Bytes a fusion reads of its operand `index`: what its slices and gathers take when that is all it does
  with it (through nested fusions too); nothing for a buffer it updates in place; else the whole operand."""
  param = next((i for i in fused.instructions if i.opcode == "parameter" and i.arguments.strip() == str(index)), None)
  if param is None:
    return full
  taken = 0
  for user in (i for i in fused.instructions if param.name in i.operands):
    if user.opcode in ("slice", "dynamic-slice", "gather"):
      taken += hbm_shape_bytes(user.shape)
    elif user.opcode in _IN_PLACE and param.name in _updated(user):
      continue
    elif user.opcode == "fusion" and user.called() and user.called()[0] in computations:
      taken += _read_bytes(computations[user.called()[0]], user.operands.index(param.name), full, computations)
    else:
      return full
  return min(taken, full)


def _traffic(computations: dict[str, Computation], inst: Instruction, computation: Computation, count: int,
             loops: str = "") -> float:
  """HBM bytes `inst` reads and writes, `count` times (`hbm_bytes`' rules; loops, calls and conditionals move
  nothing themselves: the walk enters them)."""
  del loops
  if inst.opcode in _NO_TRAFFIC or inst.opcode.endswith("-done"):
    return 0.0
  table = computation.by_name()
  if inst.opcode in _IN_PLACE:
    return count * 2 * sum(hbm_shape_bytes(table[u].shape) for u in _updates(inst) if u in table)
  if inst.opcode == "slice-start":  # an asynchronous slice reads its slice, not the whole operand
    source = table.get(inst.operands[0]) if inst.operands else None
    return count * max(0, shape_bytes(inst.shape) - (shape_bytes(source.shape) if source is not None else 0))
  if inst.opcode in ("slice", "dynamic-slice", "gather"):  # reads what it takes, writes it
    return count * 2 * hbm_shape_bytes(inst.shape)
  fused = computations.get(inst.called()[0]) if inst.opcode == "fusion" and inst.called() else None
  reads = 0
  for index, operand in enumerate(inst.operands):
    source = table.get(operand)
    if source is None:
      continue
    full = hbm_shape_bytes(source.shape)
    reads += _read_bytes(fused, index, full, computations) if fused is not None else full
  writes = 0 if inst.opcode.endswith("-start") else hbm_shape_bytes(inst.shape)  # a -start's tuple aliases
  if fused is not None and fused.instructions and _updates_a_parameter(fused.instructions[-1], fused):
    inner = fused.by_name()
    writes = sum(hbm_shape_bytes(inner[u].shape) for u in _updates(fused.instructions[-1]) if u in inner)
  return count * (reads + writes)


def hbm_bytes(text: str) -> float:
  """HBM bytes one run of a compiled program reads and writes, per device, loop iterations counted.

  Every instruction outside fusions reads its operands and writes its
  result, except what lives in an alternate memory space (`S(1)`: XLA's
  prefetches into on-chip memory count once, as the copy that reads HBM);
  a fusion reads only the slices it takes of an operand, and an update in
  place writes only the update; a `conditional` counts its costliest
  branch. A bound on what the program moves (a Pallas
  kernel is charged its whole operands, however few blocks it reads), not
  a simulation.
  """
  computations = parse(text)
  return fold(computations, functools.partial(_traffic, computations), enters=lambda inst: inst.opcode == "call")



_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+_\w+->\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DECLARED_FLOPS = re.compile(r'cost_estimate\\?"\s*:\s*\{\s*\\?"flops\\?"\s*:\s*\\?"?(\d+)')


def _array_dims(shape: str) -> tuple[int, ...] | None:
  """Dimensions of a one-array HLO shape (`bf16[4,8]{1,0}` -> (4, 8)); None for a tuple or no array."""
  arrays = _ARRAY.findall(shape)
  if len(arrays) != 1:
    return None
  return tuple(int(d) for d in arrays[0][1].split(",") if d)


def _operand_dims(inst: Instruction, index: int, table: dict[str, Instruction]) -> tuple[int, ...] | None:
  """Dimensions of operand `index`: from the instruction that makes it, else the shape written beside it."""
  source = table.get(inst.operands[index]) if index < len(inst.operands) else None
  if source is not None:
    return _array_dims(source.shape)
  written = _ARRAY.findall(inst.arguments)
  if len(written) != len(inst.operands) or index >= len(written):
    return None
  return tuple(int(d) for d in written[index][1].split(",") if d)


def dot_flops(output: Sequence[int], lhs: Sequence[int], contracting: Sequence[int]) -> int:
  """FLOPs of a `dot`: 2 (a multiply and an add) x output elements x contracted elements.

  Args:
    output: the result's dimensions (batch dimensions included).
    lhs: the left operand's dimensions.
    contracting: the left operand's contracted dimensions (indices into `lhs`).
  """
  return 2 * math.prod(output) * math.prod(lhs[d] for d in contracting)


def valid_taps(input_size: int, output_size: int, kernel_size: int, stride: int = 1, pad_low: int = 0,
               lhs_dilation: int = 1, rhs_dilation: int = 1) -> int:
  """(output position, kernel position) pairs of one spatial dimension of a convolution that read an input
  element rather than padding or a hole the input's dilation leaves (what XLA's own cost analysis counts)."""
  last = (input_size - 1) * lhs_dilation
  count = 0
  for k in range(kernel_size):
    offset = k * rhs_dilation - pad_low  # input position of output position 0
    if lhs_dilation == 1:
      count += max(0, min(output_size - 1, (last - offset) // stride) - max(0, -(offset // stride)) + 1)
    else:
      count += sum(1 for o in range(output_size)
                   if 0 <= o * stride + offset <= last and (o * stride + offset) % lhs_dilation == 0)
  return count


def _window_fields(window: str, spatial: int) -> list[dict[str, int]]:
  """Per spatial dimension, the `valid_taps` keywords of a convolution's `window={size=1x8 pad=0_0x7_7 ...}`."""
  fields = dict(re.findall(r"(\w+)=(\S+)", window))
  per_dim = [{} for _ in range(spatial)]
  for key, name in (("stride", "stride"), ("lhs_dilate", "lhs_dilation"), ("rhs_dilate", "rhs_dilation")):
    for dim, value in enumerate(fields[key].split("x") if key in fields else []):
      per_dim[dim][name] = int(value)
  for dim, value in enumerate(fields["pad"].split("x") if "pad" in fields else []):
    per_dim[dim]["pad_low"] = int(value.split("_")[0])
  return per_dim


def convolution_flops(lhs: Sequence[int], kernel: Sequence[int], output: Sequence[int], dim_labels: str,
                      window: str = "") -> int:
  """FLOPs of a `convolution`: 2 x output batch x output features x the kernel's input features x, over the
  spatial dimensions, the product of their `valid_taps`.

  libtpu writes matmuls as convolutions, some with a spatial dimension that
  only selects (`btd,dnh->btnh` as a window of 8 heads over an input of 1,
  padded 7 each side: each output head reads one tap); taps that fall on
  padding are not counted.

  Args:
    lhs: the input's dimensions.
    kernel: the kernel's dimensions.
    output: the result's dimensions.
    dim_labels: as HLO writes them, `0bf1_i1o0->0b1f` (b batch, f feature, i/o kernel input/output
      features, digits spatial dimensions).
    window: the text inside `window={...}` (`size=1x8 pad=0_0x7_7 rhs_reversal=0x1`); empty for none.
  """
  lhs_labels, rest = dim_labels.split("_", 1)
  kernel_labels, out_labels = rest.split("->")
  spatial = sorted(c for c in out_labels if c.isdigit())
  fields = _window_fields(window, len(spatial))
  taps = math.prod(
      valid_taps(lhs[lhs_labels.index(d)], output[out_labels.index(d)], kernel[kernel_labels.index(d)], **fields[i])
      for i, d in enumerate(spatial))
  return 2 * output[out_labels.index("b")] * output[out_labels.index("f")] * kernel[kernel_labels.index("i")] * taps


def instruction_flops(inst: Instruction, table: dict[str, Instruction]) -> int:
  """Matmul FLOPs of one instruction, not counting the computations it calls: a `dot`'s, a
  `convolution`'s, or what a Pallas kernel (`custom-call`) declares in its `cost_estimate`; 0 for others."""
  output = _array_dims(inst.shape)
  if inst.opcode == "dot":
    lhs = _operand_dims(inst, 0, table)
    contracting = _LHS_CONTRACTING.search(inst.attributes)
    if output is None or lhs is None or contracting is None:
      return 0
    return dot_flops(output, lhs, [int(d) for d in contracting.group(1).split(",") if d])
  if inst.opcode == "convolution":
    lhs, kernel = _operand_dims(inst, 0, table), _operand_dims(inst, 1, table)
    labels, window = _DIM_LABELS.search(inst.attributes), _WINDOW.search(inst.attributes)
    if output is None or lhs is None or kernel is None or labels is None:
      return 0
    return convolution_flops(lhs, kernel, output, labels.group(1), window.group(1) if window else "")
  if inst.opcode == "custom-call":
    declared = _DECLARED_FLOPS.search(inst.attributes)
    return int(declared.group(1)) if declared else 0
  return 0


def _instruction_flops(inst: Instruction, computation: Computation, count: int, loops: str = "") -> float:
  """`instruction_flops` of `inst`, `count` times (an async op's -done and update run nothing: its -start did)."""
  del loops
  return 0.0 if _runs_nothing(inst) else count * instruction_flops(inst, computation.by_name())


def _runs_nothing(inst: Instruction) -> bool:
  return inst.opcode.endswith("-done") or inst.opcode == "async-update"


def loop_flops(text: str) -> float:
  """Matmul FLOPs of one run of a compiled program, per device, loop iterations counted.

  Counts `dot` and `convolution` instructions (TPU programs write many
  matmuls as convolutions), inside fusions and called computations too,
  each as many times as its enclosing `while` loops iterate (a loop whose
  trip count is not read counts once); a `conditional` counts its costliest
  branch; a convolution counts only the window taps that read input, not
  padding (`convolution_flops`); a Pallas kernel counts the FLOPs its
  `pl.CostEstimate` declares, none when it declares none (JAX's splash
  attention kernels declare none: attention's score and value matmuls in
  them are missing, a few percent of an LLM step at 1-2k tokens).
  Elementwise, reduction and transcendental operations are not counted:
  matmuls dominate a transformer step. Unlike `cost_analysis()["flops"]`,
  which counts a loop body once.
  """
  return fold(text, _instruction_flops, enters=lambda inst: not _runs_nothing(inst))
