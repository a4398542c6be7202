"""A JetStream engine over rljax's causal LMs.

`Engine` implements the interface of `jetstream.engine.engine_api.Engine`
(google-jetstream 0.2.2): `prefill` computes a request's KV cache, `insert`
places it into one of `max_concurrent_decodes` decode slots, `generate` runs
one decode step for every slot, returning a `ResultTokens` of JetStream's
layout (`rljax.rollout.jetstream_adapter`). This module never imports JetStream: its `engine_api` pulls in
TensorFlow (through seqio), seconds of start-up and CUDA-driver noise for
every trainer and `rljax.compile` run that never serves. `serving.make_driver`
imports it when JetStream's orchestrator is used and registers `Engine` and
`ResultTokens` as (virtual) subclasses of JetStream's, which is all the
orchestrator checks.

Layout. The decode state holds a KV cache of L arrays `[slots, K, S, head_dim]`
(`S = max_prefill_length + max_decode_length`, rounded up to whole
128-slot blocks for the Pallas decode kernel) sharded over the mesh (slots
by the `cache_batch` rule: data x fsdp; KV heads over tensor; with
`kv_cache_dtype` int8 or float8, 8-bit arrays with a scale per token and
head, `rljax.models.kv_quant`), the next-token logits of every slot, and
per-slot counters (`rljax.rollout.decode_state`). Prefill traces the model under the job's rules (rows over data x fsdp, weights gathered, like a
training forward pass); decode under `rljax.sharding.decode_rules`, where
each device multiplies by the weight shard it holds and no weight moves. Prompts arrive right-padded to a length bucket (one
compilation per bucket, not per prompt length), as JetStream pads them; the
prefill moves the padding to the left, so a slot's cache holds the prompt
in slots `[bucket - true_length, bucket)` (the rest masked) and generated
tokens from slot `bucket` on. `generate` first samples from the stored logits (so the first token
comes from the prompt's last position), then runs the model on the sampled
token. Functions that update the decode state donate it, so the cache is
updated in place.

Parameters are an argument of every call: the engine reads whatever
parameter pytree it is given (the trainer's own arrays), never a host copy.
The sampler passes them through `compute_params` (`rljax.rollout.weights`), which leaves them as they
are when they already are in the compute dtype (read in place) and
otherwise casts them once per rollout (float32 master weights decoded in
bfloat16: one device copy, not a cast per decode step). With `quantization`
(`rollout.quantization`) that copy also quantizes the projections, experts
and embeddings to 8 bits with a scale per output channel
(`rljax.models.weight_quant`), on the device, so a decode step reads half
the weight bytes. A scanned mixture-of-experts model's copy holds its expert
kernels per layer (`rljax.models.layers.PerLayer`): a decode step runs its
layers on static slices, and a slice of a stacked kernel that feeds a grouped
matmul would be copied out every step.

Continuation (`rljax.rollout.continuation`). A conversation goes on after a slot's turn has ended (a
multi-turn rollout appending a tool's answer): `append` writes each chosen
slot's new tokens into its cache after what it holds, in place, in one
call, and leaves each slot's logits after its last new token, so the next
`generate` samples the model's reply; nothing already cached is recomputed.
A few appending slots (a power of two per `cache_batch` shard, up to a
quarter of its slots) are
copied out of the cache, continued and put back, on each device from its
own shard, so the call's cost scales with the appending slots; more run
as one call over all slots in place (rows with nothing to add keep their
state). A decode
step leaves an idle slot's write index where it is, so a slot waiting for
its tools keeps its cache room. The cache has `max(append_buckets)` slots of
headroom for the padding of an appended chunk. JetStream's
`prefill(existing_prefix=...)` continues a prefix the same way before it is
inserted.

Routing. With `record_routing` (a mixture-of-experts model, verl's R3) a
prefix also holds the experts each prompt token went to, and every decode
step outputs the experts of the token it fed, so the trainer can replay the
rollout's routing.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rljax.models import CausalLM, KVCache, ModelConfig, init_cache
from rljax.models import vision
from rljax.models.transformer import CACHE_AXES
from rljax.rollout import continuation, jetstream_adapter, sampling
from rljax.rollout.decode_state import CacheLayout, DecodeState, Prefix, StepOutput, cache_length, rows_by_shard
from rljax.rollout.weights import RolloutWeights
from rljax.sharding import rules as rules_lib
from rljax.sharding.placement import abstract


class Engine:
  """JetStream engine over a `CausalLM` graph, parameters passed per call."""

  def __init__(
      self,
      graphdef: nnx.GraphDef,
      cfg: ModelConfig,
      *,
      max_concurrent_decodes: int,
      prefill_buckets: Sequence[int],
      max_decode_length: int,
      sampling_params: sampling.SamplingParams = sampling.SamplingParams(),
      eos_ids: Sequence[int] = (),
      ignore_eos: bool = False,
      mesh: Mesh | None = None,
      rules: rules_lib.Rules | None = None,
      tokenizer: Any = None,
      params: Any = None,
      seed: int = 0,
      decode_compiler_options: dict[str, str] | None = None,
      record_routing: bool = False,
      append_buckets: Sequence[int] = (),
      kv_cache_dtype: Any = None,
      quantization: Any = None,
  ):
    """Builds the engine.

    Args:
      graphdef: the model's graph (`nnx.graphdef(model)`); with LoRA adapters
        decoding runs x @ W + scale * (x @ A) @ B, never a merged W.
      cfg: the model's ModelConfig.
      max_concurrent_decodes: decode slots (rollout.max_num_seqs).
      prefill_buckets: increasing prompt lengths prompts are padded to.
      max_decode_length: tokens generated per request at most (response_length).
      sampling_params: temperature / top-k / top-p / greedy.
      eos_ids: tokens that end a request (unless ignore_eos).
      ignore_eos: keep generating after eos until max_decode_length.
      mesh, rules: where the KV cache lives (default: one device).
      tokenizer: an rljax tokenizer, for JetStream's tokenizer hooks.
      params: parameters `load_params()` returns (JetStream serving).
      seed: seed of the decode state's PRNG key.
      decode_compiler_options: XLA options of the decode loop's compilation
        (`rljax.rollout.factory.decode_compiler_options`).
      record_routing: record each token's experts (a mixture-of-experts
        model; see the module docstring).
      append_buckets: increasing chunk lengths `append` pads new tokens to
        (multi-turn rollouts); the cache grows by the largest.
      kv_cache_dtype: the KV cache's dtype (default the compute dtype); int8
        or a float8 stores it quantized (`rljax.models.kv_quant`).
      quantization: int8 or a float8 dtype: the weights the engine decodes
        with are quantized to it at each weight sync, one scale per output
        channel (`rljax.models.weight_quant`); default None, the compute
        dtype.
    """
    if record_routing and cfg.routing_shape is None:
      raise ValueError(f"record_routing needs a mixture-of-experts model; this is a dense {cfg.model_type}")
    if record_routing and append_buckets:
      raise ValueError("record_routing does not record the experts of appended tokens; a multi-turn rollout "
                       "cannot replay its routing (set actor_rollout_ref.rollout.enable_rollout_routing_replay=false)")
    self.record_routing = record_routing
    self.graphdef = graphdef
    self.cfg = cfg
    self._slots = int(max_concurrent_decodes)
    self.buckets = tuple(sorted(int(b) for b in prefill_buckets))
    self.max_decode_length = int(max_decode_length)
    self.sampling_params = sampling_params
    self.eos_ids = tuple(int(e) for e in eos_ids)
    self.ignore_eos = ignore_eos
    self._mesh = mesh if mesh is not None else Mesh(np.array(jax.devices()[:1]).reshape(1), ("data",))
    self.rules = rules
    self.tokenizer = tokenizer
    self._params = params
    self.seed = seed
    self.append_buckets = tuple(sorted(int(b) for b in append_buckets))
    self.kv_cache_dtype = jnp.dtype(kv_cache_dtype or cfg.dtype)
    headroom = self.append_buckets[-1] if self.append_buckets else 0
    self.cache_length = cache_length(self.buckets[-1] + self.max_decode_length + headroom, cfg.attention_kernel)
    self.decode_compiler_options = dict(decode_compiler_options or {})
    self.quantization = quantization
    self._jit_on_mesh()

  def _jit_on_mesh(self) -> None:
    """The jitted calls over `self._mesh` (prefills and reshards are made when first needed)."""
    step_rules = rules_lib.decode_rules(self.rules)
    self.layout = CacheLayout(self.cfg, self._mesh, self.rules, self._slots, self.cache_length, self.kv_cache_dtype,
                              self.record_routing, self.seed)
    self.slot_shards = self.layout.slot_shards
    self.weights = RolloutWeights(self.cfg, self._mesh, self.rules, self.quantization)
    self._prefills: dict[tuple[int, int], Any] = {}
    self._continue_prefills: dict[tuple[int, int, int], Any] = {}
    decode_shardings = self.decode_state_shardings()
    self.insert_program = jax.jit(_traced(self._mesh, self.rules, self._insert_impl, gather_weights=False),
                                  donate_argnums=(1,), out_shardings=decode_shardings)
    self.generate_program = jax.jit(_traced(self._mesh, step_rules, self._generate_impl, gather_weights=False),
                                    static_argnums=(2, 3), donate_argnums=(1,),
                                    compiler_options=self.decode_compiler_options)
    append_all = functools.partial(continuation.append_all, self.graphdef, self.max_decode_length)
    self.append_program = jax.jit(_traced(self._mesh, step_rules, append_all, gather_weights=False),
                                  donate_argnums=(1,), out_shardings=decode_shardings)
    append_rows = functools.partial(continuation.append_rows, self.graphdef, self.max_decode_length, self._mesh,
                                    decode_shardings)
    self.append_rows_program = jax.jit(_traced(self._mesh, step_rules, append_rows, gather_weights=False),
                                       donate_argnums=(1,), out_shardings=decode_shardings)

  def on_devices(self, devices: Sequence[jax.Device]) -> "Engine":
    """This engine with its mesh laid over `devices` instead (as many, same axes): `rljax.compile` compiles
    one host of a multi-host slice on a single-host slice of the same chips, as libtpu compiles a program
    for a whole slice or one host's slice, not for some of a slice's chips."""
    other = copy.copy(self)
    other._mesh = Mesh(np.array(devices).reshape(self._mesh.devices.shape), self._mesh.axis_names)
    other._jit_on_mesh()  # pylint: disable=protected-access
    return other

  # ----- JetStream properties -------------------------------------------------

  @property
  def max_concurrent_decodes(self) -> int:
    return self._slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self.buckets[-1]

  @property
  def mesh(self) -> Mesh:
    return self._mesh

  @property
  def colocated_cpus(self) -> None:
    return None

  def load_params(self, *args, **kwargs) -> Any:
    """The parameters given at construction (JetStream serving loads them once)."""
    del args, kwargs
    if self._params is None:
      raise ValueError("this engine was built without params; pass params= to Engine or call "
                       "prefill/generate with the trainer's parameters")
    return self._params

  def get_prefix_destination_sharding(self) -> Any:
    return None

  # ----- layout and weights ------------------------------------------------------

  def decode_state_shardings(self) -> DecodeState:
    """NamedShardings of the decode state (`CacheLayout`)."""
    return self.layout.decode_state_shardings()

  def compute_params(self, params: Any) -> Any:
    """`params` as decode calls read them: in place, or one cast (and quantized, resharded) copy
    (`RolloutWeights.compute`)."""
    return self.weights.compute(params)

  def prefill_fn(self, rows: int, bucket: int, patches: int = 0) -> Any:
    """The jitted prefill of `rows` prompts padded to `bucket`: (params, tokens, lengths[, images, positions,
    offsets]) -> Prefix; `patches`: image patches per row (0: no images)."""
    key = (rows, bucket, patches)
    if key not in self._prefills:
      self._prefills[key] = jax.jit(_traced(self._mesh, self.rules, self._prefill_impl),
                                    out_shardings=self.layout.prefix_shardings(rows, bucket))
    return self._prefills[key]

  def abstract_decode_state(self) -> DecodeState:
    """The decode state as ShapeDtypeStructs with its shardings (for lowering without allocating it)."""
    return abstract(jax.eval_shape(self.layout.empty_state), self.decode_state_shardings())

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    """Empty slots, all marked done; the cache is created on its devices."""
    del args, kwargs
    return jax.jit(self.layout.empty_state, out_shardings=self.decode_state_shardings())()

  # ----- prefill / insert / generate -----------------------------------------

  def _prefill_impl(self, params, tokens: jax.Array, true_lengths: jax.Array, images: vision.Images | None = None,
                    positions: jax.Array | None = None, offsets: jax.Array | None = None) -> Prefix:
    """tokens [N, bucket] right-padded, true_lengths [N] -> Prefix of N rows.

    Rows are rolled to left padding first, so the last position holds each
    prompt's last token and only its logits are computed (no [N, bucket, V]).
    A vision-language model's prompts may hold images (each row's own, `row_images`), with their M-RoPE
    positions [3, N, bucket] (laid out as the tokens) and each row's offset [N], which its slot keeps for the
    positions of the tokens it decodes.
    """
    n, bucket = tokens.shape
    left, mask = continuation.to_the_end(tokens, true_lengths)
    if positions is not None:
      positions = jnp.stack([continuation.to_the_end(axis, true_lengths)[0] for axis in positions])
    cache = init_cache(self.cfg, n, bucket, self.kv_cache_dtype)
    if self.layout.offsets:
      cache = cache._replace(offset=jnp.zeros((n,), jnp.int32) if offsets is None else offsets)
    model = nnx.merge(self.graphdef, params)
    logits, cache, routing = model.step(left, cache, attention_mask=mask.astype(jnp.int32), positions=positions,
                                        last_only=True, query_offset=0, with_routing=True, images=images)
    experts = routing.experts if self.record_routing else None
    return Prefix(cache=cache, logits=logits[:, -1].astype(jnp.float32), experts=experts)

  def prefill(self, *, params: Any, existing_prefix: Prefix | None = None,
              padded_tokens: jax.Array, true_length: int | jax.Array, images: vision.Images | None = None,
              grids: Sequence[np.ndarray | None] | None = None) -> Prefix:
    """KV cache for right-padded `padded_tokens` ([T] or [N, T]) of `true_length`.

    T should be one of the prefill buckets (JetStream pads to its own
    buckets; each distinct T compiles once). A vision-language model's rows may hold images: `images` (each
    row's own, `rljax.models.vision.row_images`) and `grids`, each row's patch grids [I_r, 3] (None: none),
    which give the rows' M-RoPE positions; the patch bucket compiles once per size too.
    """
    tokens = jnp.asarray(padded_tokens, jnp.int32)
    lengths = jnp.asarray(true_length, jnp.int32)
    if tokens.ndim == 1:
      tokens, lengths = tokens[None], lengths.reshape(1)
    if images is not None:
      if existing_prefix is not None:
        raise ValueError("a prefix is continued with text only; images enter with a request's first prefill")
      positions, offsets = self.image_positions(np.asarray(padded_tokens).reshape(tokens.shape),
                                                np.asarray(lengths), grids)
      return self.prefill_fn(*tokens.shape, images.pixels.shape[1])(params, tokens, lengths, images,
                                                                    jnp.asarray(positions), jnp.asarray(offsets))
    if existing_prefix is not None:
      held, room = existing_prefix.cache.mask.shape[1], self.cache_length - self.max_decode_length
      if held + tokens.shape[1] > room:
        raise ValueError(f"continuing a {held}-slot prefix by {tokens.shape[1]} tokens leaves no room for "
                         f"{self.max_decode_length} decode steps in a {self.cache_length}-slot cache; build the "
                         f"engine with a larger prefill bucket or append_buckets")
      if np.any(np.asarray(true_length) < 1):
        raise ValueError(f"true_length {true_length} continues a prefix by nothing; every row needs a new token")
      return self.continue_fn(*tokens.shape, held)(params, existing_prefix, tokens, lengths)
    return self.prefill_fn(*tokens.shape)(params, tokens, lengths)

  def image_positions(self, tokens: np.ndarray, lengths: np.ndarray, grids: Sequence[np.ndarray | None]
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(M-RoPE positions [3, N, T], offsets [N]) of right-padded prompts `tokens` [N, T] of `lengths`, row r's
    images of patch grids grids[r] (`rljax.models.vision.rope_index`)."""
    cfg = self.cfg
    if cfg.vision is None:
      raise ValueError(f"images were given to an engine over a {cfg.model_type} model, which has no vision tower")
    mask = (np.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(np.int32)
    return vision.rope_index(tokens, mask, vision.joined_grids(grids), cfg.image_token_id,
                             cfg.vision.spatial_merge_size, cfg.hf_top.get("video_token_id"))

  def continue_fn(self, rows: int, length: int, held: int) -> Any:
    """The jitted continuation of a `held`-slot prefix by `length` new tokens: (params, prefix, tokens, lengths) -> Prefix."""
    key = (rows, length, held)
    if key not in self._continue_prefills:
      grow = functools.partial(continuation.continue_prefix, self.graphdef, self.record_routing)
      self._continue_prefills[key] = jax.jit(_traced(self._mesh, self.rules, grow),
                                             out_shardings=self.layout.prefix_shardings(rows, held + length))
    return self._continue_prefills[key]

  def _insert_impl(self, prefix: Prefix, state: DecodeState, source: jax.Array, request_ids: jax.Array
                   ) -> DecodeState:
    """Slot s takes prefix row source[s] where source[s] >= 0 (and keeps its state where it is -1), and request
    request_ids[s]'s sampling stream.

    One gather of the chosen prefix rows into slot order, then a select over
    the first `bucket` cache positions of every slot: no per-slot loop, and
    no update at a dynamic index of the sharded slot axis (which would make
    XLA gather the whole cache for each slot).
    """
    bucket = prefix.cache.mask.shape[1]
    chosen = source >= 0
    take = jnp.maximum(source, 0)

    def rows(x: jax.Array, names: tuple) -> jax.Array:
      return rules_lib.constrain(jnp.take(x, take, axis=0), names)

    def put(dst: jax.Array, src: jax.Array) -> jax.Array:
      """One layer's cache [slots, K, S, ...] (values or scales) with the chosen rows' first `bucket` slots."""
      new = rows(src, CACHE_AXES[:src.ndim])
      head = jax.lax.slice_in_dim(dst, 0, bucket, axis=2)
      pick = chosen.reshape(-1, *(1,) * (dst.ndim - 1))
      return jax.lax.dynamic_update_slice_in_dim(dst, jnp.where(pick, new, head), 0, axis=2)

    c, p = state.cache, prefix.cache
    mask = jnp.pad(rows(p.mask, ("cache_batch", "length")), ((0, 0), (0, c.mask.shape[1] - bucket)))
    cache = KVCache(k=jax.tree.map(put, c.k, p.k), v=jax.tree.map(put, c.v, p.v),
                    mask=jnp.where(chosen[:, None], mask, c.mask),
                    index=jnp.where(chosen, rows(p.index, ("cache_batch",)), c.index),
                    offset=None if c.offset is None else jnp.where(chosen, rows(p.offset, ("cache_batch",)),
                                                                   c.offset))
    streams = jax.vmap(lambda r: jax.random.fold_in(state.key, r))(request_ids)
    return state._replace(cache=cache, logits=jnp.where(chosen[:, None], rows(prefix.logits, ("cache_batch", "vocab")),
                                                        state.logits),
                          generated=jnp.where(chosen, 0, state.generated), done=state.done & ~chosen,
                          slot_keys=jnp.where(chosen, streams, state.slot_keys),
                          requests=state.requests + chosen.sum(dtype=jnp.int32))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    """Places a one-request prefix into `slot` (the decode state is donated)."""
    return self.insert_many(prefix, decode_state, [slot], [0])

  def insert_many(self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int], rows: Sequence[int],
                  request_ids: Sequence[int] | None = None) -> DecodeState:
    """Places prefix row rows[i] into slot slots[i] for every i in one call (compiled once per prefix shape).

    request_ids[i] names the request slot slots[i] serves: its sampling stream (default: the state's running
    count of insertions, as JetStream's requests carry no id).
    """
    if len(slots) > self._slots:
      raise ValueError(f"{len(slots)} insertions for {self._slots} slots")
    source = np.full((self._slots,), -1, np.int32)
    source[np.asarray(slots, np.int64)] = np.asarray(rows, np.int32)
    ids = np.zeros((self._slots,), np.int32)
    if request_ids is None:
      ids[np.asarray(slots, np.int64)] = np.arange(len(slots))
      ids = jnp.asarray(ids) + decode_state.requests
    else:
      ids[np.asarray(slots, np.int64)] = np.asarray(request_ids, np.int64)
    return self.insert_program(prefix, decode_state, jnp.asarray(source), jnp.asarray(ids))

  def _step(self, params, state: DecodeState, how: sampling.SamplingParams) -> tuple[DecodeState, StepOutput]:
    """Sample every active slot from its logits, then feed the sampled token."""
    streams = jax.vmap(jax.random.split)(state.slot_keys)
    tokens, log_probs = sampling.sample(streams[:, 1], state.logits, how)
    active = ~state.done
    generated = state.generated + active.astype(jnp.int32)
    stop = generated >= self.max_decode_length
    if self.eos_ids and not self.ignore_eos:
      stop |= jnp.isin(tokens, jnp.asarray(self.eos_ids, jnp.int32))
    model = nnx.merge(self.graphdef, params)
    logits, cache, routing = model.step(tokens[:, None], state.cache, attention_mask=active[:, None].astype(jnp.int32),
                                        with_routing=True)
    cache = cache._replace(index=jnp.where(active, cache.index, state.cache.index))
    new_state = DecodeState(cache=cache, logits=logits[:, -1].astype(jnp.float32), generated=generated,
                            done=state.done | (active & stop), key=state.key,
                            slot_keys=jnp.where(active, streams[:, 0], state.slot_keys), requests=state.requests)
    experts = routing.experts[:, 0] if self.record_routing else None
    return new_state, StepOutput(tokens=tokens, valid=active, log_probs=log_probs, generated=generated,
                                 experts=experts)

  def append_rows_per_shard(self, slots: Sequence[int]) -> int | None:
    """Rows per shard an append of `slots` runs over, or None: over all slots (`CacheLayout`)."""
    return self.layout.append_rows_per_shard(slots)

  def append(self, params: Any, decode_state: DecodeState, tokens: dict[int, Sequence[int]]) -> DecodeState:
    """Continues slots: slot s takes the ids tokens[s] after its cache's contents (the state is donated).

    The ids count towards the slot's `max_decode_length`; each slot's next
    token is then sampled after its last new id. The chunk is padded to the
    smallest `append_buckets` length that holds the longest, and the rows
    to `append_rows_per_shard` per shard (one compilation per pair); when
    many slots append, one call runs over all slots.
    """
    if not self.append_buckets:
      raise ValueError("this engine was built without append_buckets; it cannot continue a slot")
    outside = sorted(int(s) for s in tokens if not 0 <= int(s) < self._slots)
    if outside:
      raise ValueError(f"appending to slot(s) {outside} of an engine with {self._slots} slots (0 .. {self._slots - 1})")
    tokens = {int(slot): ids for slot, ids in tokens.items() if len(ids)}
    longest = max((len(ids) for ids in tokens.values()), default=0)
    width = next((b for b in self.append_buckets if b >= longest), None)
    if width is None:
      raise ValueError(f"appending {longest} tokens to a slot exceeds the largest append bucket "
                       f"{self.append_buckets[-1]}")
    if not tokens:
      return decode_state
    per_shard = self.append_rows_per_shard(list(tokens))
    if per_shard is None:
      rows, order = None, np.arange(self._slots)
    else:
      rows, order = rows_by_shard(sorted(tokens), self._slots // self.slot_shards, self.slot_shards, per_shard)
    chunk = np.zeros((len(order), width), np.int32)
    lengths = np.zeros((len(order),), np.int32)
    for r, slot in enumerate(order):
      ids = tokens.get(int(slot), ())
      chunk[r, :len(ids)] = ids
      lengths[r] = len(ids)
    if rows is None:
      return self.append_program(params, decode_state, jnp.asarray(chunk), jnp.asarray(lengths))
    return self.append_rows_program(params, decode_state, jnp.asarray(rows), jnp.asarray(chunk), jnp.asarray(lengths))

  def _generate_impl(self, params, state: DecodeState, steps: int,
                     how: sampling.SamplingParams) -> tuple[DecodeState, StepOutput]:
    """`steps` decode steps in one call: outputs are [slots, steps]."""
    state, out = jax.lax.scan(lambda s, _: self._step(params, s, how), state, None, length=steps)
    return state, jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1), out)

  def generate_steps(self, params: Any, decode_state: DecodeState, steps: int,
                     sampling_params: sampling.SamplingParams | None = None) -> tuple[DecodeState, StepOutput]:
    """Runs `steps` decode steps (one host round trip); the state is donated.

    `sampling_params` overrides the engine's (e.g. validation's val_kwargs).
    """
    return self.generate_program(params, decode_state, steps, sampling_params or self.sampling_params)

  def generate(self, params: Any, decode_state: DecodeState) -> tuple[DecodeState, Any]:
    """One decode step; returns JetStream `ResultTokens` (token, valid, length)."""
    state, out = self.generate_program(params, decode_state, 1, self.sampling_params)
    data = jnp.stack([out.tokens[:, 0], out.valid[:, 0].astype(jnp.int32), out.generated[:, 0]], axis=1)
    return state, jetstream_adapter.ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                               samples_per_slot=1)

  # ----- tokenizer hooks --------------------------------------------------------

  def get_tokenizer(self) -> Any:
    """JetStream tokenizer metadata (the tokenizer object itself is `build_tokenizer`'s)."""
    return jetstream_adapter.tokenizer_metadata()

  def build_tokenizer(self, metadata: Any = None) -> jetstream_adapter.JetStreamTokenizer:
    del metadata
    if self.tokenizer is None:
      raise ValueError("this engine was built without a tokenizer; pass tokenizer= to Engine")
    return jetstream_adapter.JetStreamTokenizer(self.tokenizer, self.buckets, self.eos_ids)


