"""A JetStream engine over rljax's causal LMs.

`Engine` implements the interface of `jetstream.engine.engine_api.Engine`
(google-jetstream 0.2.2): `prefill` computes a request's KV cache, `insert`
places it into one of `max_concurrent_decodes` decode slots, `generate` runs
one decode step for every slot, returning a `ResultTokens` of JetStream's
layout. This module never imports JetStream: its `engine_api` pulls in
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
per-slot counters. Prefill traces the model under the job's rules (rows over data x fsdp, weights gathered, like a
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
The sampler passes them through `compute_params`, which leaves them as they
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

Continuation. A conversation goes on after a slot's turn has ended (a
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
import importlib.util
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.models import CausalLM, KVCache, ModelConfig, init_cache, kv_quant, weight_quant
from rljax.models.kv_quant import QuantizedKV
from rljax.models.layers import PerLayer, split_layers
from rljax.models.transformer import CACHE_AXES
from rljax.rollout import jetstream_compat, sampling
from rljax.sharding import hosts, rules as rules_lib
from rljax.sharding.placement import Step, abstract


# Whether google-jetstream is installed (found, not imported: see the module docstring).
HAS_JETSTREAM = importlib.util.find_spec("jetstream") is not None


class SlotData(NamedTuple):
  """One slot's rows of a ResultTokens (JetStream's `SlotData`)."""

  tokens: Any
  valid: Any
  lengths: Any


@struct.dataclass
class ResultTokens:
  """JetStream's ResultTokens layout: data [slots, 3] = token | valid | length.

  The same fields and methods as `jetstream.engine.engine_api.ResultTokens`;
  `serving.make_driver` registers it as a subclass of that class.
  """

  data: Any
  tokens_idx: tuple[int, int] = struct.field(pytree_node=False)
  valid_idx: tuple[int, int] = struct.field(pytree_node=False)
  length_idx: tuple[int, int] = struct.field(pytree_node=False)
  samples_per_slot: int = struct.field(pytree_node=False)

  def copy_to_host_async(self) -> None:
    if not isinstance(self.data, np.ndarray):
      self.data.copy_to_host_async()

  def convert_to_numpy(self) -> "ResultTokens":
    return dataclasses.replace(self, data=np.asarray(self.data))

  def get_result_at_slot(self, slot: int) -> SlotData:
    """The `samples_per_slot` rows of one slot (lengths 1-D), as JetStream's."""
    rows = self.data[slot * self.samples_per_slot:(slot + 1) * self.samples_per_slot]
    return SlotData(tokens=rows[:, self.tokens_idx[0]:self.tokens_idx[1]],
                    valid=rows[:, self.valid_idx[0]:self.valid_idx[1]],
                    lengths=rows[:, self.length_idx[0]:self.length_idx[1]][:, 0])


class Prefix(NamedTuple):
  """A prefilled request (or N of them).

  Attributes:
    cache: KVCache with N rows of `bucket` slots (left-padded; `index` = bucket).
    logits: [N, V] float32 next-token logits after the prompt.
    experts: with record_routing, [N, bucket, L_sparse, k] int32 experts of
      each (left-padded) prompt position; else None.
  """

  cache: KVCache
  logits: jax.Array
  experts: jax.Array | None = None


class DecodeState(NamedTuple):
  """Everything `generate` transforms.

  Attributes:
    cache: KVCache, L arrays [slots, K, S, head_dim] (+ mask [slots, S], index [slots]).
    logits: [slots, V] float32 next-token logits per slot.
    generated: [slots] int32, tokens generated so far.
    done: [slots] bool, True for empty or finished slots.
    key: the rollout's PRNG key; request r samples from its own stream `fold_in(key, r)`, so a response does
      not depend on which slot, batch or host decodes it.
    slot_keys: [slots] PRNG keys, each slot's request's stream (advanced once per token it samples).
    requests: int32, requests inserted so far (the id of a request inserted without one).
  """

  cache: KVCache
  logits: jax.Array
  generated: jax.Array
  done: jax.Array
  key: jax.Array
  slot_keys: jax.Array
  requests: jax.Array


