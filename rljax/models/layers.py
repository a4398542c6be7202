"""Decoder layers: RMSNorm, GQA attention with RoPE, gated MLP (SwiGLU or GeGLU), the block.

Every parameter is an ``nnx.Param`` whose ``out_sharding`` metadata holds its
logical axis names (``embed``, ``mlp``, ``heads``, ``kv_heads``,
``head_dim``, ``vocab``, and ``layers`` first when layers are stacked for
``lax.scan``). The sharding rules map those names onto a mesh.

A module built with ``stack=L`` holds parameters for L layers at once (a
leading ``layers`` axis); its ``__call__`` is written for one layer and runs
on a slice of that state inside ``lax.scan``.

A projection may carry an adapter (``rljax.models.lora``): the module's
``adapters`` dict maps the kernel's attribute name (``q``, ``down``, ...) to
a module taking the projection's input and returning a delta of the
projection's output shape, added to it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from rljax.models import kv_quant, rope, weight_quant
from rljax.models.kv_quant import QuantizedKV
from rljax.models.attention import AttentionMask, attend
from rljax.models.config import ModelConfig
from rljax.sharding.rules import constrain, gather, gathers, param_names

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]
_NORMAL = jax.nn.initializers.normal(0.02)
_ZEROS = jax.nn.initializers.zeros
_ONES = jax.nn.initializers.ones


def make_param(
    rngs: nnx.Rngs,
    shape: tuple[int, ...],
    names: tuple[str, ...],
    init: Initializer,
    dtype: Any,
    stack: int | None = None,
) -> nnx.Param:
  """A Param of ``shape`` with logical axis ``names`` (``layers`` prepended if stacked)."""
  if stack is not None:
    shape, names = (stack, *shape), ("layers", *names)
  return nnx.Param(
      init(rngs.params(), shape, dtype), out_sharding=names, eager_sharding=False
  )


@jax.tree_util.register_pytree_node_class
class PerLayer:
  """A stacked parameter [L, ...] held as its L layers' values (arrays or `QuantizedWeight`s), each [...].

  The engine's copy of a scanned mixture-of-experts model keeps its expert
  kernels this way (`rljax.rollout.engine`): its layers run one after
  another on static slices, and a slice of a stacked kernel feeding a
  grouped matmul is copied out every decode step (a dot reads it in place),
  where a layer's own array is read as it lies.
  """

  def __init__(self, layers: Any):
    self.layers = tuple(layers)

  def tree_flatten(self) -> tuple[tuple[Any, ...], None]:
    return self.layers, None

  @classmethod
  def tree_unflatten(cls, _, layers: Any) -> "PerLayer":
    return cls(layers)


def split_layers(value: Any) -> PerLayer:
  """A stacked value (an array or a `QuantizedWeight` of arrays [L, ...]) as a PerLayer of its L layers."""
  return PerLayer(jax.tree.map(lambda x, i=i: x[i], value) for i in range(jax.tree.leaves(value)[0].shape[0]))


def layer_of(value: Any, i: int) -> Any:
  """Layer i of a stacked value: its own entry of a PerLayer, else a static slice [i] of each array."""
  if isinstance(value, PerLayer):
    return value.layers[i]
  return jax.tree.map(lambda x: x[i], value)


@jax.custom_vjp
def _cast(x: jax.Array, dtype_of: jax.Array) -> jax.Array:
  return x.astype(dtype_of.dtype)


def _cast_fwd(x, dtype_of):
  return _cast(x, dtype_of), None


def _cast_bwd(_, grad):
  return grad, None


_cast.defvjp(_cast_fwd, _cast_bwd)


def compute_cast(x: jax.Array, dtype: Any) -> jax.Array:
  """x cast to the compute dtype; when that is narrower, its gradient is left in it.

  A plain cast's transpose turns a bfloat16 gradient back into the
  parameter's float32, so every layer's gradient of a micro-batch would
  be held in float32 before it joins the (float32) accumulator; this keeps
  it in bfloat16, the dtype it was computed in. A cast to a wider dtype is
  a plain cast (its gradient comes back in the parameter's dtype).
  """
  if jnp.dtype(x.dtype) == jnp.dtype(dtype):
    return x
  if jnp.dtype(dtype).itemsize >= jnp.dtype(x.dtype).itemsize:
    return x.astype(dtype)
  return _cast(x, jnp.zeros((), dtype))


def gather_layer(state: nnx.State, dtype: Any) -> nnx.State:
  """A layer's state with its floating parameters cast to `dtype` and FSDP-gathered (`rljax.sharding.rules.gather`).

  Called where a layer starts, inside its rematerialised region: the cast
  runs on each device's shard before the gather (half the bytes of a
  float32 gather for bfloat16 compute), and the backward pass gathers once.
  Outside a gathering context the state is returned as it is.
  """
  def one(var):
    if not isinstance(var, nnx.Param):
      return var
    value = var.get_value()
    names = param_names(var)
    if isinstance(value, weight_quant.QuantizedWeight):  # the engine's 8-bit weights: gathered as stored
      names = names[len(names) - value.values.ndim:]
      return var.replace(weight_quant.QuantizedWeight(*(gather(v, names) for v in value)))
    if not jnp.issubdtype(value.dtype, jnp.floating):
      return var
    names = names[len(names) - value.ndim:]
    return var.replace(gather(compute_cast(value, dtype), names))

  if not gathers():
    return state
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def with_adapter(module: nnx.Module, name: str, x: jax.Array, y: jax.Array) -> jax.Array:
  """y plus ``module.adapters[name](x)`` when the projection ``name`` has an adapter, else y.

  Args:
    module: the Attention or MLP holding the projection.
    name: the kernel's attribute name (``q``, ``o``, ``gate``, ...).
    x: the projection's input [..., *in].
    y: the projection's output [..., *out].
  """
  adapters = getattr(module, "adapters", None)
  if adapters is None or name not in adapters:
    return y
  return y + adapters[name](x).astype(y.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, plus_one: bool = False) -> jax.Array:
  """x / rms(x) * scale over the last axis, computed in float32.

  ``plus_one`` (Gemma): times (1 + scale), the product taken in float32 and
  cast to x's dtype after it.
  """
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  if plus_one:
    return (normed * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
  return scale.astype(x.dtype) * normed.astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over a last axis of size ``dim`` named ``name`` (``plus_one``: scaled by 1 + weight, weight from 0)."""

  def __init__(
      self, dim: int, eps: float, rngs: nnx.Rngs, *, name: str = "embed",
      dtype: Any = jnp.float32, stack: int | None = None, plus_one: bool = False,
  ):
    self.eps = eps
    self.plus_one = plus_one
    self.scale = make_param(rngs, (dim,), (name,), _ZEROS if plus_one else _ONES, dtype, stack)

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.scale[...], self.eps, self.plus_one)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optional biases, q/k norm and score softcapping."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
    d, h, k, hd, pd = (
        cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
    )
    if h % k:
      raise ValueError(f"num_attention_heads={h} is not a multiple of num_key_value_heads={k}.")
    self.cfg = cfg
    self.q = make_param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), _NORMAL, pd, stack)
    self.k = make_param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), _NORMAL, pd, stack)
    self.v = make_param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), _NORMAL, pd, stack)
    self.o = make_param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), _NORMAL, pd, stack)
    if cfg.qkv_bias:
      self.q_bias = make_param(rngs, (h, hd), ("heads", "head_dim"), _ZEROS, pd, stack)
      self.k_bias = make_param(rngs, (k, hd), ("kv_heads", "head_dim"), _ZEROS, pd, stack)
      self.v_bias = make_param(rngs, (k, hd), ("kv_heads", "head_dim"), _ZEROS, pd, stack)
    if cfg.o_bias:
      self.o_bias = make_param(rngs, (d,), ("embed",), _ZEROS, pd, stack)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, rngs, name="head_dim", dtype=pd, stack=stack,
                            plus_one=cfg.norm_plus_one)
      self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, rngs, name="head_dim", dtype=pd, stack=stack,
                            plus_one=cfg.norm_plus_one)

  def _project(self, x: jax.Array, name: str) -> jax.Array:
    """x [B, T, D] -> [B, T, N, head_dim] through kernel ``name`` (q, k or v), its adapter and bias."""
    y = jnp.einsum("btd,dnh->btnh", x, weight_quant.value(getattr(self, name), x.dtype))
    y = with_adapter(self, name, x, y)
    if self.cfg.qkv_bias:
      y = y + getattr(self, f"{name}_bias")[...].astype(x.dtype)
    return y

  def __call__(
      self,
      x: jax.Array,
      cos: jax.Array,
      sin: jax.Array,
      mask: AttentionMask,
      kv: tuple[jax.Array, jax.Array] | None = None,
      write_index: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """Self-attention.

    Args:
      x: [B, T, D] inputs.
      cos, sin: [B, T, head_dim] RoPE tables for the T new tokens.
      mask: which keys each query sees: over the T new tokens without a
        cache, over the cache's S slots (the new tokens' included) with one.
      kv: optional cache (k, v), each [B, K, S, head_dim] (or its 8-bit
        `QuantizedKV`, quantized as it is written): the T new keys and
        values are written at row b's slots write_index[b] .. + T first,
        then attention runs over the whole cache. Written before it is read,
        a donated cache is updated in place (reading the old cache and
        writing afterwards makes XLA copy it).
      write_index: [B] the slot of each row's first new token (with kv).

    Returns:
      ([B, T, D] outputs, the updated (k, v) with a cache, else None).
    """
    cfg = self.cfg
    heads = ("cache_batch", "length", "heads", "head_dim")
    kv_heads = ("cache_batch", "length", "kv_heads", "head_dim")
    q = constrain(self._project(x, "q"), heads)
    k = constrain(self._project(x, "k"), kv_heads)
    v = constrain(self._project(x, "v"), kv_heads)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin)
    b, t, h, hd = q.shape
    groups = h // cfg.num_kv_heads
    scale = (cfg.query_pre_attn_scalar or hd) ** -0.5
    q = q.reshape(b, t, cfg.num_kv_heads, groups, hd) * jnp.asarray(scale, q.dtype)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if kv is None:
      new_kv = None
    else:
      new_kv = (write_kv(kv[0], k, write_index), write_kv(kv[1], v, write_index))
      k, v = new_kv
    out = attend(q, k, v, mask, cfg.attention_kernel, cfg.attn_logit_softcapping).astype(x.dtype).reshape(b, t, h, hd)
    out = checkpoint_name(constrain(out, ("batch", "length", "heads", "head_dim")), "attention_out")
    y = with_adapter(self, "o", out, jnp.einsum("bthk,hkd->btd", out, weight_quant.value(self.o, x.dtype)))
    if cfg.o_bias:
      y = y + self.o_bias[...].astype(x.dtype)
    return y, new_kv


