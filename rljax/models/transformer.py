"""The causal LM: embeddings, a stack of decoder blocks, final norm, LM head.

Left-padded batches are the RL norm: positions come from the attention mask
(``cumsum(mask) - 1``) and attention is causal AND masked by padding (and by
``segment_ids`` for packed rows). ``step`` runs prefill or decode against a
KV cache.

Layers come in two kinds when ``ModelConfig.layer_types`` mixes them
(Gemma 3): sliding layers, with a window and their own RoPE base, and full
ones. Each pass builds one mask and one RoPE table per kind, and each layer
runs with its kind's, whose window is static (so the flash kernel applies
it): unrolled layers directly, and a scan over layers of both kinds through
``lax.cond`` on a scanned per-layer flag (both branches compiled, one run).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from rljax.models import kv_quant, rope, weight_quant
from rljax.models.attention import AttentionMask
from rljax.models.config import ModelConfig
from rljax.models.layers import Block, PerLayer, RMSNorm, gather_layer, layer_of, make_param
from rljax.models import moe
from rljax.models.mtp import MTPLayer, shifted
from rljax.models.vision import Images, VisionTower, feature_counts, place_images
from rljax.models.remat import LAYER_INPUT, remat_policy
from rljax.sharding.rules import constrain

_RESIDUAL = ("batch", "activation_length", "embed")  # the residual stream: see rljax.sharding.rules
CACHE_AXES = ("cache_batch", "kv_heads", "length", "head_dim")  # a cache layer's axes ([:3]: its 8-bit scales')

_EMBED_INIT = jax.nn.initializers.normal(0.02)


class KVCache(NamedTuple):
  """Keys and values for L layers and S slots, with one write index per row.

  Attributes:
    k, v: L arrays [B, K, S, head_dim], one per layer (head-major: attention
      reads them without a transpose), or L `QuantizedKV` (8-bit values of
      that shape and [B, K, S] scales; `rljax.models.kv_quant`). Separate
      arrays, not one [L, ...] array, so each layer reads its cache directly and each decode step
      updates each layer's donated buffer in place: slicing a stacked cache
      per layer makes XLA copy every slice and the whole cache per step.
      The engine's caches are always per layer (a model with stacked,
      scanned layers runs them one by one against such a cache). A cache
      made and dropped inside one pass (the shared-prompt passes) may be
      stacked, [L, B, K, S, head_dim] each, for a scanned model.
    mask: [B, S] bool, True for slots holding a real (non-pad) token.
    index: [B] int32, the slot where each row's next token is written.
    offset: [B] int32 or None: what each row's later positions add to its real tokens cached (a prompt with
      images: its M-RoPE offset, ``rljax.models.vision.rope_index``); None adds nothing.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  mask: jax.Array
  index: jax.Array
  offset: jax.Array | None = None


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = None, stacked: bool = False) -> KVCache:
  """An empty cache for ``batch`` rows of up to ``max_len`` tokens (``stacked``: [L, ...] arrays).

  ``dtype`` defaults to the compute dtype; an 8-bit one (int8, float8)
  stores each layer as a ``QuantizedKV`` with scales in the compute dtype.
  """
  shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  dtype = dtype or cfg.dtype
  if kv_quant.is_quantized(dtype):
    if stacked:
      raise ValueError("a stacked (scanned) cache is made within one pass; it is never stored quantized")
    return KVCache(k=tuple(kv_quant.empty(shape, dtype, cfg.dtype) for _ in range(cfg.num_layers)),
                   v=tuple(kv_quant.empty(shape, dtype, cfg.dtype) for _ in range(cfg.num_layers)),
                   mask=jnp.zeros((batch, max_len), bool), index=jnp.zeros((batch,), jnp.int32))
  if stacked:
    zeros = jnp.zeros((cfg.num_layers, *shape), dtype)
    return KVCache(k=zeros, v=zeros, mask=jnp.zeros((batch, max_len), bool), index=jnp.zeros((batch,), jnp.int32))
  return KVCache(
      k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
      v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
      mask=jnp.zeros((batch, max_len), bool),
      index=jnp.zeros((batch,), jnp.int32),
  )


