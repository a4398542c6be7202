"""Hugging Face checkpoints in and out: names, layouts, sharded placement.

Each Flax parameter maps to one HF tensor per layer. An HF tensor is split
into axes (``groups``: the sizes each HF axis factors into) and transposed
(``perm``) to give the Flax layout, e.g. ``q_proj.weight`` [H*hd, D] ->
split [H, hd, D] -> perm (2, 0, 1) -> ``q`` [D, H, hd]. Reading a shard of
a Flax parameter reads only the rows of the HF tensor that cover it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shutil
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rljax.sharding.rules import Rules, logical_to_spec, param_names

from rljax.models import config as config_lib
from rljax.models import safetensors_io
from rljax.models.config import ModelConfig
from rljax.models.transformer import CausalLM

# Tensors some checkpoints carry that the model rebuilds itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class TensorLayout:
  """How an HF tensor becomes a Flax parameter: split each axis, then transpose.

  ``pick`` = (group, k): the HF tensor concatenates equal parts along axis ``group`` (the first size of that group
  counts them) and the parameter is part k, e.g. Qwen3-VL-MoE's ``mlp.experts.gate_up_proj`` [E, D, 2 * F] ->
  split [E, D, 2, F] -> part 0 the experts' ``gate`` [E, D, F], part 1 their ``up``.
  """

  groups: tuple[tuple[int, ...], ...]
  perm: tuple[int, ...]
  pick: tuple[int, int] | None = None

  @property
  def hf_shape(self) -> tuple[int, ...]:
    return tuple(math.prod(g) for g in self.groups)

  @property
  def picked_axis(self) -> int | None:
    """The split axis ``pick`` fixes (the first of its group), or None."""
    return None if self.pick is None else sum(len(g) for g in self.groups[:self.pick[0]])

  @property
  def _free_axes(self) -> list[int]:
    """The split axes the parameter keeps, in split order (``perm`` indexes these)."""
    return [a for a in range(sum(map(len, self.groups))) if a != self.picked_axis]

  @property
  def shape(self) -> tuple[int, ...]:
    split = [s for g in self.groups for s in g]
    free = [split[a] for a in self._free_axes]
    return tuple(free[p] for p in self.perm)

  def to_hf(self, x: np.ndarray) -> np.ndarray:
    """Flax layout -> HF layout (for a picked part, its slice of the HF tensor: ``to_hf_tensors`` joins the parts)."""
    y = x.transpose(np.argsort(self.perm))
    if self.pick is None:
      return y.reshape(self.hf_shape)
    g = self.pick[0]
    part = self.hf_shape[:g] + (self.hf_shape[g] // self.groups[g][0],) + self.hf_shape[g + 1:]
    return np.expand_dims(y, self.picked_axis).reshape(part)

  def read(self, hf: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
    """The block ``index`` (over Flax axes) of the Flax view of ``hf``, reading only its rows."""
    split = [s for g in self.groups for s in g]
    split_index: list[slice] = [slice(None)] * len(split)
    free = self._free_axes
    for axis, p in enumerate(self.perm):
      split_index[free[p]] = slice(*index[axis].indices(split[free[p]])) if axis < len(index) else slice(None)
    if self.pick is not None:
      split_index[self.picked_axis] = slice(self.pick[1], self.pick[1] + 1)
    split_index = [slice(*s.indices(n)) for s, n in zip(split_index, split)]
    hf_index, block_shape, post, k = [], [], [], 0
    for g in self.groups:
      first, rest = split_index[k], math.prod(g[1:])
      hf_index.append(slice(first.start * rest, first.stop * rest))
      block_shape.extend([first.stop - first.start, *g[1:]])
      post.extend([slice(None), *split_index[k + 1:k + len(g)]])
      k += len(g)
    block = np.asarray(hf[tuple(hf_index)]).reshape(block_shape)[tuple(post)]
    if self.pick is not None:
      block = block.squeeze(self.picked_axis)
    return block.transpose(self.perm)


def _block_table(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, TensorLayout]]:
  """Flax path inside a block -> (HF name inside ``model.layers.{i}.``, layout)."""
  d, h, k, hd, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                    cfg.intermediate_size)
  vec = lambda n: TensorLayout(((n,),), (0,))  # noqa: E731
  t = {
      ("input_norm", "scale"): ("input_layernorm.weight", vec(d)),
      ("post_attn_norm", "scale"): ("post_attention_layernorm.weight", vec(d)),
      ("pre_mlp_norm", "scale"): ("pre_feedforward_layernorm.weight", vec(d)),
      ("post_mlp_norm", "scale"): ("post_feedforward_layernorm.weight", vec(d)),
      ("attn", "q"): ("self_attn.q_proj.weight", TensorLayout(((h, hd), (d,)), (2, 0, 1))),
      ("attn", "k"): ("self_attn.k_proj.weight", TensorLayout(((k, hd), (d,)), (2, 0, 1))),
      ("attn", "v"): ("self_attn.v_proj.weight", TensorLayout(((k, hd), (d,)), (2, 0, 1))),
      ("attn", "o"): ("self_attn.o_proj.weight", TensorLayout(((d,), (h, hd)), (1, 2, 0))),
      ("attn", "q_bias"): ("self_attn.q_proj.bias", TensorLayout(((h, hd),), (0, 1))),
      ("attn", "k_bias"): ("self_attn.k_proj.bias", TensorLayout(((k, hd),), (0, 1))),
      ("attn", "v_bias"): ("self_attn.v_proj.bias", TensorLayout(((k, hd),), (0, 1))),
      ("attn", "o_bias"): ("self_attn.o_proj.bias", vec(d)),
      ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", vec(hd)),
      ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", vec(hd)),
      ("mlp", "gate"): ("mlp.gate_proj.weight", TensorLayout(((f,), (d,)), (1, 0))),
      ("mlp", "up"): ("mlp.up_proj.weight", TensorLayout(((f,), (d,)), (1, 0))),
      ("mlp", "down"): ("mlp.down_proj.weight", TensorLayout(((d,), (f,)), (1, 0))),
      ("mlp", "gate_bias"): ("mlp.gate_proj.bias", vec(f)),
      ("mlp", "up_bias"): ("mlp.up_proj.bias", vec(f)),
      ("mlp", "down_bias"): ("mlp.down_proj.bias", vec(d)),
  }
  return t


def experts_fused(cfg: ModelConfig) -> bool:
  """Whether ``cfg``'s checkpoints hold each projection of a layer's experts as one tensor (Qwen3-VL-MoE) rather
  than a module per expert: PEFT then sees no expert modules to adapt."""
  return cfg.model_type == "qwen3_vl_moe"


def _expert_table(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, TensorLayout]]:
  """Flax path of a mixture-of-experts parameter inside a block -> (HF name, with ``{e}`` for the expert, layout).

  The router is one tensor. Qwen3-MoE stores each expert's projections as HF tensors of their own
  (``mlp.experts.{e}.gate_proj.weight``), stacked on the Flax parameter's leading expert axis; Qwen3-VL-MoE stores
  every expert in one tensor per projection, gate and up concatenated (``mlp.experts.gate_up_proj`` [E, D, 2 * F],
  ``mlp.experts.down_proj`` [E, F, D]: the Flax layouts, as its released checkpoints and transformers 5 write them).
  """
  d, f, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
  router = ("mlp.gate.weight", TensorLayout(((e,), (d,)), (1, 0)))
  if experts_fused(cfg):
    gate_up = "mlp.experts.gate_up_proj"
    return {("mlp", "router"): router,
            ("mlp", "gate"): (gate_up, TensorLayout(((e,), (d,), (2, f)), (0, 1, 2), pick=(2, 0))),
            ("mlp", "up"): (gate_up, TensorLayout(((e,), (d,), (2, f)), (0, 1, 2), pick=(2, 1))),
            ("mlp", "down"): ("mlp.experts.down_proj", TensorLayout(((e,), (f,), (d,)), (0, 1, 2)))}
  return {
      ("mlp", "router"): router,
      ("mlp", "gate"): ("mlp.experts.{e}.gate_proj.weight", TensorLayout(((f,), (d,)), (1, 0))),
      ("mlp", "up"): ("mlp.experts.{e}.up_proj.weight", TensorLayout(((f,), (d,)), (1, 0))),
      ("mlp", "down"): ("mlp.experts.{e}.down_proj.weight", TensorLayout(((d,), (f,)), (1, 0))),
  }


@dataclasses.dataclass(frozen=True)
class Source:
  """The HF tensors behind one Flax parameter: one name, or one per entry of its leading stacked axes.

  Attributes:
    names: the HF names, row-major over ``stack``.
    layout: how each HF tensor becomes a slice of the parameter.
    stack: the sizes of the parameter's leading axes that index HF tensors
      (layers when scanned, experts, or both); () for one tensor.
  """

  names: tuple[str, ...]
  layout: TensorLayout
  stack: tuple[int, ...] = ()

  def to_hf(self, value: np.ndarray) -> dict[str, np.ndarray]:
    """The parameter ``value`` (Flax layout) as its HF tensors by name."""
    values = value.reshape(-1, *value.shape[len(self.stack):]) if self.stack else [value]
    return {name: self.layout.to_hf(v) for name, v in zip(self.names, values)}


def _layer_source(cfg: ModelConfig, inner: tuple[Any, ...], layers: tuple[int, ...], stacked: bool) -> Source | None:
  """The Source of block parameter ``inner`` for ``layers`` (all of them when stacked), or None if unknown."""
  table, experts = _block_table(cfg), _expert_table(cfg)
  sparse = cfg.is_sparse(layers[0])
  if sparse and inner in experts:
    name, layout = experts[inner]
    if "{e}" not in name:
      names = tuple(f"model.layers.{i}.{name}" for i in layers)
      return Source(names, layout, (len(layers),) if stacked else ())
    names = tuple(f"model.layers.{i}.{name.format(e=e)}" for i in layers for e in range(cfg.num_experts))
    return Source(names, layout, ((len(layers),) if stacked else ()) + (cfg.num_experts,))
  if inner in table and not (sparse and inner[0] == "mlp"):
    name, layout = table[inner]
    return Source(tuple(f"model.layers.{i}.{name}" for i in layers), layout, (len(layers),) if stacked else ())
  return None


def _merger_table(prefix: str, wide_norm: bool, cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, TensorLayout]]:
  """Flax path inside a ``PatchMerger`` -> (HF name, layout): Qwen3-VL's (``prefix`` + norm, linear_fc1,
  linear_fc2) or Qwen2.5-VL's (merger.ln_q, merger.mlp.0, merger.mlp.2)."""
  v = cfg.vision
  d, wide = v.hidden_size, v.merge_unit * v.hidden_size
  vec = lambda n: TensorLayout(((n,),), (0,))  # noqa: E731
  dense = lambda out, inp: TensorLayout(((out,), (inp,)), (1, 0))  # noqa: E731
  if not v.qwen3:
    return {("norm", "scale"): ("merger.ln_q.weight", vec(d)), ("fc1",): ("merger.mlp.0.weight", dense(wide, wide)),
            ("fc1_bias",): ("merger.mlp.0.bias", vec(wide)),
            ("fc2",): ("merger.mlp.2.weight", dense(v.out_hidden_size, wide)),
            ("fc2_bias",): ("merger.mlp.2.bias", vec(v.out_hidden_size))}
  norm = wide if wide_norm else d
  return {("norm", "scale"): (f"{prefix}.norm.weight", vec(norm)), ("norm", "bias"): (f"{prefix}.norm.bias", vec(norm)),
          ("fc1",): (f"{prefix}.linear_fc1.weight", dense(wide, wide)), ("fc1_bias",): (f"{prefix}.linear_fc1.bias",
                                                                                    vec(wide)),
          ("fc2",): (f"{prefix}.linear_fc2.weight", dense(v.out_hidden_size, wide)),
          ("fc2_bias",): (f"{prefix}.linear_fc2.bias", vec(v.out_hidden_size))}