def write_slots(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """[B, K, S, ...] cache with row b's T new slots [B, K, T, ...] written at index[b]."""
  return jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice_in_dim(c, u, i, 1))(cache, new, index)


def write_kv(cache: jax.Array | QuantizedKV, new: jax.Array, index: jax.Array) -> jax.Array | QuantizedKV:
  """One layer's cache [B, K, S, hd] (an array, or 8-bit values and scales) with new [B, K, T, hd] written at
  row b's slots index[b] .. + T (quantized first for a `QuantizedKV` cache)."""
  if isinstance(cache, QuantizedKV):
    new = kv_quant.quantize(new, cache.values.dtype, cache.scale.dtype)
    return QuantizedKV(write_slots(cache.values, new.values, index), write_slots(cache.scale, new.scale, index))
  return write_slots(cache, new.astype(cache.dtype), index)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}


class MLP(nnx.Module):
  """Gated MLP: down(act(gate(x)) * up(x)), act silu (SwiGLU) or tanh-approximated gelu (GeGLU)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
    self.bias = cfg.mlp_bias
    self.act = cfg.hidden_act
    self.gate = make_param(rngs, (d, f), ("embed", "mlp"), _NORMAL, pd, stack)
    self.up = make_param(rngs, (d, f), ("embed", "mlp"), _NORMAL, pd, stack)
    self.down = make_param(rngs, (f, d), ("mlp", "embed"), _NORMAL, pd, stack)
    if cfg.mlp_bias:
      self.gate_bias = make_param(rngs, (f,), ("mlp",), _ZEROS, pd, stack)
      self.up_bias = make_param(rngs, (f,), ("mlp",), _ZEROS, pd, stack)
      self.down_bias = make_param(rngs, (d,), ("embed",), _ZEROS, pd, stack)

  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, T, D] -> [B, T, D]."""
    hidden_axes = ("batch", "length", "mlp")
    gate = constrain(with_adapter(self, "gate", x, x @ weight_quant.value(self.gate, x.dtype)), hidden_axes)
    up = constrain(with_adapter(self, "up", x, x @ weight_quant.value(self.up, x.dtype)), hidden_axes)
    if self.bias:
      gate = gate + self.gate_bias[...].astype(x.dtype)
      up = up + self.up_bias[...].astype(x.dtype)
    hidden = ACTIVATIONS[self.act](gate) * up
    y = with_adapter(self, "down", hidden, hidden @ weight_quant.value(self.down, x.dtype))
    if self.bias:
      y = y + self.down_bias[...].astype(x.dtype)
    return y


