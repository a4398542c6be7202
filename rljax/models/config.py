"""Model configuration: one dataclass for every supported decoder family.

A model is identified by its Hugging Face ``config.json``. ``from_hf_dict``
reads the fields the Flax modules need (both the transformers 4 spelling,
``rope_theta`` + ``rope_scaling``, and the transformers 5 spelling,
``rope_parameters``, which Gemma 3 keys by layer type), and ``to_hf_dict``
writes them back so a saved checkpoint opens in ``transformers``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from rljax.models.vision_config import VisionConfig, vision_from_hf, vision_to_hf

# model_type -> family defaults that differ from Llama's.
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"qkv_bias": None, "o_bias": None, "qk_norm": False},
    "mistral": {"qkv_bias": False, "o_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "o_bias": False, "qk_norm": False},
    "mimo": {"qkv_bias": True, "o_bias": False, "qk_norm": False},  # Qwen2 with multi-token prediction layers
    "qwen3": {"qkv_bias": None, "o_bias": None, "qk_norm": True},
    "qwen3_moe": {"qkv_bias": None, "o_bias": None, "qk_norm": True},
    "gemma3_text": {"qkv_bias": None, "o_bias": None, "qk_norm": True},
}
# model types with a vision tower; their language model is read as one of the families above
VISION_LANGUAGE_TYPES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
# each vision-language type's language model family (its text_config's fields are read as that family's)
_VL_TEXT = {"qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}
# each vision-language type's tower family (``VisionConfig.family``): Qwen3-VL-MoE's tower is Qwen3-VL's
TOWER_FAMILY = {"qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl"}

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mimo": "MiMoForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
}
# The top-level fields of a vision-language config.json that are not its language model's.
_VL_TOP = frozenset({"model_type", "architectures", "text_config", "vision_config", "image_token_id", "video_token_id",
                     "vision_start_token_id", "vision_end_token_id", "vision_token_id", "tie_word_embeddings",
                     "dtype", "torch_dtype", "transformers_version"})
# ... of which these are written back as they were read (ModelConfig.hf_top)
_VL_TOKENS = ("video_token_id", "vision_start_token_id", "vision_end_token_id", "vision_token_id")

_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_LAYER_TYPES = ("sliding_attention", "full_attention")

SUPPORTED_MODEL_TYPES = (*_FAMILIES, *VISION_LANGUAGE_TYPES)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and options of a decoder-only causal LM.

  Attributes:
    model_type: HF ``model_type`` (llama, mistral, qwen2, qwen3, qwen3_moe, gemma3_text, qwen2_5_vl, qwen3_vl,
      qwen3_vl_moe).
    vocab_size: V.
    hidden_size: D, the residual width.
    intermediate_size: F, the gated MLP's width.
    num_layers: L.
    num_heads: H, query heads.
    num_kv_heads: K, key/value heads (GQA when K < H).
    head_dim: per-head width (need not equal D / H).
    rms_norm_eps: RMSNorm epsilon.
    rope_theta: RoPE base.
    rope_scaling: None or a dict with ``rope_type`` in default, linear,
      llama3, yarn and that type's parameters (HF spelling).
    max_position_embeddings: HF field, kept for round trips and YaRN.
    tie_word_embeddings: LM head shares the embedding matrix.
    qkv_bias: q/k/v projections have biases (Qwen2).
    o_bias: output projection has a bias (Llama ``attention_bias``).
    mlp_bias: gate/up/down projections have biases (Llama ``mlp_bias``).
    qk_norm: per-head RMSNorm on queries and keys before RoPE (Qwen3).
    sliding_window: None, or keys further back than this many positions are
      masked (Mistral: every layer; with layer_types: the sliding layers).
    hidden_act: the gated MLP's activation, ``silu`` (SwiGLU) or
      ``gelu_pytorch_tanh`` (GeGLU, Gemma).
    norm_plus_one: RMSNorms scale by (1 + weight), in float32 (Gemma).
    sandwich_norms: blocks also norm the attention and MLP outputs before
      each residual add (Gemma's four norms per block).
    scale_embeddings: embeddings are multiplied by sqrt(D) (Gemma).
    query_pre_attn_scalar: None, or attention scores scale by this ** -0.5
      instead of head_dim ** -0.5 (Gemma; an int in HF configs, kept as read).
    attn_logit_softcapping: None, or attention scores become
      cap * tanh(scores / cap) before the mask (not read from gemma3_text
      configs: transformers' Gemma 3 ignores the field).
    final_logit_softcapping: None, or logits become cap * tanh(logits / cap).
    layer_types: None (every layer alike), or one of ``sliding_attention``,
      ``full_attention`` per layer (Gemma 3): sliding layers use
      sliding_window and RoPE base rope_local_theta without scaling, full
      ones see every key and use rope_theta and rope_scaling.
    rope_local_theta: RoPE base of the sliding layers (with layer_types).
    num_experts: E, experts per sparse layer (0: a dense model).
    num_experts_per_tok: k, experts each token is routed to.
    moe_intermediate_size: each expert's SwiGLU width.
    norm_topk_prob: renormalise the k routing weights to sum to 1.
    decoder_sparse_step: layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: ... and i is not listed here (those keep the dense MLP).
    router_aux_loss_coef: weight of the load-balancing loss in training,
      applied as HF applies it: only where config.json sets
      ``output_router_logits`` (false in Qwen3-MoE's releases, as verl's FSDP
      path trains them); 0 otherwise.
    bos_token_id, eos_token_id, pad_token_id: HF token ids (eos may be a list).
    dtype: activation/compute dtype.
    param_dtype: parameter dtype.
    scan_layers: stack layer parameters on a leading ``layers`` axis and run
      them with ``lax.scan`` (compile time flat in depth).
    remat: rematerialise each layer in the backward pass (gradient
      checkpointing).
    remat_policy: what a rematerialised layer saves (``rljax.models.remat``).
    offload_activations: a rematerialised layer keeps its input in host memory (``rljax.models.remat``).
    attention_kernel: ``xla`` or ``pallas`` (``rljax.models.attention``).
    mrope_section: None, or how many of each head's head_dim / 2 rotary
      frequencies turn with the temporal, height and width position
      (Qwen2.5-VL's M-RoPE; positions [3, B, T]).
    mrope_interleaved: the three axes' frequencies interleave (Qwen3-VL) rather than follow one another
      (``rljax.models.rope.mrope_axes``).
    vision: None, or the vision tower's configuration (a vision-language
      model: ``rljax.models.vision``).
    image_token_id: the image-pad token whose embeddings the tower's
      features replace.
    mtp_layers: MiMo's multi-token prediction layers the model holds (config.json's
      ``num_nextn_predict_layers``; 0 when built without them: ``rljax.models.mtp``).
    hf_extra: the remaining HF config fields, written back unchanged.
    hf_top: a vision-language config.json's remaining top-level fields
      (its language model's are in hf_extra), written back unchanged.
  """

  model_type: str = "llama"
  vocab_size: int = 32000
  hidden_size: int = 4096
  intermediate_size: int = 11008
  num_layers: int = 32
  num_heads: int = 32
  num_kv_heads: int = 32
  head_dim: int = 128
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: Mapping[str, Any] | None = None
  max_position_embeddings: int = 4096
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False
  sliding_window: int | None = None
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  router_aux_loss_coef: float = 0.0
  hidden_act: str = "silu"
  norm_plus_one: bool = False
  sandwich_norms: bool = False
  scale_embeddings: bool = False
  query_pre_attn_scalar: float | None = None
  attn_logit_softcapping: float | None = None
  final_logit_softcapping: float | None = None
  layer_types: tuple[str, ...] | None = None
  rope_local_theta: float | None = None
  bos_token_id: int | None = None
  eos_token_id: int | list[int] | None = None
  pad_token_id: int | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  scan_layers: bool = False
  remat: bool = False
  remat_policy: str = "full"
  offload_activations: bool = False
  attention_kernel: str = "xla"
  mrope_section: tuple[int, ...] | None = None
  mrope_interleaved: bool = False
  vision: VisionConfig | None = None
  image_token_id: int | None = None
  mtp_layers: int = 0
  hf_extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  hf_top: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __hash__(self) -> int:
    return hash(repr(self))

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def is_sparse(self, layer: int) -> bool:
    """Whether decoder layer ``layer`` holds a mixture-of-experts MLP (HF Qwen3-MoE's rule)."""
    return (self.num_experts > 0 and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0)

  @property
  def sparse_layers(self) -> tuple[int, ...]:
    """The indices of the mixture-of-experts layers."""
    return tuple(i for i in range(self.num_layers) if self.is_sparse(i))

  @property
  def routing_shape(self) -> tuple[int, int] | None:
    """(sparse layers, experts per token): the trailing shape of recorded routing; None for a dense model."""
    return (len(self.sparse_layers), self.num_experts_per_tok) if self.sparse_layers else None

  @property
  def rope_type(self) -> str:
    if not self.rope_scaling:
      return "default"
    return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))

  @property
  def local_layers(self) -> tuple[bool, ...]:
    """Per layer, whether it is a sliding layer of a model with layer_types."""
    return tuple(t == "sliding_attention" for t in self.layer_types or ("full_attention",) * self.num_layers)

  def attention_kind(self, local: bool) -> tuple[int | None, float, Mapping[str, Any] | None]:
    """(sliding window or None, RoPE base, RoPE scaling) of a sliding (``local``) or other layer."""
    if local:
      return self.sliding_window, self.rope_local_theta, None
    return (None if self.layer_types else self.sliding_window), self.rope_theta, self.rope_scaling