def _traced(mesh: Mesh, rules: Any, fn, gather_weights: bool = True):
  """`fn` traced inside `activation_sharding(mesh, rules, gather_weights)`."""
  def wrapped(*args):
    with rules_lib.activation_sharding(mesh, rules, gather_weights):
      return fn(*args)
  return wrapped


def make_engine(model: CausalLM, compute_dtype: Any = None, **kwargs) -> Engine:
  """An Engine for `model`'s graph; pass its parameters to each call.

  Args:
    model: the model whose parameters the engine will be given.
    compute_dtype: activation and KV-cache dtype of prefill and decode
      (`rollout.dtype`); default the model's. Parameters keep their own
      dtype: read in place when it is this one, else cast once per rollout
      by the sampler (`Engine.compute_params`).
    **kwargs: Engine arguments.
  """
  cfg = model.cfg
  if compute_dtype is None or jnp.dtype(compute_dtype) == jnp.dtype(cfg.dtype):
    return Engine(nnx.graphdef(model), cfg, **kwargs)
  cfg = dataclasses.replace(cfg, dtype=jnp.dtype(compute_dtype))
  view = nnx.merge(*nnx.split(model))  # new modules over the same arrays, LoRA adapters included
  view.set_attributes(cfg=cfg, raise_if_not_found=False)
  return Engine(nnx.graphdef(view), cfg, **kwargs)