def _vision_table(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, TensorLayout]]:
  """Flax path inside ``visual`` -> (HF name inside ``visual.``, with ``{i}`` for a block and ``{j}`` for a
  deepstack merger; layout)."""
  v = cfg.vision
  d, h, hd, f = v.hidden_size, v.num_heads, v.head_dim, v.intermediate_size
  vec = lambda n: TensorLayout(((n,),), (0,))  # noqa: E731
  dense = lambda out, inp: TensorLayout(((out,), (inp,)), (1, 0))  # noqa: E731
  table = {
      ("embed", "patch"): ("patch_embed.proj.weight", TensorLayout(((d,), *((n,) for n in v.patch_shape)), (1, 2, 3, 4, 0))),
      ("blocks", "norm1", "scale"): ("blocks.{i}.norm1.weight", vec(d)),
      ("blocks", "norm2", "scale"): ("blocks.{i}.norm2.weight", vec(d)),
      ("blocks", "qkv"): ("blocks.{i}.attn.qkv.weight", TensorLayout(((3, h, hd), (d,)), (3, 0, 1, 2))),
      ("blocks", "qkv_bias"): ("blocks.{i}.attn.qkv.bias", TensorLayout(((3, h, hd),), (0, 1, 2))),
      ("blocks", "proj"): ("blocks.{i}.attn.proj.weight", TensorLayout(((d,), (h, hd)), (1, 2, 0))),
      ("blocks", "proj_bias"): ("blocks.{i}.attn.proj.bias", vec(d)),
      **{("merger", *path): entry for path, entry in _merger_table("merger", False, cfg).items()},
  }
  if not v.qwen3:
    return {**table,
            ("blocks", "gate"): ("blocks.{i}.mlp.gate_proj.weight", dense(f, d)),
            ("blocks", "gate_bias"): ("blocks.{i}.mlp.gate_proj.bias", vec(f)),
            ("blocks", "up"): ("blocks.{i}.mlp.up_proj.weight", dense(f, d)),
            ("blocks", "up_bias"): ("blocks.{i}.mlp.up_proj.bias", vec(f)),
            ("blocks", "down"): ("blocks.{i}.mlp.down_proj.weight", dense(d, f)),
            ("blocks", "down_bias"): ("blocks.{i}.mlp.down_proj.bias", vec(d))}
  return {**table,
          ("embed", "bias"): ("patch_embed.proj.bias", vec(d)),
          ("embed", "positions"): ("pos_embed.weight", TensorLayout(((v.num_position_embeddings,), (d,)), (0, 1))),
          ("blocks", "norm1", "bias"): ("blocks.{i}.norm1.bias", vec(d)),
          ("blocks", "norm2", "bias"): ("blocks.{i}.norm2.bias", vec(d)),
          ("blocks", "up"): ("blocks.{i}.mlp.linear_fc1.weight", dense(f, d)),
          ("blocks", "up_bias"): ("blocks.{i}.mlp.linear_fc1.bias", vec(f)),
          ("blocks", "down"): ("blocks.{i}.mlp.linear_fc2.weight", dense(d, f)),
          ("blocks", "down_bias"): ("blocks.{i}.mlp.linear_fc2.bias", vec(d)),
          **{("deepstack", *path): entry
             for path, entry in _merger_table("deepstack_merger_list.{j}", True, cfg).items()}}


def _vision_source(cfg: ModelConfig, inner: tuple[Any, ...]) -> Source | None:
  """The Source of vision tower parameter ``inner`` (the blocks' stacked over the tower's depth, the deepstack
  mergers' over their number), or None."""
  entry = None if cfg.vision is None else _vision_table(cfg).get(inner)
  if entry is None:
    return None
  name, layout = entry
  for field, count in (("{i}", cfg.vision.depth), ("{j}", len(cfg.vision.deepstack_visual_indexes))):
    if field in name:
      return Source(tuple(f"visual.{name.replace(field, str(i))}" for i in range(count)), layout, (count,))
  return Source((f"visual.{name}",), layout)


def _mtp_source(cfg: ModelConfig, depth: int, inner: tuple[Any, ...]) -> Source | None:
  """The Source of MTP layer ``depth``'s parameter ``inner`` (``model.mtp_layers.{depth}.*``), or None."""
  d = cfg.hidden_size
  vec = TensorLayout(((d,),), (0,))
  own = {("token_norm", "scale"): ("token_layernorm.weight", vec),
         ("hidden_norm", "scale"): ("hidden_layernorm.weight", vec),
         ("final_norm", "scale"): ("final_layernorm.weight", vec),
         ("input_proj",): ("input_proj.weight", TensorLayout(((d,), (2 * d,)), (1, 0)))}
  entry = own.get(inner) or (_block_table(cfg).get(inner[1:]) if inner[:1] == ("block",) else None)
  return None if entry is None else Source((f"model.mtp_layers.{depth}.{entry[0]}",), entry[1])


def hf_sources(cfg: ModelConfig, path: tuple[Any, ...]) -> Source:
  """The HF tensor(s) and layout for the Flax parameter at ``path``."""
  top = TensorLayout(((cfg.vocab_size,), (cfg.hidden_size,)), (0, 1))
  if path == ("embed",):
    return Source(("model.embed_tokens.weight",), top)
  if path == ("lm_head",):
    return Source(("lm_head.weight",), top)
  if path == ("final_norm", "scale"):
    return Source(("model.norm.weight",), TensorLayout(((cfg.hidden_size,),), (0,)))
  source = None
  if path[0] == "visual":
    source = _vision_source(cfg, path[1:])
  elif path[0] == "mtp":
    source = _mtp_source(cfg, path[1], path[2:])
  elif path[0] == "layers" and cfg.scan_layers:
    source = _layer_source(cfg, path[1:], tuple(range(cfg.num_layers)), True)
  elif path[0] == "layers" and isinstance(path[1], int):
    source = _layer_source(cfg, path[2:], (path[1],), False)
  if source is not None:
    return source
  hint = (" (a LoRA adapter: write rljax.models.lora.merge_lora(model), or save_peft for PEFT's format)"
          if "adapters" in path else "")
  raise KeyError(f"no HF tensor is known for parameter {'/'.join(map(str, path))}{hint}.")


class TensorSource:
  """A checkpoint's tensors by HF name: names() and tensor(name) (array-like)."""

  def __init__(self, tensors: Mapping[str, Any], origin: str):
    self._tensors = tensors
    self.origin = origin

  def names(self) -> list[str]:
    return list(self._tensors)

  def tensor(self, name: str) -> Any:
    return self._tensors[name]


# transformers 5's own module names of a vision-language model -> the released checkpoints' names
_NESTED_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def released_name(name: str) -> str:
  """A tensor's name as the released checkpoints spell it (transformers 5's nested ``model.language_model.`` and
  ``model.visual.`` become ``model.`` and ``visual.``); other names unchanged."""
  for nested, released in _NESTED_PREFIXES:
    if name.startswith(nested):
      return released + name[len(nested):]
  return name


def nested_name(name: str) -> str:
  """A vision-language model's tensor or module name as transformers 5 nests it (``model.language_model.``,
  ``model.visual.``: ``released_name``'s inverse); a name already nested, or outside both, as it is."""
  if name.startswith(tuple(nested for nested, _ in _NESTED_PREFIXES)):
    return name
  for nested, released in _NESTED_PREFIXES:
    if name.startswith(released):
      return nested + name[len(released):]
  return name


def module_name(cfg: ModelConfig, name: str) -> str:
  """A tensor's or module's name in transformers 5's module tree of ``cfg``'s model: ``nested_name`` for a
  vision-language model, a text model's as it is."""
  return name if cfg.vision is None else nested_name(name)


def written_name(cfg: ModelConfig, name: str) -> str:
  """A tensor's name as ``cfg``'s released checkpoints spell it: Qwen3-VL's and Qwen3-VL-MoE's nest the language
  model and the tower (``module_name``); the others' are ``released_name``'s."""
  return module_name(cfg, name) if cfg.vision is not None and cfg.vision.qwen3 else name


def safetensors_source(path: str) -> TensorSource:
  reader = safetensors_io.SafetensorsReader(path)
  return TensorSource({released_name(n): reader.tensor(n) for n in reader.names()}, path)


def _check_tensors(cfg: ModelConfig, sources: Mapping[tuple, Source], src: TensorSource) -> None:
  """Raises ValueError naming any missing, unexpected or mis-shaped tensor."""
  expected = {n: s.layout.hf_shape for s in sources.values() for n in s.names}
  present = set(src.names())
  missing = sorted(set(expected) - present)
  if missing:
    raise ValueError(
        f"{src.origin}: missing tensor(s) for model_type={cfg.model_type!r}: "
        f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}"
    )
  ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
  unexpected = sorted(n for n in present - set(expected)
                      if n not in ignorable and not n.endswith(_IGNORED_SUFFIXES) and not _dropped_mtp(cfg, n))
  if unexpected:
    raise ValueError(
        f"{src.origin}: unexpected tensor(s) for model_type={cfg.model_type!r} "
        f"(check config.json): {', '.join(unexpected[:10])}"
        f"{' ...' if len(unexpected) > 10 else ''}"
    )
  for name, shape in expected.items():
    found = tuple(src.tensor(name).shape)
    if found != shape:
      raise ValueError(
          f"{src.origin}: tensor {name!r} has shape {found}, config.json implies {shape}."
      )


