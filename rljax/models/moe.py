"""Mixture-of-experts MLP (Qwen3-MoE): top-k routing and grouped matmuls over the experts.

A router picks k of E experts per token (softmax in float32, top-k,
optionally renormalised, as HF's Qwen3-MoE does). The N*k token copies are
sorted by expert and each expert's rows run through its SwiGLU as one
grouped matmul (`jax.lax.ragged_dot`, the TPU's grouped GEMM; for float8
rollout experts on v5p and v6e, where that would convert them into a
temporary, `rljax.kernels.grouped_matmul`, which reads them as stored; in
a pass that gathers its weights on a TPU, that kernel and its gradients,
where XLA's kernel gradient is a dense product per expert over every
row): the work is that of the activated experts, and nothing of shape
[tokens, E, ...] is built.

Sharding. Expert weights carry the logical axes `(exp, embed, mlp)` (down:
`(exp, mlp, embed)`). Inside `rljax.sharding.activation_sharding` the
dispatch runs per device under `shard_map`, reading each weight in the
layout it has there:

* `exp` over the mesh's `expert` axis (expert parallelism): a device holds
  E / ep experts. Tokens split over that axis too are all-gathered within
  the expert group, each device runs the copies routed to its own experts,
  and the partial outputs are reduce-scattered back to the tokens' owners.
* `embed` still split (a decode step, whose weights stay where they are):
  the gate and up projections are partial sums over it, summed per copy
  (a few KiB per token); no expert weight is gathered.
* `mlp` over `tensor`: the down projection's partial sums are summed over
  `tensor`.

Capacity. A pass whose experts are split over devices sizes each device's
grouped matmuls for `CAPACITY_FACTOR` times its even share of the token
copies (`capacity`), its own copies first, rather than for all N*k of
them: a device holding 16 of 128 experts multiplies about 1/8 of the rows.
The result is exact whatever the routing. A device routed more copies than
that runs all of them in a weight-stationary pass (a decode step, which
would read its experts again for each further chunk; `jax.lax.cond`), and
takes them `capacity` at a time in a pass that gathers its weights (the
update, the log-prob passes, the prefill; `jax.lax.while_loop`), whose
gradient goes over the same chunks and recomputes each chunk's forward, so
no buffer of an update holds all N*k copies.

Router statistics (`stats`, [2, E]: copies routed to each expert and summed
router probabilities, over real tokens) feed the load-balancing loss and
the expert-load metrics. Each token's chosen experts are returned too, and
a pass may be given them instead of choosing (router replay, verl's R2:
the update routes every token to the experts the old-log-prob pass chose,
so the importance ratio compares the same experts; the routing weights
still come from the current router, which keeps its gradient).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from rljax.kernels import grouped_matmul as grouped_lib
from rljax.models import weight_quant
from rljax.models.config import ModelConfig
from rljax.models.layers import make_param
from rljax.models.weight_quant import QuantizedWeight
from rljax.sharding import rules as rules_lib

_NORMAL = jax.nn.initializers.normal(0.02)
# a pass whose experts are split over devices sizes each device's grouped matmuls for this many times its even
# share of the token copies (more run all at once in a decode step, `_experts_bounded`, and in further chunks of
# this size in a pass that gathers its weights, `_experts_chunked`)
CAPACITY_FACTOR = 2.0
# TPU kinds -> the 8-bit expert dtypes their grouped matmul (`ragged_dot`) converts into a temporary first,
# which `rljax.kernels.grouped_matmul` reads as stored instead (`benchmarks/moe_grouped_traffic.py`: float8 on
# v5p and v6e, 8x the stored bytes; v5p's int8, 1.1x, stays with `ragged_dot`, whose grid steps are libtpu's)
PALLAS_GROUPED = {"TPU v5": ("float8_e4m3fn",), "TPU v6 lite": ("float8_e4m3fn",)}
# TPU kinds with two TensorCores per chip (megacore), which split a Pallas kernel's parallel grid axis
MEGACORE = {"TPU v5": 2}
WEIGHT_NAMES = {"gate": ("exp", "embed", "mlp"), "up": ("exp", "embed", "mlp"), "down": ("exp", "mlp", "embed")}


class Routing(NamedTuple):
  """What a pass's mixture-of-experts layers did.

  Attributes:
    stats: [L, 2, E] router stats per sparse layer (see `router_stats`).
    experts: [B, T, L, k] int32, each token's chosen experts per sparse layer.
  """

  stats: jax.Array
  experts: jax.Array


def route(logits: jax.Array, top_k: int, normalize: bool,
          experts: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Top-k routing of router logits [N, E], or the routing to given experts [N, k].

  Returns:
    (weights [N, k] in the logits' dtype, expert ids [N, k] int32,
    probabilities [N, E] float32): weights are the k largest softmax
    probabilities (the given experts' probabilities), divided by their sum
    when ``normalize``.
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  if experts is None:
    weights, ids = jax.lax.top_k(probs, top_k)
  else:
    ids = experts
    weights = jnp.take_along_axis(probs, ids, axis=-1)
  if normalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights.astype(logits.dtype), ids.astype(jnp.int32), probs


def router_stats(probs: jax.Array, ids: jax.Array, valid: jax.Array) -> jax.Array:
  """[2, E] float32: (copies routed to each expert, summed probabilities) over the tokens where valid.

  Args:
    probs: [N, E] router probabilities.
    ids: [N, k] chosen experts.
    valid: [N] bool, real (non-padding) tokens.
  """
  e = probs.shape[-1]
  w = valid.astype(jnp.float32)
  counts = jnp.zeros((e,), jnp.float32).at[ids.reshape(-1)].add(jnp.repeat(w, ids.shape[-1]))
  return jnp.stack([counts, jnp.sum(probs * w[:, None], axis=0)])


def load_balancing_loss(stats: jax.Array, tokens: jax.Array) -> jax.Array:
  """HF's (Switch Transformer's) auxiliary loss from per-layer router stats [L, 2, E] over `tokens` real tokens.

  E * sum_e f_e * P_e, with f_e the share of routed copies and P_e the mean
  router probability of expert e over all L layers' tokens (HF counts each
  of the k copies, so a uniform router gives k).
  """
  layers, _, e = stats.shape
  total = jnp.maximum(tokens * layers, 1.0)
  counts, probs = jnp.sum(stats, axis=0)
  return e * jnp.sum((counts / total) * (probs / total))


def max_load(stats: jax.Array) -> jax.Array:
  """[L] the busiest expert's routed copies over the mean per expert, per layer (1 = perfectly balanced).

  Args:
    stats: [L, 2, E] router stats.
  """
  counts = stats[:, 0]
  return jnp.max(counts, axis=-1) / jnp.maximum(jnp.mean(counts, axis=-1), 1e-9)


def _sorted_copies(ids: jax.Array, first: Any, experts: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Sorts token copies by local expert: (order [N*k], group sizes [experts], copy is local [N, k]).

  Copies routed to experts outside ``first .. first + experts`` sort last and
  fall outside the groups (the grouped matmul leaves their rows zero).
  """
  local = ids - first
  here = (local >= 0) & (local < experts)
  key = jnp.where(here, local, experts).reshape(-1)
  order = jnp.argsort(key, stable=True)
  sizes = jnp.zeros((experts + 1,), jnp.int32).at[key].add(1)[:experts]
  return order, sizes, here


