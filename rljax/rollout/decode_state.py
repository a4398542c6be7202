"""The decode state and its cache layout: what a rollout engine's decode slots hold and where it lives.

`DecodeState` holds a KV cache of L arrays `[slots, K, S, head_dim]` (with
`kv_cache_dtype` int8 or float8, 8-bit values with a scale per token and
head, `rljax.models.kv_quant`), the next-token logits of every slot and
per-slot counters; a `Prefix` is a prefilled request's (or N requests')
cache rows. `CacheLayout` lays them out on the engine's mesh; an append
over a few slots copies their rows out of each shard and back
(`rows_by_shard`, `take_rows`, `put_rows`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.models import KVCache, ModelConfig, init_cache, kv_quant
from rljax.models.kv_quant import QuantizedKV
from rljax.models.transformer import CACHE_AXES
from rljax.sharding import rules as rules_lib


class Prefix(NamedTuple):
  """A prefilled request (or N of them).

  Attributes:
    cache: KVCache with N rows of `bucket` slots (left-padded; `index` = bucket).
    logits: [N, V] float32 next-token logits after the prompt.
    experts: with record_routing, [N, bucket, L_sparse, k] int32 experts of
      each (left-padded) prompt position; else None.
  """

  cache: KVCache
  logits: jax.Array
  experts: jax.Array | None = None


class DecodeState(NamedTuple):
  """Everything `generate` transforms.

  Attributes:
    cache: KVCache, L arrays [slots, K, S, head_dim] (+ mask [slots, S], index [slots]).
    logits: [slots, V] float32 next-token logits per slot.
    generated: [slots] int32, tokens generated so far.
    done: [slots] bool, True for empty or finished slots.
    key: the rollout's PRNG key; request r samples from its own stream `fold_in(key, r)`, so a response does
      not depend on which slot, batch or host decodes it.
    slot_keys: [slots] PRNG keys, each slot's request's stream (advanced once per token it samples).
    requests: int32, requests inserted so far (the id of a request inserted without one).
  """

  cache: KVCache
  logits: jax.Array
  generated: jax.Array
  done: jax.Array
  key: jax.Array
  slot_keys: jax.Array
  requests: jax.Array


class StepOutput(NamedTuple):
  """One decode step for every slot: token, validity, log-prob, count (and with record_routing the experts
  [slots, L_sparse, k] the token went to when it was fed)."""

  tokens: jax.Array
  valid: jax.Array
  log_probs: jax.Array
  generated: jax.Array
  experts: jax.Array | None = None


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length."""
  for bucket in buckets:
    if bucket >= length:
      return bucket
  raise ValueError(f"a prompt of {length} tokens exceeds the largest prefill bucket {buckets[-1]} "
                   "(actor_rollout_ref.rollout.prefill_length_buckets / data.max_prompt_length)")


def pad_to_bucket(ids: Sequence[int], buckets: Sequence[int], pad_id: int) -> np.ndarray:
  """[len(ids)] -> [bucket] right-padded with pad_id."""
  bucket = bucket_for(len(ids), buckets)
  out = np.full((bucket,), pad_id, np.int32)
  out[:len(ids)] = ids
  return out


