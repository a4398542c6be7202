"""Rollout weights stored in 8 bits: int8 or float8 values with one scale per output channel.

`rollout.quantization` (verl's key) makes the engine quantize the trainer's
weights as it takes them at each weight sync (`Engine.compute_params`, on
the device, in the same jitted copy that casts them to the rollout dtype):
every matrix a token is multiplied by (attention's q, k, v and o, the MLP's
gate, up and down, experts included, the embedding and the LM head) keeps
`round(w / s)` in 8 bits, with `s = max|w| / R` taken over the axes the
matrix is contracted over (R: 127 for int8, the format's largest finite
value for float8), so each output channel has its own scale. The layers
read a quantized parameter through `value`, which multiplies the 8-bit
values by their scales in the compute dtype as the matmul reads them (XLA
fuses the convert and the product into the dot's operand, so a decode
step reads the 8-bit bytes; an expert's int8 weights reach XLA's grouped
matmul as stored, and its float8 ones a Pallas grouped matmul on the TPUs
where XLA's would convert them, `rljax.models.moe`).
Norm scales, biases, the router, LoRA adapters and a vision-language model's
tower (which runs once per prompt in its prefill, never in a decode step)
stay in the compute dtype; the trainer's own parameters never change.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models import kv_quant

# rollout.quantization (null: not quantized) -> storage dtype of the quantized weights
QUANTIZATIONS = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}

# the logical axes each quantized kernel (by attribute name) is contracted over; its scale has one entry per
# combination of the others
CONTRACTED = {"q": ("embed",), "k": ("embed",), "v": ("embed",), "o": ("heads", "head_dim"), "gate": ("embed",),
              "up": ("embed",), "down": ("mlp",), "embed": ("embed",), "lm_head": ("embed",)}


class QuantizedWeight(NamedTuple):
  """A weight in 8 bits.

  Attributes:
    values: the weight's shape, int8 or float8.
    scale: the weight's shape with 1 on its contracted axes, in the compute
      dtype: values * scale is the weight.
  """

  values: jax.Array
  scale: jax.Array


def quantize(w: jax.Array, contracted: tuple[int, ...], dtype: Any, scale_dtype: Any) -> QuantizedWeight:
  """w -> QuantizedWeight in `dtype` with one scale per output channel: over the axes `contracted`
  (`rljax.models.kv_quant.quantize_along`)."""
  return QuantizedWeight(*kv_quant.quantize_along(w, contracted, dtype, scale_dtype))


def dequantize(w: QuantizedWeight | jax.Array, dtype: Any) -> jax.Array:
  """The weight in `dtype` (an unquantized array is only cast)."""
  if not isinstance(w, QuantizedWeight):
    return w.astype(dtype)
  return w.values.astype(dtype) * w.scale.astype(dtype)


def shape(w: QuantizedWeight | jax.Array) -> tuple[int, ...]:
  """The weight's shape (its values' when quantized)."""
  return tuple(w.values.shape if isinstance(w, QuantizedWeight) else w.shape)


def value(var: nnx.Variable, dtype: Any) -> jax.Array:
  """A parameter's weight in `dtype`, dequantized when the engine quantized it."""
  return dequantize(var.get_value(), dtype)


def stored(var: nnx.Variable, dtype: Any) -> jax.Array:
  """A parameter as stored, or dequantized to `dtype` when the engine quantized it."""
  w = var.get_value()
  return dequantize(w, dtype) if isinstance(w, QuantizedWeight) else w


def rows(var: nnx.Variable, ids: jax.Array, dtype: Any) -> jax.Array:
  """Rows `ids` [...] of a [V, D] table parameter -> [..., D] in `dtype` (only those rows dequantized)."""
  table = var.get_value()
  if not isinstance(table, QuantizedWeight):
    return table[ids].astype(dtype)
  return table.values[ids].astype(dtype) * table.scale[ids].astype(dtype)


def _quantized_leaf(path: tuple[Any, ...], var: Any, dtype: Any, compute_dtype: Any) -> Any:
  """One leaf of a parameter state: a listed kernel quantized along its contracted axes, any other floating
  parameter cast to `compute_dtype`."""
  if not isinstance(var, nnx.Variable):
    return var
  x = var.get_value()
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return var
  name = str(getattr(path[-1], "key", path[-1])) if path else ""
  names = tuple(var.get_metadata().get("out_sharding") or ())
  contracted = CONTRACTED.get(name, ())
  keys = {str(getattr(p, "key", p)) for p in path}
  if keys & {"adapters", "visual"} or not contracted or not set(contracted) <= set(names):
    return var.replace(x.astype(compute_dtype))
  axes = tuple(i for i, n in enumerate(names) if n in contracted)
  return var.replace(quantize(x, axes, dtype, compute_dtype))


def quantize_params(params: Any, dtype: Any, compute_dtype: Any) -> Any:
  """An nnx.State of parameters with every kernel `CONTRACTED` names quantized to `dtype` (scales in
  `compute_dtype`) and every other floating parameter cast to `compute_dtype` (elementwise per array except
  the scales' reductions)."""
  return jax.tree_util.tree_map_with_path(lambda p, v: _quantized_leaf(p, v, dtype, compute_dtype), params,
                                          is_leaf=lambda x: isinstance(x, nnx.Variable))


__all__ = ["CONTRACTED", "QUANTIZATIONS", "QuantizedWeight", "dequantize", "quantize", "quantize_params", "rows",
           "shape", "stored", "value"]