def _row_scales(scale: jax.Array, sizes: jax.Array, rows: int) -> jax.Array:
  """[rows, out]: each row's expert's output-channel scales (scale [E', 1, out]; rows past the groups take the
  last expert's, their products being zero)."""
  group = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(rows, dtype=sizes.dtype), side="right")
  return scale[jnp.minimum(group, scale.shape[0] - 1), 0]


def _kernel_takes(rows: jax.Array, kernel: jax.Array | QuantizedWeight) -> bool:
  """Whether `rljax.kernels.grouped_matmul` multiplies these rows by these experts: bfloat16 rows (the kernel
  multiplies at the chip's default precision) by 8-bit experts on a TPU whose own grouped matmul would convert
  them into a temporary (`PALLAS_GROUPED`), in blocks that fit."""
  return (isinstance(kernel, QuantizedWeight) and rows.dtype == jnp.bfloat16 and rules_lib.on_tpu()
          and jnp.dtype(kernel.values.dtype).name in PALLAS_GROUPED.get(rules_lib.device_kind(), ())
          and grouped_lib.fits(rows, kernel.values))


def _trainable_takes(rows: jax.Array, kernel: jax.Array | QuantizedWeight, trained: bool) -> bool:
  """Whether `rljax.kernels.grouped_matmul.trainable` multiplies these rows by these experts: bfloat16 rows by
  full-precision experts on a TPU, in blocks that fit, in a pass that gathers its weights (`trained`: the
  update, the log-prob passes and the rollout's prefill). The kernels' gradient of XLA's grouped matmul is a
  dense product per group (G times the forward's FLOPs, over every row), where the Pallas kernels' forward
  and gradients multiply only the row tiles each group overlaps."""
  return (trained and not isinstance(kernel, QuantizedWeight) and rows.dtype == jnp.bfloat16
          and rules_lib.on_tpu()
          and grouped_lib.fits(rows, jax.ShapeDtypeStruct(kernel.shape, rows.dtype), gradients=True))