def _dropped_mtp(cfg: ModelConfig, name: str) -> bool:
  """Whether ``name`` is a MiMo multi-token prediction tensor of a model built without those layers (verl's
  model.mtp.enable=false: they are neither loaded nor saved)."""
  return cfg.model_type == "mimo" and not cfg.mtp_layers and name.startswith("model.mtp_layers.")


# fused expert tensors (Qwen3-VL-MoE) that transformers 5 writes in its modules' layout, their last two axes swapped
_FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _released_layout(sources: Mapping[tuple, Source], src: TensorSource) -> TensorSource:
  """``src`` with each fused expert tensor that transformers 5 saved in its modules' layout ([E, 2F, D], [E, D, F])
  read as the released checkpoints store it ([E, D, 2F], [E, F, D]: ``_expert_table``'s), as transformers reads
  both."""
  expected = {n: s.layout.hf_shape for s in sources.values() for n in s.names if n.endswith(_FUSED_EXPERTS)}
  present = set(src.names())
  swapped = {n for n, shape in expected.items() if n in present
             and tuple(src.tensor(n).shape) != shape and tuple(src.tensor(n).shape) == (*shape[:-2], *shape[:-3:-1])}
  if not swapped:
    return src
  return TensorSource({n: (np.swapaxes(src.tensor(n), -1, -2) if n in swapped else src.tensor(n))
                       for n in src.names()}, src.origin)


def _reader(src: TensorSource, source: Source, dtype: np.dtype) -> Callable[[tuple], np.ndarray]:
  """Callback: a Flax-layout index -> that block of the parameter, as ``dtype``."""

  def read(index: tuple[slice, ...]) -> np.ndarray:
    if not source.stack:
      return source.layout.read(src.tensor(source.names[0]), index).astype(dtype)
    index = tuple(index) + (slice(None),) * (len(source.stack) + len(source.layout.shape) - len(index))
    lead = [range(*s.indices(n)) for s, n in zip(index, source.stack)]
    rest = index[len(source.stack):]
    blocks = [source.layout.read(src.tensor(source.names[int(np.ravel_multi_index(ix, source.stack))]), rest)
              .astype(dtype) for ix in itertools.product(*lead)]
    return np.stack(blocks).reshape(*(len(r) for r in lead), *blocks[0].shape)

  return read


