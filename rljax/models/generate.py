"""Greedy decoding through the KV cache: a reference for the rollout engine."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models.transformer import CausalLM, init_cache


def greedy_generate(
    model: CausalLM,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
) -> np.ndarray:
  """Greedy continuation of left-padded prompts.

  Args:
    model: the LM.
    input_ids: [B, P] left-padded prompts.
    attention_mask: [B, P] 1 for prompt tokens.
    max_new_tokens: N.
    eos_ids: a row stops (pads with its first eos id) after any of these.

  Returns:
    [B, N] generated ids.
  """
  graphdef, state = nnx.split(model)
  b, p = input_ids.shape
  cache = init_cache(model.cfg, b, p + max_new_tokens)

  @jax.jit
  def step(state, ids, cache, mask):
    logits, cache = nnx.merge(graphdef, state).step(ids, cache, mask, last_only=True)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  token, cache = step(state, jnp.asarray(input_ids), cache, jnp.asarray(attention_mask))
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
    token, cache = step(state, token[:, None], cache, ones)
  return out