def _grouped(rows: jax.Array, kernel: jax.Array | QuantizedWeight, sizes: jax.Array,
             trained: bool = False) -> jax.Array:
  """rows [M, in] @ their experts' kernels [E', in, out].

  XLA's grouped matmul is a custom call that cannot fuse a convert, and on
  some chips it converts 8-bit kernels into a temporary itself
  (`PALLAS_GROUPED`): there the experts go to `rljax.kernels.grouped_matmul`,
  which converts each block in VMEM. Elsewhere an int8 kernel's values go to
  XLA's grouped matmul as stored and its per-output-channel scales multiply
  the product; a float8 one is dequantized first. ``trained``: a pass
  that gathers its weights (the update, a log-prob pass, the rollout's
  prefill), where a TPU takes the Pallas kernel and its gradients for
  full-precision experts too (`_trainable_takes`).
  """
  cores, interpret = MEGACORE.get(rules_lib.device_kind(), 1), not rules_lib.on_tpu()
  if _trainable_takes(rows, kernel, trained):
    return grouped_lib.trainable(rows, kernel.astype(rows.dtype), sizes, cores, interpret)
  if _kernel_takes(rows, kernel):
    return grouped_lib.grouped_matmul(rows, kernel.values, sizes, kernel.scale, cores=cores, interpret=interpret)
  if isinstance(kernel, QuantizedWeight) and kernel.values.dtype == jnp.int8:
    y = jax.lax.ragged_dot(rows, kernel.values, sizes, preferred_element_type=rows.dtype)
    return y * _row_scales(kernel.scale, sizes, rows.shape[0]).astype(rows.dtype)
  return jax.lax.ragged_dot(rows, weight_quant.dequantize(kernel, rows.dtype), sizes)


def _project(rows: jax.Array, kernel: jax.Array | QuantizedWeight, sizes: jax.Array,
             adapter: tuple | None, trained: bool = False) -> jax.Array:
  """rows [M, in] @ their experts' kernels [E', in, out] (`_grouped`), plus scale * (rows @ A) @ B with a LoRA
  adapter.

  adapter: (A [E', in, r], B [E', r, out], scale []) or None. Both terms are
  linear in rows, so a partial sum over a split `in` stays one.
  """
  y = _grouped(rows, kernel, sizes, trained)
  if adapter is None:
    return y
  a, b, scale = adapter
  h = _grouped(rows, a, sizes, trained) * scale.astype(rows.dtype)
  return y + _grouped(h, b, sizes, trained)


