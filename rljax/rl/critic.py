"""The critic: the policy's architecture with a scalar value head on the last hidden state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models import CausalLM, ModelConfig
from rljax.rl import packing
from rljax.rl.experience import Experience
from rljax.rl.sequences import response_hidden


class ValueModel(nnx.Module):
  """V(s) for every response position: a linear head over the backbone's final hidden states."""

  def __init__(self, backbone: CausalLM, rngs: nnx.Rngs):
    self.backbone = backbone
    d = backbone.cfg.hidden_size
    self.value_head = nnx.Param(jax.random.normal(rngs.params(), (d,), jnp.float32) * 0.02,
                                out_sharding=("embed",), eager_sharding=False)
    self.value_bias = nnx.Param(jnp.zeros((), jnp.float32))

  @property
  def cfg(self) -> ModelConfig:
    return self.backbone.cfg

  def response_values(self, batch: Experience, group_size: int = 1) -> jax.Array:
    """[N, R] value of the state before each response token (group_size: see `response_hidden`; a batch
    holding `packed` tokens runs them, `rl.packing`)."""
    if batch.packed is not None:
      hidden = packing.packed_hidden(self.backbone, batch.packed).astype(jnp.float32)
      return packing.to_rows(hidden @ self.value_head[...] + self.value_bias[...], batch.packed.out_index)
    hidden = response_hidden(self.backbone, batch, group_size).astype(jnp.float32)
    return hidden @ self.value_head[...] + self.value_bias[...]