def write_mask(cache: KVCache, valid: jax.Array) -> jax.Array:
  """[B, S] slot mask with each row's T new tokens' validity [B, T] written at its index."""
  return jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice_in_dim(c, u, i, 0))(cache.mask, valid, cache.index)


def live_slots(mask: jax.Array, end: jax.Array) -> tuple[jax.Array, jax.Array]:
  """([B] first slot holding a real key, [B] end): every True slot of mask [B, S] lies before `end`."""
  return jnp.argmax(mask, axis=-1).astype(jnp.int32), end.astype(jnp.int32)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """[B, T] positions cumsum(mask) - 1, clipped at 0 for left padding."""
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def attention_mask_3d(
    key_valid: jax.Array,
    query_slots: jax.Array,
    key_slots: jax.Array,
    sliding_window: int | None = None,
    segment_ids: jax.Array | None = None,
) -> jax.Array:
  """[B, T, S] bool: causal by slot, key not padding, same segment, in window.

  Args:
    key_valid: [B, S] True for real keys.
    query_slots: [B, T] slot (sequence index) of each query.
    key_slots: [S] slot of each key.
    sliding_window: keys more than this many slots back are masked.
    segment_ids: [B, T] (T == S) packed-sequence ids; attention stays within
      a segment.
  """
  diff = query_slots[:, :, None] - key_slots[None, None, :]
  mask = (diff >= 0) & key_valid[:, None, :]
  if sliding_window is not None:
    mask &= diff < sliding_window
  if segment_ids is not None:
    mask &= segment_ids[:, :, None] == segment_ids[:, None, :]
  return mask


def _pass_mask(attention_mask: jax.Array, segment_ids: jax.Array | None, window: int | None) -> AttentionMask:
  """The AttentionMask of a pass without a cache over [B, T] tokens (``attention_mask``, packed ``segment_ids``)."""
  b, t = attention_mask.shape
  slots = jnp.arange(t, dtype=jnp.int32)
  valid = attention_mask.astype(bool)
  segments = segment_ids if segment_ids is not None else valid.astype(jnp.int32)
  return AttentionMask(dense=attention_mask_3d(valid, jnp.broadcast_to(slots, (b, t)), slots, window, segment_ids),
                       query_segments=segments, key_segments=segments, offset=0, window=window)


def _check_scannable(cfg: ModelConfig) -> None:
  """Raises ValueError when scan_layers is asked of layers that differ (some sparse, some dense)."""
  sparse = cfg.sparse_layers
  if cfg.scan_layers and sparse and len(sparse) != cfg.num_layers:
    raise ValueError(
        f"scan_layers needs identical layers, but only layers {list(sparse)} of {cfg.num_layers} are "
        f"mixture-of-experts (decoder_sparse_step={cfg.decoder_sparse_step}, "
        f"mlp_only_layers={list(cfg.mlp_only_layers)}); set actor_rollout_ref.model.scan_layers=false.")


