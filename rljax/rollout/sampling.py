"""Token sampling: temperature, top-k, top-p and greedy, with log-probs.

verl's rollout keys: `temperature`, `top_k` (-1 or 0 = off), `top_p`
(1.0 = off), `do_sample` (False = greedy). The returned log-probability of a
sampled token is the one verl's actor recomputes for it,
`log_softmax(logits / temperature)[token]` (plain `log_softmax(logits)` when
greedy), before any top-k/top-p filtering, so rollout and training
log-probs are comparable for rollout importance-sampling correction.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings (hashable: they are compile-time constants).

  Attributes:
    temperature: softmax temperature; 0 means greedy.
    top_k: keep the k most likely tokens; -1 or 0 keeps all.
    top_p: keep the smallest set whose probability reaches top_p; 1.0 keeps all.
    greedy: argmax decoding (verl's do_sample=False).
  """

  temperature: float = 1.0
  top_k: int = -1
  top_p: float = 1.0
  greedy: bool = False

  @classmethod
  def from_rollout_config(cls, node) -> "SamplingParams":
    """From `actor_rollout_ref.rollout` or its `val_kwargs`."""
    greedy = (not node.do_sample) or node.temperature == 0
    return cls(temperature=float(node.temperature), top_k=int(node.top_k),
               top_p=float(node.top_p), greedy=bool(greedy))


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
  """[N, V] -> logits outside each row's k largest set to -inf (ties kept)."""
  if k <= 0 or k >= logits.shape[-1]:
    return logits
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  return jnp.where(logits < kth, NEG_INF, logits)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
  """[N, V] -> logits outside the nucleus set to -inf.

  The nucleus is the most likely tokens, in order, up to and including the
  first one at which the cumulative probability reaches p.
  """
  if p >= 1.0:
    return logits
  order = jnp.argsort(-logits, axis=-1)
  sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs
  keep_sorted = before < p
  keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
  return jnp.where(keep, logits, NEG_INF)


CDF_BLOCK = 128


def _last_positive(x: jax.Array) -> jax.Array:
  """[N, M] -> [N] index of each row's last positive entry (0 if none)."""
  m = x.shape[-1]
  return jnp.maximum(m - 1 - jnp.argmax(x[:, ::-1] > 0, axis=-1), 0)


def inverse_cdf_index(probs: jax.Array, u: jax.Array, block: int = CDF_BLOCK) -> jax.Array:
  """[N, V] probabilities, [N] u in [0, 1] -> [N] int32: the first token whose CDF exceeds u * total.

  Two levels instead of a cumulative sum over the vocabulary (a slow scan
  on the CPU): the cumulative mass of blocks of `block` tokens picks the
  block, then a cumulative sum inside that block picks the token. Where
  float32 rounding would run past the mass (u at or near 1), the draw stays on the
  last token of positive probability, so a filtered token is never drawn.
  """
  n, v = probs.shape
  blocks = -(-v // block)
  tiles = jnp.pad(probs, ((0, 0), (0, blocks * block - v))).reshape(n, blocks, block)
  mass = tiles.sum(axis=-1)
  cum = jnp.cumsum(mass, axis=-1)
  target = (u * cum[:, -1])[:, None]
  b = jnp.minimum(jnp.sum(cum <= target, axis=-1), _last_positive(mass))
  before = jnp.where(b > 0, jnp.take_along_axis(cum, jnp.maximum(b - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
  inside = jnp.take_along_axis(tiles, b[:, None, None], axis=1)[:, 0]
  cdf = before[:, None] + jnp.cumsum(inside, axis=-1)
  t = jnp.minimum(jnp.sum(cdf <= target, axis=-1), _last_positive(inside))
  return (b * block + t).astype(jnp.int32)


def inverse_cdf_sample(keys: jax.Array, probs: jax.Array) -> jax.Array:
  """[N] PRNG keys, [N, V] probabilities -> [N] int32 draws, one uniform number per row from its own key.

  One uniform per row instead of V Gumbel draws (the PRNG dominates a CPU
  decode step otherwise); `inverse_cdf_index` maps it to a token.
  """
  return inverse_cdf_index(probs, jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys))


def sample(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row.

  Args:
    keys: [N] PRNG keys, one per row.
    logits: [N, V] next-token logits.
    params: sampling settings.

  Returns:
    (tokens [N] int32, log-probs [N] float32 of those tokens under
    log_softmax(logits / temperature)).
  """
  logits = logits.astype(jnp.float32)
  if params.greedy:
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits
  else:
    scaled = logits / params.temperature
    filtered = top_p_filter(top_k_filter(scaled, params.top_k), params.top_p)
    tokens = inverse_cdf_sample(keys, jax.nn.softmax(filtered, axis=-1))
  logp = jax.nn.log_softmax(scaled, axis=-1)
  return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