def _require(d: Mapping[str, Any], key: str, model_type: str) -> Any:
  if key not in d or d[key] is None:
    raise ValueError(f"config.json for model_type={model_type!r} lacks the field {key!r}.")
  return d[key]


def _rope_from_hf(d: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
  """(rope_theta, rope_scaling) from either HF spelling; top-level keys win."""
  params = dict(d.get("rope_parameters") or {})
  theta = float(d.get("rope_theta") or params.pop("rope_theta", 10000.0))
  params.pop("rope_theta", None)
  if "rope_scaling" in d:
    scaling = dict(d["rope_scaling"]) if d["rope_scaling"] else None
  else:
    scaling = params or None
  if scaling is not None:
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type not in _ROPE_TYPES:
      raise ValueError(
          f"rope_scaling.rope_type={rope_type!r} is not supported; supported: {_ROPE_TYPES}."
      )
    scaling["rope_type"] = rope_type
    scaling.pop("type", None)
    if rope_type == "default":
      scaling = None
  return theta, scaling


_KNOWN_KEYS = {
    "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "sliding_window", "use_sliding_window", "bos_token_id", "eos_token_id",
    "pad_token_id", "hidden_act", "layer_types", "max_window_layers",
    "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
    "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits",
    "hidden_activation", "query_pre_attn_scalar", "final_logit_softcapping",
    "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern", "use_bidirectional_attention",
    "num_nextn_predict_layers",
}
# The fields from_hf_dict reads into a ModelConfig: overriding one changes the
# built model (max_window_layers is dropped unread, and so is layer_types but
# for gemma3_text: neither is listed).
READ_FIELDS = frozenset(_KNOWN_KEYS - {"layer_types", "max_window_layers"})


def override_applies(name: str, value: Any) -> bool:
  """Whether an HF config override `name=value` means the same for rljax's models as for HF's.

  True for the fields ``from_hf_dict`` reads, and for a dropout probability
  of 0 (``attention_dropout``, ``resid_pdrop``, ...): the models have no
  dropout, which is what 0 asks for.
  """
  dropout = "dropout" in name or name.endswith("pdrop")
  is_zero = isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
  return name in READ_FIELDS or (dropout and is_zero)


def _gemma_rope(d: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
  """(rope_theta, rope_scaling, rope_local_theta) of Gemma 3's full and sliding layers.

  transformers 4 writes ``rope_theta`` + ``rope_scaling`` (full layers) and
  ``rope_local_base_freq`` (sliding layers); transformers 5 writes
  ``rope_parameters`` keyed by layer type.
  """
  params = d.get("rope_parameters") or {}
  nested = "full_attention" in params or "sliding_attention" in params
  full = {"rope_theta": 1_000_000.0, **((params.get("full_attention") or {}) if nested else params)}
  local = {"rope_theta": 10_000.0, **(params.get("sliding_attention") or {})}
  top = {k: d[k] for k in ("rope_theta", "rope_scaling") if k in d}
  theta, scaling = _rope_from_hf({"rope_parameters": full, **top})
  local_theta, local_scaling = _rope_from_hf({"rope_parameters": local, "rope_theta": d.get("rope_local_base_freq")})
  if local_scaling is not None:
    raise ValueError(
        f"rope_parameters.sliding_attention.rope_type={local_scaling['rope_type']!r} is not supported; "
        "sliding layers use default RoPE.")
  return theta, scaling, local_theta


def _gemma_fields(d: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
  """The ModelConfig fields particular to a gemma3_text config.json; ValueError naming an unsupported field.

  ``attn_logit_softcapping`` stays unread (in hf_extra): transformers'
  Gemma3ForCausalLM never applies it, so neither does a model built here.
  """
  if d.get("use_bidirectional_attention"):
    raise ValueError("use_bidirectional_attention=True is not supported; rljax's models are causal.")
  types = d.get("layer_types")
  if types is None:
    pattern = int(d.get("sliding_window_pattern") or 6)
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
  if len(types) != num_layers or not set(types) <= set(_LAYER_TYPES):
    raise ValueError(f"layer_types={types!r} must give one of {_LAYER_TYPES} for each of {num_layers} layers.")
  theta, scaling, local_theta = _gemma_rope(d)
  window = d.get("sliding_window")
  if "sliding_attention" in types and not window:
    raise ValueError(f"sliding_window={window!r}: layer_types has sliding layers, which need a window.")
  cap = d.get("final_logit_softcapping")
  return dict(
      rope_theta=theta, rope_scaling=scaling, rope_local_theta=local_theta, layer_types=tuple(types),
      sliding_window=int(window) if window else None, norm_plus_one=True, sandwich_norms=True,
      scale_embeddings=True, query_pre_attn_scalar=d.get("query_pre_attn_scalar", 256),
      final_logit_softcapping=None if cap is None else float(cap),
  )


def model_type_of(d: Mapping[str, Any]) -> str | None:
  """A config.json's model_type, or the one its architectures name (None if neither)."""
  if d.get("model_type") is not None:
    return d["model_type"]
  by_arch = {v: k for k, v in _ARCHITECTURES.items()}
  return next((by_arch[a] for a in d.get("architectures") or () if a in by_arch), None)


def from_hf_dict(
    d: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, **options: Any
) -> ModelConfig:
  """Builds a ModelConfig from an HF config.json dict.

  Args:
    d: the parsed config.json.
    overrides: HF-named fields that replace those in ``d`` (verl's
      ``actor_rollout_ref.model.override_config.model_config``).
    **options: ModelConfig runtime fields (dtype, param_dtype, scan_layers,
      remat, remat_policy, attention_kernel), and ``mtp``: False builds a MiMo model without its multi-token
      prediction layers (verl's model.mtp.enable=false; default True).

  Returns:
    The config. Raises ValueError naming the field for an unsupported
    model_type, activation or a missing field.
  """
  if model_type_of(d) in VISION_LANGUAGE_TYPES:
    return _vision_language_from_hf(d, overrides, options)
  d = {**d, **(overrides or {})}
  with_mtp = options.pop("mtp", True)
  model_type = model_type_of(d)
  if model_type not in _FAMILIES:
    raise ValueError(
        f"model_type={model_type!r} (architectures={d.get('architectures')}) is not "
        f"supported; supported model_type values: {SUPPORTED_MODEL_TYPES}."
    )
  family = _FAMILIES[model_type]
  gemma = model_type == "gemma3_text"
  act_key = "hidden_activation" if gemma else "hidden_act"
  act = d.get(act_key, "gelu_pytorch_tanh" if gemma else "silu")
  act = "silu" if act == "swish" else act
  if act not in _ACTIVATIONS:
    raise ValueError(f"{act_key}={act!r} is not supported; supported: {_ACTIVATIONS}.")
  if model_type in ("qwen2", "mimo", "qwen3", "qwen3_moe") and d.get("use_sliding_window"):
    raise ValueError(f"use_sliding_window=True is not supported for {model_type}.")
  hidden = int(_require(d, "hidden_size", model_type))
  heads = int(_require(d, "num_attention_heads", model_type))
  num_layers = int(_require(d, "num_hidden_layers", model_type))
  attention_bias = bool(d.get("attention_bias", False))
  qkv_bias = attention_bias if family["qkv_bias"] is None else family["qkv_bias"]
  o_bias = attention_bias if family["o_bias"] is None else family["o_bias"]
  if gemma:
    fields = _gemma_fields(d, num_layers)
  else:
    theta, scaling = _rope_from_hf(d)
    window = d.get("sliding_window") if model_type == "mistral" else None
    fields = dict(rope_theta=theta, rope_scaling=scaling, sliding_window=int(window) if window else None)
  return ModelConfig(
      **(_moe_fields(d) if model_type == "qwen3_moe" else {}),
      model_type=model_type,
      vocab_size=int(_require(d, "vocab_size", model_type)),
      hidden_size=hidden,
      intermediate_size=int(_require(d, "intermediate_size", model_type)),
      num_layers=num_layers,
      num_heads=heads,
      num_kv_heads=int(d.get("num_key_value_heads") or heads),
      head_dim=int(d.get("head_dim") or hidden // heads),
      rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
      max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      qkv_bias=qkv_bias,
      o_bias=o_bias,
      mlp_bias=bool(d.get("mlp_bias", False)) if model_type == "llama" else False,
      qk_norm=family["qk_norm"],
      hidden_act=act,
      bos_token_id=d.get("bos_token_id"),
      eos_token_id=d.get("eos_token_id"),
      pad_token_id=d.get("pad_token_id"),
      mtp_layers=int(d.get("num_nextn_predict_layers") or 0) if with_mtp and model_type == "mimo" else 0,
      hf_extra={k: v for k, v in d.items() if k not in _KNOWN_KEYS},
      **fields,
      **options,
  )


def _vision_language_from_hf(d: Mapping[str, Any], overrides: Mapping[str, Any] | None,
                             options: Mapping[str, Any]) -> ModelConfig:
  """A Qwen2.5-VL, Qwen3-VL or Qwen3-VL-MoE config.json (its language model's fields nested in ``text_config`` as
  transformers 5 writes them, or at the top level as the released Qwen2.5-VL checkpoints have them) as a ModelConfig
  with its ``vision``. Qwen3-VL-MoE's router always renormalises its top-k weights (``norm_topk_prob``)."""
  vl_type = model_type_of(d)
  text = {k: v for k, v in d.items() if k not in _VL_TOP}
  text.update(d.get("text_config") or {})
  text.update(overrides or {})
  rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
  section = rope.pop("mrope_section", None)
  if not section:
    raise ValueError(f"config.json for model_type={vl_type!r} lacks mrope_section (text_config.rope_parameters in "
                     "transformers 5's spelling, rope_scaling in the released configs): M-RoPE's split of each head's "
                     "frequencies between time, height and width ([16, 24, 24] in the released Qwen2.5-VL, "
                     "[24, 20, 20] in Qwen3-VL); add it.")
  theta = text.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
  for key in ("rope_parameters", "rope_scaling", "model_type"):
    text.pop(key, None)
  if "vision_config" not in d:
    raise ValueError(f"config.json for model_type={vl_type!r} lacks the field 'vision_config' (the vision "
                     "tower's shapes); copy it from the model's released config.json.")
  tie = d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
  moe = {"norm_topk_prob": True} if vl_type == "qwen3_vl_moe" else {}
  cfg = from_hf_dict({**text, "model_type": _VL_TEXT[vl_type], "rope_theta": theta, "tie_word_embeddings": tie,
                      **moe}, **options)
  head_half = cfg.head_dim // 2
  if len(section) != 3 or sum(section) != head_half:
    raise ValueError(f"rope_scaling.mrope_section={list(section)} must be 3 sizes summing to head_dim / 2 = "
                     f"{head_half}.")
  vision = vision_from_hf(d["vision_config"], TOWER_FAMILY[vl_type])
  if vision.out_hidden_size != cfg.hidden_size:
    raise ValueError(f"vision_config.out_hidden_size={vision.out_hidden_size} must equal the language model's "
                     f"hidden_size={cfg.hidden_size}.")
  if len(vision.deepstack_visual_indexes) > cfg.num_layers:
    raise ValueError(f"vision_config.deepstack_visual_indexes={list(vision.deepstack_visual_indexes)}: more deepstack "
                     f"features than the language model's {cfg.num_layers} layers to add them to.")
  return cfg.replace(model_type=vl_type, mrope_section=tuple(int(s) for s in section),
                     mrope_interleaved=vision.qwen3, vision=vision,
                     image_token_id=int(_require(d, "image_token_id", vl_type)),
                     hf_top={k: d[k] for k in _VL_TOKENS if k in d})


def _vision_language_to_hf(cfg: ModelConfig, torch_dtype: str) -> dict[str, Any]:
  """The Qwen2.5-VL, Qwen3-VL or Qwen3-VL-MoE config.json of ``cfg`` (the language model's fields in
  ``text_config``, the tower's in ``vision_config``, each sub-config's model_type the whole model's)."""
  text = to_hf_dict(cfg.replace(model_type=_VL_TEXT[cfg.model_type], vision=None, mrope_section=None,
                                mrope_interleaved=False), torch_dtype)
  for key in ("architectures", "torch_dtype", "dtype"):
    text.pop(key)
  mrope = {"rope_type": "default", "mrope_section": list(cfg.mrope_section)}
  if cfg.mrope_interleaved:
    mrope["mrope_interleaved"] = True
  text.update(model_type=f"{cfg.model_type}_text", rope_scaling={"type": "mrope", **mrope})
  return {**cfg.hf_top, "model_type": cfg.model_type, "architectures": [_ARCHITECTURES[cfg.model_type]],
          "text_config": text, "vision_config": {**vision_to_hf(cfg.vision), "model_type": f"{cfg.model_type}_vision"},
          "image_token_id": cfg.image_token_id,
          "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": torch_dtype, "dtype": torch_dtype}


def _moe_fields(d: Mapping[str, Any]) -> dict[str, Any]:
  """The mixture-of-experts fields of a Qwen3-MoE config.json (``num_local_experts`` is transformers 5's name)."""
  experts = d.get("num_experts", d.get("num_local_experts"))
  if not experts:
    raise ValueError("config.json for model_type='qwen3_moe' lacks the field 'num_experts'.")
  top_k = int(_require(d, "num_experts_per_tok", "qwen3_moe"))
  if not 1 <= top_k <= int(experts):
    raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and num_experts={experts}.")
  step = int(d.get("decoder_sparse_step", 1))
  if step < 1:
    raise ValueError(f"decoder_sparse_step={step} must be >= 1.")
  if d.get("hidden_act", "silu") not in ("silu", "swish"):
    raise ValueError(f"hidden_act={d['hidden_act']!r} is not supported for qwen3_moe; its experts are SwiGLU (silu).")
  for shared in ("shared_expert_intermediate_size", "n_shared_experts"):
    if d.get(shared):
      raise ValueError(f"{shared}={d[shared]}: shared experts are not supported (Qwen3-MoE has none).")
  coef = float(d.get("router_aux_loss_coef", 0.001)) if d.get("output_router_logits") else 0.0
  return {
      "num_experts": int(experts),
      "num_experts_per_tok": top_k,
      "moe_intermediate_size": int(_require(d, "moe_intermediate_size", "qwen3_moe")),
      "norm_topk_prob": bool(d.get("norm_topk_prob", False)),
      "decoder_sparse_step": step,
      "mlp_only_layers": tuple(int(i) for i in d.get("mlp_only_layers") or ()),
      "router_aux_loss_coef": coef,
  }


def to_hf_dict(cfg: ModelConfig, torch_dtype: str = "float32") -> dict[str, Any]:
  """The HF config.json dict for ``cfg`` (readable by transformers 4 and 5)."""
  if cfg.vision is not None:
    return _vision_language_to_hf(cfg, torch_dtype)
  d: dict[str, Any] = dict(cfg.hf_extra)
  for stale in ("rope_parameters", "dtype", "torch_dtype", "transformers_version"):
    d.pop(stale, None)
  d.update(
      model_type=cfg.model_type,
      architectures=[_ARCHITECTURES[cfg.model_type]],
      vocab_size=cfg.vocab_size,
      hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size,
      num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim,
      rms_norm_eps=cfg.rms_norm_eps,
      rope_theta=cfg.rope_theta,
      rope_scaling=dict(cfg.rope_scaling) if cfg.rope_scaling else None,
      max_position_embeddings=cfg.max_position_embeddings,
      tie_word_embeddings=cfg.tie_word_embeddings,
      bos_token_id=cfg.bos_token_id,
      eos_token_id=cfg.eos_token_id,
      pad_token_id=cfg.pad_token_id,
      torch_dtype=torch_dtype,
      dtype=torch_dtype,
  )
  if cfg.model_type == "gemma3_text":
    d.update(hidden_activation=cfg.hidden_act, rope_local_base_freq=cfg.rope_local_theta,
             layer_types=list(cfg.layer_types), sliding_window=cfg.sliding_window,
             query_pre_attn_scalar=cfg.query_pre_attn_scalar, final_logit_softcapping=cfg.final_logit_softcapping,
             use_bidirectional_attention=False)
  else:
    d["hidden_act"] = cfg.hidden_act
  if cfg.model_type in ("llama", "qwen3", "qwen3_moe", "gemma3_text"):
    d["attention_bias"] = cfg.qkv_bias
  if cfg.model_type == "qwen3_moe":
    d.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
             moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
             decoder_sparse_step=cfg.decoder_sparse_step, mlp_only_layers=list(cfg.mlp_only_layers))
    if cfg.router_aux_loss_coef:
      d.update(router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=True)
  if cfg.model_type == "llama":
    d["mlp_bias"] = cfg.mlp_bias
  if cfg.model_type == "mistral":
    d["sliding_window"] = cfg.sliding_window
  if cfg.model_type == "mimo":
    d["num_nextn_predict_layers"] = cfg.mtp_layers
  if cfg.model_type in ("qwen2", "mimo", "qwen3", "qwen3_moe"):
    d["use_sliding_window"] = False
    d.setdefault("sliding_window", None)
  return d