def load_state(
    cfg: ModelConfig,
    src: TensorSource,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
) -> CausalLM:
  """Builds the model from ``src``; with a mesh each device reads only its shard."""
  abstract = nnx.eval_shape(lambda: CausalLM(cfg, nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = nnx.to_flat_state(state)
  sources = {path: hf_sources(cfg, path) for path, _ in flat}
  src = _released_layout(sources, src)
  _check_tensors(cfg, sources, src)
  dtype = np.dtype(cfg.param_dtype)
  loaded = []
  for path, var in flat:
    read = _reader(src, sources[path], dtype)
    shape = tuple(var.shape)
    if mesh is None:
      value = jax.device_put(read((slice(None),) * len(shape)))
    else:
      sharding = NamedSharding(mesh, logical_to_spec(param_names(var), shape, mesh, rules))
      value = jax.make_array_from_callback(shape, sharding, read)
    loaded.append((path, var.replace(value)))
  return nnx.merge(graphdef, nnx.from_flat_state(loaded))


def abstract_state(model: nnx.Module, mesh: Mesh, rules: Rules | None) -> nnx.Module:
  """`model` (built under `nnx.eval_shape`) with each parameter a ShapeDtypeStruct sharded by its logical names."""
  graphdef, state = nnx.split(model)

  def leaf(var):
    sharding = NamedSharding(mesh, logical_to_spec(param_names(var), var.shape, mesh, rules))
    return var.replace(jax.ShapeDtypeStruct(var.shape, var.dtype, sharding=sharding))

  return nnx.merge(graphdef, jax.tree.map(leaf, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def to_hf_tensors(cfg: ModelConfig, params: Iterable[tuple[tuple[Any, ...], np.ndarray]]) -> dict[str, np.ndarray]:
  """Parameters (Flax path, host value) as HF tensors by (released) name; the parts of a fused tensor (``pick``)
  concatenated in order. ValueError when a fused tensor's parts are not all among ``params``."""
  out: dict[str, np.ndarray] = {}
  parts: dict[str, tuple[TensorLayout, dict[int, np.ndarray]]] = {}
  for path, value in params:
    source = hf_sources(cfg, path)
    for name, tensor in source.to_hf(value).items():
      if source.layout.pick is None:
        out[name] = tensor
      else:
        parts.setdefault(name, (source.layout, {}))[1][source.layout.pick[1]] = tensor
  for name, (layout, pieces) in parts.items():
    count = layout.groups[layout.pick[0]][0]
    if sorted(pieces) != list(range(count)):
      raise ValueError(f"HF tensor {name} joins {count} parameters; only parts {sorted(pieces)} were given.")
    out[name] = np.concatenate([pieces[k] for k in range(count)], axis=layout.pick[0])
  return out


def hf_tensors(model: CausalLM) -> dict[str, np.ndarray]:
  """All parameters as host numpy arrays under their HF names (as ``written_name`` spells them) and layouts."""
  cfg = model.cfg
  params = ((path, np.asarray(jax.device_get(var[...])))
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  return {written_name(cfg, name): tensor for name, tensor in to_hf_tensors(cfg, params).items()}


def _dtype_name(dtype: Any) -> str:
  return {"bfloat16": "bfloat16", "float16": "float16"}.get(np.dtype(dtype).name, "float32")


def save_pretrained(
    model: CausalLM,
    path: str,
    tokenizer: Any = None,
    max_shard_bytes: int = safetensors_io.SHARD_BYTES,
) -> None:
  """Writes an HF checkpoint directory that transformers opens.

  Writes config.json, generation_config.json, model.safetensors (or shards of
  at most ``max_shard_bytes`` and model.safetensors.index.json) and, when
  given, the tokenizer files. Files are built in a temporary sibling
  directory and moved into ``path`` only when complete.
  """
  cfg = model.cfg
  tensors = hf_tensors(model)
  tmp = path.rstrip("/") + ".rljax-tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  shards = safetensors_io.plan_shards(((n, t.nbytes) for n, t in tensors.items()),
                                      max_shard_bytes)
  files = safetensors_io.shard_file_names(len(shards))
  for file, names in zip(files, shards):
    safetensors_io.write_file(os.path.join(tmp, file), {n: tensors[n] for n in names})
  if len(files) > 1:
    safetensors_io.write_index(tmp, {n: f for f, ns in zip(files, shards) for n in ns},
                               sum(t.nbytes for t in tensors.values()))
  with open(os.path.join(tmp, "config.json"), "w") as f:
    json.dump(config_lib.to_hf_dict(cfg, _dtype_name(cfg.param_dtype)), f, indent=2)
  generation = {k: getattr(cfg, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                if getattr(cfg, k) is not None}
  with open(os.path.join(tmp, "generation_config.json"), "w") as f:
    json.dump(generation, f, indent=2)
  if tokenizer is not None:
    tokenizer.save_pretrained(tmp)
  os.makedirs(path, exist_ok=True)
  for stale in os.listdir(path):
    if stale.startswith("model") and stale.endswith((".safetensors", ".index.json")):
      os.remove(os.path.join(path, stale))
  for name in os.listdir(tmp):
    os.replace(os.path.join(tmp, name), os.path.join(path, name))
  os.rmdir(tmp)


def hf_config_from_dir(path: str) -> dict[str, Any]:
  file = os.path.join(path, "config.json")
  if not os.path.exists(file):
    raise FileNotFoundError(f"{path} has no config.json.")
  with open(file) as f:
    return json.load(f)


def make_model(
    hf_config: Mapping[str, Any],
    src: TensorSource,
    *,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
    override_config: Mapping[str, Any] | None = None,
    **options: Any,
) -> CausalLM:
  cfg = config_lib.from_hf_dict(hf_config, override_config, dtype=dtype, param_dtype=param_dtype or dtype, **options)
  return load_state(cfg, src, mesh, rules)