def cache_length(length: int, attention_kernel: str) -> int:
  """KV-cache slots for prompts and responses of `length` tokens: whole decode-kernel blocks under `pallas`."""
  return -(-length // 128) * 128 if attention_kernel == "pallas" else length


class CacheLayout:
  """Where the decode state's arrays live on the engine's mesh: slots over the `cache_batch` rule (data x fsdp),
  KV heads over tensor (the decode rules' layout); and the state's empty value."""

  def __init__(self, cfg: ModelConfig, mesh: Mesh, rules: rules_lib.Rules | None, slots: int, length: int,
               kv_cache_dtype: Any, record_routing: bool, seed: int):
    """`slots` decode slots of `length` cache positions each, in `kv_cache_dtype` (8-bit: values and scales);
    `record_routing`: prefixes hold their prompts' experts; `seed`: the state's PRNG key."""
    self.cfg, self.mesh, self.rules = cfg, mesh, rules
    self.slots, self.length, self.kv_cache_dtype = slots, length, kv_cache_dtype
    self.record_routing, self.seed = record_routing, seed
    # a vision-language model's slots carry their prompt's M-RoPE offset (KVCache.offset)
    self.offsets = cfg.vision is not None
    spec = self.sharding(("cache_batch",), (slots,)).spec
    # how many `cache_batch` shards the slots are split into (each holds slots / slot_shards of them)
    self.slot_shards = math.prod(mesh.shape[a] for a in rules_lib.spec_axes(spec[0] if spec else None))

  def sharding(self, names: tuple[str | None, ...], shape: tuple[int, ...]) -> NamedSharding:
    """The NamedSharding of an array of logical axes `names` and `shape` under the cache's rules."""
    rules = rules_lib.with_cache_batch(self.rules)
    return NamedSharding(self.mesh, rules_lib.logical_to_spec(names, shape, self.mesh, rules))

  def kv_shardings(self, rows: int, length: int) -> tuple[Any, ...]:
    """NamedShardings of a cache's L layers of keys (or values) for `rows` rows of `length` slots (the values'
    and the scales' of an 8-bit cache)."""
    cfg = self.cfg
    shape = (rows, cfg.num_kv_heads, length, cfg.head_dim)
    layer = self.sharding(CACHE_AXES, shape)
    if kv_quant.is_quantized(self.kv_cache_dtype):
      layer = QuantizedKV(values=layer, scale=self.sharding(CACHE_AXES[:3], shape[:3]))
    return (layer,) * cfg.num_layers

  def decode_state_shardings(self) -> DecodeState:
    """NamedShardings of the decode state."""
    cfg, slots, length = self.cfg, self.slots, self.length
    kv = self.kv_shardings(slots, length)
    per_slot = self.sharding(("cache_batch",), (slots,))
    replicated = NamedSharding(self.mesh, PartitionSpec())
    return DecodeState(
        cache=KVCache(k=kv, v=kv, mask=self.sharding(("cache_batch", "length"), (slots, length)), index=per_slot,
                      offset=per_slot if self.offsets else None),
        logits=self.sharding(("cache_batch", "vocab"), (slots, cfg.vocab_size)),
        generated=per_slot, done=per_slot, key=replicated, slot_keys=replicated, requests=replicated)

  def prefix_shardings(self, rows: int, bucket: int) -> Prefix:
    """NamedShardings of a prefill's output for `rows` prompts of `bucket` tokens."""
    cfg = self.cfg
    kv = self.kv_shardings(rows, bucket)
    per_row = self.sharding(("cache_batch",), (rows,))
    experts = (self.sharding(("cache_batch", None, None, None), (rows, bucket, *cfg.routing_shape))
               if self.record_routing else None)
    return Prefix(cache=KVCache(k=kv, v=kv, mask=self.sharding(("cache_batch", "length"), (rows, bucket)),
                                index=per_row, offset=per_row if self.offsets else None),
                  logits=self.sharding(("cache_batch", "vocab"), (rows, cfg.vocab_size)), experts=experts)

  def empty_state(self) -> DecodeState:
    """Empty slots, all marked done (traced: jit it with `decode_state_shardings` to place it)."""
    cfg, slots = self.cfg, self.slots
    cache = init_cache(cfg, slots, self.length, self.kv_cache_dtype)
    return DecodeState(
        cache=cache._replace(offset=jnp.zeros((slots,), jnp.int32)) if self.offsets else cache,
        logits=jnp.zeros((slots, cfg.vocab_size), jnp.float32),
        generated=jnp.zeros((slots,), jnp.int32),
        done=jnp.ones((slots,), bool),
        key=jax.random.key(self.seed),
        slot_keys=jax.random.split(jax.random.key(self.seed), slots),
        requests=jnp.zeros((), jnp.int32))

  def most_rows_per_shard(self) -> int:
    """The most rows per shard an append runs over alone (the largest power of two up to a quarter of a shard's
    slots; 0: none): more run over all slots in place (about as cheap as copying that many rows out and back),
    and no copy of the cache is made."""
    quarter = (self.slots // self.slot_shards) // 4
    return 1 << (quarter.bit_length() - 1) if quarter else 0

  def append_rows_per_shard(self, slots: Sequence[int]) -> int | None:
    """Rows per shard an append of `slots` runs over (the smallest power of two holding the most appending slots
    of one shard), or None when that is more than `most_rows_per_shard`: the append then runs over all slots."""
    local = self.slots // self.slot_shards
    most = max(np.bincount(np.asarray(slots, np.int64) // local, minlength=self.slot_shards), default=0)
    rows = 1 << max(0, int(most) - 1).bit_length()
    return rows if rows <= self.most_rows_per_shard() else None


def rows_by_shard(slots: Sequence[int], local: int, shards: int, per_shard: int) -> tuple[np.ndarray, np.ndarray]:
  """(rows [shards * per_shard]: each appending slot's index within its shard of `local` slots, `local` for
  padding; order: the slot each row is, -1 for padding), shard by shard as the slots are split."""
  rows = np.full((shards, per_shard), local, np.int32)
  order = np.full((shards, per_shard), -1, np.int64)
  for shard in range(shards):
    mine = [s for s in slots if s // local == shard]
    rows[shard, :len(mine)] = np.asarray(mine, np.int64) - shard * local
    order[shard, :len(mine)] = mine
  return rows.reshape(-1), order.reshape(-1)


def take_rows(mesh: Mesh, x: jax.Array, rows: jax.Array, spec: PartitionSpec) -> jax.Array:
  """x's rows `rows` [R] (indices within each shard of x's first axis; R split as that axis is) -> [R, ...] laid
  out as x, gathered on each device from its own shard."""
  lead = PartitionSpec(spec[0] if spec else None)
  return jax.shard_map(lambda a, r: jnp.take(a, r, axis=0, mode="clip"), mesh=mesh, in_specs=(spec, lead),
                       out_specs=spec, check_vma=False)(x, rows)


def put_rows(mesh: Mesh, x: jax.Array, rows: jax.Array, new: jax.Array, spec: PartitionSpec) -> jax.Array:
  """x with its rows `rows` (indices within each shard, as `take_rows` reads them) set to `new` [R, ...] in
  place on each device; rows past a shard's end (padding) are dropped."""
  lead = PartitionSpec(spec[0] if spec else None)
  return jax.shard_map(lambda a, r, b: a.at[r].set(b, mode="drop"), mesh=mesh, in_specs=(spec, lead, spec),
                       out_specs=spec, check_vma=False)(x, rows, new)


__all__ = ["CacheLayout", "DecodeState", "Prefix", "StepOutput", "bucket_for", "cache_length", "pad_to_bucket",
           "put_rows", "rows_by_shard", "take_rows"]