def _rope_tables(cfg: ModelConfig, positions: jax.Array, local: bool) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, T, head_dim] of the rotary embedding at `positions` [B, T] for the layers of kind `local`
  (sliding-window layers may have their own theta and scaling); positions [3, B, T] are M-RoPE's
  (``ModelConfig.mrope_section``)."""
  _, theta, scaling = cfg.attention_kind(local)
  inv_freq, attention_factor = rope.inv_frequencies(cfg.head_dim, theta, scaling, cfg.max_position_embeddings)
  if positions.ndim == 3:
    if cfg.mrope_section is None:
      raise ValueError(f"positions of shape {positions.shape} are M-RoPE's; {cfg.model_type} has none: pass "
                       "positions [B, T].")
    return rope.mrope_cos_sin(positions, inv_freq, attention_factor, cfg.mrope_section, cfg.mrope_interleaved)
  return rope.cos_sin(positions, inv_freq, attention_factor)


def _routing(routing: tuple[jax.Array, jax.Array] | None) -> moe.Routing | None:
  """Per-layer (stats [L, 2, E], experts [L, B, T, k]) as a Routing (experts [B, T, L, k]), or None."""
  if routing is None:
    return None
  stats, experts = routing
  return moe.Routing(stats=stats, experts=jnp.moveaxis(experts, 0, 2))


def _block(cfg: ModelConfig, rngs: nnx.Rngs, layer: int, stack: int | None = None) -> Block:
  """Decoder layer ``layer`` (all layers when stacked): with a mixture-of-experts MLP where the config says."""
  return Block(cfg, rngs, stack, mlp=moe.MoE(cfg, rngs, stack) if cfg.is_sparse(layer) else None)


class CausalLM(nnx.Module):
  """Decoder-only LM for the Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE and Gemma 3 (text) families; with a vision
  tower (``visual``) for Qwen2.5-VL and Qwen3-VL, whose features replace the image-pad tokens' embeddings."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.param_dtype
    _check_scannable(cfg)
    self.embed = make_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"),
                            _EMBED_INIT, pd)
    if cfg.scan_layers:
      self.layers = _block(cfg, rngs, 0, stack=cfg.num_layers)
    else:
      self.layers = nnx.List([_block(cfg, rngs, i) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, rngs, dtype=pd, plus_one=cfg.norm_plus_one)
    if not cfg.tie_word_embeddings:
      self.lm_head = make_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"),
                                _EMBED_INIT, pd)
    if cfg.vision is not None:
      self.visual = VisionTower(cfg.vision, rngs, cfg.dtype, pd, remat=cfg.remat)
    if cfg.mtp_layers:
      self.mtp = nnx.List([MTPLayer(cfg, rngs) for _ in range(cfg.mtp_layers)])

  def lm_head_weight(self) -> jax.Array:
    """[V, D] output projection (the embedding matrix when tied)."""
    return weight_quant.stored(self.embed if self.cfg.tie_word_embeddings else self.lm_head, self.cfg.dtype)

  def _embed(self, input_ids: jax.Array) -> jax.Array:
    """[B, T] ids -> [B, T, D] embeddings in the compute dtype (times sqrt(D) with scale_embeddings)."""
    x = weight_quant.rows(self.embed, input_ids, self.cfg.dtype)
    if self.cfg.scale_embeddings:
      x = x * jnp.asarray(self.cfg.hidden_size ** 0.5, x.dtype)
    return constrain(x, _RESIDUAL)

  def _inputs(self, input_ids: jax.Array, images: Images | None, positions: jax.Array | None
              ) -> tuple[jax.Array, jax.Array | None]:
    """([B, T, D] embeddings of input_ids, the image-pad tokens' replaced by the tower's features of ``images``
    (whose prompts need their M-RoPE ``positions``: ``rljax.models.vision.rope_index``); [k, B, T, D] the deepstack
    features at the same tokens, zero elsewhere, that the first k layers add to their outputs (Qwen3-VL), or
    None)."""
    x = self._embed(input_ids)
    if images is None:
      return x, None
    if self.cfg.vision is None:
      raise ValueError(f"images were given to a {self.cfg.model_type} model, which has no vision tower.")
    if positions is None or positions.ndim != 3:
      raise ValueError("a pass with images needs their M-RoPE positions [3, B, T] (rljax.models.vision.rope_index).")
    features, deep = self.visual(images)
    if images.slots is not None:
      place = lambda embeds, f: place_images(embeds, images.slots, f)  # noqa: E731
    else:
      is_image, counts = input_ids == self.cfg.image_token_id, feature_counts(images)
      place = lambda embeds, f: place_images(embeds, is_image, f, counts)  # noqa: E731
    x = constrain(place(x, features), _RESIDUAL)
    if deep is None:
      return x, None
    zeros = jnp.zeros_like(x)
    return x, jnp.stack([constrain(place(zeros, level), _RESIDUAL) for level in deep])

  def logits(self, h: jax.Array) -> jax.Array:
    """[..., D] final hidden states -> [..., V] logits (softcapped with final_logit_softcapping)."""
    z = h @ self.lm_head_weight().astype(h.dtype).T
    cap = self.cfg.final_logit_softcapping
    return z if cap is None else cap * jnp.tanh(z / cap)

  def _masks(self, build: Callable[[int | None], AttentionMask]) -> dict[bool, AttentionMask]:
    """{local: the mask of that kind of layer} for the kinds the model has, from build(sliding window)."""
    return {local: build(self.cfg.attention_kind(local)[0]) for local in set(self.cfg.local_layers)}

  def _run_layers(
      self,
      x: jax.Array,
      positions: jax.Array,
      masks: dict[bool, AttentionMask],
      cache: KVCache | None,
      experts: jax.Array | None = None,
      deep: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None, moe.Routing | None]:
    """x [B, T, D] through every block.

    ``masks`` holds each kind of layer's mask (``_masks``); ``experts``
    [B, T, L_sparse, k] replays the mixture-of-experts layers' routing;
    ``deep`` [k, B, T, D] is added to the first k layers' outputs.
    Returns (x, the updated caches (k, v) in the cache's layout or None, the
    sparse layers' Routing or None for a dense model).

    With scan_layers, a pass without a cache or with a stacked one scans the
    stacked layers; against per-layer caches (the engine's), or with
    parameters held per layer (`PerLayer`, the engine's expert kernels), the
    layers run one after another over static slices of the stacked
    parameters, so each layer's cache is read and written in place.
    """
    cfg = self.cfg
    write_index = None if cache is None else cache.index
    tables = {local: _rope_tables(cfg, positions, local) for local in masks}

    def layer_fn(local: bool):
      """apply(graphdef, state, x, kv, experts) of one layer of kind `local`."""
      def apply(graphdef, state, x, kv, layer_experts):
        cos, sin = tables[local]
        if cfg.offload_activations:
          x = checkpoint_name(x, LAYER_INPUT)
        return nnx.merge(graphdef, gather_layer(state, cfg.dtype))(x, cos, sin, masks[local], kv, write_index,
                                                                   layer_experts)

      if cfg.remat:
        return jax.checkpoint(apply, static_argnums=(0,),
                              policy=remat_policy(cfg.remat_policy, cfg.offload_activations))
      return apply

    split = cfg.scan_layers and any(isinstance(p, PerLayer) for p in jax.tree.leaves(
        nnx.state(self.layers), is_leaf=lambda p: isinstance(p, PerLayer)))
    if cfg.scan_layers and (cache is None or not isinstance(cache.k, tuple)) and not split:
      graphdef, state = nnx.split(self.layers)
      kinds = {local: functools.partial(layer_fn(local), graphdef) for local in masks}

      def body(x, xs):
        layer_state, kv, local, layer_experts, layer = xs
        if len(kinds) == 1:
          x, kv, routing = next(iter(kinds.values()))(layer_state, x, kv, layer_experts)
        else:
          x, kv, routing = jax.lax.cond(local, kinds[True], kinds[False], layer_state, x, kv, layer_experts)
        if deep is not None:
          x = x + jnp.where(layer < deep.shape[0], deep[jnp.minimum(layer, deep.shape[0] - 1)], 0).astype(x.dtype)
        return x, (kv, routing)

      xs = (state, None if cache is None else (cache.k, cache.v), jnp.asarray(cfg.local_layers),
            None if experts is None else jnp.moveaxis(experts, 2, 0),
            None if deep is None else jnp.arange(cfg.num_layers))
      x, (kv_out, routing) = jax.lax.scan(body, x, xs)
      return x, kv_out, _routing(routing)
    if cfg.scan_layers:
      graphdef, stacked = nnx.split(self.layers)
      layers = [(graphdef, jax.tree.map(lambda p, i=i: layer_of(p, i), stacked,
                                        is_leaf=lambda p: isinstance(p, PerLayer))) for i in range(cfg.num_layers)]
    else:
      layers = [nnx.split(block) for block in self.layers]
    new_k, new_v, routings = [], [], []
    for i, (graphdef, state) in enumerate(layers):
      kv = None if cache is None else (cache.k[i], cache.v[i])
      layer_experts = None if experts is None or not cfg.is_sparse(i) else experts[:, :, len(routings)]
      x, kv, routing = layer_fn(cfg.local_layers[i])(graphdef, state, x, kv, layer_experts)
      if deep is not None and i < deep.shape[0]:
        x = x + deep[i].astype(x.dtype)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
      if routing is not None:
        routings.append(routing)
    return (x, None if cache is None else (tuple(new_k), tuple(new_v)),
            _routing(tuple(jnp.stack(part) for part in zip(*routings)) if routings else None))

  def hidden_states(
      self,
      input_ids: jax.Array,
      attention_mask: jax.Array | None = None,
      positions: jax.Array | None = None,
      segment_ids: jax.Array | None = None,
      with_routing: bool = False,
      experts: jax.Array | None = None,
      images: Images | None = None,
  ) -> jax.Array | tuple[jax.Array, moe.Routing | None]:
    """Final (normed) hidden states [B, T, D] for input_ids [B, T].

    Args:
      input_ids: [B, T] token ids.
      attention_mask: [B, T] 1 for real tokens, 0 for padding (default all 1).
      positions: [B, T] RoPE positions (default cumsum(mask) - 1), or
        [3, B, T] M-RoPE ones (a vision-language model).
      segment_ids: [B, T] packed-sequence ids (attention stays within one).
      with_routing: also return what the mixture-of-experts layers did
        (``rljax.models.moe.Routing``; None for a dense model).
      experts: [B, T, L_sparse, k] route each token to these experts
        (router replay).
      images: the batch's images (``rljax.models.vision.Images``), whose
        features replace the image-pad tokens' embeddings in order.
    """
    attention_mask, positions = self._defaults(input_ids, attention_mask, positions)
    masks = self._masks(functools.partial(_pass_mask, attention_mask, segment_ids))
    x, deep = self._inputs(input_ids, images, positions)
    x, _, routing = self._run_layers(x, positions, masks, None, experts, deep)
    h = constrain(self.final_norm(x), _RESIDUAL)
    return (h, routing) if with_routing else h

  @staticmethod
  def _defaults(input_ids: jax.Array, attention_mask: jax.Array | None, positions: jax.Array | None
                ) -> tuple[jax.Array, jax.Array]:
    """(attention mask [B, T], default all 1; positions, default cumsum(mask) - 1) of a pass over input_ids."""
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    return attention_mask, positions_from_mask(attention_mask) if positions is None else positions

  def mtp_hidden(
      self,
      hidden: jax.Array,
      input_ids: jax.Array,
      attention_mask: jax.Array | None = None,
      positions: jax.Array | None = None,
      segment_ids: jax.Array | None = None,
      detach: bool = False,
  ) -> jax.Array:
    """[K, B, T, D]: each multi-token prediction depth's final-normed hidden states (``rljax.models.mtp``).

    Args:
      hidden: [B, T, D] the trunk's final hidden states of the pass over input_ids.
      input_ids, attention_mask, positions, segment_ids: that pass's (see ``hidden_states``).
      detach: no gradient flows from a depth into the states it reads (the trunk's or the previous depth's) or
        into the embedding (verl's mtp.detach_encoder, which detaches each MTP layer's inputs); the LM head is the
        caller's to stop.

    Depth k's state at position i predicts token i + k + 1; where token i + k lies past the row or in another
    segment, it predicts nothing (the caller masks it).
    """
    if not self.cfg.mtp_layers:
      raise ValueError(f"this {self.cfg.model_type} model holds no multi-token prediction layers.")
    attention_mask, positions = self._defaults(input_ids, attention_mask, positions)
    mask = _pass_mask(attention_mask, segment_ids, None)
    cos, sin = _rope_tables(self.cfg, positions, local=False)
    stop = jax.lax.stop_gradient if detach else (lambda x: x)
    h, out = hidden, []
    for depth, layer in enumerate(self.mtp, start=1):
      h = layer(stop(h), stop(self._embed(shifted(input_ids, depth))), cos, sin, mask)
      out.append(h)
    return jnp.stack(out)

  def __call__(
      self,
      input_ids: jax.Array,
      attention_mask: jax.Array | None = None,
      positions: jax.Array | None = None,
      segment_ids: jax.Array | None = None,
      images: Images | None = None,
  ) -> jax.Array:
    """Logits [B, T, V]; arguments as in ``hidden_states``."""
    return self.logits(self.hidden_states(input_ids, attention_mask, positions, segment_ids, images=images))

  def step_hidden(
      self,
      input_ids: jax.Array,
      cache: KVCache,
      attention_mask: jax.Array | None = None,
      positions: jax.Array | None = None,
      last_only: bool = False,
      query_offset: int | None = None,
      with_routing: bool = False,
      experts: jax.Array | None = None,
      images: Images | None = None,
  ) -> tuple[jax.Array, KVCache] | tuple[jax.Array, KVCache, moe.Routing | None]:
    """Final (normed) hidden states of T new tokens per row run against a KV cache.

    Row b's tokens go to slots ``cache.index[b] .. + T`` (the caller keeps
    ``index + T <= S``); every row then advances by T.

    Args:
      input_ids: [B, T] new tokens (a left-padded prompt, or one token).
      cache: the KVCache; see ``init_cache``.
      attention_mask: [B, T] 1 for real new tokens (default all 1).
      positions: [B, T] (default: real tokens already cached + cumsum - 1),
        or [3, B, T] M-RoPE positions (a prompt with images).
      last_only: the last new token's hidden state only ([B, 1, D]).
      query_offset: static ``cache.index`` of every row when the caller
        knows it (a prefill into an empty cache: 0; the responses after a
        shared prompt: its length), which lets attention run as a flash
        kernel (``rljax.models.attention``).
      with_routing, experts, images: as in ``hidden_states``, for the new
        tokens.

    Returns:
      (hidden [B, T, D] or [B, 1, D], the updated cache[, Routing]).
    """
    b, t = input_ids.shape
    if attention_mask is None:
      attention_mask = jnp.ones((b, t), jnp.int32)
    if positions is None:
      seen = jnp.sum(cache.mask, axis=-1, dtype=jnp.int32)[:, None]
      positions = seen + positions_from_mask(attention_mask)
      if cache.offset is not None:
        positions = positions + cache.offset[:, None]
    slots_mask = write_mask(cache, attention_mask.astype(bool))
    query_slots = cache.index[:, None] + jnp.arange(t, dtype=jnp.int32)
    key_slots = jnp.arange(slots_mask.shape[1], dtype=jnp.int32)
    masks = self._masks(lambda window: AttentionMask(
        dense=attention_mask_3d(slots_mask, query_slots, key_slots, window),
        query_segments=attention_mask.astype(jnp.int32), key_segments=slots_mask.astype(jnp.int32),
        offset=query_offset, window=window,
        live=live_slots(slots_mask, cache.index + t) if t == 1 else None))
    x, deep = self._inputs(input_ids, images, positions)
    x, (k, v), routing = self._run_layers(x, positions, masks, cache, experts, deep)
    h = constrain(self.final_norm(x[:, -1:] if last_only else x), _RESIDUAL)
    cache = KVCache(k=k, v=v, mask=slots_mask, index=cache.index + t, offset=cache.offset)
    return (h, cache, routing) if with_routing else (h, cache)

  def step(
      self,
      input_ids: jax.Array,
      cache: KVCache,
      attention_mask: jax.Array | None = None,
      positions: jax.Array | None = None,
      last_only: bool = False,
      query_offset: int | None = None,
      with_routing: bool = False,
      images: Images | None = None,
  ) -> tuple[jax.Array, KVCache] | tuple[jax.Array, KVCache, moe.Routing | None]:
    """Prefill or decode against a KV cache: (logits [B, T, V] or [B, 1, V], the updated cache[, Routing]).

    Arguments as in ``step_hidden``; ``last_only`` keeps a long prefill from
    ever holding [B, T, V] logits (the routing covers every new token).
    """
    h, cache, routing = self.step_hidden(input_ids, cache, attention_mask, positions, last_only, query_offset,
                                         with_routing=True, images=images)
    logits = constrain(self.logits(h), ("cache_batch", "length", "vocab"))
    return (logits, cache, routing) if with_routing else (logits, cache)

  def shared_prompt_hidden(
      self,
      prompt_ids: jax.Array,
      prompt_mask: jax.Array,
      prompt_positions: jax.Array,
      response_ids: jax.Array,
      response_mask: jax.Array,
      response_positions: jax.Array,
      with_routing: bool = False,
      prompt_experts: jax.Array | None = None,
      response_experts: jax.Array | None = None,
      prompt_images: Images | None = None,
  ) -> tuple[jax.Array, jax.Array] | tuple[jax.Array, jax.Array, tuple[moe.Routing, moe.Routing] | None]:
    """Hidden states of G-sample groups whose rows share one prompt, the prompt run once per group.

    Rows ``g * n .. g * n + n - 1`` answer prompt g (n = N / G). The prompt
    pass fills a KV cache for G rows, which is repeated n times (a broadcast:
    row-sharding stays local when each device holds whole groups, and the
    backward pass sums the n copies' gradients), then the responses run
    against it. The result equals running every row's prompt + response,
    with the prompt's layers computed G instead of N times.

    Args:
      prompt_ids, prompt_mask, prompt_positions: [G, P] left-padded prompts.
      response_ids, response_mask, response_positions: [N, R] responses
        (response_mask: 1 for tokens other tokens may attend to).
      with_routing: also return the prompts' and the responses' Routing
        (None for a dense model).
      prompt_experts, response_experts: [G, P, L_sparse, k] and
        [N, R, L_sparse, k] replayed routing (see ``hidden_states``).
      prompt_images: the prompts' images (a vision-language model; the
        positions are then M-RoPE's [3, G, P] and [3, N, R]).

    Returns:
      (the last prompt token's hidden state [G, D], response hidden states
      [N, R, D][, routings]), final-normed.
    """
    g, p = prompt_ids.shape
    rows, r = response_ids.shape
    n = rows // g
    stacked = self.cfg.scan_layers
    cache = init_cache(self.cfg, g, p + r, stacked=stacked)
    last, cache, prompt_routing = self.step_hidden(prompt_ids, cache, prompt_mask, prompt_positions, last_only=True,
                                                   query_offset=0, with_routing=True, experts=prompt_experts,
                                                   images=prompt_images)
    names, axis = ((None, *CACHE_AXES), 1) if stacked else (CACHE_AXES, 0)
    repeat = lambda x: constrain(jnp.repeat(x, n, axis=axis), names)  # noqa: E731
    layers = (lambda f, kv: f(kv)) if stacked else (lambda f, kv: tuple(map(f, kv)))  # noqa: E731
    cache = KVCache(k=layers(repeat, cache.k), v=layers(repeat, cache.v), mask=jnp.repeat(cache.mask, n, axis=0),
                    index=jnp.repeat(cache.index, n, axis=0))
    hidden, _, routing = self.step_hidden(response_ids, cache, response_mask, response_positions, query_offset=p,
                                          with_routing=True, experts=response_experts)
    if not with_routing:
      return last[:, 0], hidden
    return last[:, 0], hidden, (None if routing is None else (prompt_routing, routing))