class Block(nnx.Module):
  """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x)).

  With ``sandwich_norms`` (Gemma): x + norm(attn(norm(x))), then
  + norm(mlp(norm(x))). ``post_attn_norm`` is HF's post_attention_layernorm
  in both: the MLP's input norm without sandwich norms, the attention
  output's with them. ``mlp`` replaces the dense SwiGLU (a mixture-of-experts
  layer passes ``rljax.models.moe.MoE``: called with the token mask, it
  returns its routing beside its output).
  """

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None, mlp: nnx.Module | None = None):
    norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, rngs, dtype=cfg.param_dtype,  # noqa: E731
                           stack=stack, plus_one=cfg.norm_plus_one)
    self.sandwich = cfg.sandwich_norms
    self.input_norm = norm()
    self.attn = Attention(cfg, rngs, stack)
    self.post_attn_norm = norm()
    if cfg.sandwich_norms:
      self.pre_mlp_norm = norm()
      self.post_mlp_norm = norm()
    self.mlp = MLP(cfg, rngs, stack) if mlp is None else mlp

  def __call__(
      self,
      x: jax.Array,
      cos: jax.Array,
      sin: jax.Array,
      mask: AttentionMask,
      kv: tuple[jax.Array, jax.Array] | None = None,
      write_index: jax.Array | None = None,
      experts: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None, tuple[jax.Array, jax.Array] | None]:
    """[B, T, D] -> ([B, T, D], updated kv, (router stats [2, E], experts [B, T, k]) or None).

    See Attention for the arguments; ``experts`` [B, T, k] replays a
    mixture-of-experts layer's routing.
    """
    residual = ("batch", "activation_length", "embed")
    attn_out, kv = self.attn(self.input_norm(x), cos, sin, mask, kv, write_index)
    if self.sandwich:
      x = constrain(x + constrain(self.post_attn_norm(attn_out), residual), residual)
      h = self.pre_mlp_norm(x)
    else:
      x = constrain(x + constrain(attn_out, residual), residual)
      h = self.post_attn_norm(x)
    if isinstance(self.mlp, MLP):
      mlp_out, routing = self.mlp(h), None
    else:
      valid = None if mask.query_segments is None else mask.query_segments != 0
      mlp_out, routing = self.mlp(h, valid, experts)
    if self.sandwich:
      mlp_out = self.post_mlp_norm(mlp_out)
    x = constrain(x + constrain(mlp_out, residual), residual)
    return x, kv, routing
