"""Packed training passes (verl's `use_remove_padding`): the rows' real tokens in fixed-length buffers.

The padded layout (`rl/sequences.py`) gives every row P + R tokens. A packed
pass lays each row's real tokens (the one run of its attention mask: the
left-padded prompt's tokens, then the response's attended ones) one after
another into buffers of L = P + R tokens, each row its own segment (attention
stays inside it, its RoPE positions are its own), and reads every row's
per-token outputs back into the [rows, R] response layout. The model computes
about the rows' real tokens, and everything downstream (losses, metrics,
advantages) reads the same numbers as from the padded pass.

One micro-batch of `rows` rows over D data-parallel shards (its rows split in
D equal blocks, block d on shard d, as the padded layout splits them), r =
rows / D rows per shard, B buffers per shard:

  PackedRows.input_ids, positions  [D, B, L] int32, 0 on padding
  PackedRows.segment_ids           [D, B, L] int32: 1, 2, ... for the rows of a buffer in their order
                                   (two copies of a row, as PF-PPO draws them, are two), 0 on padding
  PackedRows.out_index             [D, r, R] int32: where, among its shard's B * L tokens, the
                                   position predicting row token t sits; -1 where none
  PackedRows.experts               [D, B, L, L_sparse, k] int32, the experts each token is routed to
                                   (router replay R2/R3; None otherwise), 0 on padding
  PackedRows.row_index             [D, r, P + R] int32: where, among its shard's B * L tokens, row
                                   column c sits, -1 where none (what an R2 old-log-prob pass reads
                                   its routing back into rows by, and the reward model finds each
                                   row's last token by; None otherwise)

A batch of M micro-batches stacks them ([M, D, ...]). Every micro-batch and
shard of a pass has the same B: the most any of them needs (rows placed
first-fit decreasing), rounded up to the quarter-octave grid 1, 2, ..., 8,
10, 12, 14, 16, 20, 24, ... and never above r (one row per buffer always
fits). So a pass with the layout's M compiles at most one program per grid
value <= r, however the lengths move from step to step, and computes at most
a quarter more buffers than it needs.

Under verl's token budget (`use_dynamic_bsz`, `budget_arrangement`) the
step's lengths choose M too: each shard's rows are packed first-fit
decreasing into buffers, and micro-batches of B of them (B * L within the
budget) take them in the fewest micro-batches that compute no more than an
eighth more buffers than the fewest. A micro-batch then holds however many
rows its buffers do: r (in the shapes above) becomes S row slots, the most
any micro-batch's shard holds rounded up to a power of two (r itself when
that is less); the empty slots are rows of nothing (no tokens, no mask; the
losses count the mini-batch's real rows). Such a pass compiles at most one
program per (M, B, S): M <= r, B on the grid or the budget's most buffers
(and at most S), S a power of two or r.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding

from rljax.models import token_log_probs, vision
from rljax.rl import layout
from rljax.sharding import hosts, rules as rules_lib
from rljax.training.packing import first_fit_decreasing


@struct.dataclass
class PackedRows:
  """One pass's packed tokens (see the module docstring for the shapes)."""

  input_ids: Any
  positions: Any
  segment_ids: Any
  out_index: Any
  experts: Any = None
  row_index: Any = None
  image_slots: Any = None
  images: Any = None


@dataclasses.dataclass(frozen=True)
class PackPlan:
  """Where a batch's rows go, this process's shards of it.

  Attributes:
    buffers: B, buffers per shard and micro-batch.
    src: [M, D_local, B, L] int32, each buffer token's place in the step's
      [N * (P + R)] padded tokens, -1 on padding.
    out_index: [M, D_local, r, R] int32 (PackedRows.out_index; r the row slots S under a token budget).
    row_index: [M, D_local, r, P + R] int32 (PackedRows.row_index).
    real_tokens: the batch's real tokens (every shard's).
  """

  buffers: int
  src: np.ndarray
  out_index: np.ndarray
  row_index: np.ndarray
  real_tokens: int
  patches: "PatchPlan | None" = None


