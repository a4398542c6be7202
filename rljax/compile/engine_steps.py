"""The rollout engine's programs at the shapes a rollout runs them, as `rljax.compile` lowers them.

`engine_steps` lists them on abstract arguments: prefill at every bucket (with images too, for a vision-language
model), insertion, the decode loop and one decode step, and the appends of a multi-turn rollout; `append_step` is
one append. The compile plan lowers each for a TPU topology and reads its memory, collectives and HBM traffic.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rljax.models import vision

from rljax.rollout import sampling
from rljax.rollout.engine import Engine
from rljax.sharding.placement import Step, abstract


def engine_steps(engine: Engine, params: Any, steps_per_call: int = 1, how: sampling.SamplingParams | None = None,
                 samples_per_prompt: int = 1, appending: int | None = None,
                 image_patches: int | None = None) -> list[Step]:
  """The engine's jitted calls on abstract arguments, at the shapes a rollout uses.

  Prefill at every bucket for a full refill (the prompts of
  `max_concurrent_decodes` requests of `samples_per_prompt` samples each,
  padded to a power of two rows as the sampler pads them), insertion
  into every slot, the decode loop of
  `steps_per_call` steps (what a rollout calls), and one decode step
  (its HBM traffic is a step's), and an append at each of
  `append_buckets` over all slots and over the rows of `appending` slots
  spread over the shards (default: the most rows an append runs over
  without running over all slots). `params` are arrays or ShapeDtypeStructs
  with shardings, taken in the compute dtype as the sampler passes them
  (`Engine.compute_params`). `image_patches`: a vision-language engine's
  prefill with images too, each row holding that many patches
  (`image_prefill_step`).
  """
  how = how or engine.sampling_params
  slots, layout = engine.max_concurrent_decodes, engine.layout
  # a full refill's requests span at most slots / n + 1 prompts
  rows = 1 << max(0, (min(slots, -(-slots // samples_per_prompt) + 1) - 1).bit_length())
  replicated = NamedSharding(engine.mesh, PartitionSpec())
  rows_sh = layout.sharding(("batch",), (rows,))
  params = engine.compute_params(abstract(params))
  state = engine.abstract_decode_state()
  out = []
  for bucket in engine.buckets:
    tokens = jax.ShapeDtypeStruct((rows, bucket), jnp.int32, sharding=layout.sharding(("batch", None), (rows, bucket)))
    lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rows_sh)
    out.append(Step(f"prefill[{rows}x{bucket}]", engine.prefill_fn(rows, bucket), (params, tokens, lengths)))
    if image_patches and engine.cfg.vision is not None:
      out.append(image_prefill_step(engine, params, rows, bucket, image_patches))
  prefix = abstract(jax.eval_shape(engine.prefill_fn(rows, bucket), params, tokens, lengths),
                    layout.prefix_shardings(rows, bucket))
  source = jax.ShapeDtypeStruct((slots,), jnp.int32, sharding=replicated)
  out.append(Step(f"insert[{rows} into {slots}]", engine.insert_program, (prefix, state, source, source)))
  out.append(Step(f"decode[{slots} slots x {steps_per_call}]", engine.generate_program,
                  (params, state, steps_per_call, how)))
  if steps_per_call > 1:
    out.append(Step(f"decode_step[{slots} slots]", engine.generate_program, (params, state, 1, how)))
  if appending is None:
    per_shard = layout.most_rows_per_shard() or None
  else:
    if appending < 1:
      raise ValueError(f"appending={appending}: the appending slots must be 1 or more")
    per_shard = layout.append_rows_per_shard(range(0, slots, max(1, slots // appending))[:appending])
  for width in engine.append_buckets:
    out.append(append_step(engine, params, width))
    if per_shard:
      out.append(append_step(engine, params, width, per_shard))
  return out


def image_prefill_step(engine: Engine, params: Any, rows: int, bucket: int, patches: int) -> Step:
  """The jitted prefill of `rows` prompts padded to `bucket` tokens whose images hold `patches` patches per row
  (a power of two, as `rljax.models.vision.row_images` pads them), on abstract arguments (`params` in the compute
  dtype): the tower's pass over each row's patches, then the language model's over the tokens."""
  cfg, layout = engine.cfg.vision, engine.layout
  q = vision.patch_bucket(patches, cfg.merge_unit)
  by_row = lambda *shape, dtype=jnp.int32: jax.ShapeDtypeStruct(  # noqa: E731
      (rows, *shape), dtype, sharding=layout.sharding(("batch",) + (None,) * len(shape), (rows, *shape)))
  images = vision.Images(pixels=by_row(q, int(np.prod(cfg.patch_shape)), dtype=jnp.float32),
                         layout=vision.ImageLayout(order=by_row(q), rotary=by_row(q, 4), windows=by_row(q),
                                                   frames=by_row(q), restore=by_row(q // cfg.merge_unit)))
  positions = jax.ShapeDtypeStruct((3, rows, bucket), jnp.int32,
                                   sharding=layout.sharding((None, "batch", None), (3, rows, bucket)))
  return Step(f"image_prefill[{rows}x{bucket}, {q} patches a row]", engine.prefill_fn(rows, bucket, q),
              (params, by_row(bucket), by_row(), images, positions, by_row()))


def append_step(engine: Engine, params: Any, width: int, per_shard: int | None = None) -> Step:
  """The jitted append of a `width`-token chunk on abstract arguments (`params` as `engine_steps` takes them):
  over all slots, or over `per_shard` appending rows of each `cache_batch` shard."""
  params, state = engine.compute_params(abstract(params)), engine.abstract_decode_state()
  slots, layout = engine.max_concurrent_decodes, engine.layout
  if per_shard is None:
    rows, fn, args, name = slots, engine.append_program, (), f"append[{slots} slots x {width}]"
  else:
    rows, fn = per_shard * layout.slot_shards, engine.append_rows_program
    index = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=layout.sharding(("cache_batch",), (rows,)))
    args, name = (index,), f"append[{rows} of {slots} slots x {width}]"
  chunk = jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=layout.sharding(("cache_batch", None), (rows, width)))
  lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=layout.sharding(("cache_batch",), (rows,)))
  return Step(name, fn, (params, state, *args, chunk, lengths))


__all__ = ["append_step", "engine_steps"]
