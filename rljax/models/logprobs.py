"""Token log-probs and entropy without materialising [B, T, V] float32 logits.

For tokens n with final hidden state h_n and LM-head weight W [V, D]:

  z_n = W h_n / temperature               logits, [V]
  log p_n = z_n[y_n] - logsumexp(z_n)
  H_n = logsumexp(z_n) - sum_v softmax(z_n)_v z_n,v

Tokens are processed in equal chunks of at most ``chunk_size``
(``rljax.algos.entropy.map_token_chunks``), and each chunk is
rematerialised in the backward pass, so at any time only one [chunk, V]
block of logits (and its softmax) is alive. When all tokens fit in one
chunk there is nothing to save by recomputing, and the logits are computed
once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.algos.entropy import map_token_chunks


def _chunk_stats(
    h: jax.Array, targets: jax.Array, weight: jax.Array, temperature: float,
    with_entropy: bool,
) -> tuple[jax.Array, jax.Array]:
  """(log_probs [C], entropy [C]) for hidden [C, D], weight [V, D], targets [C]."""
  logits = jnp.einsum("cd,vd->cv", h, weight, preferred_element_type=jnp.float32)
  logits = logits.astype(jnp.float32) / temperature
  lse = jax.nn.logsumexp(logits, axis=-1)
  target = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
  if not with_entropy:
    return target - lse, jnp.zeros_like(lse)
  probs = jnp.exp(logits - lse[:, None])
  entropy = lse - jnp.sum(probs * logits, axis=-1)
  return target - lse, entropy


@functools.partial(jax.jit, static_argnames=("chunk_size", "temperature", "with_entropy"))
def token_log_probs(
    hidden: jax.Array,
    weight: jax.Array,
    targets: jax.Array,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Log-probs of ``targets`` and the entropy of each next-token distribution.

  Args:
    hidden: [B, T, D] final hidden states (after the final norm).
    weight: [V, D] LM-head weight (``CausalLM.lm_head_weight()``).
    targets: [B, T] int token ids to score (the next tokens).
    chunk_size: most tokens per chunk (`map_token_chunks`); peak extra memory
      is about 3-4 * chunk_size * V float32 values (4 with the entropy).
    temperature: logits are divided by it first (as verl does).
    with_entropy: compute the entropy (zeros otherwise; skips a [C, V] pass).

  Returns:
    (log_probs [B, T], entropy [B, T]), float32; differentiable in hidden and
    weight.
  """
  b, t, d = hidden.shape
  stats = functools.partial(_chunk_stats, weight=weight, temperature=temperature, with_entropy=with_entropy)
  logp, ent = map_token_chunks(stats, (hidden.reshape(b * t, d), targets.reshape(b * t)), chunk_size)
  return logp.reshape(b, t), ent.reshape(b, t)


def naive_token_log_probs(
    hidden: jax.Array, weight: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
  """Reference: full [B, T, V] float32 logits. Same signature and results."""
  logits = jnp.einsum("btd,vd->btv", hidden, weight,
                      preferred_element_type=jnp.float32).astype(jnp.float32) / temperature
  logp_all = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, entropy
