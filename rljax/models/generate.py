"""Greedy decoding through the KV cache: a reference for the rollout engine."""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import vision
from rljax.models.transformer import CausalLM, init_cache


def greedy_generate(
    model: CausalLM,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    images: vision.Images | None = None,
    grid_thw: np.ndarray | None = None,
) -> np.ndarray:
  """Greedy continuation of left-padded prompts.

  Args:
    model: the LM.
    input_ids: [B, P] left-padded prompts.
    attention_mask: [B, P] 1 for prompt tokens.
    max_new_tokens: N.
    eos_ids: a row stops (pads with its first eos id) after any of these.
    images: the prompts' images (a vision-language model), with ...
    grid_thw: ... their patch grids [I, 3], which give the M-RoPE positions.

  Returns:
    [B, N] generated ids.
  """
  graphdef, state = nnx.split(model)
  b, p = input_ids.shape
  cache = init_cache(model.cfg, b, p + max_new_tokens)
  positions, offset = None, np.zeros((b, 1), np.int32)
  if images is not None:
    if model.cfg.vision is None or grid_thw is None:
      raise ValueError("images need a vision-language model and their grid_thw")
    positions, deltas = vision.rope_index(input_ids, attention_mask, grid_thw, model.cfg.image_token_id,
                                          model.cfg.vision.spatial_merge_size, model.cfg.hf_top.get("video_token_id"))
    positions, offset = jnp.asarray(positions), deltas[:, None]

  @functools.partial(jax.jit, static_argnames="decoding")
  def step(state, ids, cache, mask, positions, images, decoding=False):
    if decoding:  # the real tokens cached so far, plus the prompt's M-RoPE offset
      positions = jnp.sum(cache.mask, axis=-1, dtype=jnp.int32)[:, None] + jnp.asarray(offset)
    logits, cache = nnx.merge(graphdef, state).step(ids, cache, mask, positions, last_only=True, images=images)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  token, cache = step(state, jnp.asarray(input_ids), cache, jnp.asarray(attention_mask), positions, images)
  eos = np.asarray(list(eos_ids) or [-1])
  out = np.zeros((b, max_new_tokens), np.int32)
  done = np.zeros((b,), bool)
  ones = jnp.ones((b, 1), jnp.int32)
  for i in range(max_new_tokens):
    tok = np.asarray(token)
    out[:, i] = np.where(done, eos[0], tok)
    done |= np.isin(tok, eos)
    if done.all() or i + 1 == max_new_tokens:
      out[:, i + 1:] = eos[0]
      break
    token, cache = step(state, token[:, None], cache, ones, None, None, decoding=True)
  return out
