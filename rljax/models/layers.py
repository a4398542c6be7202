"""Decoder layers: RMSNorm, GQA attention with RoPE, SwiGLU MLP, the block.

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

from rljax.models import rope
from rljax.models.config import ModelConfig

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


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) * scale over the last axis, computed in float32."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * normed.astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over a last axis of size ``dim`` named ``name``."""

  def __init__(
      self, dim: int, eps: float, rngs: nnx.Rngs, *, name: str = "embed",
      dtype: Any = jnp.float32, stack: int | None = None,
  ):
    self.eps = eps
    self.scale = make_param(rngs, (dim,), (name,), _ONES, dtype, stack)

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.scale[...], self.eps)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optional biases and q/k norm."""

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
      self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, rngs, name="head_dim", dtype=pd, stack=stack)
      self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, rngs, name="head_dim", dtype=pd, stack=stack)

  def _project(self, x: jax.Array, name: str) -> jax.Array:
    """x [B, T, D] -> [B, T, N, head_dim] through kernel ``name`` (q, k or v), its adapter and bias."""
    y = jnp.einsum("btd,dnh->btnh", x, getattr(self, name)[...].astype(x.dtype))
    y = with_adapter(self, name, x, y)
    if self.cfg.qkv_bias:
      y = y + getattr(self, f"{name}_bias")[...].astype(x.dtype)
    return y

  def __call__(
      self,
      x: jax.Array,
      cos: jax.Array,
      sin: jax.Array,
      mask: jax.Array,
      kv: tuple[jax.Array, jax.Array] | None = None,
      write_index: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """Self-attention.

    Args:
      x: [B, T, D] inputs.
      cos, sin: [B, T, head_dim] RoPE tables for the T new tokens.
      mask: [B, T, T] without a cache; [B, T, S] over the cache's slots
        (the new tokens' slots included) with one.
      kv: optional cache (k, v), each [B, K, S, head_dim]: the T new keys
        and values are written at row b's slots write_index[b] .. + T first,
        then attention runs over the whole cache. Written before it is read,
        a donated cache is updated in place (reading the old cache and
        writing afterwards makes XLA copy it).
      write_index: [B] the slot of each row's first new token (with kv).

    Returns:
      ([B, T, D] outputs, the updated (k, v) with a cache, else None).
    """
    cfg = self.cfg
    q = self._project(x, "q")
    k = self._project(x, "k")
    v = self._project(x, "v")
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin)
    b, t, h, hd = q.shape
    groups = h // cfg.num_kv_heads
    q = q.reshape(b, t, cfg.num_kv_heads, groups, hd) * jnp.asarray(hd ** -0.5, q.dtype)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if kv is None:
      out = _attend(q, [(k, v, mask)], x.dtype)
      new_kv = None
    else:
      new_kv = (write_slots(kv[0], k.astype(kv[0].dtype), write_index),
                write_slots(kv[1], v.astype(kv[1].dtype), write_index))
      out = _attend(q, [(new_kv[0], new_kv[1], mask)], x.dtype)
    out = out.reshape(b, t, h, hd)
    y = with_adapter(self, "o", out, jnp.einsum("bthk,hkd->btd", out, self.o[...].astype(x.dtype)))
    if cfg.o_bias:
      y = y + self.o_bias[...].astype(x.dtype)
    return y, new_kv


def write_slots(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """[B, K, S, hd] cache with row b's T new slots [B, K, T, hd] written at index[b]."""
  return jax.vmap(lambda c, u, i: jax.lax.dynamic_update_slice_in_dim(c, u, i, 1))(cache, new, index)


def _attend(q: jax.Array, parts: list[tuple[jax.Array, jax.Array, jax.Array]], dtype) -> jax.Array:
  """Softmax attention of scaled queries q [B, T, K, G, hd] over several key/value parts.

  Each part is (keys [B, K, S_i, hd], values [B, K, S_i, hd], mask [B, T, S_i]);
  the softmax runs over all parts' keys together, as over their concatenation,
  without building it. Keys and values are laid out head-major ([B, K, S, hd]),
  so the score and value contractions are plain batched matmuls over (B, K)
  with no transpose of the (cached) keys.
  """
  neg = jnp.finfo(jnp.float32).min
  scores = [jnp.where(m[:, None, None], jnp.einsum("btkgh,bksh->bkgts", q, k.astype(q.dtype)).astype(jnp.float32), neg)
            for k, _, m in parts]
  top = functools.reduce(jnp.maximum, [s.max(axis=-1, keepdims=True) for s in scores])
  weights = [jnp.exp(s - top) for s in scores]
  total = functools.reduce(jnp.add, [w.sum(axis=-1, keepdims=True) for w in weights])
  return functools.reduce(jnp.add, [_weighted_values((w / total).astype(dtype), v.astype(dtype))
                                     for w, (_, v, _) in zip(weights, parts)])


def _weighted_values(weights: jax.Array, v: jax.Array) -> jax.Array:
  """Attention outputs [B, T, K, G, hd] from weights [B, K, G, T, S] and values [B, K, S, hd].

  For one new token (a decode step) the contraction is written without the
  T axis: with it, XLA on the CPU lays the [B, 1, K, G, hd] output out
  through a slow per-layer transpose, and the decode step at 192 cached
  slots took 1.6x longer.
  """
  if weights.shape[3] == 1:
    return jnp.einsum("bkgs,bksh->bkgh", weights[:, :, :, 0], v)[:, None]
  return jnp.einsum("bkgts,bksh->btkgh", weights, v)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
    self.bias = cfg.mlp_bias
    self.gate = make_param(rngs, (d, f), ("embed", "mlp"), _NORMAL, pd, stack)
    self.up = make_param(rngs, (d, f), ("embed", "mlp"), _NORMAL, pd, stack)
    self.down = make_param(rngs, (f, d), ("mlp", "embed"), _NORMAL, pd, stack)
    if cfg.mlp_bias:
      self.gate_bias = make_param(rngs, (f,), ("mlp",), _ZEROS, pd, stack)
      self.up_bias = make_param(rngs, (f,), ("mlp",), _ZEROS, pd, stack)
      self.down_bias = make_param(rngs, (d,), ("embed",), _ZEROS, pd, stack)

  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, T, D] -> [B, T, D]."""
    gate = with_adapter(self, "gate", x, x @ self.gate[...].astype(x.dtype))
    up = with_adapter(self, "up", x, x @ self.up[...].astype(x.dtype))
    if self.bias:
      gate = gate + self.gate_bias[...].astype(x.dtype)
      up = up + self.up_bias[...].astype(x.dtype)
    hidden = jax.nn.silu(gate) * up
    y = with_adapter(self, "down", hidden, hidden @ self.down[...].astype(x.dtype))
    if self.bias:
      y = y + self.down_bias[...].astype(x.dtype)
    return y


class Block(nnx.Module):
  """Pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
    pd = cfg.param_dtype
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, rngs, dtype=pd, stack=stack)
    self.attn = Attention(cfg, rngs, stack)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, rngs, dtype=pd, stack=stack)
    self.mlp = MLP(cfg, rngs, stack)

  def __call__(
      self,
      x: jax.Array,
      cos: jax.Array,
      sin: jax.Array,
      mask: jax.Array,
      kv: tuple[jax.Array, jax.Array] | None = None,
      write_index: jax.Array | None = None,
  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """[B, T, D] -> ([B, T, D], updated kv); see Attention for the arguments."""
    attn_out, kv = self.attn(self.input_norm(x), cos, sin, mask, kv, write_index)
    x = x + attn_out
    x = x + self.mlp(self.post_attn_norm(x))
    return x, kv
