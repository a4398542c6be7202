"""The configuration of a vision tower (HF ``vision_config``): read, validated, written back.

Kept apart from ``rljax.models.vision`` (the modules) so ``rljax.models.config`` can hold one without importing the
layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

VISION_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # rljax.models.layers.ACTIVATIONS' names
# the HF vision_config fields each family reads (the rest are kept in hf_extra and written back)
_COMMON = {"model_type", "depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size",
           "spatial_merge_size", "temporal_patch_size", "in_channels", "in_chans", "hidden_act", "rope_parameters"}
_KNOWN = {"qwen2_5_vl": _COMMON | {"window_size", "fullatt_block_indexes", "tokens_per_second"},
          "qwen3_vl": _COMMON | {"num_position_embeddings", "deepstack_visual_indexes"}}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """Shapes of a Qwen2.5-VL or Qwen3-VL vision tower (HF ``vision_config``).

  The two families differ in their blocks (Qwen2.5-VL: RMSNorm, a SwiGLU MLP, windowed attention in all but the
  ``fullatt_block_indexes`` blocks; Qwen3-VL: LayerNorm, a plain MLP, every block attending across its frame),
  their positions (Qwen3-VL adds a learned table of ``num_position_embeddings`` positions, resampled to each image's
  grid) and their outputs (Qwen3-VL also merges the ``deepstack_visual_indexes`` blocks' outputs, which the language
  model's first layers add at the image tokens).

  Attributes:
    family: ``qwen2_5_vl`` or ``qwen3_vl`` (the whole model's HF model_type).
    depth: number of blocks.
    hidden_size: Dv, the tower's width.
    intermediate_size: the blocks' MLP width (SwiGLU's in Qwen2.5-VL).
    num_heads: attention heads (head_dim = Dv / num_heads).
    out_hidden_size: D, the language model's width the merger projects to.
    patch_size: p, pixels per patch side.
    spatial_merge_size: m, patches per side of a merged block (m * m patches -> one token).
    temporal_patch_size: frames per patch (an image is repeated to fill them).
    window_size: pixels per side of an attention window (Qwen2.5-VL); None: a frame (Qwen3-VL).
    fullatt_block_indexes: blocks that attend across the whole frame (Qwen3-VL: all of them).
    in_channels: colour channels.
    hidden_act: the blocks' MLP activation.
    rope_theta: base of the 2-D rotary embedding.
    tokens_per_second: temporal position step of video frames (kept for round trips).
    num_position_embeddings: S * S learned positions on an S x S grid (Qwen3-VL), or None.
    deepstack_visual_indexes: blocks whose outputs are merged for the language model's first layers (Qwen3-VL).
    hf_extra: the remaining HF fields, written back unchanged.
  """

  family: str = "qwen2_5_vl"
  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  out_hidden_size: int = 3584
  patch_size: int = 14
  spatial_merge_size: int = 2
  temporal_patch_size: int = 2
  window_size: int | None = 112
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  in_channels: int = 3
  hidden_act: str = "silu"
  rope_theta: float = 10000.0
  tokens_per_second: int = 2
  num_position_embeddings: int | None = None
  deepstack_visual_indexes: tuple[int, ...] = ()
  hf_extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __hash__(self) -> int:
    return hash(repr(self))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def qwen3(self) -> bool:
    """A Qwen3-VL tower (LayerNorm, plain MLP, learned positions, deepstack mergers)."""
    return self.family == "qwen3_vl"

  @property
  def position_side(self) -> int:
    """S, the side of the learned position grid (0: none)."""
    return int(round((self.num_position_embeddings or 0) ** 0.5))

  @property
  def merge_unit(self) -> int:
    """Patches per merged token (m * m)."""
    return self.spatial_merge_size ** 2

  @property
  def patch_shape(self) -> tuple[int, int, int, int]:
    """(channels, frames, p, p): one patch's pixels, in the order the image processor flattens them."""
    return (self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size)


def vision_from_hf(d: Mapping[str, Any], family: str = "qwen2_5_vl") -> VisionConfig:
  """A VisionConfig from an HF ``vision_config`` dict of a ``family`` model; ValueError naming an unsupported
  field."""
  qwen3 = family == "qwen3_vl"
  act = d.get("hidden_act", "gelu_pytorch_tanh" if qwen3 else "silu")
  if act not in VISION_ACTIVATIONS:
    raise ValueError(f"vision_config.hidden_act={act!r} is not supported; supported: {VISION_ACTIVATIONS}.")
  hidden, heads = int(d.get("hidden_size", 1152 if qwen3 else 1280)), int(d.get("num_heads", 16))
  if hidden % heads or (hidden // heads) % 4:
    raise ValueError(f"vision_config: hidden_size={hidden} over num_heads={heads} must give a head width that is a "
                     "multiple of 4 (its rotary embedding splits each half between height and width).")
  patch, merge = int(d.get("patch_size", 16 if qwen3 else 14)), int(d.get("spatial_merge_size", 2))
  rope = d.get("rope_parameters") or {}
  common = dict(family=family, hidden_size=hidden, num_heads=heads, patch_size=patch, spatial_merge_size=merge,
                temporal_patch_size=int(d.get("temporal_patch_size", 2)),
                in_channels=int(d.get("in_channels", d.get("in_chans", 3))), hidden_act=act,
                rope_theta=float(rope.get("rope_theta", 10000.0)),
                hf_extra={k: v for k, v in d.items() if k not in _KNOWN[family]})
  if qwen3:
    depth, positions = int(d.get("depth", 27)), int(d.get("num_position_embeddings", 2304))
    side = int(round(positions ** 0.5))
    if side * side != positions or side < 2:
      raise ValueError(f"vision_config.num_position_embeddings={positions} must be the square of a grid side of at "
                       "least 2 (2304 = 48 x 48 in the released models).")
    deepstack = tuple(int(i) for i in d.get("deepstack_visual_indexes", (8, 16, 24)))
    if any(not 0 <= i < depth for i in deepstack) or list(deepstack) != sorted(set(deepstack)):
      raise ValueError(f"vision_config.deepstack_visual_indexes={list(deepstack)} must be increasing block indexes "
                       f"below depth={depth}.")
    return VisionConfig(**common, depth=depth, intermediate_size=int(d.get("intermediate_size", 4304)),
                        out_hidden_size=int(d.get("out_hidden_size", 3584)), window_size=None,
                        fullatt_block_indexes=tuple(range(depth)), num_position_embeddings=positions,
                        deepstack_visual_indexes=deepstack)
  window = int(d.get("window_size", 112))
  if window < patch * merge:
    raise ValueError(f"vision_config.window_size={window} must be at least patch_size x spatial_merge_size = "
                     f"{patch * merge} pixels (one merged patch).")
  return VisionConfig(**common, depth=int(d.get("depth", 32)), intermediate_size=int(d.get("intermediate_size", 3420)),
                      out_hidden_size=int(d.get("out_hidden_size", 3584)), window_size=window,
                      fullatt_block_indexes=tuple(int(i) for i in d.get("fullatt_block_indexes", (7, 15, 23, 31))),
                      tokens_per_second=int(d.get("tokens_per_second", 2)))


def vision_to_hf(cfg: VisionConfig) -> dict[str, Any]:
  """The HF ``vision_config`` dict of ``cfg`` (its model_type, ``{model_type}_vision`` of the whole model, is the
  caller's)."""
  common = {**cfg.hf_extra, "depth": cfg.depth, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_heads": cfg.num_heads,
            "out_hidden_size": cfg.out_hidden_size, "patch_size": cfg.patch_size,
            "spatial_merge_size": cfg.spatial_merge_size, "temporal_patch_size": cfg.temporal_patch_size,
            "in_channels": cfg.in_channels, "hidden_act": cfg.hidden_act,
            "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "axial"}}
  if cfg.qwen3:
    return {**common, "num_position_embeddings": cfg.num_position_embeddings,
            "deepstack_visual_indexes": list(cfg.deepstack_visual_indexes)}
  return {**common, "window_size": cfg.window_size,
          "fullatt_block_indexes": list(cfg.fullatt_block_indexes), "tokens_per_second": cfg.tokens_per_second}
