"""Rotary position embeddings: default, linear, llama3 and YaRN frequencies.

Rotation follows the Hugging Face layout (the two halves of each head are
the real and imaginary parts), so HF checkpoints need no permutation.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np


def _default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
  """[head_dim // 2] inverse frequencies theta^(-2i / head_dim)."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def _llama3_inv_freq(inv_freq: np.ndarray, s: Mapping[str, Any]) -> np.ndarray:
  """Llama 3.1 scaling: long wavelengths / factor, short ones kept, smooth between."""
  factor = float(s["factor"])
  low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
  old_ctx = float(s["original_max_position_embeddings"])
  wavelen = 2.0 * np.pi / inv_freq
  smooth = (old_ctx / wavelen - low) / (high - low)
  blended = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
  out = np.where(wavelen > old_ctx / low, inv_freq / factor, blended)
  out = np.where(wavelen < old_ctx / high, inv_freq, out)
  return out.astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(
    head_dim: int, theta: float, s: Mapping[str, Any], max_positions: int
) -> tuple[np.ndarray, float]:
  """YaRN: (inv_freq, attention_factor) blending interpolation and extrapolation."""
  factor = float(s["factor"])
  old_ctx = float(s.get("original_max_position_embeddings") or max_positions)
  beta_fast = float(s.get("beta_fast") or 32.0)
  beta_slow = float(s.get("beta_slow") or 1.0)
  attention_factor = s.get("attention_factor")
  if attention_factor is None:
    mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all:
      attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    else:
      attention_factor = _yarn_mscale(factor)

  def correction_dim(rotations: float) -> float:
    return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if s.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, head_dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation_weight = 1.0 - ramp
  pos_freqs = np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
  inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (
      1.0 / pos_freqs
  ) * extrapolation_weight
  return inv_freq.astype(np.float32), float(attention_factor)


def inv_frequencies(
    head_dim: int,
    theta: float,
    scaling: Mapping[str, Any] | None,
    max_positions: int,
) -> tuple[np.ndarray, float]:
  """(inv_freq [head_dim // 2], attention_factor) for a RoPE configuration."""
  inv_freq = _default_inv_freq(head_dim, theta)
  rope_type = (scaling or {}).get("rope_type", "default")
  if rope_type == "default":
    return inv_freq, 1.0
  if rope_type == "linear":
    return (inv_freq / np.float32(scaling["factor"])).astype(np.float32), 1.0
  if rope_type == "llama3":
    return _llama3_inv_freq(inv_freq, scaling), 1.0
  if rope_type == "yarn":
    return _yarn(head_dim, theta, scaling, max_positions)
  raise ValueError(f"rope_type={rope_type!r} is not supported.")


def cos_sin(
    positions: jax.Array, inv_freq: np.ndarray, attention_factor: float
) -> tuple[jax.Array, jax.Array]:
  """cos, sin tables [B, T, head_dim] (float32) for integer positions [B, T]."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  angles = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, T, N, head_dim] by cos/sin [B, T, head_dim] (half-split layout)."""
  half = x.shape[-1] // 2
  x32 = x.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
  return out.astype(x.dtype)


def mrope_axes(sections: tuple[int, ...], interleaved: bool) -> np.ndarray:
  """[sum(sections)] the axis (0 temporal, 1 height, 2 width) each rotary frequency turns with: in blocks of
  sections[0], sections[1], sections[2] (Qwen2.5-VL), or interleaved (Qwen3-VL: frequency i turns with the height
  when i = 1 mod 3 and i < 3 * sections[1], with the width when i = 2 mod 3 and i < 3 * sections[2], else time)."""
  if not interleaved:
    return np.repeat(np.arange(len(sections)), sections)
  i = np.arange(sum(sections))
  return np.where((i % 3 == 1) & (i < 3 * sections[1]), 1, np.where((i % 3 == 2) & (i < 3 * sections[2]), 2, 0))


def mrope_cos_sin(
    positions: jax.Array, inv_freq: np.ndarray, attention_factor: float, sections: tuple[int, ...],
    interleaved: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """cos, sin tables [B, T, head_dim] (float32) of multimodal RoPE (Qwen2.5-VL's and Qwen3-VL's M-RoPE).

  positions [3, B, T] hold each token's temporal, height and width
  position; each of the head_dim // 2 frequencies turns with one of them
  (``mrope_axes``). Text tokens carry one position on all three axes, where
  this is ``cos_sin`` of it.
  """
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [3, B, T, head_dim // 2]
  axis_of = mrope_axes(tuple(sections), interleaved)
  pick = (axis_of[None, :] == np.arange(len(sections))[:, None]).astype(np.float32)  # [3, head_dim // 2]
  chosen = jnp.sum(freqs * jnp.asarray(pick)[:, None, None, :], axis=0)
  angles = jnp.concatenate([chosen, chosen], axis=-1)
  return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor
