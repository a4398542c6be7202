"""The weights a rollout engine decodes with: the trainer's arrays, read in place when they already are in the
engine's compute dtype and layout, else one copy per weight sync.

The copy casts to `rollout.dtype` (and with `rollout.quantization` quantizes the projections, experts and
embeddings to 8 bits, a scale per output channel, `rljax.models.weight_quant`), holds a scanned
mixture-of-experts model's expert kernels per layer (`PerLayer`), and lays the result out as the engine's rules
do. Which copy runs is one rule (`RolloutWeights.copier`):

    already typed and laid out           none: the engine reads the trainer's arrays
    laid out, only the dtype differs     the cast, where the weights lie
    on devices of the rollout's own      `SendCopy`: cast where they lie, then device to device (separate_async)
    on other hosts' devices              `hosts.HostLocalCopy`: to this host's engine mesh (multi-process)
    else                                 one jitted cast-and-reshard
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from rljax.models import ModelConfig, weight_quant
from rljax.models.layers import PerLayer, split_layers
from rljax.sharding import hosts, rules as rules_lib
from rljax.sharding.placement import Step, abstract


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


class RolloutWeights:
  """The engine's weights from the trainer's: `compute` gives what a decode call reads, `sync_steps` the programs
  that make it (for `rljax.compile`)."""

  def __init__(self, cfg: ModelConfig, mesh: Mesh, rules: rules_lib.Rules | None, quantization: Any = None):
    """`cfg`: the model's, in the compute dtype; `mesh`, `rules`: the engine's layout; `quantization`: int8 or a
    float8 dtype to quantize to, or None."""
    self.cfg, self.mesh, self.rules = cfg, mesh, rules
    self.quantization = None if quantization is None else jnp.dtype(quantization)
    cast = (functools.partial(_cast_floats, dtype=jnp.dtype(cfg.dtype)) if quantization is None else
            functools.partial(weight_quant.quantize_params, dtype=self.quantization,
                              compute_dtype=jnp.dtype(cfg.dtype)))
    # a scanned mixture-of-experts model's expert kernels are held per layer (`rljax.models.layers.PerLayer`)
    self.split_experts = bool(cfg.scan_layers and cfg.routing_shape)
    self.cast_impl = (lambda params: _split_experts(cast(params))) if self.split_experts else cast
    self._cast = jax.jit(self.cast_impl)
    self._reshards: dict[Any, Any] = {}

  def compute(self, params: Any) -> Any:
    """`params` in the engine's compute dtype (`rollout.dtype`), quantized with `quantization`, and laid out on
    the engine's mesh.

    The same arrays when they already are all three (the trainer's arrays,
    read in place); else one copy, cast (and quantized) and resharded, made
    once per rollout rather than once per decode call, so every decode step
    reads compute-dtype (or 8-bit) weights (float32 master weights would
    double a step's bytes) in the rollout's layout
    (`rljax.rollout.factory.rollout_mesh`).
    """
    copier = self.copier(params)
    if copier is None:
      return params
    if all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):
      return abstract(jax.eval_shape(self.cast_impl, params), self.shardings(params))
    return copier(params)

  def shardings(self, params: Any) -> Any:
    """The NamedShardings of `params` as the engine computes with them (its mesh and rules; a quantized
    weight's values and scales laid out by its axis names)."""
    return rules_lib.param_shardings(jax.eval_shape(self.cast_impl, params), self.mesh, self.rules)

  def copier(self, params: Any) -> Callable[[Any], Any] | None:
    """The jitted cast (and quantization) `params` need, or None when the engine computes with them as they are:
    laid out and typed as it needs (quantized when it quantizes: what `compute` returned). The cast runs in place
    on their devices when they already lie as the engine's rules lay them out and nothing is quantized, else it
    reshards (`_resharder`)."""
    dtype = jnp.dtype(self.cfg.dtype)
    target = rules_lib.param_shardings(params, self.mesh, self.rules)
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
    (`shardings`), made once per tree."""
    key = jax.tree.structure(params)
    if key not in self._reshards:
      target = self.shardings(params)
      source = sorted(jax.tree.leaves(params)[0].sharding.device_set, key=lambda d: d.id)
      if not set(source) & set(self.mesh.devices.flat):  # separate_async: the rollout's devices are its own
        self._reshards[key] = SendCopy(target, self.cast_impl)
      elif len(hosts.processes(source)) > 1 and len(hosts.processes(self.mesh.devices.flat)) == 1:
        # a multi-process job's weights reach this host's engine mesh across the hosts, one array at a time
        self._reshards[key] = hosts.HostLocalCopy(target, self.cast_impl, source)
      else:
        self._reshards[key] = jax.jit(self.cast_impl, out_shardings=target)
    return self._reshards[key]

  def sync_steps(self, params: Any) -> list[tuple[Step, bool]]:
    """The jitted copies that bring the trainer's weights (`params`: arrays or ShapeDtypeStructs with their
    shardings) to the engine's dtype and layout once per rollout, in the order they run, each with whether its
    output only feeds the next; none when the engine reads them in place. One for the whole tree (on devices of
    the engine's own, the cast that precedes the device-to-device copy, `SendCopy`); on a host-local engine of a
    multi-process job, two per array (`rljax.sharding.hosts.HostLocalCopy`)."""
    params = abstract(params)
    copier = self.copier(params)
    if copier is None:
      return []
    if isinstance(copier, hosts.HostLocalCopy):
      return [(Step("rollout_weights", fn, args), feeds) for fn, args, feeds in copier.programs(params)]
    if isinstance(copier, SendCopy):  # the cast where the weights lie; the copy to the rollout's devices is no program
      return [(Step("rollout_weights", copier.cast, (params,)), False)]
    return [(Step("rollout_weights", copier, (params,)), False)]


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


__all__ = ["RolloutWeights", "SendCopy"]