def _swiglu_rows(rows, sizes, gate, up, down, sum_inputs, adapters, trained=False) -> jax.Array:
  """rows [M, D'] (sorted by local expert, `sizes` [E'] rows each; the rest left zero) through their experts'
  SwiGLU -> [M, D'] (a partial sum over a split embed or mlp axis)."""
  h_gate = sum_inputs(_project(rows, gate, sizes, adapters.get("gate"), trained))
  h_up = sum_inputs(_project(rows, up, sizes, adapters.get("up"), trained))
  return _project(jax.nn.silu(h_gate) * h_up, down, sizes, adapters.get("down"), trained)


def _experts_local(x, ids, weights, gate, up, down, first, sum_inputs, adapters, trained=False) -> jax.Array:
  """The outputs [N, D'] of N tokens' copies routed to this device's experts, weighted and summed per token (a
  partial sum over a split mlp axis and over other devices' experts).

  Args:
    x: [N, D'] tokens (D' = D / the devices splitting a weight's embed axis).
    ids, weights: [N, k] routing.
    gate, up: [E', D', F'] local experts' weights; down: [E', F', D'] (or their `QuantizedWeight`s).
    first: the global id of local expert 0.
    sum_inputs: sums partial projections over the embed split (identity when whole).
    adapters: {gate, up, down: (A, B, scale)} LoRA adapters of the local experts (some or none).
    trained: the pass gathers its weights (`_grouped`).
  """
  n, k = ids.shape
  order, sizes, here = _sorted_copies(ids, first, weight_quant.shape(gate)[0])
  y = _swiglu_rows(x[order // k], sizes, gate, up, down, sum_inputs, adapters, trained)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
  y = y[inverse].reshape(n, k, -1)
  scale = jnp.where(here, weights, jnp.zeros_like(weights)).astype(x.dtype)
  return jnp.einsum("nkd,nk->nd", y, scale)


def capacity(copies: int, shards: int) -> int:
  """Rows a device's grouped matmuls are sized for when `copies` token copies are routed over experts split
  `shards` ways: CAPACITY_FACTOR times an even share, in whole sublane tiles of 8, at most all of them."""
  return min(copies, -(-math.ceil(CAPACITY_FACTOR * copies / shards) // 8) * 8)


def _weighted_copies(x, scale, experts, taken, sizes, k, sum_inputs, trained) -> jax.Array:
  """[R, D'] the weighted outputs of copies `taken` [R] (sorted by local expert, `sizes` [E'] rows each; the
  rest zero) of tokens x [N, D'], scale [N, k] their routing weights (zero where not local), experts (gate, up,
  down, adapters)."""
  gate, up, down, adapters = experts
  y = _swiglu_rows(x[taken // k], sizes, gate, up, down, sum_inputs, adapters, trained)
  return y * scale.reshape(-1)[taken][:, None]


def _experts_capped(x, ids, weights, gate, up, down, first, sum_inputs, adapters, rows: int) -> jax.Array:
  """`_experts_local` with the grouped matmuls sized for `rows` copies (the local ones first): exact when at
  most `rows` copies are routed here, which `_experts_bounded` checks."""
  k = ids.shape[1]
  order, sizes, here = _sorted_copies(ids, first, weight_quant.shape(gate)[0])
  taken = order[:rows]
  scale = jnp.where(here, weights, jnp.zeros_like(weights)).astype(x.dtype)
  y = _weighted_copies(x, scale, (gate, up, down, adapters), taken, sizes, k, sum_inputs, False)
  return jnp.zeros_like(x).at[taken // k].add(y)


def _experts_bounded(x, ids, weights, gate, up, down, first, sum_inputs, adapters, rows: int) -> jax.Array:
  """`_experts_local` computed over `rows` copies (`_experts_capped`), or over all N*k when more are routed to
  this device's experts (exact either way; the branch is taken per device, and the devices summing partial
  projections over an embed split hold the same tokens and experts, so they take the same one)."""
  experts = weight_quant.shape(gate)[0]
  routed = jnp.sum((ids >= first) & (ids < first + experts))
  args = (x, ids, weights, gate, up, down)
  return jax.lax.cond(
      routed > rows,
      lambda *a: _experts_local(*a, first, sum_inputs, adapters),
      lambda *a: _experts_capped(*a, first, sum_inputs, adapters, rows), *args)


def _chunk_sizes(sizes: jax.Array, start: jax.Array, rows: int) -> jax.Array:
  """[E'] each local expert's copies among the sorted copies start .. start + rows - 1 (sizes [E']: its copies
  among all of them, sorted by expert)."""
  ends = jnp.cumsum(sizes)
  return (jnp.clip(ends - start, 0, rows) - jnp.clip(ends - sizes - start, 0, rows)).astype(sizes.dtype)


def _chunk_loop(rows: int, k: int, sum_inputs, trained: bool):
  """f(x [N, D'], scale [N, k], experts, order [N*k + rows - 1], sizes [E']) -> [N, D']: the local copies'
  weighted outputs summed per token, `rows` sorted copies at a time while any are left, and its gradient over
  the same chunks (each recomputes its forward: nothing of the copies' size is kept between the passes), traced
  in the sharding context of the forward pass. Both sum over the chunks in float32."""
  context = rules_lib.active_state()

  def chunk(order, sizes, c):
    start = c * rows
    return jax.lax.dynamic_slice(order, (start,), (rows,)), _chunk_sizes(sizes, start, rows)

  def while_left(sizes, body, init):
    routed = jnp.sum(sizes)
    return jax.lax.while_loop(lambda carry: carry[0] * rows < routed, body, (jnp.int32(0), init))[1]

  def forward(x, scale, experts, order, sizes):
    def body(carry):
      c, out = carry
      taken, chunk_sizes = chunk(order, sizes, c)
      y = _weighted_copies(x, scale, experts, taken, chunk_sizes, k, sum_inputs, trained)
      return c + 1, out.at[taken // k].add(y.astype(jnp.float32))
    return while_left(sizes, body, jnp.zeros(x.shape, jnp.float32)).astype(x.dtype)

  def backward(residuals, d_out):
    with rules_lib.restored(context):
      return backward_chunks(residuals, d_out)

  def backward_chunks(residuals, d_out):
    x, scale, experts, order, sizes = residuals

    def body(carry):
      c, grads = carry
      taken, chunk_sizes = chunk(order, sizes, c)
      copies = lambda *a: _weighted_copies(*a, taken, chunk_sizes, k, sum_inputs, trained)  # noqa: E731
      _, vjp = jax.vjp(copies, x, scale, experts)
      return c + 1, jax.tree.map(lambda g, d: g + d.astype(g.dtype), grads, vjp(d_out[taken // k]))
    primals = (x, scale, experts)
    zeros = jax.tree.map(lambda v: jnp.zeros(v.shape, jnp.promote_types(v.dtype, jnp.float32)), primals)
    grads = while_left(sizes, body, zeros)
    return (*jax.tree.map(lambda g, v: g.astype(v.dtype), grads, primals), None, None)

  f = jax.custom_vjp(forward)
  f.defvjp(lambda *args: (forward(*args), args), backward)
  return f


def _experts_chunked(x, ids, weights, gate, up, down, first, sum_inputs, adapters, rows: int,
                     trained: bool = False) -> jax.Array:
  """`_experts_local` with the grouped matmuls sized for `rows` copies: this device's copies go through them
  `rows` at a time (one pass unless more are routed here), in the forward and again in the gradient, so no
  buffer holds every copy (a pass that gathers its weights, whose experts are split over devices; the devices
  summing partial projections over an embed split hold the same tokens and experts, so they loop alike)."""
  n, k = ids.shape
  order, sizes, here = _sorted_copies(ids, first, weight_quant.shape(gate)[0])
  scale = jnp.where(here, weights, jnp.zeros_like(weights)).astype(x.dtype)
  padded = jnp.pad(order, (0, rows - 1))
  return _chunk_loop(rows, k, sum_inputs, trained)(x, scale, (gate, up, down, adapters), padded, sizes)


class Adapter(NamedTuple):
  """An expert projection's LoRA adapter as the dispatch reads it (one layer's).

  Attributes:
    a: [E, in, r]; b: [E, r, out]; scale: [] float32.
    a_names, b_names: their logical axis names.
  """

  a: jax.Array
  b: jax.Array
  scale: jax.Array
  a_names: tuple[str, ...]
  b_names: tuple[str, ...]


def _spec_entry(axes: tuple[str, ...]) -> Any:
  return None if not axes else (axes[0] if len(axes) == 1 else axes)


def _weight_specs(w: jax.Array | QuantizedWeight, name: str) -> Any:
  """The PartitionSpec of expert kernel `name` (gate, up or down) as the mesh lays it out (of its values and
  scales when quantized)."""
  names = WEIGHT_NAMES[name]
  if isinstance(w, QuantizedWeight):
    return QuantizedWeight(*(rules_lib.weight_spec(names, v.shape) for v in w))
  return rules_lib.weight_spec(names, w.shape)


def dispatch(x: jax.Array, ids: jax.Array, weights: jax.Array, gate: jax.Array | QuantizedWeight,
             up: jax.Array | QuantizedWeight, down: jax.Array | QuantizedWeight,
             adapters: dict[str, Adapter] | None = None) -> jax.Array:
  """The experts' weighted outputs [B, T, D] for tokens x [B, T, D] routed by ids, weights [B, T, k].

  ``adapters``: LoRA adapters of some of gate, up, down. Runs directly
  outside a mesh context, per device under `shard_map` inside one (see the
  module docstring).
  """
  b, t, d = x.shape
  k = ids.shape[-1]
  adapters = adapters or {}
  mesh = rules_lib.active_mesh()
  if mesh is None:
    local = {name: (a.a, a.b, a.scale) for name, a in adapters.items()}
    out = _experts_local(x.reshape(b * t, d), ids.reshape(-1, k), weights.reshape(-1, k), gate, up, down, 0,
                         lambda v: v, local)
    return out.reshape(b, t, d)
  w_spec = rules_lib.weight_spec(WEIGHT_NAMES["gate"], weight_quant.shape(gate))
  exp_axes, d_axes, f_axes = (rules_lib.spec_axes(e) for e in w_spec)
  taken = set(d_axes) | set(f_axes)
  tok = rules_lib.active_spec(("batch", "length"), (b, t))
  tok = [tuple(a for a in rules_lib.spec_axes(e) if a not in taken) for e in tok]
  gathered = tuple(a for e in tok for a in e if a in exp_axes)
  x_spec = PartitionSpec(*(_spec_entry(e) for e in tok), _spec_entry(d_axes))
  r_spec = PartitionSpec(*(_spec_entry(e) for e in tok), None)
  summed = tuple(f_axes) + tuple(a for a in exp_axes if a not in gathered)
  shards = math.prod(mesh.shape[a] for a in exp_axes)
  experts = weight_quant.shape(gate)[0] // shards
  stationary = not rules_lib.gathers()

  names = sorted(adapters)

  def body(x, ids, weights, gate, up, down, *lora):
    lb, lt, ld = x.shape
    x, ids, weights = x.reshape(lb * lt, ld), ids.reshape(-1, k), weights.reshape(-1, k)
    if gathered:
      x, ids, weights = (jax.lax.all_gather(v, gathered, axis=0, tiled=True) for v in (x, ids, weights))
    first = jax.lax.axis_index(exp_axes) * experts if exp_axes else 0
    sum_in = (lambda v: jax.lax.psum(v, d_axes)) if d_axes else (lambda v: v)
    sum_out = (lambda v: jax.lax.psum(v, summed)) if summed else (lambda v: v)
    local = {name: tuple(lora[3 * i:3 * i + 3]) for i, name in enumerate(names)}
    rows = capacity(x.shape[0] * k, shards)
    if rows == x.shape[0] * k:
      out = _experts_local(x, ids, weights, gate, up, down, first, sum_in, local, not stationary)
    elif stationary:
      out = _experts_bounded(x, ids, weights, gate, up, down, first, sum_in, local, rows)
    else:
      out = _experts_chunked(x, ids, weights, gate, up, down, first, sum_in, local, rows, trained=True)
    out = sum_out(out)
    if gathered:
      out = jax.lax.psum_scatter(out, gathered, scatter_dimension=0, tiled=True)
    return out.reshape(lb, lt, ld)

  specs = (x_spec, r_spec, r_spec, _weight_specs(gate, "gate"), _weight_specs(up, "up"), _weight_specs(down, "down"))
  lora_args, lora_specs = [], []
  for name in names:
    adapter = adapters[name]
    lora_args += [adapter.a, adapter.b, adapter.scale]
    lora_specs += [rules_lib.weight_spec(adapter.a_names, adapter.a.shape),
                   rules_lib.weight_spec(adapter.b_names, adapter.b.shape), PartitionSpec()]
  return jax.shard_map(body, mesh=mesh, in_specs=(*specs, *lora_specs), out_specs=x_spec, check_vma=False)(
      x, ids, weights, gate, up, down, *lora_args)


class MoE(nnx.Module):
  """Top-k routed SwiGLU experts (Qwen3-MoE's sparse MLP block)."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: int | None = None):
    d, e, f, pd = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.param_dtype
    self.top_k = cfg.num_experts_per_tok
    self.normalize = cfg.norm_topk_prob
    self.router = make_param(rngs, (d, e), ("embed", None), _NORMAL, pd, stack)
    self.gate = make_param(rngs, (e, d, f), WEIGHT_NAMES["gate"], _NORMAL, pd, stack)
    self.up = make_param(rngs, (e, d, f), WEIGHT_NAMES["up"], _NORMAL, pd, stack)
    self.down = make_param(rngs, (e, f, d), WEIGHT_NAMES["down"], _NORMAL, pd, stack)

  def __call__(self, x: jax.Array, valid: jax.Array | None = None,
               experts: jax.Array | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """x [B, T, D] -> ([B, T, D], (router stats [2, E] over the tokens where valid [B, T], experts [B, T, k])).

    ``experts`` [B, T, k]: route to these instead of the top k (replay).
    """
    b, t, _ = x.shape
    logits = x @ self.router[...].astype(x.dtype)
    given = None if experts is None else experts.reshape(b * t, -1)
    weights, ids, probs = route(logits.reshape(b * t, -1), self.top_k, self.normalize, given)
    valid = jnp.ones((b * t,), bool) if valid is None else valid.reshape(-1)
    stats = router_stats(probs, ids, valid)
    ids, weights = ids.reshape(b, t, -1), weights.reshape(b, t, -1)
    out = dispatch(x, ids, weights, self.gate.get_value(), self.up.get_value(), self.down.get_value(),
                   self._adapters())
    return out, (stats, ids)

  def _adapters(self) -> dict[str, Adapter]:
    """The LoRA adapters (`rljax.models.lora`) of this layer's expert projections, by kernel name."""
    adapters = getattr(self, "adapters", None) or {}
    out = {}
    for name, adapter in adapters.items():
      a, b = adapter.a[...], adapter.b[...]
      out[name] = Adapter(a, b, adapter.scale[...], rules_lib.param_names(adapter.a)[-a.ndim:],
                          rules_lib.param_names(adapter.b)[-b.ndim:])
    return out
