"""Clipped value (critic) loss, verl's `compute_value_loss` (spec §4.1).

With `v` the new value predictions, `v_old` the rollout-time values, `R` the
returns and `ε` = `cliprange_value`:

  v_clip      = clip(v, v_old - ε, v_old + ε)
  vf_loss     = 0.5 · agg_loss(max((v - R)², (v_clip - R)²), m, mode, ...)
  vf_clipfrac = masked_mean([(v_clip - R)² > (v - R)²], m)

Gradient wrt `v` on a valid token: `(v - R)·w` where the unclipped term is
the larger, 0 where the clipped term is strictly larger and `v` lies outside
the clip range, with `w` the aggregation weight of the token (`1/N` for
token-mean).
"""

import jax
import jax.numpy as jnp

from rljax.algos.agg import Scalar, agg_loss
from rljax.algos.masked import masked_mean


def clip_by_value(x: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
  """`max(min(x, hi), lo)` with array bounds (verl's `clip_by_value`)."""
  return jnp.maximum(jnp.minimum(x, hi), lo)


def compute_value_loss(
    vpreds: jax.Array,
    returns: jax.Array,
    values: jax.Array,
    response_mask: jax.Array,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Scalar | None = None,
    global_batch_size: Scalar | None = None,
    loss_scale_factor: Scalar | None = None,
) -> tuple[jax.Array, jax.Array]:
  """PPO clipped value loss.

  Args:
    vpreds: float `[B, T]` current critic predictions.
    returns: float `[B, T]` value targets.
    values: float `[B, T]` critic predictions at rollout time.
    response_mask: `[B, T]` mask.
    cliprange_value: ε, `critic.cliprange_value` (verl default 0.5).
    loss_agg_mode: see `agg_loss`.
    dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: global
      normalisation, see `agg_loss`.

  Returns:
    `(vf_loss, vf_clipfrac)`, both scalars.
  """
  valid = response_mask.astype(bool)
  vpreds = jnp.where(valid, vpreds, 0.0)
  returns = jnp.where(valid, returns, 0.0)
  values = jnp.where(valid, values, 0.0)
  vclip = clip_by_value(
      vpreds, values - cliprange_value, values + cliprange_value
  )
  unclipped = (vpreds - returns) ** 2
  clipped = (vclip - returns) ** 2
  vf_loss = 0.5 * agg_loss(
      jnp.maximum(unclipped, clipped),
      response_mask,
      loss_agg_mode,
      dp_size=dp_size,
      batch_num_tokens=batch_num_tokens,
      global_batch_size=global_batch_size,
      loss_scale_factor=loss_scale_factor,
  )
  vf_clipfrac = masked_mean((clipped > unclipped).astype(vpreds.dtype), response_mask)
  return vf_loss, vf_clipfrac
