"""A JetStream engine over rljax's causal LMs.

`Engine` implements the interface of `jetstream.engine.engine_api.Engine`
(google-jetstream 0.2.2): `prefill` computes a request's KV cache, `insert`
places it into one of `max_concurrent_decodes` decode slots, `generate` runs
one decode step for every slot. When google-jetstream is installed the class
is a real subclass of JetStream's `Engine` and returns its `ResultTokens`, so
JetStream's orchestrator can serve it; without it (the core install, no
TensorFlow) the same class works with a local `ResultTokens` of the same
layout.

Layout. The decode state holds a KV cache of L arrays `[slots, K, S, head_dim]`
(`S = max_prefill_length + max_decode_length`) sharded over the mesh (slots
over data/fsdp, KV heads over tensor), the next-token logits of every slot,
and per-slot counters. Prompts arrive right-padded to a length bucket (one
compilation per bucket, not per prompt length), as JetStream pads them; the
prefill moves the padding to the left, so a slot's cache holds the prompt
in slots `[bucket - true_length, bucket)` (the rest masked) and generated
tokens from slot `bucket` on. `generate` first samples from the stored logits (so the first token
comes from the prompt's last position), then runs the model on the sampled
token. Functions that update the decode state donate it, so the cache is
updated in place.

Parameters are an argument of every call: the engine reads whatever
parameter pytree it is given (the trainer's own arrays), never a copy.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import CPU_DOT_LIBRARIES
from rljax.models import CausalLM, KVCache, ModelConfig, init_cache
from rljax.rollout import jetstream_compat, sampling
from rljax.sharding import rules as rules_lib


_JETSTREAM = jetstream_compat.import_quietly("jetstream.engine.engine_api")
HAS_JETSTREAM = _JETSTREAM is not None


@struct.dataclass
class _LocalResultTokens:
  """JetStream's ResultTokens layout: data [slots, 3] = token | valid | length."""

  data: Any
  tokens_idx: tuple[int, int] = struct.field(pytree_node=False)
  valid_idx: tuple[int, int] = struct.field(pytree_node=False)
  length_idx: tuple[int, int] = struct.field(pytree_node=False)
  samples_per_slot: int = struct.field(pytree_node=False)

  def copy_to_host_async(self) -> None:
    if not isinstance(self.data, np.ndarray):
      self.data.copy_to_host_async()

  def convert_to_numpy(self) -> "_LocalResultTokens":
    return dataclasses.replace(self, data=np.asarray(self.data))


ResultTokens = _JETSTREAM.ResultTokens if HAS_JETSTREAM else _LocalResultTokens
_EngineBase = _JETSTREAM.Engine if HAS_JETSTREAM else abc.ABC


class Prefix(NamedTuple):
  """A prefilled request (or N of them).

  Attributes:
    cache: KVCache with N rows of `bucket` slots (left-padded; `index` = bucket).
    logits: [N, V] float32 next-token logits after the prompt.
  """

  cache: KVCache
  logits: jax.Array


class DecodeState(NamedTuple):
  """Everything `generate` transforms.

  Attributes:
    cache: KVCache, L arrays [slots, K, S, head_dim] (+ mask [slots, S], index [slots]).
    logits: [slots, V] float32 next-token logits per slot.
    generated: [slots] int32, tokens generated so far.
    done: [slots] bool, True for empty or finished slots.
    key: PRNG key for sampling.
  """

  cache: KVCache
  logits: jax.Array
  generated: jax.Array
  done: jax.Array
  key: jax.Array


class StepOutput(NamedTuple):
  """One decode step for every slot: token, validity, log-prob, count."""

  tokens: jax.Array
  valid: jax.Array
  log_probs: jax.Array
  generated: jax.Array


EIGEN_ROWS = (8, 24)


