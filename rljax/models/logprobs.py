"""Token log-probs and entropy without materialising [B, T, V] float32 logits.

For tokens n with final hidden state h_n and LM-head weight W [V, D]:

  z_n = cap(W h_n) / temperature          logits, [V]
  log p_n = z_n[y_n] - logsumexp(z_n)
  H_n = logsumexp(z_n) - sum_v softmax(z_n)_v z_n,v

or in a forward pass that takes no gradient (``sum_pi_squared``), in the entropy's place,

  S_n = sum_v softmax(z_n)_v^2 = exp(logsumexp(2 z_n) - 2 logsumexp(z_n))

(verl's ``calculate_sum_pi_squared_from_logits``, read by the optimal-token-baseline estimators).

The sequence axis is cut into equal chunks (``chunk_layout``) of about
``chunk_size`` tokens per device: every chunk keeps all B rows, so a batch
sharded over devices stays sharded and each device computes the logits of
its own rows ([rows per device, chunk, V], vocabulary split by the tensor
rule). The weight is cast to the hidden states' dtype and gathered once
(not per chunk). The backward pass is written out (``jax.custom_vjp``): it
walks the vocabulary in blocks instead, from each token's logsumexp and
expected logit saved by the forward pass; a block's logits for every token,
its share of the hidden gradient, and its weight gradient, which is
reduce-scattered to the weight's sharding as soon as the block is done
(laid out [D, block] while it is reduced, and compiled with
``rljax.sharding.gradient_compiler_options``: TPU would otherwise lower
some of these reduce-scatters as all-reduces). No
[V, D] partial sum is ever held, and only about chunk_size x V logits are
alive at once in either pass. With p = softmax(z), the logit gradients are

  d log p_n / d z_n = onehot(y_n) - p_n
  d H_n / d z_n = -p_n * (z_n - sum_v p_n,v z_n,v)

divided by the temperature for the raw logits W h_n. cap is the identity, or
with a softcap c (``ModelConfig.final_logit_softcapping``, Gemma) c * tanh(x / c),
whose derivative 1 - (cap(x) / c)^2 multiplies the gradients above.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rljax.sharding.rules import batch_shards, constrain, gather, reduce_partials, relayout, vocab_shards

_HIDDEN = ("batch", "length", "embed")
_RESIDUAL = ("batch", "activation_length", "embed")  # the residual stream's layout (sequence-split under TP)
_LOGITS = ("batch", "length", "vocab")
# the backward pass's views, the vocabulary as [parts, V / parts] (parts: its split over devices)
_SPLIT_WEIGHT = ("vocab", None, None)
_SPLIT_LOGITS = ("batch", "length", "vocab", None)
_PARTIAL_WEIGHT = ("batch", None, "vocab", None)
_WEIGHT_T = ("embed", "vocab", None)


def chunk_layout(tokens: int, chunk_size: int) -> tuple[int, int]:
  """(chunks, rows per chunk): the fewest chunks of at most chunk_size rows, as equal as can be.

  Padding is then under one row per chunk (2 chunks of 768 for 1536 rows,
  not 2 of 1024 with 512 padding rows computed for nothing).
  """
  if chunk_size < 1:
    raise ValueError(f"chunk_size={chunk_size}: must be a positive number of tokens")
  chunks = max(1, -(-tokens // chunk_size))
  return chunks, -(-tokens // chunks)


def _cap(z: jax.Array, softcap: float | None) -> jax.Array:
  """softcap * tanh(z / softcap), or z when softcap is None."""
  return z if softcap is None else softcap * jnp.tanh(z / softcap)


def _logits(h: jax.Array, weight: jax.Array, temperature: float, softcap: float | None) -> jax.Array:
  """[B, C, V] float32 cap(logits) / temperature for hidden [B, C, D] and weight [V, D]."""
  z = jnp.einsum("bcd,vd->bcv", relayout(h, _HIDDEN, _RESIDUAL), weight, preferred_element_type=jnp.float32)
  return constrain(_cap(z.astype(jnp.float32), softcap) / temperature, _LOGITS)


# the second output of a pass: the entropy, Σ_v π_v² (forward passes only), or zeros
ENTROPY, SUM_PI_SQUARED, NOTHING = "entropy", "sum_pi_squared", "nothing"


def _expected_logit(z: jax.Array, lse: jax.Array, second: str) -> jax.Array:
  """[B, C] sum_v softmax(z)_v z_v where the entropy is asked for (zeros otherwise: the backward pass reads it)."""
  return jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1) if second == ENTROPY else jnp.zeros_like(lse)


def _second(z: jax.Array, lse: jax.Array, mean: jax.Array, second: str) -> jax.Array:
  """[B, C] the pass's second output from logits z [B, C, V], their logsumexp and expected logit."""
  if second == ENTROPY:
    return lse - mean
  if second == SUM_PI_SQUARED:
    return jnp.exp(jax.nn.logsumexp(2.0 * z, axis=-1) - 2.0 * lse)
  return jnp.zeros_like(lse)