class StepOutput(NamedTuple):
  """One decode step for every slot: token, validity, log-prob, count (and with record_routing the experts
  [slots, L_sparse, k] the token went to when it was fed)."""

  tokens: jax.Array
  valid: jax.Array
  log_probs: jax.Array
  generated: jax.Array
  experts: jax.Array | None = None


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length."""
  for bucket in buckets:
    if bucket >= length:
      return bucket
  raise ValueError(f"a prompt of {length} tokens exceeds the largest prefill bucket {buckets[-1]} "
                   "(actor_rollout_ref.rollout.prefill_length_buckets / data.max_prompt_length)")


class SendCopy:
  """`tree -> cast(tree)` laid out by `shardings` on devices `tree` does not lie on (separate_async's rollout
  devices): the cast runs where the weights lie (so rollout.dtype's bytes travel, not the master weights'), then
  `jax.device_put` copies each array device to device into its layout there."""

  def __init__(self, shardings: Any, cast: Callable[[Any], Any]):
    self.shardings = shardings
    self.cast = jax.jit(cast)

  def __call__(self, tree: Any) -> Any:
    cast = self.cast(tree)
    return jax.device_put(cast, jax.tree.unflatten(jax.tree.structure(cast), jax.tree.leaves(self.shardings)))


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
    self.quantization = None if quantization is None else jnp.dtype(quantization)
    cast = (functools.partial(_cast_floats, dtype=jnp.dtype(cfg.dtype)) if quantization is None else
            functools.partial(weight_quant.quantize_params, dtype=self.quantization,
                              compute_dtype=jnp.dtype(cfg.dtype)))
    # a scanned mixture-of-experts model's expert kernels are held per layer (`rljax.models.layers.PerLayer`)
    self.split_experts = bool(cfg.scan_layers and cfg.routing_shape)
    self.cast_impl = (lambda params: _split_experts(cast(params))) if self.split_experts else cast
    self._cast = jax.jit(self.cast_impl)
    self._jit_on_mesh()

  def _jit_on_mesh(self) -> None:
    """The jitted calls over `self._mesh` (prefills and reshards are made when first needed)."""
    step_rules = rules_lib.decode_rules(self.rules)
    spec = self._sharding(("cache_batch",), (self._slots,)).spec
    # how many `cache_batch` shards the slots are split into (each holds slots / slot_shards of them)
    self.slot_shards = math.prod(self._mesh.shape[a] for a in rules_lib.spec_axes(spec[0] if spec else None))
    self._prefills: dict[tuple[int, int], Any] = {}
    self._continue_prefills: dict[tuple[int, int, int], Any] = {}
    self._reshards: dict[Any, Any] = {}
    self._insert = jax.jit(_traced(self._mesh, self.rules, self._insert_impl, gather_weights=False),
                           donate_argnums=(1,), out_shardings=self.decode_state_shardings())
    self._generate = jax.jit(_traced(self._mesh, step_rules, self._generate_impl, gather_weights=False),
                             static_argnums=(2, 3),
                             donate_argnums=(1,), compiler_options=self.decode_compiler_options)
    self._append = jax.jit(_traced(self._mesh, step_rules, self._append_impl, gather_weights=False),
                           donate_argnums=(1,), out_shardings=self.decode_state_shardings())
    self._append_rows = jax.jit(_traced(self._mesh, step_rules, self._append_rows_impl, gather_weights=False),
                                donate_argnums=(1,), out_shardings=self.decode_state_shardings())

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

  # ----- shardings ------------------------------------------------------------

  def _sharding(self, names: tuple[str | None, ...], shape: tuple[int, ...]) -> NamedSharding:
    rules = rules_lib.with_cache_batch(self.rules)
    return NamedSharding(self._mesh, rules_lib.logical_to_spec(names, shape, self._mesh, rules))

  def _kv_shardings(self, rows: int, length: int) -> tuple[Any, ...]:
    """NamedShardings of a cache's L layers of keys (or values) for `rows` rows of `length` slots (the values'
    and the scales' of an 8-bit cache)."""
    cfg = self.cfg
    shape = (rows, cfg.num_kv_heads, length, cfg.head_dim)
    layer = self._sharding(CACHE_AXES, shape)
    if kv_quant.is_quantized(self.kv_cache_dtype):
      layer = QuantizedKV(values=layer, scale=self._sharding(CACHE_AXES[:3], shape[:3]))
    return (layer,) * cfg.num_layers

  def decode_state_shardings(self) -> DecodeState:
    """NamedShardings of the decode state: slots over the `cache_batch` rule, KV heads over tensor."""
    cfg, slots, length = self.cfg, self._slots, self.cache_length
    kv = self._kv_shardings(slots, length)
    per_slot = self._sharding(("cache_batch",), (slots,))
    return DecodeState(
        cache=KVCache(k=kv, v=kv, mask=self._sharding(("cache_batch", "length"), (slots, length)), index=per_slot),
        logits=self._sharding(("cache_batch", "vocab"), (slots, cfg.vocab_size)),
        generated=per_slot, done=per_slot, key=NamedSharding(self._mesh, PartitionSpec()),
        slot_keys=NamedSharding(self._mesh, PartitionSpec()), requests=NamedSharding(self._mesh, PartitionSpec()))

  def compute_params(self, params: Any) -> Any:
    """`params` in the engine's compute dtype (`rollout.dtype`), quantized with `quantization`, and laid out on
    the engine's mesh.

    The same arrays when they already are all three (the trainer's arrays,
    read in place); else one copy, cast (and quantized) and resharded, made
    once per rollout rather than once per decode call, so every decode step
    reads compute-dtype (or 8-bit) weights (float32 master weights would
    double a step's bytes) in the rollout's layout
    (`rljax.rollout.factory.rollout_mesh`).
    """
    copier = self._copier(params)
    if copier is None:
      return params
    if all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):
      return abstract(jax.eval_shape(self.cast_impl, params), self._compute_shardings(params))
    return copier(params)

  def _compute_shardings(self, params: Any) -> Any:
    """The NamedShardings of `params` as the engine computes with them (its mesh and rules; a quantized
    weight's values and scales laid out by its axis names)."""
    return rules_lib.param_shardings(jax.eval_shape(self.cast_impl, params), self._mesh, self.rules)

  def _copier(self, params: Any) -> Callable[[Any], Any] | None:
    """The jitted cast (and quantization) `params` need, or None when the engine computes with them as they are:
    laid out and typed as it needs (quantized when it quantizes: what `compute_params` returned). The cast runs
    in place on their devices when they already lie as the engine's rules lay them out and nothing is quantized,
    else it reshards (`_resharder`)."""
    dtype = jnp.dtype(self.cfg.dtype)
    target = rules_lib.param_shardings(params, self._mesh, self.rules)
    same_layout = all(x.sharding == s for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(target)))
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    values = [v.get_value() if isinstance(v, nnx.Variable) else v for v in leaves]
    quantized = [w for w in values if isinstance(w, weight_quant.QuantizedWeight)]
    plain = [x for w in values if not isinstance(w, weight_quant.QuantizedWeight) for x in jax.tree.leaves(w)]
    typed = (all(not jnp.issubdtype(x.dtype, jnp.floating) or jnp.dtype(x.dtype) == dtype for x in plain)
             and all(w.values.dtype == self.quantization and w.scale.dtype == dtype for w in quantized))
    split = all(isinstance(w, PerLayer) for v, w in zip(leaves, values) if _is_expert_kernel(v))
    if same_layout and typed and bool(quantized) == (self.quantization is not None) and split:
      return None
    if same_layout and self.quantization is None and not self.split_experts:
      return self._cast
    return self._resharder(params)

  def _resharder(self, params: Any) -> Callable[[Any], Any]:
    """The jitted cast-and-reshard of `params` (arrays or ShapeDtypeStructs) to the engine's layout
    (`_compute_shardings`), made once per tree."""
    key = jax.tree.structure(params)
    if key not in self._reshards:
      target = self._compute_shardings(params)
      source = sorted(jax.tree.leaves(params)[0].sharding.device_set, key=lambda d: d.id)
      if not set(source) & set(self._mesh.devices.flat):  # separate_async: the rollout's devices are its own
        self._reshards[key] = SendCopy(target, self.cast_impl)
      elif len(hosts.processes(source)) > 1 and len(hosts.processes(self._mesh.devices.flat)) == 1:
        # a multi-process job's weights reach this host's engine mesh across the hosts, one array at a time
        self._reshards[key] = hosts.HostLocalCopy(target, self.cast_impl, source)
      else:
        self._reshards[key] = jax.jit(self.cast_impl, out_shardings=target)
    return self._reshards[key]

  def weight_sync_steps(self, params: Any) -> list[tuple[Step, bool]]:
    """The jitted copies that bring the trainer's weights (`params`: arrays or ShapeDtypeStructs with their
    shardings) to the engine's dtype and layout once per rollout, in the order they run, each with whether its
    output only feeds the next; none when the engine reads them in place. One for the whole tree (on devices of
    the engine's own, the cast that precedes the device-to-device copy, `SendCopy`); on a host-local engine of a
    multi-process job, two per array (`rljax.sharding.hosts.HostLocalCopy`)."""
    params = abstract(params)
    copier = self._copier(params)
    if copier is None:
      return []
    if isinstance(copier, hosts.HostLocalCopy):
      return [(Step("rollout_weights", fn, args), feeds) for fn, args, feeds in copier.programs(params)]
    if isinstance(copier, SendCopy):  # the cast where the weights lie; the copy to the rollout's devices is no program
      return [(Step("rollout_weights", copier.cast, (params,)), False)]
    return [(Step("rollout_weights", copier, (params,)), False)]

  def prefix_shardings(self, rows: int, bucket: int) -> Prefix:
    """NamedShardings of a prefill's output for `rows` prompts of `bucket` tokens."""
    cfg = self.cfg
    kv = self._kv_shardings(rows, bucket)
    per_row = self._sharding(("cache_batch",), (rows,))
    experts = (self._sharding(("cache_batch", None, None, None), (rows, bucket, *cfg.routing_shape))
               if self.record_routing else None)
    return Prefix(cache=KVCache(k=kv, v=kv, mask=self._sharding(("cache_batch", "length"), (rows, bucket)),
                                index=per_row),
                  logits=self._sharding(("cache_batch", "vocab"), (rows, cfg.vocab_size)), experts=experts)

  def prefill_fn(self, rows: int, bucket: int) -> Any:
    """The jitted prefill of `rows` prompts padded to `bucket`: (params, tokens, lengths) -> Prefix."""
    key = (rows, bucket)
    if key not in self._prefills:
      self._prefills[key] = jax.jit(_traced(self._mesh, self.rules, self._prefill_impl),
                                    out_shardings=self.prefix_shardings(rows, bucket))
    return self._prefills[key]

  def abstract_decode_state(self) -> DecodeState:
    """The decode state as ShapeDtypeStructs with its shardings (for lowering without allocating it)."""
    return abstract(jax.eval_shape(self._empty_state), self.decode_state_shardings())

  def _empty_state(self) -> DecodeState:
    cfg, slots, length = self.cfg, self._slots, self.cache_length
    return DecodeState(
        cache=init_cache(cfg, slots, length, self.kv_cache_dtype),
        logits=jnp.zeros((slots, cfg.vocab_size), jnp.float32),
        generated=jnp.zeros((slots,), jnp.int32),
        done=jnp.ones((slots,), bool),
        key=jax.random.key(self.seed),
        slot_keys=jax.random.split(jax.random.key(self.seed), slots),
        requests=jnp.zeros((), jnp.int32))

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    """Empty slots, all marked done; the cache is created on its devices."""
    del args, kwargs
    return jax.jit(self._empty_state, out_shardings=self.decode_state_shardings())()

  # ----- prefill / insert / generate -----------------------------------------

  def _prefill_impl(self, params, tokens: jax.Array, true_lengths: jax.Array) -> Prefix:
    """tokens [N, bucket] right-padded, true_lengths [N] -> Prefix of N rows.

    Rows are rolled to left padding first, so the last position holds each
    prompt's last token and only its logits are computed (no [N, bucket, V]).
    """
    n, bucket = tokens.shape
    left, mask = _to_the_end(tokens, true_lengths)
    model = nnx.merge(self.graphdef, params)
    logits, cache, routing = model.step(left, init_cache(self.cfg, n, bucket, self.kv_cache_dtype),
                                        attention_mask=mask.astype(jnp.int32),
                                        last_only=True, query_offset=0, with_routing=True)
    experts = routing.experts if self.record_routing else None
    return Prefix(cache=cache, logits=logits[:, -1].astype(jnp.float32), experts=experts)

  def prefill(self, *, params: Any, existing_prefix: Prefix | None = None,
              padded_tokens: jax.Array, true_length: int | jax.Array) -> Prefix:
    """KV cache for right-padded `padded_tokens` ([T] or [N, T]) of `true_length`.

    T should be one of the prefill buckets (JetStream pads to its own
    buckets; each distinct T compiles once).
    """
    tokens = jnp.asarray(padded_tokens, jnp.int32)
    lengths = jnp.asarray(true_length, jnp.int32)
    if tokens.ndim == 1:
      tokens, lengths = tokens[None], lengths.reshape(1)
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

  def continue_fn(self, rows: int, length: int, held: int) -> Any:
    """The jitted continuation of a `held`-slot prefix by `length` new tokens: (params, prefix, tokens, lengths) -> Prefix."""
    key = (rows, length, held)
    if key not in self._continue_prefills:
      self._continue_prefills[key] = jax.jit(_traced(self._mesh, self.rules, self._continue_impl),
                                             out_shardings=self.prefix_shardings(rows, held + length))
    return self._continue_prefills[key]

  def _continue_impl(self, params, prefix: Prefix, tokens: jax.Array, true_lengths: jax.Array) -> Prefix:
    """prefix of N rows x H slots, tokens [N, T] right-padded, true_lengths [N] -> Prefix of N rows x (H + T).

    The new tokens are rolled to the end of their chunk, so each row's last
    position holds its last token and only its logits are computed; the
    chunk's padding sits masked between the held tokens and the new ones.
    """
    length = tokens.shape[1]
    left, mask = _to_the_end(tokens, true_lengths)
    grow = lambda x: jnp.pad(x, [(0, length if axis == 2 else 0) for axis in range(x.ndim)])
    held = prefix.cache
    cache = KVCache(k=jax.tree.map(grow, held.k), v=jax.tree.map(grow, held.v),
                    mask=jnp.pad(held.mask, ((0, 0), (0, length))), index=held.index)
    model = nnx.merge(self.graphdef, params)
    logits, cache, routing = model.step(left, cache, attention_mask=mask.astype(jnp.int32), last_only=True,
                                        with_routing=True)
    experts = (jnp.concatenate([prefix.experts, routing.experts], axis=1) if self.record_routing else None)
    return Prefix(cache=cache, logits=logits[:, -1].astype(jnp.float32), experts=experts)

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
                    index=jnp.where(chosen, rows(p.index, ("cache_batch",)), c.index))
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
    return self._insert(prefix, decode_state, jnp.asarray(source), jnp.asarray(ids))

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

  def _append_impl(self, params, state: DecodeState, tokens: jax.Array, lengths: jax.Array) -> DecodeState:
    """Slot s takes tokens[s, :lengths[s]] after what its cache holds; slots with lengths[s] = 0 keep their state.

    tokens [slots, T] right-padded, lengths [slots]. One model call over all
    slots (the chunk's padding is written masked, and the write index then
    moves past the real tokens only, so later tokens overwrite it); logits
    come from each row's last new token only.
    """
    logits, cache, generated = self._continue_rows(params, state.cache, state.generated, tokens, lengths)
    active = lengths > 0
    return state._replace(cache=cache, logits=jnp.where(active[:, None], logits, state.logits), generated=generated,
                          done=jnp.where(active, generated >= self.max_decode_length, state.done))

  def _append_rows_impl(self, params, state: DecodeState, rows: jax.Array, tokens: jax.Array,
                        lengths: jax.Array) -> DecodeState:
    """The appending slots only: row r is slot rows[r] of its `cache_batch` shard (an index within the shard;
    the shard's slot count for a padding row) and takes tokens[r, :lengths[r]].

    rows [R], tokens [R, T], lengths [R], R split over the shards as the slots
    are. Each shard copies its R / shards appending rows out of its cache (no
    collective: indices are local), the model runs on those rows only, and
    the rows go back in place (padding rows are dropped), so the cost scales
    with the appending rows, not the slots.
    """
    specs = self.decode_state_shardings()
    take = lambda x, sh: _take_rows(self._mesh, x, rows, sh.spec)
    put = lambda x, new, sh: _put_rows(self._mesh, x, rows, new, sh.spec)
    c, cs = state.cache, specs.cache
    held = KVCache(k=jax.tree.map(take, c.k, cs.k), v=jax.tree.map(take, c.v, cs.v), mask=take(c.mask, cs.mask),
                   index=take(c.index, cs.index))
    logits, cache, generated = self._continue_rows(params, held, take(state.generated, specs.generated), tokens,
                                                   lengths)
    return state._replace(
        cache=KVCache(k=jax.tree.map(put, c.k, cache.k, cs.k), v=jax.tree.map(put, c.v, cache.v, cs.v),
                      mask=put(c.mask, cache.mask, cs.mask), index=put(c.index, cache.index, cs.index)),
        logits=put(state.logits, logits, specs.logits), generated=put(state.generated, generated, specs.generated),
        done=put(state.done, generated >= self.max_decode_length, specs.done))

  def _continue_rows(self, params, cache: KVCache, generated: jax.Array, tokens: jax.Array, lengths: jax.Array
                     ) -> tuple[jax.Array, KVCache, jax.Array]:
    """Rows of `cache` continued by tokens[r, :lengths[r]] ([R, T] right-padded, lengths [R]) -> (logits [R, V]
    after each row's last new token, the cache with them written and its write index past the real ones,
    generated + lengths)."""
    mask = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    model = nnx.merge(self.graphdef, params)
    hidden, written = model.step_hidden(tokens, cache, attention_mask=mask.astype(jnp.int32))
    last = jnp.take_along_axis(hidden, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)
    logits = model.logits(last)[:, 0].astype(jnp.float32)
    return logits, written._replace(index=cache.index + lengths), generated + lengths

  def _most_rows_per_shard(self) -> int:
    """The most rows per shard an append runs over alone (the largest power of two up to a quarter of a shard's
    slots; 0: none): more run over all slots in place (about as cheap as copying that many rows out and back),
    and no copy of the cache is made."""
    quarter = (self._slots // self.slot_shards) // 4
    return 1 << (quarter.bit_length() - 1) if quarter else 0

  def append_rows_per_shard(self, slots: Sequence[int]) -> int | None:
    """Rows per shard an append of `slots` runs over (the smallest power of two holding the most appending slots
    of one shard), or None when that is more than `_most_rows_per_shard`: the append then runs over all slots."""
    local = self._slots // self.slot_shards
    most = max(np.bincount(np.asarray(slots, np.int64) // local, minlength=self.slot_shards), default=0)
    rows = 1 << max(0, int(most) - 1).bit_length()
    return rows if rows <= self._most_rows_per_shard() else None

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
      rows, order = _rows_by_shard(sorted(tokens), self._slots // self.slot_shards, self.slot_shards, per_shard)
    chunk = np.zeros((len(order), width), np.int32)
    lengths = np.zeros((len(order),), np.int32)
    for r, slot in enumerate(order):
      ids = tokens.get(int(slot), ())
      chunk[r, :len(ids)] = ids
      lengths[r] = len(ids)
    if rows is None:
      return self._append(params, decode_state, jnp.asarray(chunk), jnp.asarray(lengths))
    return self._append_rows(params, decode_state, jnp.asarray(rows), jnp.asarray(chunk), jnp.asarray(lengths))

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
    return self._generate(params, decode_state, steps, sampling_params or self.sampling_params)

  def generate(self, params: Any, decode_state: DecodeState) -> tuple[DecodeState, Any]:
    """One decode step; returns JetStream `ResultTokens` (token, valid, length)."""
    state, out = self._generate(params, decode_state, 1, self.sampling_params)
    data = jnp.stack([out.tokens[:, 0], out.valid[:, 0].astype(jnp.int32), out.generated[:, 0]], axis=1)
    return state, ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                               samples_per_slot=1)

  def lowering_steps(self, params: Any, steps_per_call: int = 1, how: sampling.SamplingParams | None = None,
                     samples_per_prompt: int = 1, appending: int | None = None) -> list[Step]:
    """The engine's jitted calls on abstract arguments, at the shapes a rollout uses.

    Prefill at every bucket for a full refill (the prompts of
    `max_concurrent_decodes` requests of `samples_per_prompt` samples each,
    padded to a power of two rows as the sampler pads them), insertion
    into every slot, the decode loop of
    `steps_per_call` steps (what a rollout calls), and one decode step
    (its HBM traffic is a step's), and an append at each of
    `append_buckets` over all slots and over the rows of `appending` slots
    spread over the shards (default: the most rows an append runs over
    without running over all slots). `params` are arrays or ShapeDtypeStructs
    with shardings, taken in the compute dtype as the sampler passes them
    (`compute_params`).
    """
    how = how or self.sampling_params
    # a full refill's requests span at most slots / n + 1 prompts
    rows = 1 << max(0, (min(self._slots, -(-self._slots // samples_per_prompt) + 1) - 1).bit_length())
    replicated = NamedSharding(self._mesh, PartitionSpec())
    rows_sh = self._sharding(("batch",), (rows,))
    params = self.compute_params(abstract(params))
    state = self.abstract_decode_state()
    out = []
    for bucket in self.buckets:
      tokens = jax.ShapeDtypeStruct((rows, bucket), jnp.int32, sharding=self._sharding(("batch", None), (rows, bucket)))
      lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rows_sh)
      out.append(Step(f"prefill[{rows}x{bucket}]", self.prefill_fn(rows, bucket), (params, tokens, lengths)))
    prefix = abstract(jax.eval_shape(self._prefill_impl, params, tokens, lengths),
                      self.prefix_shardings(rows, self.buckets[-1]))
    source = jax.ShapeDtypeStruct((self._slots,), jnp.int32, sharding=replicated)
    slots = self._slots
    out.append(Step(f"insert[{rows} into {slots}]", self._insert, (prefix, state, source, source)))
    out.append(Step(f"decode[{slots} slots x {steps_per_call}]", self._generate, (params, state, steps_per_call, how)))
    if steps_per_call > 1:
      out.append(Step(f"decode_step[{slots} slots]", self._generate, (params, state, 1, how)))
    if appending is None:
      per_shard = self._most_rows_per_shard() or None
    else:
      if appending < 1:
        raise ValueError(f"appending={appending}: the appending slots must be 1 or more")
      per_shard = self.append_rows_per_shard(range(0, slots, max(1, slots // appending))[:appending])
    for width in self.append_buckets:
      out.append(self.append_lowering(params, width))
      if per_shard:
        out.append(self.append_lowering(params, width, per_shard))
    return out

  def append_lowering(self, params: Any, width: int, per_shard: int | None = None) -> Step:
    """The jitted append of a `width`-token chunk on abstract arguments (`params` as `lowering_steps` takes
    them): over all slots, or over `per_shard` appending rows of each `cache_batch` shard."""
    params, state = self.compute_params(abstract(params)), self.abstract_decode_state()
    if per_shard is None:
      rows, fn, args, name = self._slots, self._append, (), f"append[{self._slots} slots x {width}]"
    else:
      rows, fn = per_shard * self.slot_shards, self._append_rows
      index = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=self._sharding(("cache_batch",), (rows,)))
      args, name = (index,), f"append[{rows} of {self._slots} slots x {width}]"
    chunk = jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=self._sharding(("cache_batch", None), (rows, width)))
    lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=self._sharding(("cache_batch",), (rows,)))
    return Step(name, fn, (params, state, *args, chunk, lengths))

  # ----- tokenizer hooks --------------------------------------------------------

  def get_tokenizer(self) -> Any:
    """JetStream tokenizer metadata (the tokenizer object itself is `build_tokenizer`'s)."""
    tokenizer_pb2 = jetstream_compat.import_quietly("jetstream.engine.tokenizer_pb2") if HAS_JETSTREAM else None
    return {"path": "rljax"} if tokenizer_pb2 is None else tokenizer_pb2.TokenizerParameters(path="rljax")

  def build_tokenizer(self, metadata: Any = None) -> "JetStreamTokenizer":
    del metadata
    if self.tokenizer is None:
      raise ValueError("this engine was built without a tokenizer; pass tokenizer= to Engine")
    return JetStreamTokenizer(self.tokenizer, self.buckets, self.eos_ids)


class JetStreamTokenizer:
  """JetStream's tokenizer API over an rljax tokenizer (encode pads to a bucket)."""

  def __init__(self, tokenizer: Any, buckets: Sequence[int], eos_ids: Sequence[int]):
    self.tokenizer, self.buckets, self.eos_ids = tokenizer, tuple(buckets), tuple(eos_ids)

  def encode(self, s: str, **kwargs) -> tuple[np.ndarray, int]:
    """Token ids right-padded to the nearest bucket, and the true length."""
    del kwargs
    ids = list(self.tokenizer.encode(s))
    return pad_to_bucket(ids, self.buckets, self.pad_id), len(ids)

  def decode(self, token_ids: list[int], **kwargs) -> str:
    del kwargs
    return self.tokenizer.decode(token_ids)

  @property
  def pad_id(self) -> int:
    pad = getattr(self.tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else self.eos_id)

  @property
  def eos_id(self) -> int:
    return int(self.eos_ids[0]) if self.eos_ids else 0

  @property
  def bos_id(self) -> int:
    bos = getattr(self.tokenizer, "bos_token_id", None)
    return int(bos if bos is not None else self.pad_id)

  @property
  def stop_tokens(self) -> set[int]:
    return set(self.eos_ids)


def pad_to_bucket(ids: Sequence[int], buckets: Sequence[int], pad_id: int) -> np.ndarray:
  """[len(ids)] -> [bucket] right-padded with pad_id."""
  bucket = bucket_for(len(ids), buckets)
  out = np.full((bucket,), pad_id, np.int32)
  out[:len(ids)] = ids
  return out


def _to_the_end(tokens: jax.Array, true_lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
  """tokens [N, T] right-padded, true_lengths [N] -> (each row rolled so its tokens end at T, [N, T] bool mask of
  them)."""
  shift = tokens.shape[1] - true_lengths
  rolled = jax.vmap(lambda row, k: jnp.roll(row, k))(tokens, shift)
  return rolled, jnp.arange(tokens.shape[1])[None, :] >= shift[:, None]


def _is_expert_kernel(var: Any) -> bool:
  """Whether a state leaf is a stacked expert parameter (axis names `layers` first and `exp`)."""
  return (isinstance(var, nnx.Variable) and rules_lib.param_names(var)[:1] == ("layers",)
          and "exp" in rules_lib.param_names(var))


def _split_experts(params: Any) -> Any:
  """A parameter state with each stacked expert parameter held per layer (`PerLayer`; the rest as it is)."""

  def one(var: Any) -> Any:
    if not _is_expert_kernel(var) or isinstance(var.get_value(), PerLayer):
      return var
    return var.replace(split_layers(var.get_value()))

  return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _cast_floats(tree: Any, dtype: Any) -> Any:
  """Every floating leaf of `tree` in `dtype` (elementwise: each keeps its sharding)."""
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def cache_length(length: int, attention_kernel: str) -> int:
  """KV-cache slots for prompts and responses of `length` tokens: whole decode-kernel blocks under `pallas`."""
  return -(-length // 128) * 128 if attention_kernel == "pallas" else length


def _rows_by_shard(slots: Sequence[int], local: int, shards: int, per_shard: int) -> tuple[np.ndarray, np.ndarray]:
  """(rows [shards * per_shard]: each appending slot's index within its shard of `local` slots, `local` for
  padding; order: the slot each row is, -1 for padding), shard by shard as the slots are split."""
  rows = np.full((shards, per_shard), local, np.int32)
  order = np.full((shards, per_shard), -1, np.int64)
  for shard in range(shards):
    mine = [s for s in slots if s // local == shard]
    rows[shard, :len(mine)] = np.asarray(mine, np.int64) - shard * local
    order[shard, :len(mine)] = mine
  return rows.reshape(-1), order.reshape(-1)


def _take_rows(mesh: Mesh, x: jax.Array, rows: jax.Array, spec: PartitionSpec) -> jax.Array:
  """x's rows `rows` [R] (indices within each shard of x's first axis; R split as that axis is) -> [R, ...] laid
  out as x, gathered on each device from its own shard."""
  lead = PartitionSpec(spec[0] if spec else None)
  return jax.shard_map(lambda a, r: jnp.take(a, r, axis=0, mode="clip"), mesh=mesh, in_specs=(spec, lead),
                       out_specs=spec, check_vma=False)(x, rows)


def _put_rows(mesh: Mesh, x: jax.Array, rows: jax.Array, new: jax.Array, spec: PartitionSpec) -> jax.Array:
  """x with its rows `rows` (indices within each shard, as `_take_rows` reads them) set to `new` [R, ...] in
  place on each device; rows past a shard's end (padding) are dropped."""
  lead = PartitionSpec(spec[0] if spec else None)
  return jax.shard_map(lambda a, r, b: a.at[r].set(b, mode="drop"), mesh=mesh, in_specs=(spec, lead, spec),
                       out_specs=spec, check_vma=False)(x, rows, new)


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
