"""`Experience`: the record one RL step's rows travel in, from rollout to the update.

A step fills one record in stages, each adding fields (`dataclasses.replace`
style, the record is frozen):

    rollout     input_ids, attention_mask, positions, responses, response_mask, prompt_mask, group,
                rollout_log_probs (and routed_experts with router replay R3)
    score       token_level_scores, reward_components (and reward_baselines for remax)
    experience  old_log_probs, ref_log_prob, values, token_level_rewards, advantages, returns,
                rollout_is_weights, positive (each where the run has it); response_mask narrowed
                by rollout rejection sampling
    update      mini-batches of the fields each update step reads

Every per-row field is declared once below with its shape and dtype (`FIELDS`);
rows are laid out over the batch rule (`batch` -> data x fsdp), so a field's
sharding is its rows' split and nothing per field. N rows (a step's
`train_batch_size * n`), P the prompt length, R the response length:

    [N, P + R]  input_ids, attention_mask, positions (int32); routed_experts [N, P + R, L_sparse, k]
    [N, P]      prompt_mask (int32)
    [N, R]      responses, response_mask (int32); the float32 log-probs, scores, rewards, advantages ...
    [N]         group (int32), reward_baselines (float32), positive (bool)

The record is a pytree (absent fields are None), so host arrays, device
arrays and ShapeDtypeStructs all travel in it: a jitted step takes an
`Experience` of the fields it reads, and its abstract arguments are an
`Experience` of ShapeDtypeStructs (`spec`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.models.vision import ImageLayout, Images
from rljax.rl import layout as layout_lib
from rljax.sharding import hosts, mesh as sharding_lib
from rljax.sharding import rules as rules_lib

# axes of each kind of field: "sequence" [N, P + R], "prompt" [N, P], "response" [N, R], "row" [N]
_SEQUENCE, _PROMPT, _RESPONSE, _ROW = "sequence", "prompt", "response", "row"


def _field(axes: str, dtype: Any, fill: int | None = None) -> Any:
  """A record field of `axes` rows and `dtype` (None until a stage fills it); `fill`: a ragged field, whose rows
  may be padded along their second axis with `fill` (a step's images, each batch as wide as its widest row)."""
  return struct.field(default=None, metadata={"axes": axes, "dtype": jnp.dtype(dtype), "fill": fill})


@struct.dataclass
class Experience:
  """One step's rows (see the module docstring); absent fields are None.

  Attributes:
    input_ids, attention_mask, positions: [N, P + R] left-padded prompt then
      right-padded response; attention_mask is 1 on every id the model reads
      (a multi-turn response's tool turns included).
    responses: [N, R] response ids.
    response_mask: [N, R] 1 on the tokens the losses count (generated ones).
    prompt_mask: [N, P] 1 on prompt tokens.
    group: [N] the prompt (group) of each row, 0..N / n - 1.
    rollout_log_probs: [N, R] the sampler's log-probs.
    routed_experts: [N, P + R, L_sparse, k] each token's experts (router replay).
    token_level_scores: [N, R] the reward (on a response's last token).
    reward_components: name -> [N] float32 numeric entries of the reward
      function's extra info (gdpo's components, dynamic sampling's metric).
    reward_baselines: [N] the greedy response's reward of each row's prompt (remax).
    old_log_probs, ref_log_prob, values: [N, R] the forward passes' outputs.
    sum_pi_squared: [N, R] Σ_v π_v² of the old policy at each response token (the old-log-prob pass's, for the
      optimal-token-baseline estimators).
    token_level_rewards: [N, R] scores with the KL penalty when in the reward.
    advantages, returns: [N, R].
    rollout_is_weights: [N, R] rollout-correction importance weights.
    positive: [N] whether a row's score is positive (positive_nll_coef).
    pixels, patch_order, patch_rotary, patch_windows, patch_frames, merge_restore: a vision-language run's
      images, each row's own prompt's (`rljax.models.vision.row_images`): pixels [N, Q, F], the layout [N, Q]
      (rotary [N, Q, 4], merge_restore [N, Q / m^2]); positions are then M-RoPE's [N, P + R, 3], and
      image_slots [N, P + R] 1 on the prompt's image-pad tokens (where a packed pass places the features).
    packed: a packed pass's tokens (`rl.packing.PackedRows`), which then
      stand for input_ids, attention_mask, positions and responses.
  """

  input_ids: Any = _field(_SEQUENCE, jnp.int32)
  attention_mask: Any = _field(_SEQUENCE, jnp.int32)
  positions: Any = _field(_SEQUENCE, jnp.int32)
  responses: Any = _field(_RESPONSE, jnp.int32)
  response_mask: Any = _field(_RESPONSE, jnp.int32)
  prompt_mask: Any = _field(_PROMPT, jnp.int32)
  group: Any = _field(_ROW, jnp.int32)
  rollout_log_probs: Any = _field(_RESPONSE, jnp.float32)
  routed_experts: Any = _field(_SEQUENCE, jnp.int32)
  token_level_scores: Any = _field(_RESPONSE, jnp.float32)
  reward_components: Mapping[str, Any] | None = struct.field(default=None)
  reward_baselines: Any = _field(_ROW, jnp.float32)
  old_log_probs: Any = _field(_RESPONSE, jnp.float32)
  sum_pi_squared: Any = _field(_RESPONSE, jnp.float32)
  ref_log_prob: Any = _field(_RESPONSE, jnp.float32)
  values: Any = _field(_RESPONSE, jnp.float32)
  token_level_rewards: Any = _field(_RESPONSE, jnp.float32)
  advantages: Any = _field(_RESPONSE, jnp.float32)
  returns: Any = _field(_RESPONSE, jnp.float32)
  rollout_is_weights: Any = _field(_RESPONSE, jnp.float32)
  positive: Any = _field(_ROW, jnp.bool_)
  image_slots: Any = _field(_SEQUENCE, jnp.int32)
  pixels: Any = _field(_ROW, jnp.float32, 0)
  patch_order: Any = _field(_ROW, jnp.int32, -1)
  patch_rotary: Any = _field(_ROW, jnp.int32, 0)
  patch_windows: Any = _field(_ROW, jnp.int32, -1)
  patch_frames: Any = _field(_ROW, jnp.int32, -1)
  merge_restore: Any = _field(_ROW, jnp.int32, -1)
  packed: Any = struct.field(default=None)

  def present(self) -> tuple[str, ...]:
    """The names of the fields that hold arrays."""
    return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

  def select(self, names: Iterable[str]) -> "Experience":
    """A record of only the fields `names` (each must be present)."""
    names = tuple(names)
    missing = [n for n in names if getattr(self, n) is None]
    if missing:
      raise KeyError(f"the step's rows lack {missing} (they hold {list(self.present())})")
    return Experience(**{n: getattr(self, n) for n in names})

  def take(self, index: Any) -> "Experience":
    """The rows `index` (a bool mask or integer indices) of every field."""
    return jax.tree.map(lambda x: np.asarray(x)[index], self)


# Each field's (axes, dtype); reward_components has no single shape (a mapping of [N] rows).
FIELDS: dict[str, tuple[str, jnp.dtype]] = {
    f.name: (f.metadata["axes"], f.metadata["dtype"]) for f in dataclasses.fields(Experience) if "axes" in f.metadata}

# What a model pass reads (old / reference log-probs, values, the update).
MODEL_FIELDS = ("input_ids", "attention_mask", "positions", "responses", "response_mask")
# a vision-language run's images (ragged: each step's rows as wide as its widest)
IMAGE_FIELDS = ("pixels", "patch_order", "patch_rotary", "patch_windows", "patch_frames", "merge_restore")
RAGGED = {f.name: f.metadata["fill"] for f in dataclasses.fields(Experience) if f.metadata.get("fill") is not None}


def field_shape(name: str, rows: int, prompt_length: int, response_length: int,
                routing: tuple[int, int] | None = None, trailing: Mapping[str, tuple[int, ...]] | None = None
                ) -> tuple[int, ...]:
  """The shape of field `name` for `rows` rows (routing: (L_sparse, k) of routed_experts; trailing: the axes
  after the rows' of fields that have more, by name: the images', M-RoPE positions' (3,))."""
  axes = FIELDS[name][0]
  shape = {_SEQUENCE: (rows, prompt_length + response_length), _PROMPT: (rows, prompt_length),
           _RESPONSE: (rows, response_length), _ROW: (rows,)}[axes]
  return shape + (tuple(routing) if name == "routed_experts" else ()) + tuple((trailing or {}).get(name, ()))


def trailing_of(rows: Experience, names: Iterable[str], prompt_length: int, response_length: int
                ) -> dict[str, tuple[int, ...]]:
  """The trailing axes (`field_shape`'s) of `rows`' fields `names` (routed_experts' are its routing)."""
  out = {}
  for name in names:
    if name != "routed_experts":
      base = len(field_shape(name, 1, prompt_length, response_length))
      out[name] = tuple(np.shape(getattr(rows, name))[base:])
  return out


def images_of(batch: Experience) -> Any:
  """The `rljax.models.vision.Images` of a batch's image fields (None: a text run's batch)."""
  if batch.pixels is None:
    return None
  return Images(batch.pixels, ImageLayout(order=batch.patch_order, rotary=batch.patch_rotary,
                                          windows=batch.patch_windows, frames=batch.patch_frames,
                                          restore=batch.merge_restore))


def widened(x: np.ndarray, width: int, fill: int) -> np.ndarray:
  """Rows x [N, W, ...] padded along their second axis to `width` with `fill` (a ragged field)."""
  x = np.asarray(x)
  if x.shape[1] >= width:
    return x
  return np.pad(x, [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2), constant_values=fill)


def spec(names: Iterable[str], micro_batches: int, rows: int, prompt_length: int, response_length: int, mesh: Mesh,
         rules: Any, routing: tuple[int, int] | None = None,
         trailing: Mapping[str, tuple[int, ...]] | None = None) -> Experience:
  """The abstract [micro_batches, rows / micro_batches, ...] fields `names`, rows over the batch rule."""
  per = rows // micro_batches
  out = {}
  for name in names:
    shape = (micro_batches, *field_shape(name, per, prompt_length, response_length, routing, trailing))
    partition = rules_lib.logical_to_spec((None, "batch") + (None,) * (len(shape) - 2), shape, mesh, rules)
    out[name] = jax.ShapeDtypeStruct(shape, FIELDS[name][1], sharding=NamedSharding(mesh, partition))
  return Experience(**out)


def place(rows: Experience, abstract: Experience) -> Experience:
  """The fields `abstract` holds, from host rows [N, ...] cut into its micro-batches ([M, N / M, ...]) and placed
  by its shardings (a multi-host job passes its own rows)."""
  def put(x: Any, s: jax.ShapeDtypeStruct) -> jax.Array:
    x = np.asarray(x, s.dtype)
    micro = x.reshape(s.shape[0], x.shape[0] // s.shape[0], *x.shape[1:])
    return jax.make_array_from_process_local_data(s.sharding, micro, s.shape)

  return jax.tree.map(put, rows.select(abstract.present()), abstract)


def regrouped(abstract: Experience, micro_batches: int, rows: int) -> Experience:
  """`abstract`'s fields as [micro_batches, rows / micro_batches, ...], laid out alike."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct((micro_batches, rows // micro_batches, *s.shape[2:]), s.dtype,
                                                     sharding=s.sharding), abstract)


def row_gather(abstract: Experience) -> Callable[[Experience, np.ndarray], Experience]:
  """A jitted `(whole, index) -> batch`: rows `index` ([B] global row numbers, the same on every host) of `whole`
  ([1, N, ...], each host's rows where `place` put them), as `abstract`'s [M, B / M, ...] batch (or an index
  [M', S] as that batch of M' micro-batches of S rows, laid out alike; an index of -1 gives a row of zeros).

  The rows move between devices (and hosts) on device: a mini-batch holds the same rows in the same order
  however many processes hold the step.
  """
  shardings = jax.tree.map(lambda s: s.sharding, abstract)
  micro = next(iter(jax.tree.leaves(abstract))).shape[0]
  replicated = NamedSharding(next(iter(jax.tree.leaves(shardings))).mesh, PartitionSpec())
  def take(x: jax.Array, index: jax.Array) -> jax.Array:
    rows = x[0][jnp.maximum(index, 0)]
    return jnp.where((index >= 0).reshape(index.shape + (1,) * (rows.ndim - index.ndim)), rows, 0)

  gather = jax.jit(lambda whole, index: jax.tree.map(lambda x: take(x, index), whole), out_shardings=shardings)

  def rows(whole: Experience, index: np.ndarray) -> Experience:
    index = np.asarray(index, np.int32)
    index = index.reshape(micro, -1) if index.ndim == 1 else index
    return gather(whole, jax.make_array_from_process_local_data(replicated, index))

  return rows


@functools.lru_cache(maxsize=None)
def _unarrange_program(sharding: NamedSharding, dtype: jnp.dtype) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """The jitted (outputs [M, k, ...], slots [N]) -> [1, N, ...]: row r is flat slot slots[r] of the outputs."""
  return jax.jit(lambda x, slots: x.reshape(1, -1, *x.shape[2:])[:, slots].astype(dtype), out_shardings=sharding)


def unarrange(outputs: jax.Array, arrangement: np.ndarray, abstract: jax.ShapeDtypeStruct) -> jax.Array:
  """A pass's outputs [M, k, ...] over the micro-batches `arrangement` ([M, k] the slots of `OnDevice` they
  belong in, -1 in empty micro-batch slots, every row once) as the step's rows [1, N', ...] on device, laid out
  as `abstract` (moved on device; an empty slot of the step's copies any output)."""
  filled = arrangement >= 0
  slots = np.zeros(abstract.shape[1], np.int32)
  slots[arrangement[filled]] = np.flatnonzero(filled)
  replicated = NamedSharding(abstract.sharding.mesh, PartitionSpec())
  return _unarrange_program(abstract.sharding, abstract.dtype)(
      outputs, jax.make_array_from_process_local_data(replicated, slots))


class OnDevice:
  """One step's rows on device, each field placed once: [1, N', ...] over the batch rule, every host's rows in
  its own slots (as `place` lays [1, N'] rows: a host's after those of the hosts before it). A host's N / H rows
  take the first of its N' / H slots, N' / H the rows rounded up to a multiple of its data-parallel devices
  (`rl.layout.slots_of`; N' = N where they divide), the rest empty; `slot_numbers` maps global row numbers
  (host h's row i is h * N / H + i) to slots.

  The forward passes, the packer and the updates' mini-batches gather from here. A field is placed when first
  asked for; one a pass computed on device is kept there (`adopt`); a field whose host array the step's record
  replaced (a new array) is placed again, the same array never.
  """

  def __init__(self, rows: int, prompt_length: int, response_length: int, mesh: Mesh, rules: Any):
    self.rows, self.prompt_length, self.response_length, self.mesh, self.rules = (
        rows, prompt_length, response_length, mesh, rules)
    processes = hosts.count()
    self.local = rows // processes
    data_parallel = sharding_lib.data_parallel_size(mesh)
    self.local_slots = (self.local if data_parallel % processes
                        else layout_lib.slots_of(self.local, data_parallel // processes))
    self._fields: dict[str, tuple[Any, Any]] = {}  # name -> (its host array, its device array or a thunk)

  def slot_numbers(self, index: np.ndarray) -> np.ndarray:
    """`index` (global row numbers, -1 for none) as the slots holding those rows (-1 stays)."""
    index = np.asarray(index)
    slots = index // self.local * self.local_slots + index % self.local
    return np.where(index >= 0, slots, -1).astype(index.dtype)

  def spec(self, names: Iterable[str], routing: tuple[int, int] | None = None,
           trailing: Mapping[str, tuple[int, ...]] | None = None) -> Experience:
    """The abstract [1, N', ...] fields `names` (routing: (L_sparse, k) of routed_experts; trailing: see
    `field_shape`)."""
    slots = self.rows // self.local * self.local_slots
    return spec(names, 1, slots, self.prompt_length, self.response_length, self.mesh, self.rules, routing,
                trailing)

  def of(self, rows: Experience, names: Iterable[str]) -> Experience:
    """The fields `names` of `rows` (this host's [N_h, ...]) on device, [1, N, ...] each (a ragged field as wide
    as its widest row on any host)."""
    names = tuple(names)
    stale = [n for n in names if n not in self._fields or self._fields[n][0] is not getattr(rows, n)]
    if stale:
      routing = tuple(rows.routed_experts.shape[-2:]) if "routed_experts" in stale else None
      host = rows.select(stale)
      ragged = [n for n in stale if n in RAGGED]
      if ragged:
        widths = np.asarray([np.shape(getattr(host, n))[1] for n in ragged], np.float64)
        widths = hosts.process_extrema(widths)[0] if hosts.count() > 1 else widths
        host = host.replace(**{n: widened(getattr(host, n), int(w), RAGGED[n]) for n, w in zip(ragged, widths)})
      trailing = trailing_of(host, stale, self.prompt_length, self.response_length)
      if self.local_slots > self.local:
        host = jax.tree.map(lambda x: np.pad(np.asarray(x), [(0, self.local_slots - self.local)] + [(0, 0)] * (
            np.ndim(x) - 1)), host)
      placed = place(host, self.spec(stale, routing, trailing))
      self._fields.update({n: (getattr(rows, n), getattr(placed, n)) for n in stale})
    for n in names:
      host, held = self._fields[n]
      if callable(held):
        self._fields[n] = (host, held())
    return Experience(**{n: self._fields[n][1] for n in names})

  def adopt(self, name: str, host: Any, whole: Callable[[], jax.Array]) -> None:
    """Keeps field `name`, whose host rows are `host`, as `whole()` gives it on device (called when first
    asked for)."""
    self._fields[name] = (host, whole)


def concatenate(parts: list[Experience]) -> Experience:
  """The rows of `parts` one after another: the fields all parts hold, and the reward components all returned."""
  names = [n for n in parts[0].present() if n != "reward_components" and all(getattr(p, n) is not None for p in parts)]
  widths = {n: max(np.shape(getattr(p, n))[1] for p in parts) for n in names if n in RAGGED}
  out = {n: np.concatenate([widened(getattr(p, n), widths[n], RAGGED[n]) if n in widths else getattr(p, n)
                            for p in parts]) for n in names}
  components = [p.reward_components or {} for p in parts]
  out["reward_components"] = {k: np.concatenate([c[k] for c in components])
                              for k in components[0] if all(k in c for c in components[1:])}
  return Experience(**out)