def _chunk_stats(h: jax.Array, targets: jax.Array, weight: jax.Array, temperature: float,
                 second: str, softcap: float | None) -> tuple[jax.Array, jax.Array]:
  """(log_probs [B, C], second output [B, C]) for hidden [B, C, D], weight [V, D], targets [B, C]."""
  z = _logits(h, weight, temperature, softcap)
  lse = jax.nn.logsumexp(z, axis=-1)
  target = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
  return target - lse, _second(z, lse, _expected_logit(z, lse, second), second)


def _split(x: jax.Array, chunks: int, width: int) -> jax.Array:
  """[B, T, ...] -> [chunks, B, width, ...], T zero-padded to chunks * width."""
  pad = chunks * width - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return jnp.moveaxis(x.reshape(x.shape[0], chunks, width, *x.shape[2:]), 1, 0)


def _join(x: jax.Array, length: int) -> jax.Array:
  """[chunks, B, width, ...] -> [B, length, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _gathered(weight: jax.Array, dtype) -> jax.Array:
  """The LM-head weight in the compute dtype, whole over the batch axes (one gather, not one per chunk)."""
  return gather(weight.astype(dtype), ("vocab", "embed"))


def _vocab_blocks(vocab: int, tokens: int, chunk_size: int) -> tuple[int, int]:
  """(blocks, rows per block) of the LM head for the backward pass: about chunk_size * V logits at a time.

  Blocks are equal and, when there are several, whole multiples of 128 rows
  (TPU tiles), so each reduce-scatters as one; the last block is moved back
  to end at V, and the rows it shares with its neighbour count once.
  """
  block = min(vocab, max(128, -(-(chunk_size * vocab // max(1, tokens)) // 128) * 128))
  blocks = -(-vocab // block)
  return blocks, vocab if blocks == 1 else -(-vocab // (blocks * 128)) * 128


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def _chunked(hidden, weight, targets, chunks, width, temperature, second, chunk_size, softcap):
  return _chunked_fwd(hidden, weight, targets, chunks, width, temperature, second, chunk_size, softcap)[0]


def _chunked_fwd(hidden, weight, targets, chunks, width, temperature, second, chunk_size, softcap):
  """Token chunks: each keeps its logsumexp and expected logit for the backward pass."""
  del chunk_size
  gathered = _gathered(weight, hidden.dtype)

  def stats(h, y):
    z = _logits(h, gathered, temperature, softcap)
    lse = jax.nn.logsumexp(z, axis=-1)
    target = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0]
    mean = _expected_logit(z, lse, second)
    return target - lse, _second(z, lse, mean, second), lse, mean

  out = jax.lax.map(lambda xs: stats(*xs), (_split(hidden, chunks, width), _split(targets, chunks, width)))
  logp, other, lse, mean = (_join(x, hidden.shape[1]) for x in out)
  return (logp, other), (hidden, weight, gathered, targets, lse, mean)


def _chunked_bwd(chunks, width, temperature, second, chunk_size, softcap, residuals, cotangents):
  """Vocabulary blocks: each block's logits for every token of the micro-batch, the hidden gradient summed over
  blocks, and the block's weight gradient reduce-scattered as soon as it is complete (no [V, D] partial sum
  is ever held).

  With the vocabulary split over devices (tensor parallelism), each device
  walks the blocks of its own part: the weight is viewed [shards, V / shards,
  D] and the loop slices the second axis, which no device splits.
  """
  del chunks, width
  hidden, weight, gathered, targets, lse, mean = residuals
  g_logp, g_ent = (g.astype(jnp.float32) for g in cotangents)
  b, t, d = hidden.shape
  vocab = weight.shape[0]
  shards = batch_shards(b)
  parts_of_vocab = vocab_shards(vocab)
  local = vocab // parts_of_vocab
  blocks, block = _vocab_blocks(local, max(1, b // shards) * t, chunk_size * parts_of_vocab)
  split = constrain(gathered.reshape(parts_of_vocab, local, d), _SPLIT_WEIGHT)
  offsets = (jnp.arange(parts_of_vocab) * local)[:, None]

  def body(carry, index):
    dh, dw = carry
    first = index * block
    start = jnp.minimum(first, local - block)  # the last block ends at the part's end, overlapping its neighbour
    local_ids = start + jnp.arange(block)
    w = jax.lax.dynamic_slice_in_dim(split, start, block, axis=1)
    capped = _cap(jnp.einsum("btd,pvd->btpv", hidden, w, preferred_element_type=jnp.float32).astype(jnp.float32),
                  softcap)
    z = constrain(capped / temperature, _SPLIT_LOGITS)
    p = jnp.exp(z - lse[..., None, None])
    dz = g_logp[..., None, None] * ((targets[..., None, None] == offsets + local_ids).astype(jnp.float32) - p)
    if second == ENTROPY:  # Σπ² is a forward pass's alone (`token_log_probs` stops its gradient)
      dz = dz - g_ent[..., None, None] * p * (z - mean[..., None, None])
    if softcap is not None:
      dz = dz * (1.0 - jnp.square(capped / softcap))
    dz = constrain(jnp.where(local_ids >= first, dz / temperature, 0.0), _SPLIT_LOGITS).astype(hidden.dtype)
    dh = dh + constrain(jnp.einsum("btpv,pvd->btd", dz, w, preferred_element_type=jnp.float32), _RESIDUAL)
    parts = jnp.einsum("sbtpv,sbtd->sdpv", dz.reshape(shards, b // shards, t, parts_of_vocab, block),
                       hidden.reshape(shards, b // shards, t, d), preferred_element_type=jnp.float32)
    parts = constrain(parts, _PARTIAL_WEIGHT).astype(hidden.dtype).reshape(shards, d, parts_of_vocab * block)
    block_dw = reduce_partials(parts, ("embed", "vocab")).reshape(d, parts_of_vocab, block)
    dw = jax.lax.dynamic_update_slice_in_dim(
        dw, jax.lax.dynamic_slice_in_dim(dw, start, block, axis=2) + block_dw.astype(jnp.float32), start, axis=2)
    return (constrain(dh, _RESIDUAL), constrain(dw, _WEIGHT_T)), None

  zeros = (constrain(jnp.zeros((b, t, d), jnp.float32), _RESIDUAL),
           constrain(jnp.zeros((d, parts_of_vocab, local), jnp.float32), _WEIGHT_T))
  (dh, dw), _ = jax.lax.scan(body, zeros, jnp.arange(blocks))
  return dh.astype(hidden.dtype), dw.reshape(d, vocab).T.astype(weight.dtype), None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


def token_log_probs(
    hidden: jax.Array,
    weight: jax.Array,
    targets: jax.Array,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = True,
    softcap: float | None = None,
    sum_pi_squared: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Log-probs of ``targets`` and the entropy (or Σ_v π_v²) of each next-token distribution.

  Args:
    hidden: [B, T, D] final hidden states (after the final norm).
    weight: [V, D] LM-head weight (``CausalLM.lm_head_weight()``); the
      logits are computed in hidden's dtype, its gradient comes in its own.
    targets: [B, T] int token ids to score (the next tokens).
    chunk_size: about the most tokens per chunk on one device (at least one
      position of every row); peak extra memory is about 3-4 * chunk_size
      * V float32 values per device (4 with the entropy).
    temperature: logits are divided by it first (as verl does).
    with_entropy: compute the entropy (zeros otherwise; skips a [.., V] pass).
    softcap: ``ModelConfig.final_logit_softcapping``: logits become
      softcap * tanh(logits / softcap) before the temperature.
    sum_pi_squared: the second output is Σ_v π_v² of each distribution instead
      of the entropy (with_entropy must be False), with no gradient: for the
      forward passes that feed the optimal-token-baseline estimators.

  Returns:
    (log_probs [B, T], entropy or Σπ² [B, T]), float32; the log-probs and the
    entropy are differentiable in hidden and weight.
  """
  if with_entropy and sum_pi_squared:
    raise ValueError("token_log_probs: with_entropy and sum_pi_squared both ask for the second output; choose one")
  second = ENTROPY if with_entropy else SUM_PI_SQUARED if sum_pi_squared else NOTHING
  b, t, _ = hidden.shape
  rows = max(1, b // batch_shards(b))
  chunks, width = chunk_layout(t, max(1, chunk_size // rows))
  if chunks == 1:
    out = _chunk_stats(hidden, targets, _gathered(weight, hidden.dtype), temperature, second, softcap)
  else:
    out = _chunked(hidden, weight, targets, chunks, width, float(temperature), second, int(chunk_size),
                   None if softcap is None else float(softcap))
  return (out[0], jax.lax.stop_gradient(out[1])) if second == SUM_PI_SQUARED else out


def naive_token_log_probs(
    hidden: jax.Array, weight: jax.Array, targets: jax.Array, temperature: float = 1.0,
    softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Reference: full [B, T, V] float32 logits. Same signature and results."""
  logits = _cap(jnp.einsum("btd,vd->btv", hidden, weight, preferred_element_type=jnp.float32).astype(jnp.float32),
                softcap) / temperature
  logp_all = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, entropy
