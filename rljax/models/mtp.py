"""MiMo's multi-token prediction (MTP) layers, as Megatron-LM trains them under verl's model.mtp.

Depth k (1-based) reads, at each position i, the previous depth's final
hidden state (the trunk's, after its final norm, for k = 1) and the
embedding of token i + k, and predicts token i + k + 1 through the shared
LM head: ``input_proj([hidden_norm(h); token_norm(embed(t[i + k]))])``, one
decoder layer over the same positions and attention mask as the trunk, then
``final_norm``. MiMo's checkpoints name them ``model.mtp_layers.{k - 1}.*``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models import weight_quant
from rljax.models.config import ModelConfig
from rljax.models.layers import Block, RMSNorm, make_param
from rljax.sharding.rules import constrain

_RESIDUAL = ("batch", "activation_length", "embed")
_PROJ_INIT = jax.nn.initializers.normal(0.02)


class MTPLayer(nnx.Module):
  """One MTP depth: two input norms, the [2D, D] input projection, a decoder layer and a final norm."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, rngs, dtype=cfg.param_dtype,  # noqa: E731
                           plus_one=cfg.norm_plus_one)
    self.token_norm = norm()
    self.hidden_norm = norm()
    self.input_proj = make_param(rngs, (2 * cfg.hidden_size, cfg.hidden_size), ("embed", "mlp"), _PROJ_INIT,
                                 cfg.param_dtype)
    self.block = Block(cfg, rngs)
    self.final_norm = norm()

  def __call__(self, hidden: jax.Array, embeds: jax.Array, cos: jax.Array, sin: jax.Array, mask) -> jax.Array:
    """hidden [B, T, D] (the previous depth's), embeds [B, T, D] (of the tokens one further on) -> [B, T, D]."""
    joined = jnp.concatenate([self.hidden_norm(hidden), self.token_norm(embeds)], axis=-1)
    x = constrain(joined @ weight_quant.value(self.input_proj, joined.dtype), _RESIDUAL)
    x, _, _ = self.block(x, cos, sin, mask)
    return constrain(self.final_norm(x), _RESIDUAL)


def shifted(input_ids: jax.Array, by: int) -> jax.Array:
  """[B, T] -> [B, T]: each position holds the token `by` places on (0 past the end)."""
  return jnp.concatenate([input_ids[:, by:], jnp.zeros_like(input_ids[:, :by])], axis=1)
