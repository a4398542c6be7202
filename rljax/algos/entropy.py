"""Token entropy and log-probabilities from logits, and the entropy loss.

  entropy(l)        = logsumexp(l) - Σ_v softmax(l)_v · l_v          (spec §0)
  logprob(l, y)     = l_y - logsumexp(l)
  entropy_loss      = agg_loss(entropy(logits), m, loss_agg_mode)     (spec §3.13)

`entropy_from_logits_with_chunking` computes the same entropy over the token
axis in chunks (`lax.map` over `[chunk, V]` blocks, each block rematerialised
in the backward pass; a single chunk is computed once), so the float32
softmax of all `N x V` logits never exists at once: peak temporary memory is
`O(chunk · V)` instead of `O(N · V)`.

Both compute in float32 whatever the logits' dtype (verl computes the
unchunked entropy in the logits' dtype; for float32 logits the two agree).
"""

import jax
import jax.numpy as jnp

from rljax.algos.agg import agg_loss


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of `softmax(logits)` over the last axis.

  `H = logsumexp(l) - Σ_v softmax(l)_v · l_v`.

  Args:
    logits: `[..., V]`, e.g. `[B, T, V]`.

  Returns:
    float32 `[...]`, e.g. `[B, T]`.
  """
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  probs = jax.nn.softmax(logits, axis=-1)
  return lse - jnp.sum(probs * logits, axis=-1)


def map_token_chunks(fn, arrays: tuple[jax.Array, ...], chunk_size: int):
  """`fn(*arrays)` computed on at most `chunk_size` rows at a time (`lax.map`).

  Every array is `[N, ...]` with the same N; `fn` maps `[chunk, ...]` slices
  to a pytree of `[chunk, ...]` arrays. N is split into the fewest chunks
  of at most `chunk_size` rows, as equal as can be (padding under one row
  per chunk), zero-padded to whole chunks and the padding cut from the
  outputs. Each
  chunk is rematerialised in the backward pass (`jax.checkpoint`), so
  neither pass holds more than one chunk's intermediates (e.g. `[chunk, V]`
  logits). When N fits in one chunk, `fn` runs once on the arrays as they
  are: recomputing would save no memory.

  Args:
    fn: function of `len(arrays)` chunk arrays.
    arrays: tuple of `[N, ...]` arrays.
    chunk_size: most rows per chunk (static).

  Returns:
    The pytree `fn` returns, with `[N, ...]` leaves.
  """
  n = arrays[0].shape[0]
  if chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size}: must be a positive number of tokens")
  num_chunks = max(1, -(-n // chunk_size))
  chunk = -(-n // num_chunks)
  if num_chunks == 1:
    return fn(*arrays)
  pad = num_chunks * chunk - n
  chunked = tuple(
      jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(
          (num_chunks, chunk) + a.shape[1:]
      )
      for a in arrays
  )
  out = jax.lax.map(jax.checkpoint(lambda xs: fn(*xs)), chunked)
  return jax.tree.map(
      lambda o: o.reshape((num_chunks * chunk,) + o.shape[2:])[:n], out
  )


def entropy_from_logits_with_chunking(
    logits: jax.Array, chunk_size: int = 2048
) -> jax.Array:
  """`entropy_from_logits` computed `chunk_size` tokens at a time.

  Args:
    logits: `[..., V]`; all leading axes are flattened into the token axis.
    chunk_size: most tokens per chunk (static; equal chunks, as `map_token_chunks` cuts them).

  Returns:
    float32 `[...]`, equal to `entropy_from_logits(logits)`.
  """
  lead = logits.shape[:-1]
  flat = logits.reshape((-1, logits.shape[-1]))
  out = map_token_chunks(entropy_from_logits, (flat,), chunk_size)
  return out.reshape(lead)


def logprobs_from_logits(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Log-probability of each label: `l[label] - logsumexp(l)`, in float32.

  Args:
    logits: `[..., V]`.
    labels: int `[...]`.

  Returns:
    float32 `[...]`.
  """
  logits = logits.astype(jnp.float32)
  picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def compute_entropy_loss(
    logits: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
) -> jax.Array:
  """Aggregated token entropy, verl's `compute_entropy_loss`.

  `agg_loss(entropy_from_logits(logits), m, loss_agg_mode)`; no global-batch
  normalisation (as in verl; `ppo_loss` aggregates a given entropy with it).

  Args:
    logits: `[B, T, V]`.
    response_mask: `[B, T]`.
    loss_agg_mode: see `agg_loss`.

  Returns:
    Scalar entropy (to be subtracted, times `entropy_coeff`, from the loss).
  """
  return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