@dataclasses.dataclass(frozen=True)
class PatchPlan:
  """Where a vision-language pass's buffers take their rows' image patches from: each buffer's members' patches
  one after another (as its members' tokens are), Q' = the most any buffer holds on the patch-bucket grid.

  Attributes:
    src: [M, D_local, B, Q'] int32, each buffer patch's place in the step's [N * Q] row patches, -1 on padding.
    shift: [M, D_local, B, Q'] int32, where its member's patches start in the buffer (its layout's order moves
      by it).
    member: [M, D_local, B, Q'] int32, its member's number in the buffer (keeps windows and frames apart).
    merged_src, merged_shift: [M, D_local, B, Q' / m^2] the same for the merged features (restore).
  """

  src: np.ndarray
  shift: np.ndarray
  member: np.ndarray
  merged_src: np.ndarray
  merged_shift: np.ndarray


def grid_ceil(n: int, cap: int) -> int:
  """The smallest value >= n of the quarter-octave grid 1..8, 10, 12, 14, 16, 20, ..., at most `cap`."""
  if n > 8:
    step = 1 << (n.bit_length() - 3)
    n = -(-n // step) * step
  return max(1, min(n, cap))


def row_spans(attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(start [N], end [N]): row i's real tokens are columns start[i]..end[i] - 1 of its attention mask [N, P + R].

  Raises:
    ValueError: naming the first row whose mask is not one run of ones (a packed pass keeps a row's tokens
      together; `use_remove_padding=false` reads any mask).
  """
  mask = np.asarray(attention_mask) != 0
  width = mask.shape[1]
  start = np.argmax(mask, axis=1)
  end = width - np.argmax(mask[:, ::-1], axis=1)
  empty = ~mask.any(axis=1)
  start[empty], end[empty] = 0, 0
  holes = np.flatnonzero(mask.sum(axis=1) != end - start)
  if holes.size:
    raise ValueError(f"row {holes[0]}'s attention mask has gaps between its tokens: a packed pass needs each row "
                     "as one run (a left-padded prompt, then its response); set "
                     "actor_rollout_ref.model.use_remove_padding=false (and critic.model.use_remove_padding) "
                     "to read it padded")
  return start.astype(np.int64), end.astype(np.int64)


def make_plan(starts: np.ndarray, ends: np.ndarray, arrangement: np.ndarray, shards: int, prompt_length: int,
              response_length: int, local_shards: slice, budget: int | None = None,
              patches: tuple[np.ndarray, int, int] | None = None) -> PackPlan:
  """The packing of a batch of rows into buffers of L = P + R tokens.

  Args:
    starts, ends: [N] every row's span (`row_spans`, all processes' rows in their global order).
    arrangement: [M, rows] the global row numbers of each micro-batch in its order, -1 in empty slots (after
      a block's rows); block d of rows / D sits on shard d.
    shards: D.
    prompt_length, response_length: P, R.
    local_shards: the shards this process places (its block of D).
    budget: the pass's token budget, which B * (P + R) keeps within (B off the grid where the grid would pass it).
    patches: a vision-language pass's (every row's image patches [N], Q the patches per row of the step's image
      fields, m^2 the patches per merged feature): the plan then says where each buffer's patches come from.

  Returns:
    The plan, laid out for `local_shards` only, with B from every shard (the same on every process).
  """
  micro, rows = arrangement.shape
  per_shard, width = rows // shards, prompt_length + response_length
  blocks = arrangement.reshape(micro, shards, per_shard)
  lengths = ends - starts
  fits = [[first_fit_decreasing(lengths[block[block >= 0]], width) for block in blocks[m]] for m in range(micro)]
  most = per_shard if budget is None else min(per_shard, max(budget, width) // width)
  buffers = grid_ceil(max(len(fit) for per_micro in fits for fit in per_micro), most)
  local = range(shards)[local_shards]
  src = np.full((micro, len(local), buffers, width), -1, np.int32)
  out_index = np.full((micro, len(local), per_shard, response_length), -1, np.int32)
  row_index = np.full((micro, len(local), per_shard, width), -1, np.int32)
  predicting = prompt_length - 1 + np.arange(response_length)  # the column predicting response token t
  members_of = lambda m, d: [[blocks[m, d, k] for k in members] for members in fits[m][d]]  # noqa: E731
  patch_plan = None if patches is None else plan_patches(
      [[members_of(m, d) for d in local] for m in range(micro)],
      max((sum(int(patches[0][r]) for r in buffer) for m in range(micro) for d in range(shards)
           for buffer in members_of(m, d)), default=0), buffers, *patches)
  for m in range(micro):
    for i, d in enumerate(local):
      for buffer, members in enumerate(fits[m][d]):
        offset = 0
        for k in members:
          row = blocks[m, d, k]
          start, end = starts[row], ends[row]
          src[m, i, buffer, offset:offset + end - start] = row * width + np.arange(start, end)
          valid = (predicting >= start) & (predicting + 1 < end)
          out_index[m, i, k, valid] = buffer * width + offset + predicting[valid] - start
          row_index[m, i, k, start:end] = buffer * width + offset + np.arange(end - start)
          offset += end - start
  return PackPlan(buffers=buffers, src=src, out_index=out_index, row_index=row_index,
                  real_tokens=int(lengths[arrangement[arrangement >= 0]].sum()), patches=patch_plan)


def plan_patches(members: list[list[list[list[int]]]], most: int, buffers: int, counts: np.ndarray, row_patches: int,
                 unit: int) -> PatchPlan:
  """The PatchPlan of buffers whose members (global rows) are members[m][i][b], the fullest holding `most`
  patches, each row r `counts[r]` of the step's `row_patches` per row, `unit` patches per merged feature."""
  width = vision.patch_bucket(most, unit)
  shape = (len(members), len(members[0]), buffers)
  src, shift, member = (np.full((*shape, width), -1, np.int32) for _ in range(3))
  merged_src, merged_shift = (np.full((*shape, width // unit), -1, np.int32) for _ in range(2))
  for m, per_micro in enumerate(members):
    for i, per_shard in enumerate(per_micro):
      for b, rows in enumerate(per_shard):
        offset = 0
        for k, row in enumerate(rows):
          n = int(counts[row])
          src[m, i, b, offset:offset + n] = row * row_patches + np.arange(n)
          shift[m, i, b, offset:offset + n], member[m, i, b, offset:offset + n] = offset, k
          merged = slice(offset // unit, (offset + n) // unit)
          merged_src[m, i, b, merged] = row * (row_patches // unit) + np.arange(n // unit)
          merged_shift[m, i, b, merged] = offset // unit
          offset += n
  return PatchPlan(src=src, shift=shift, member=member, merged_src=merged_src, merged_shift=merged_shift)


def budget_arrangement(lengths: np.ndarray, order: np.ndarray, shards: int, budget: int, width: int) -> np.ndarray:
  """[M, D * S] micro-batches of the rows `order` ([rows] global row numbers) under verl's token budget, -1 in
  the slots no row fills.

  Shard d holds the rows order[d * r:(d + 1) * r] (r = slots / D), less its empty slots (-1): a process's
  rows stay on its devices. Each
  shard's rows are packed first-fit decreasing into n_d buffers of `width`; n = max n_d. A micro-batch takes
  B of a shard's buffers (B on the quarter-octave grid, B * width within the budget, at least one buffer), so
  M = ceil(n / B), as `budget_grid` picks them (about the fewest buffers M * B in the fewest micro-batches). The
  micro-batches of a shard share its buffers out evenly (none is empty while another holds two more). Block d
  of S columns holds shard d's rows of the micro-batch, in their order in `order` (so packing them again,
  `make_plan`, finds the same buffers), then -1; S is the most any block holds rounded up to a power of two
  (empty slots cost no tokens, only their [S, R] rows of zeros), at most r.

  Args:
    lengths: [N] every row's real tokens.
    order: [slots] the pass's rows, -1 in empty slots (`with_empty_slots`), slots a multiple of D.
    shards: D.
    budget: real tokens a shard may hold in one micro-batch.
    width: L, the buffer length.
  """
  per_shard = len(order) // shards
  blocks = [block[block >= 0] for block in np.asarray(order).reshape(shards, per_shard)]
  fits = [first_fit_decreasing(lengths[block], width) for block in blocks]
  micro, _ = budget_grid(max(len(fit) for fit in fits), max(budget, width) // width)
  groups = [[np.sort(np.asarray([i for b in range(m, len(fit), micro) for i in fit[b]], np.int64))
             for m in range(micro)] for fit in fits]
  slots = min(1 << (max(len(g) for per in groups for g in per) - 1).bit_length(), per_shard)
  out = np.full((micro, shards, slots), -1, np.int64)
  for d, per in enumerate(groups):
    for m, group in enumerate(per):
      out[m, d, :len(group)] = blocks[d][group]
  return out.reshape(micro, shards * slots)


def budget_grid(needed: int, most: int) -> tuple[int, int]:
  """(M, B): micro-batches of B buffers (B on the grid, at most `most`) holding `needed` buffers: the fewest
  micro-batches of those computing at most an eighth more buffers than the fewest (a micro-batch a buffer
  always computes the fewest)."""
  options = [(-(-needed // b), b) for b in sorted({grid_ceil(b, most) for b in range(1, max(needed, 1) + 1)})]
  fewest = min(m * b for m, b in options)
  return min((mb for mb in options if 8 * mb[0] * mb[1] <= 9 * fewest), key=lambda mb: (mb[0], mb[0] * mb[1]))


def rows_in_place(x: np.ndarray, arrangement: np.ndarray, first_row: int, rows: int) -> np.ndarray:
  """A pass's outputs [M, k, ...] for this process's columns of `arrangement` ([M, k] global row numbers, -1 in
  empty slots; its rows first_row..first_row + rows - 1) -> [rows, ...] in row order."""
  out = np.empty((rows, *x.shape[2:]), x.dtype)
  filled = arrangement >= 0
  out[arrangement[filled] - first_row] = x[filled]
  return out


def process_rows(x: jax.Array, arrangement: np.ndarray, local: int) -> np.ndarray:
  """This process's `local` rows, in row order, of a packed pass's outputs [M, k, ...] over the micro-batches
  `arrangement` ([M, k] global row numbers, -1 in empty slots; each process's rows are its own columns)."""
  per = arrangement.shape[1] // hosts.count()
  columns = arrangement[:, hosts.index() * per:][:, :per]
  return rows_in_place(hosts.process_rows(x, axis=1), columns, hosts.index() * local, local)


def shard_count(mesh: Mesh, rules: Any, micro_batches: int, rows: int) -> int:
  """D: how many shards the rows of one micro-batch ([M, rows / M] over the batch rule) are split in."""
  per = rows // micro_batches
  sharding = NamedSharding(mesh, rules_lib.logical_to_spec((None, "batch"), (micro_batches, per), mesh, rules))
  return per // sharding.shard_shape((micro_batches, per))[1]


def spec(micro_batches: int, rows: int, prompt_length: int, response_length: int, mesh: Mesh,
         rules: Any, replayed: tuple[int, int] | None = None, recorded: bool = False,
         vision_config: Any = None) -> PackedRows:
  """The abstract PackedRows of a pass over `rows` rows in `micro_batches` micro-batches, at its largest
  (one row per buffer); a run calls the pass with fewer buffers, laid out alike.

  replayed: (L_sparse, k) when the pass replays its rows' experts (router replay); recorded: whether it reads
  its routing (or a row's last token) back into rows (`row_index`). A pass of whole sequences (response_length
  0, the reward model's) has no `out_index`. vision_config: a vision-language actor's tower config: positions
  are M-RoPE's [..., 3], and each buffer holds its members' images (one merged patch here; a run's passes are as
  wide as their fullest buffer, `PatchPlan`).
  """
  shards = shard_count(mesh, rules, micro_batches, rows)
  per_shard, width = rows // micro_batches // shards, prompt_length + response_length

  def struct_of(shape):
    partition = rules_lib.logical_to_spec((None, "batch") + (None,) * (len(shape) - 2), shape, mesh, rules)
    return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=NamedSharding(mesh, partition))

  tokens = struct_of((micro_batches, shards, per_shard, width))
  slots, images = None, None
  if vision_config is not None:
    buffers, q = (micro_batches, shards, per_shard), vision_config.merge_unit
    shaped = lambda *tail: struct_of((*buffers, *tail))  # noqa: E731
    pixels = shaped(q, int(np.prod(vision_config.patch_shape)))
    slots = tokens
    images = vision.Images(pixels=jax.ShapeDtypeStruct(pixels.shape, jnp.float32, sharding=pixels.sharding),
                           layout=vision.ImageLayout(order=shaped(q), rotary=shaped(q, 4), windows=shaped(q),
                                                     frames=shaped(q), restore=shaped(q // vision_config.merge_unit)))
  return PackedRows(input_ids=tokens, positions=tokens if vision_config is None else struct_of((*tokens.shape, 3)),
                    segment_ids=tokens,
                    out_index=struct_of((micro_batches, shards, per_shard, response_length)) if response_length
                    else None,
                    experts=None if replayed is None else struct_of((*tokens.shape, *replayed)),
                    row_index=struct_of((micro_batches, shards, per_shard, width)) if recorded else None,
                    image_slots=slots, images=images)


def local_shards(abstract: PackedRows) -> slice:
  """The shards (axis 1) of `abstract`'s arrays this process places."""
  s = abstract.input_ids
  axis = [index[1] for index in s.sharding.addressable_devices_indices_map(s.shape).values()]
  return slice(min(i.start or 0 for i in axis), max(s.shape[1] if i.stop is None else i.stop for i in axis))


def member_numbers(src: jax.Array, width: int) -> jax.Array:
  """[..., L] int32 the number (1, 2, ...) of the buffer member each token of `src` ([..., L], places in the
  step's [N * width] tokens) belongs to: a member starts where the place does not follow the previous token's
  in the same row (another row, or a row again)."""
  row = src // width
  follows = (src[..., 1:] == src[..., :-1] + 1) & (row[..., 1:] == row[..., :-1])
  starts = jnp.concatenate([jnp.ones_like(follows[..., :1]), ~follows], axis=-1)
  return jnp.cumsum(starts.astype(jnp.int32), axis=-1)


@functools.lru_cache(maxsize=None)
def _gather(shardings: PackedRows) -> Any:
  """The jitted (input_ids, positions [1, N, P + R], experts [1, N, P + R, L_sparse, k] or None, src, out_index,
  row_index or None, images or None) -> PackedRows, laid out by `shardings` (a PackedRows of shardings; experts,
  row_index and images None where the pass has none; images: (the step's image_slots [1, N, P + R], its row
  images as an `Experience` of the image fields [1, N, Q, ...], the plan's `PatchPlan` arrays))."""
  def gather(input_ids, positions, experts, src, out_index, row_index, images):
    real = src >= 0
    safe = jnp.maximum(src, 0)

    def take(x, index=safe, valid=real):
      flat = x.reshape(-1, *x.shape[3:])[jnp.maximum(index, 0)]
      return jnp.where(valid.reshape(valid.shape + (1,) * (flat.ndim - valid.ndim)), flat, 0)

    slots = packed_images = None
    if images is not None:
      slot_rows, rows, (patch_src, shift, member, merged_src, merged_shift) = images
      slots = take(slot_rows)
      has, merged_has = patch_src >= 0, merged_src >= 0
      on_patches = functools.partial(take, index=patch_src, valid=has)
      spread = rows.patch_order.shape[-1]  # more than any row's window or frame ids: each member's stay apart
      packed_images = vision.Images(
          pixels=on_patches(rows.pixels), layout=vision.ImageLayout(
              order=jnp.where(has, on_patches(rows.patch_order) + shift, -1), rotary=on_patches(rows.patch_rotary),
              windows=jnp.where(has, on_patches(rows.patch_windows) + member * spread, -1),
              frames=jnp.where(has, on_patches(rows.patch_frames) + member * spread, -1),
              restore=jnp.where(merged_has, take(rows.merge_restore, merged_src, merged_has) + merged_shift,
                                -1)))
    return PackedRows(input_ids=take(input_ids), positions=take(positions),
                      segment_ids=jnp.where(real, member_numbers(src, input_ids.shape[-1]), 0), out_index=out_index,
                      experts=None if experts is None else take(experts), row_index=row_index, image_slots=slots,
                      images=packed_images)

  return jax.jit(gather, out_shardings=shardings)


def pack(input_ids: jax.Array, positions: jax.Array, plan: PackPlan, abstract: PackedRows,
         experts: jax.Array | None = None, images: tuple[jax.Array, Any] | None = None) -> PackedRows:
  """The packed batch on device, from the step's placed tokens ([1, N, P + R], each host's rows where
  `experience.place` put them; experts [1, N, P + R, L_sparse, k] when `abstract` replays routing; images, a
  vision-language pass's (image_slots [1, N, P + R], the image fields' `Experience` [1, N, Q, ...])) and this
  process's part of `plan`, laid out as `abstract`."""
  micro, _, per_shard, length = plan.out_index.shape
  shards = abstract.input_ids.shape[1]
  if (abstract.experts is None) != (experts is None):
    raise ValueError("a pass replaying router choices packs its rows' experts, and only such a pass does")

  def put(local, like, global_shape):
    return jax.make_array_from_process_local_data(like.sharding, local, global_shape)

  src = put(plan.src, abstract.input_ids, (micro, shards, plan.buffers, plan.src.shape[-1]))
  out_index = row_index = None
  if abstract.out_index is not None:
    out_index = put(plan.out_index, abstract.out_index, (micro, shards, per_shard, length))
  if abstract.row_index is not None:
    row_index = put(plan.row_index, abstract.row_index, (micro, shards, per_shard, plan.row_index.shape[-1]))
  shardings = jax.tree.map(lambda s: s.sharding, abstract)
  if (abstract.images is None) != (images is None):
    raise ValueError("a vision-language pass packs its rows' images, and only such a pass does")
  if images is not None:
    p = plan.patches
    like = abstract.images.layout.order
    on = lambda x: put(x, like, (micro, shards, *x.shape[2:]))  # noqa: E731
    images = (*images, (on(p.src), on(p.shift), on(p.member), on(p.merged_src), on(p.merged_shift)))
  return _gather(shardings)(input_ids, positions, experts, src, out_index, row_index, images)


# ----- the model side ------------------------------------------------------------------------------


def packed_hidden(model: Any, packed: PackedRows, with_routing: bool = False) -> Any:
  """[D, B * L, H] final hidden states of every buffer token (and the model's Routing, None when dense)."""
  shards, buffers, width = packed.input_ids.shape
  flat = lambda x: x.reshape(shards * buffers, width, *x.shape[3:])  # noqa: E731
  segments = flat(packed.segment_ids)
  experts = None if packed.experts is None else flat(packed.experts)
  positions = flat(packed.positions)
  images = None
  if packed.images is not None:  # each buffer its members' images, their features at the prompts' image tokens
    positions = jnp.moveaxis(positions, -1, 0)
    per_buffer = lambda x: x.reshape(shards * buffers, *x.shape[2:])  # noqa: E731
    images = jax.tree.map(per_buffer, packed.images)._replace(slots=flat(packed.image_slots) > 0)
  hidden, routing = model.hidden_states(flat(packed.input_ids), (segments > 0).astype(jnp.int32),
                                        positions, segment_ids=segments, with_routing=True,
                                        experts=experts, images=images)
  hidden = hidden.reshape(shards, buffers * width, hidden.shape[-1])
  return (hidden, routing) if with_routing else hidden


def to_rows(x: jax.Array, out_index: jax.Array) -> jax.Array:
  """Per-token outputs [D, B * L] -> the rows' [D * r, R] (0 where a row has no such token).

  The gather stays within each shard (its leading axis), so it moves nothing between devices.
  """
  shards, per_shard, length = out_index.shape
  taken = jnp.take_along_axis(x, jnp.maximum(out_index, 0).reshape(shards, -1), axis=1)
  return jnp.where(out_index >= 0, taken.reshape(out_index.shape), 0).reshape(shards * per_shard, length)


def routing_to_rows(experts: jax.Array, row_index: jax.Array) -> jax.Array:
  """A packed pass's experts [D * B, L, L_sparse, k] -> the rows' [D * r, P + R, L_sparse, k] (`row_index`
  [D, r, P + R]; 0 on a row's padding). The gather stays within each shard."""
  shards, per_shard, width = row_index.shape
  flat = experts.reshape(shards, -1, *experts.shape[2:])
  index = jnp.maximum(row_index, 0).reshape(shards, -1)
  taken = jnp.take_along_axis(flat, index[..., None, None], axis=1).reshape(shards * per_shard, width,
                                                                           *experts.shape[2:])
  return jnp.where((row_index >= 0).reshape(shards * per_shard, width, 1, 1), taken, 0)


def next_tokens(packed: PackedRows) -> jax.Array:
  """[D, B * L] the token after each buffer token (what its hidden state predicts; any id where it is the
  last of its row, which no row reads)."""
  ids = packed.input_ids.reshape(packed.input_ids.shape[0], -1)
  return jnp.concatenate([ids[:, 1:], ids[:, :1]], axis=1)


def packed_log_probs(model: Any, packed: PackedRows, temperature: float, with_entropy: bool = True,
                     chunk_size: int = 1024, sum_pi_squared: bool = False, with_trunk: bool = False
                     ) -> tuple[Any, ...]:
  """(log-probs [rows, R], entropy or Σπ² (`token_log_probs`) [rows, R], the model's Routing or None[, the final
  hidden states of every buffer position [D, B * L, H] with `with_trunk`]) of the rows' response tokens.

  The LM head runs on whichever is fewer: every buffer position (D * B * L), or the positions predicting
  the rows' response tokens gathered within each shard ([rows, R], as a padded pass does); 0 where a row has
  no such token.
  """
  hidden, routing = packed_hidden(model, packed, with_routing=True)
  shards, per_shard, length = packed.out_index.shape
  head = functools.partial(token_log_probs, weight=model.lm_head_weight(), chunk_size=chunk_size,
                           temperature=temperature, with_entropy=with_entropy,
                           softcap=model.cfg.final_logit_softcapping, sum_pi_squared=sum_pi_squared)
  trunk = (hidden,) if with_trunk else ()
  if hidden.shape[1] <= per_shard * length:
    log_probs, entropy = head(hidden, targets=next_tokens(packed))
    return to_rows(log_probs, packed.out_index), to_rows(entropy, packed.out_index), routing, *trunk
  index = jnp.maximum(packed.out_index, 0).reshape(shards, -1)
  gathered = jnp.take_along_axis(hidden, index[..., None], axis=1).reshape(shards * per_shard, length, -1)
  targets = jnp.take_along_axis(next_tokens(packed), index, axis=1).reshape(shards * per_shard, length)
  log_probs, entropy = head(gathered, targets=targets)
  valid = (packed.out_index >= 0).reshape(shards * per_shard, length)
  return jnp.where(valid, log_probs, 0), jnp.where(valid, entropy, 0), routing, *trunk


# ----- a step's packer ------------------------------------------------------------------------------


TOKEN_FIELDS = ("input_ids", "positions")


def forward_arrangement(local_rows: int, processes: int, micro_batches: int, slots: int) -> np.ndarray:
  """[M, slots] the global row numbers of a forward pass's micro-batches of `slots` row slots as
  `experience.place` lays a host's rows: micro-batch m holds every process's m-th block of its own rows, in
  process order, each process's block in its slots / processes columns (`layout.spread`, -1 in empty slots)."""
  per_process = slots // processes
  return np.concatenate([layout.spread(h * local_rows + np.arange(local_rows), micro_batches, per_process)
                         for h in range(processes)], axis=1)


def row_slots(abstract: PackedRows) -> int:
  """The row slots of one micro-batch of a packed pass (`spec`, at its largest: a buffer a slot): D * B of its
  input_ids [M, D, B, L]."""
  return abstract.input_ids.shape[1] * abstract.input_ids.shape[2]


def pass_arrangement(lengths: np.ndarray, local: int, abstract: PackedRows, budget: int | None) -> np.ndarray:
  """[M, slots] the micro-batches of a forward pass over every process's `local` rows ([N] real tokens
  `lengths`): as `experience.place` lays them (`forward_arrangement`, `abstract`'s M and slots), or by the token
  budget ([M, D * S], -1 in empty slots, `budget_arrangement`)."""
  micro, shards = abstract.input_ids.shape[:2]
  if budget is None:
    return forward_arrangement(local, hosts.count(), micro, row_slots(abstract))
  processes = hosts.count()
  order = np.concatenate([with_empty_slots(h * local + np.arange(local), shards // processes)
                          for h in range(processes)])
  return budget_arrangement(lengths, order, shards, budget, abstract.input_ids.shape[-1])


def with_empty_slots(order: np.ndarray, shards: int) -> np.ndarray:
  """`order` ([n] row numbers) then -1 up to a multiple of `shards` (`layout.slots_of`)."""
  return np.concatenate([order, np.full(layout.slots_of(len(order), shards) - len(order), -1, order.dtype)])


@dataclasses.dataclass
class Packer:
  """Packs one step's rows for its packed passes: their tokens placed on device once, every row's span known
  to every process.

  Attributes:
    starts, ends: [N] every row's span (`row_spans`), in global row order.
    input_ids, positions: [1, N', P + R] the step's tokens on device, in its slots (`experience.OnDevice`).
    prompt_length, response_length: P, R.
    computed, real: token positions the passes packed so far compute, and the real tokens they hold.
    experts: [1, N', P + R, L_sparse, k] the experts the passes replaying routing route to, or None.
    images: a vision-language step's (image_slots [1, N', P + R], the image fields [1, N', Q, ...] as an
      `Experience`, every row's patch count [N], patches per merged feature), or None.
    slot_numbers: global row numbers -> the slots on device holding them (`experience.OnDevice.slot_numbers`;
      None: the same numbers).
  """

  starts: np.ndarray
  ends: np.ndarray
  input_ids: jax.Array
  positions: jax.Array
  prompt_length: int
  response_length: int
  computed: int = 0
  real: int = 0
  experts: jax.Array | None = None
  images: tuple[Any, Any, np.ndarray, int] | None = None
  slot_numbers: Any = None

  @classmethod
  def of(cls, tokens: Any, spans: tuple[np.ndarray, np.ndarray], prompt_length: int,
         response_length: int, slot_numbers: Any = None) -> "Packer":
    """From the step's tokens on device (an `Experience` of input_ids and positions, [1, N', P + R]), every
    row's spans and `slot_numbers`."""
    return cls(spans[0], spans[1], tokens.input_ids, tokens.positions, prompt_length, response_length,
               slot_numbers=slot_numbers)

  def slots_for(self, index: np.ndarray) -> np.ndarray:
    """`index` (global row numbers, -1 for none) as the slots on device holding those rows."""
    return index if self.slot_numbers is None else self.slot_numbers(index)

  def in_slots(self, x: np.ndarray) -> np.ndarray:
    """[N] a value of every row -> [N'] of every slot (0 in empty ones)."""
    out = np.zeros(self.input_ids.shape[1], x.dtype)
    out[self.slots_for(np.arange(len(x)))] = x
    return out

  @functools.cached_property
  def slot_spans(self) -> tuple[np.ndarray, np.ndarray]:
    """(starts [N'], ends [N']): every slot's span (0, 0 in empty ones), for every plan of the step."""
    return self.in_slots(self.starts), self.in_slots(self.ends)

  def arrangement(self, abstract: PackedRows, order: np.ndarray, budget: int | None) -> np.ndarray:
    """[M, slots] the micro-batches of the rows `order`: `abstract`'s M consecutive blocks in its slots
    (`layout.spread`), or by the token budget when there is one ([M, D * S], -1 in empty slots,
    `budget_arrangement`)."""
    micro, shards = abstract.input_ids.shape[:2]
    if budget is None:
      return layout.spread(order, micro, row_slots(abstract))
    return budget_arrangement(self.ends - self.starts, with_empty_slots(order, shards), shards, budget,
                              abstract.input_ids.shape[-1])

  def plan(self, abstract: PackedRows, arrangement: np.ndarray, budget: int | None) -> PackPlan:
    """Where the rows `arrangement` ([M, rows] global row numbers) go, laid out as `abstract` (within the
    pass's token `budget`, when it has one)."""
    patches = None
    if self.images is not None:
      _, rows, counts, unit = self.images
      patches = (self.in_slots(counts), rows.pixels.shape[2], unit)
    return make_plan(*self.slot_spans, self.slots_for(arrangement),
                     abstract.input_ids.shape[1], self.prompt_length, self.response_length, local_shards(abstract),
                     budget, patches)

  def pack(self, plan: PackPlan, abstract: PackedRows) -> PackedRows:
    """The packed batch of `plan` on device (and its tokens counted)."""
    self.computed += plan_tokens(plan, abstract)
    self.real += plan.real_tokens
    return pack(self.input_ids, self.positions, plan, abstract,
                None if abstract.experts is None else self.experts,
                None if self.images is None else self.images[:2])


def plan_tokens(plan: PackPlan, abstract: PackedRows) -> int:
  """Token positions a packed pass of `plan` computes over every shard: M * D * B * L."""
  return plan.src.shape[0] * abstract.input_ids.shape[1] * plan.buffers * plan.src.shape[-1]


def padded_pays(packed_tokens: int, rows: int, prompt_length: int, response_length: int, group: int) -> bool:
  """Whether a padded pass over `rows` rows computes fewer token positions than the packed one's
  `packed_tokens`: it runs each group's prompt once (`group` rows share it) and every response in full.
  Short responses under long shared prompts can cost less padded, since every packed row holds its own
  prompt. (The LM head is left out: a packed pass runs it on no more positions than a padded one.)"""
  return rows * response_length + rows // max(group, 1) * prompt_length < packed_tokens
