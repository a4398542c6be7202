"""Continuing what a decode slot or a prefix holds, as pure traced functions the engine jits.

A conversation goes on after a slot's turn has ended (a multi-turn rollout appending a tool's answer): the new
tokens are written after what the cache holds and the logits after the last of them are kept, so the next decode
step samples the model's reply; nothing already cached is recomputed. `append_all` runs over every slot (rows with
nothing to add keep their state), `append_rows` over a few slots copied out of each `cache_batch` shard and back,
`continue_prefix` grows a prefix before it is inserted (JetStream's `prefill(existing_prefix=...)`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from rljax.models import KVCache
from rljax.rollout.decode_state import DecodeState, Prefix, put_rows, take_rows


def to_the_end(tokens: jax.Array, true_lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
  """tokens [N, T] right-padded, true_lengths [N] -> (each row rolled so its tokens end at T, [N, T] bool mask of
  them)."""
  shift = tokens.shape[1] - true_lengths
  rolled = jax.vmap(lambda row, k: jnp.roll(row, k))(tokens, shift)
  return rolled, jnp.arange(tokens.shape[1])[None, :] >= shift[:, None]


def continue_prefix(graphdef: nnx.GraphDef, record_routing: bool, params: Any, prefix: Prefix, tokens: jax.Array,
                    true_lengths: jax.Array) -> Prefix:
  """prefix of N rows x H slots, tokens [N, T] right-padded, true_lengths [N] -> Prefix of N rows x (H + T).

  The new tokens are rolled to the end of their chunk, so each row's last
  position holds its last token and only its logits are computed; the
  chunk's padding sits masked between the held tokens and the new ones.
  """
  length = tokens.shape[1]
  left, mask = to_the_end(tokens, true_lengths)
  grow = lambda x: jnp.pad(x, [(0, length if axis == 2 else 0) for axis in range(x.ndim)])
  held = prefix.cache
  cache = KVCache(k=jax.tree.map(grow, held.k), v=jax.tree.map(grow, held.v),
                  mask=jnp.pad(held.mask, ((0, 0), (0, length))), index=held.index, offset=held.offset)
  model = nnx.merge(graphdef, params)
  logits, cache, routing = model.step(left, cache, attention_mask=mask.astype(jnp.int32), last_only=True,
                                      with_routing=True)
  experts = jnp.concatenate([prefix.experts, routing.experts], axis=1) if record_routing else None
  return Prefix(cache=cache, logits=logits[:, -1].astype(jnp.float32), experts=experts)


def continue_rows(graphdef: nnx.GraphDef, params: Any, cache: KVCache, generated: jax.Array, tokens: jax.Array,
                  lengths: jax.Array) -> tuple[jax.Array, KVCache, jax.Array]:
  """Rows of `cache` continued by tokens[r, :lengths[r]] ([R, T] right-padded, lengths [R]) -> (logits [R, V]
  after each row's last new token, the cache with them written and its write index past the real ones,
  generated + lengths)."""
  mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
  model = nnx.merge(graphdef, params)
  hidden, written = model.step_hidden(tokens, cache, attention_mask=mask.astype(jnp.int32))
  last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)
  logits = model.logits(last)[:, 0].astype(jnp.float32)
  return logits, written._replace(index=cache.index + lengths), generated + lengths


def append_all(graphdef: nnx.GraphDef, max_decode_length: int, params: Any, state: DecodeState, tokens: jax.Array,
               lengths: jax.Array) -> DecodeState:
  """Slot s takes tokens[s, :lengths[s]] after what its cache holds; slots with lengths[s] = 0 keep their state.

  tokens [slots, T] right-padded, lengths [slots]. One model call over all
  slots (the chunk's padding is written masked, and the write index then
  moves past the real tokens only, so later tokens overwrite it); logits
  come from each row's last new token only.
  """
  logits, cache, generated = continue_rows(graphdef, params, state.cache, state.generated, tokens, lengths)
  active = lengths > 0
  return state._replace(cache=cache, logits=jnp.where(active[:, None], logits, state.logits), generated=generated,
                        done=jnp.where(active, generated >= max_decode_length, state.done))


def append_rows(graphdef: nnx.GraphDef, max_decode_length: int, mesh: Mesh, specs: DecodeState, params: Any,
                state: DecodeState, rows: jax.Array, tokens: jax.Array, lengths: jax.Array) -> DecodeState:
  """The appending slots only: row r is slot rows[r] of its `cache_batch` shard (an index within the shard;
  the shard's slot count for a padding row) and takes tokens[r, :lengths[r]].

  rows [R], tokens [R, T], lengths [R], R split over the shards as the slots
  are; `specs`: the decode state's shardings. Each shard copies its R / shards
  appending rows out of its cache (no collective: indices are local), the
  model runs on those rows only, and the rows go back in place (padding rows
  are dropped), so the cost scales with the appending rows, not the slots.
  """
  take = lambda x, sh: take_rows(mesh, x, rows, sh.spec)
  put = lambda x, new, sh: put_rows(mesh, x, rows, new, sh.spec)
  c, cs = state.cache, specs.cache
  held = KVCache(k=jax.tree.map(take, c.k, cs.k), v=jax.tree.map(take, c.v, cs.v), mask=take(c.mask, cs.mask),
                 index=take(c.index, cs.index), offset=None if c.offset is None else take(c.offset, cs.offset))
  logits, cache, generated = continue_rows(graphdef, params, held, take(state.generated, specs.generated), tokens,
                                           lengths)
  return state._replace(
      cache=KVCache(k=jax.tree.map(put, c.k, cache.k, cs.k), v=jax.tree.map(put, c.v, cache.v, cs.v),
                    mask=put(c.mask, cache.mask, cs.mask), index=put(c.index, cache.index, cs.index),
                    offset=c.offset),
      logits=put(state.logits, logits, specs.logits), generated=put(state.generated, generated, specs.generated),
      done=put(state.done, generated >= max_decode_length, specs.done))


__all__ = ["append_all", "append_rows", "continue_prefix", "continue_rows", "to_the_end"]