def cpu_dot_options(library: str, rows: int) -> dict[str, str]:
  """XLA:CPU compiler options that run the decode loop's dots through `library`.

  XLA's CPU backend sends dots to YNNPACK by default. A decode step's dots
  have one row per slot held by the device ([rows, D] x [D, F]); on a
  2-core AVX2 host Eigen ran SmolLM2-135M's float32 decode step 1.25x
  faster than YNNPACK at 8 rows, 1.22x at 16, 1.11x at 24, the same at 32,
  and YNNPACK was 1.07x faster at 64; below 8 rows Eigen was 2-3x slower
  (2, 4 and 6 rows) or the same (1 row) (BENCHMARKS.md). "auto" picks Eigen
  for EIGEN_ROWS[0] to EIGEN_ROWS[1] rows.

  Args:
    library: auto, ynnpack or eigen (actor_rollout_ref.rollout.cpu_dot_library).
    rows: decode rows per device.

  Returns:
    Options for `jax.jit(compiler_options=...)`; empty keeps XLA's default.
  """
  if library not in CPU_DOT_LIBRARIES:
    raise ValueError(f"cpu_dot_library={library!r}: must be one of {', '.join(CPU_DOT_LIBRARIES)}")
  eigen = library == "eigen" or (library == "auto" and EIGEN_ROWS[0] <= rows <= EIGEN_ROWS[1])
  return {"xla_cpu_experimental_ynn_fusion_type": ""} if eigen else {}


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length."""
  for bucket in buckets:
    if bucket >= length:
      return bucket
  raise ValueError(f"a prompt of {length} tokens exceeds the largest prefill bucket {buckets[-1]} "
                   "(actor_rollout_ref.rollout.prefill_length_buckets / data.max_prompt_length)")


class Engine(_EngineBase):
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
      cpu_dot_library: str = "auto",
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
      cpu_dot_library: on the CPU, the library that runs the decode loop's
        dots (`cpu_dot_options`); ignored on accelerators.
    """
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
    self.cache_length = self.buckets[-1] + self.max_decode_length
    self._prefill = jax.jit(self._prefill_impl)
    self._insert = jax.jit(self._insert_impl, donate_argnums=(1,))
    self.decode_compiler_options = self._decode_compiler_options(cpu_dot_library)
    self._generate = jax.jit(self._generate_impl, static_argnums=(2, 3), donate_argnums=(1,),
                             compiler_options=self.decode_compiler_options)

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

  def _decode_compiler_options(self, cpu_dot_library: str) -> dict[str, str]:
    """`cpu_dot_options` for the slots each device decodes; none off the CPU."""
    options = cpu_dot_options(cpu_dot_library, self.decode_state_shardings().done.shard_shape((self._slots,))[0])
    return options if self._mesh.devices.flat[0].platform == "cpu" else {}

  # ----- shardings ------------------------------------------------------------

  def _sharding(self, names: tuple[str | None, ...], shape: tuple[int, ...]) -> NamedSharding:
    return NamedSharding(self._mesh, rules_lib.logical_to_spec(names, shape, self._mesh, self.rules))

  def decode_state_shardings(self) -> DecodeState:
    """NamedShardings of the decode state: slots over the batch rule, KV heads over tensor."""
    cfg, slots, length = self.cfg, self._slots, self.cache_length
    kv_shape = (slots, cfg.num_kv_heads, length, cfg.head_dim)
    kv = (self._sharding(("batch", "kv_heads", "length", "head_dim"), kv_shape),) * cfg.num_layers
    per_slot = self._sharding(("batch",), (slots,))
    return DecodeState(
        cache=KVCache(k=kv, v=kv, mask=self._sharding(("batch", "length"), (slots, length)), index=per_slot),
        logits=self._sharding(("batch", "vocab"), (slots, cfg.vocab_size)),
        generated=per_slot, done=per_slot,
        key=NamedSharding(self._mesh, PartitionSpec()))

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    """Empty slots, all marked done; the cache is created on its devices."""
    del args, kwargs
    cfg, slots, length = self.cfg, self._slots, self.cache_length

    def make():
      return DecodeState(
          cache=init_cache(cfg, slots, length),
          logits=jnp.zeros((slots, cfg.vocab_size), jnp.float32),
          generated=jnp.zeros((slots,), jnp.int32),
          done=jnp.ones((slots,), bool),
          key=jax.random.key(self.seed))

    return jax.jit(make, out_shardings=self.decode_state_shardings())()

  # ----- prefill / insert / generate -----------------------------------------

  def _prefill_impl(self, params, tokens: jax.Array, true_lengths: jax.Array) -> Prefix:
    """tokens [N, bucket] right-padded, true_lengths [N] -> Prefix of N rows.

    Rows are rolled to left padding first, so the last position holds each
    prompt's last token and only its logits are computed (no [N, bucket, V]).
    """
    n, bucket = tokens.shape
    shift = bucket - true_lengths
    left = jax.vmap(lambda row, k: jnp.roll(row, k))(tokens, shift)
    mask = jnp.arange(bucket)[None, :] >= shift[:, None]
    model = nnx.merge(self.graphdef, params)
    logits, cache = model.step(left, init_cache(self.cfg, n, bucket), attention_mask=mask.astype(jnp.int32),
                               last_only=True)
    return Prefix(cache=cache, logits=logits[:, -1].astype(jnp.float32))

  def prefill(self, *, params: Any, existing_prefix: Prefix | None = None,
              padded_tokens: jax.Array, true_length: int | jax.Array) -> Prefix:
    """KV cache for right-padded `padded_tokens` ([T] or [N, T]) of `true_length`.

    T should be one of the prefill buckets (JetStream pads to its own
    buckets; each distinct T compiles once).
    """
    if existing_prefix is not None:
      raise ValueError("rljax's engine prefills whole prompts; existing_prefix (prefix "
                       "continuation) is not supported")
    tokens = jnp.asarray(padded_tokens, jnp.int32)
    lengths = jnp.asarray(true_length, jnp.int32)
    if tokens.ndim == 1:
      tokens, lengths = tokens[None], lengths.reshape(1)
    return self._prefill(params, tokens, lengths)

  def _insert_impl(self, prefix: Prefix, state: DecodeState, slots: jax.Array, rows: jax.Array,
                   valid: jax.Array) -> DecodeState:
    """Copies prefix row rows[i] into decode slot slots[i] wherever valid[i]."""
    bucket = prefix.cache.mask.shape[1]

    def one(i, st: DecodeState) -> DecodeState:
      slot, row = slots[i], rows[i]

      def write(st: DecodeState) -> DecodeState:
        c, p = st.cache, prefix.cache
        put = lambda dst, src: jax.lax.dynamic_update_slice(dst, src[row][None], (slot, 0, 0, 0))
        k = tuple(map(put, c.k, p.k))
        v = tuple(map(put, c.v, p.v))
        mask_row = jnp.zeros((c.mask.shape[1],), bool).at[:bucket].set(p.mask[row])
        cache = KVCache(k=k, v=v, mask=c.mask.at[slot].set(mask_row), index=c.index.at[slot].set(p.index[row]))
        return st._replace(cache=cache, logits=st.logits.at[slot].set(prefix.logits[row]),
                           generated=st.generated.at[slot].set(0), done=st.done.at[slot].set(False))

      return jax.lax.cond(valid[i], write, lambda s: s, st)

    return jax.lax.fori_loop(0, slots.shape[0], one, state)

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    """Places a one-request prefix into `slot` (the decode state is donated)."""
    one = jnp.zeros((1,), jnp.int32)
    return self._insert(prefix, decode_state, jnp.full((1,), slot, jnp.int32), one, jnp.ones((1,), bool))

  def insert_many(self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int],
                  rows: Sequence[int]) -> DecodeState:
    """Places prefix row rows[i] into slot slots[i] for every i in one call.

    The index arrays are padded to `max_concurrent_decodes` so the call
    compiles once per prefill bucket, whatever the number of insertions.
    """
    count = len(slots)
    if count > self._slots:
      raise ValueError(f"{count} insertions for {self._slots} slots")
    pad = self._slots - count
    slots_a = jnp.asarray(list(slots) + [0] * pad, jnp.int32)
    rows_a = jnp.asarray(list(rows) + [0] * pad, jnp.int32)
    valid = jnp.asarray([True] * count + [False] * pad)
    return self._insert(prefix, decode_state, slots_a, rows_a, valid)

  def _step(self, params, state: DecodeState, how: sampling.SamplingParams) -> tuple[DecodeState, StepOutput]:
    """Sample every active slot from its logits, then feed the sampled token."""
    key, sub = jax.random.split(state.key)
    tokens, log_probs = sampling.sample(sub, state.logits, how)
    active = ~state.done
    generated = state.generated + active.astype(jnp.int32)
    stop = generated >= self.max_decode_length
    if self.eos_ids and not self.ignore_eos:
      stop |= jnp.isin(tokens, jnp.asarray(self.eos_ids, jnp.int32))
    model = nnx.merge(self.graphdef, params)
    logits, cache = model.step(tokens[:, None], state.cache, attention_mask=active[:, None].astype(jnp.int32))
    new_state = DecodeState(cache=cache, logits=logits[:, -1].astype(jnp.float32), generated=generated,
                            done=state.done | (active & stop), key=key)
    return new_state, StepOutput(tokens=tokens, valid=active, log_probs=log_probs, generated=generated)

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

  # ----- tokenizer hooks --------------------------------------------------------

  def get_tokenizer(self) -> Any:
    """JetStream tokenizer metadata (the tokenizer object itself is `build_tokenizer`'s)."""
    if HAS_JETSTREAM:
      from jetstream.engine import tokenizer_pb2  # pylint: disable=import-outside-toplevel
      return tokenizer_pb2.TokenizerParameters(path="rljax")
    return {"path": "rljax"}

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


def make_engine(model: CausalLM, compute_dtype: Any = None, **kwargs) -> Engine:
  """An Engine for `model`'s graph; pass its parameters to each call.

  Args:
    model: the model whose parameters the engine will be given.
    compute_dtype: activation and KV-cache dtype of prefill and decode
      (`rollout.dtype`); default the model's. Parameters keep their own
      dtype and are read in place; each matmul casts its weight on the fly.
    **kwargs: Engine arguments.
  """
  cfg = model.cfg
  if compute_dtype is None or jnp.dtype(compute_dtype) == jnp.dtype(cfg.dtype):
    return Engine(nnx.graphdef(model), cfg, **kwargs)
  cfg = dataclasses.replace(cfg, dtype=jnp.dtype(compute_dtype))
  view = nnx.merge(*nnx.split(model))  # new modules over the same arrays, LoRA adapters included
  view.set_attributes(cfg=cfg, raise_if_not_found=False)
  return Engine(nnx.graphdef(view), cfg, **kwargs)
