"""Qwen2.5-VL's and Qwen3-VL's vision towers and the host-side layouts they and the language model read.

The tower turns an image's patches into one feature per image-pad token of
the prompt: a linear patch embedding (HF's Conv3d over temporal x spatial
patches, kernel = stride), blocks of non-causal attention with a 2-D rotary
embedding (height and width halves of each head) and an MLP, then the
patch merger (a norm, each 2 x 2 block of patches concatenated, a GELU MLP
to the language model's width). Qwen2.5-VL's blocks use RMSNorm and a
SwiGLU MLP, and most attend within windows of ``window_size`` pixels (the
``fullatt_block_indexes`` blocks across each frame). Qwen3-VL's use
LayerNorm and a plain MLP and all attend across each frame; its patches
add a learned position table resampled to each image's grid, and its
deepstack mergers turn a few blocks' outputs into features that the
language model's first layers add at the image tokens.

Everything that depends on the images' sizes is computed on the host, once
per prompt, by ``image_layout`` (numpy): the order in which the tower sees
the patches (window by window), each position's rotary coordinates, its
window and frame, and where each merged feature goes back to. Inside a
jitted pass the tower is then shape-static: a sequence of N patches, masks
from the window and frame ids. ``rope_index`` gives the language model's
three-axis (temporal, height, width) positions for a prompt with images
(M-RoPE), and the offset its decoded tokens' positions carry.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import rope
from rljax.models.attention import dense_attention
from rljax.models.layers import ACTIVATIONS, RMSNorm, gather_layer, make_param
from rljax.models.vision_config import VisionConfig
from rljax.sharding.rules import constrain

_NORMAL = jax.nn.initializers.normal(0.02)
# the residual stream of the patches, as the language model's (`rljax.sharding.rules`): under tensor parallelism
# split along the patches, so a block's output projections reduce-scatter into it instead of all-reducing
_RESIDUAL = ("batch", "activation_length", "embed")
_ZEROS = jax.nn.initializers.zeros


class ImageLayout(NamedTuple):
  """Where each of N patches (the rows of ``pixel_values``, in the image processor's order) goes in the tower.

  Attributes:
    order: [N] int32, the patch at each position of the tower's sequence (window by window).
    rotary: [N, 4] int32, the (row, column) of the patch at each position, which its rotary embedding turns with,
      and its image's (rows, columns), to which a learned position table is resampled (Qwen3-VL).
    windows: [N] int32, the attention window of each position (the windowed blocks attend within one).
    frames: [N] int32, the frame of each position (the full-attention blocks attend within one).
    restore: [N / m^2] int32, for each merged token in the processor's order, its index among the tower's merged
      outputs.
  """

  order: np.ndarray
  rotary: np.ndarray
  windows: np.ndarray
  frames: np.ndarray
  restore: np.ndarray


def _merge_order(h: int, w: int, m: int) -> tuple[np.ndarray, np.ndarray]:
  """([h * w] rows, [h * w] columns) of the patches of an h x w grid in the processor's order (each m x m block's
  patches together, blocks row by row)."""
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  block = lambda a: a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)  # noqa: E731
  return block(rows), block(cols)


def _windows(t: int, h: int, w: int, side: int) -> list[np.ndarray]:
  """The merged tokens of each non-empty window of a t x h x w merged grid (windows of side x side tokens, row by
  row in each frame), as indices into the grid's tokens in order."""
  index = np.arange(t * h * w).reshape(t, h, w)
  out = []
  for f in range(t):
    for r, c in itertools.product(range(0, h, side), range(0, w, side)):
      window = index[f, r:r + side, c:c + side].reshape(-1)
      if window.size:
        out.append(window)
  return out


def image_layout(grid_thw: np.ndarray, cfg: VisionConfig) -> ImageLayout:
  """The tower's layout of the images whose patch grids are ``grid_thw`` [I, 3] (frames, rows, columns), as HF's
  Qwen2.5-VL orders them: each image's windows in turn (Qwen3-VL: a window per frame, the processor's order); rows
  and columns must be multiples of m."""
  m, unit = cfg.spatial_merge_size, cfg.merge_unit
  order, rotary, windows, frames = [], [], [], []
  patch_start, frame_start, window_start = 0, 0, 0
  for t, h, w in np.asarray(grid_thw, np.int64).reshape(-1, 3):
    if h % m or w % m:
      raise ValueError(f"image grid {(t, h, w)}: rows and columns must be multiples of spatial_merge_size={m}.")
    rows, cols = _merge_order(h, w, m)
    side = max(h, w) // m if cfg.window_size is None else cfg.window_size // m // cfg.patch_size
    image_windows = _windows(t, h // m, w // m, side)
    for k, window in enumerate(image_windows):
      patches = (window[:, None] * unit + np.arange(unit)).reshape(-1)
      order.append(patches + patch_start)
      per_frame = patches % (h * w)
      rotary.append(np.stack([rows[per_frame], cols[per_frame], np.full(patches.size, h), np.full(patches.size, w)],
                             -1))
      windows.append(np.full(patches.size, window_start + k))
      frames.append(frame_start + patches // (h * w))
    window_start += len(image_windows)
    patch_start += t * h * w
    frame_start += t
  order = np.concatenate(order).astype(np.int32)
  merged = order[::unit] // unit
  return ImageLayout(order=order, rotary=np.concatenate(rotary).astype(np.int32),
                     windows=np.concatenate(windows).astype(np.int32), frames=np.concatenate(frames).astype(np.int32),
                     restore=np.argsort(merged).astype(np.int32))


def joined_grids(grids: Sequence[np.ndarray | None]) -> np.ndarray:
  """[I, 3] the patch grids of rows holding grids[r] each (None: no image), in row order (``rope_index``'s)."""
  present = [np.asarray(g, np.int64).reshape(-1, 3) for g in grids if g is not None]
  return np.concatenate(present) if present else np.zeros((0, 3), np.int64)


def feature_counts(images: Images) -> jax.Array | None:
  """[B] each row's real merged features of row-batched ``images`` (``row_images``: its restore entries that are
  not padding); None for one sequence of patches."""
  restore = jnp.asarray(images.layout.restore)
  return None if restore.ndim == 1 else jnp.sum(restore >= 0, axis=-1)


def patch_bucket(patches: int, unit: int) -> int:
  """The patches per row a batch's rows are padded to: the power of two holding ``patches`` (at least one merged
  patch of ``unit``), so a run compiles its passes for a few sizes, not one per batch."""
  return max(unit, 1 << max(0, int(patches) - 1).bit_length())


def row_images(pixels: list[np.ndarray | None], grids: list[np.ndarray | None], cfg: VisionConfig,
               patches: int | None = None) -> Images:
  """Each row's images as one padded sequence of patches per row, the tower's batched input.

  Args:
    pixels: per row, its images' patches [N_b, F] (the processor's ``pixel_values``) or None (no image).
    grids: per row, their grids [I_b, 3] or None.
    cfg: the vision tower's config (the layout's windows and merge size).
    patches: Q, the patches per row (default ``patch_bucket`` of the longest row).

  Returns:
    Images of pixels [B, Q, F] float32 and an ImageLayout of [B, Q] (rotary [B, Q, 4], restore [B, Q / m^2])
    arrays. Padding patches are -1 in every layout array but rotary (0), and zero pixels: the tower keeps them
    in place (order and restore -1 read as the position itself) and they form a window and frame of their own,
    so no real patch attends to them; their features follow each row's real ones and are never placed. Rows
    padded further with those values (``rljax.rl.experience``'s ragged fields) stay valid.
  """
  unit, width = cfg.merge_unit, int(np.prod(cfg.patch_shape))
  counts = [0 if p is None else len(p) for p in pixels]
  q = patch_bucket(max(counts, default=0), unit) if patches is None else int(patches)
  if max(counts, default=0) > q:
    raise ValueError(f"a row holds {max(counts)} image patches, more than the {q} its batch is padded to")
  b = len(pixels)
  out = np.zeros((b, q, width), np.float32)
  order, windows, frames = (np.full((b, q), -1, np.int32) for _ in range(3))
  rotary = np.zeros((b, q, 4), np.int32)
  restore = np.full((b, q // unit), -1, np.int32)
  for r, (p, g) in enumerate(zip(pixels, grids)):
    if not counts[r]:
      continue
    n = counts[r]
    layout = image_layout(np.asarray(g), cfg)
    if layout.order.size != n or np.asarray(p).shape[1] != width:
      raise ValueError(f"row {r}: pixel_values {np.asarray(p).shape} do not match its grids "
                       f"{np.asarray(g).tolist()} ({layout.order.size} patches of {width} values)")
    out[r, :n] = p
    order[r, :n], rotary[r, :n], windows[r, :n], frames[r, :n] = (layout.order, layout.rotary, layout.windows,
                                                                  layout.frames)
    restore[r, :n // unit] = layout.restore
  return Images(pixels=out, layout=ImageLayout(order=order, rotary=rotary, windows=windows, frames=frames,
                                               restore=restore))


def rope_index(input_ids: np.ndarray, attention_mask: np.ndarray, grid_thw: np.ndarray, image_token_id: int,
               spatial_merge_size: int, video_token_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """M-RoPE positions of a batch of prompts with images (HF Qwen2.5-VL's ``get_rope_index`` for images).

  Text tokens advance all three axes by one; an image's run of image-pad
  tokens holds its merged grid (frame, row, column) offset by the position
  where it starts, and the text after it resumes past the larger side.

  Args:
    input_ids: [B, T] token ids (images in order along the rows, then the batch).
    attention_mask: [B, T] 1 for real tokens (padding gets position 0).
    grid_thw: [I, 3] the patch grids of the batch's images, in order.
    image_token_id: the image-pad token.
    spatial_merge_size: m.
    video_token_id: the video-pad token, refused (videos are not supported).

  Returns:
    (positions [3, B, T] int32, deltas [B] int32): a token decoded after the
    prompt at sequence index s (counting real tokens) has position s + delta
    on every axis.
  """
  b, t = input_ids.shape
  if video_token_id is not None and np.any((input_ids == video_token_id) & (attention_mask > 0)):
    raise ValueError(f"video tokens (id {video_token_id}) in the prompts: videos are not supported; use images")
  positions = np.zeros((3, b, t), np.int32)
  deltas = np.zeros((b,), np.int32)
  grids = iter(np.asarray(grid_thw, np.int64).reshape(-1, 3))
  for row in range(b):
    real = np.flatnonzero(attention_mask[row])
    ids = input_ids[row, real]
    pieces, current = [], 0
    for is_image, run in itertools.groupby(ids == image_token_id):
      n = len(list(run))
      if not is_image:
        pieces.append(np.broadcast_to(np.arange(current, current + n), (3, n)))
        current += n
        continue
      try:
        frames, rows, cols = next(grids)
      except StopIteration:
        raise ValueError(f"row {row} has more runs of image tokens than the {len(grid_thw)} image grids") from None
      rows, cols = rows // spatial_merge_size, cols // spatial_merge_size
      if frames * rows * cols != n:
        raise ValueError(f"row {row}: a run of {n} image tokens for an image of {frames} x {rows} x {cols} merged "
                         "patches: grid_thw must list the images in the order their tokens appear, each image's "
                         "tokens as many as its merged patches")
      grid = np.stack(np.meshgrid(np.arange(frames), np.arange(rows), np.arange(cols), indexing="ij")).reshape(3, -1)
      pieces.append(grid + current)
      current += max(rows, cols)
    if pieces:
      row_positions = np.concatenate(pieces, axis=1)
      positions[:, row, real] = row_positions
      deltas[row] = row_positions.max() + 1 - real.size
  left = sum(1 for _ in grids)
  if left:
    raise ValueError(f"grid_thw lists {len(grid_thw)} images, but the prompts' runs of image tokens use only "
                     f"{len(grid_thw) - left}: each image needs its run of image-pad tokens in the prompt")
  return positions, deltas


class Images(NamedTuple):
  """A batch's images as the tower reads them: pixel values and their ``ImageLayout`` as arrays.

  Attributes:
    pixels: [N, C * frames * p * p] patches in the processor's order (``pixel_values``), or [B, Q, F] each row's
      own (``row_images``).
    layout: the ``ImageLayout`` of their grids (numpy or jax arrays).
    slots: [B, T] bool, the tokens that take a row's features in order (a packed row of several prompts: their
      image-pad tokens, not those a response generated); None: each row's first image-pad tokens.
  """

  pixels: jax.Array
  layout: ImageLayout
  slots: jax.Array | None = None


def _rotary_tables(rotary: jax.Array, cfg: VisionConfig) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [..., N, head_dim] of the 2-D rotary embedding at the (row, column) of ``rotary`` [..., N, 4]: half
  of the frequencies of a head's half each for rows and columns, repeated for both halves of a head."""
  inv_freq, _ = rope.inv_frequencies(cfg.head_dim // 2, cfg.rope_theta, None, 0)
  freqs = rotary[..., :2].astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [..., N, 2, head_dim / 4]
  angles = freqs.reshape(*freqs.shape[:-2], -1)
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def _axis_taps(index: jax.Array, size: jax.Array, side: int) -> tuple[jax.Array, jax.Array]:
  """([N, 2] int32 taps, [N, 2] weights): linear interpolation, corners aligned, of a ``side``-long table at
  positions ``index`` [N] of an axis ``size`` [N] long (transformers' ``F.interpolate(align_corners=True)``)."""
  src = index.astype(jnp.float32) * (side - 1) / jnp.maximum(size - 1, 1).astype(jnp.float32)
  floor = jnp.floor(src)
  taps = floor[:, None] + jnp.arange(2, dtype=jnp.float32)
  weights = jnp.maximum(1.0 - jnp.abs(src[:, None] - taps), 0.0)
  return jnp.clip(taps, 0, side - 1).astype(jnp.int32), weights


def learned_positions(table: jax.Array, rotary: jax.Array, side: int) -> jax.Array:
  """[..., N, Dv] Qwen3-VL's position embeddings: its S x S ``table`` [S * S, Dv] resampled bilinearly to each
  patch's image grid, read at the patch's (row, column) (``rotary`` [..., N, 4]: row, column, rows, columns)."""
  flat = rotary.reshape(-1, 4)
  row_taps, row_weights = _axis_taps(flat[:, 0], flat[:, 2], side)
  col_taps, col_weights = _axis_taps(flat[:, 1], flat[:, 3], side)
  index = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
  weight = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
  out = jnp.einsum("nkd,nk->nd", table[index].astype(jnp.float32), weight).astype(table.dtype)
  return out.reshape(*rotary.shape[:-1], table.shape[-1])


class LayerNorm(nnx.Module):
  """LayerNorm over a last axis of size ``dim`` (scale and bias; ``stack`` of them at once), in float32."""

  def __init__(self, dim: int, rngs: nnx.Rngs, dtype: Any, stack: int | None = None, name: str = "embed"):
    self.scale = make_param(rngs, (dim,), (name,), jax.nn.initializers.ones, dtype, stack)
    self.bias = make_param(rngs, (dim,), (name,), _ZEROS, dtype, stack)

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    out = (x32 - mean) * jax.lax.rsqrt(var + 1e-6) * self.scale[...].astype(jnp.float32)
    return (out + self.bias[...].astype(jnp.float32)).astype(x.dtype)


def _norm(cfg: VisionConfig, dim: int, rngs: nnx.Rngs, dtype: Any, stack: int | None = None,
          name: str = "embed") -> nnx.Module:
  """The tower's norm: LayerNorm (Qwen3-VL) or RMSNorm (Qwen2.5-VL), eps 1e-6."""
  return LayerNorm(dim, rngs, dtype, stack, name) if cfg.qwen3 else RMSNorm(dim, 1e-6, rngs, name=name, dtype=dtype,
                                                                            stack=stack)


class VisionBlock(nnx.Module):
  """One tower block (``stack`` of them at once): x + attn(norm1(x)); x + mlp(norm2(x)); the MLP SwiGLU (gate, up,
  down: Qwen2.5-VL) or plain (up, down: Qwen3-VL's linear_fc1, linear_fc2)."""

  def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs, dtype: Any, stack: int | None = None):
    d, h, hd, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    self.cfg = cfg
    self.norm1 = _norm(cfg, d, rngs, dtype, stack)
    self.norm2 = _norm(cfg, d, rngs, dtype, stack)
    self.qkv = make_param(rngs, (d, 3, h, hd), ("embed", None, "heads", "head_dim"), _NORMAL, dtype, stack)
    self.qkv_bias = make_param(rngs, (3, h, hd), (None, "heads", "head_dim"), _ZEROS, dtype, stack)
    self.proj = make_param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), _NORMAL, dtype, stack)
    self.proj_bias = make_param(rngs, (d,), ("embed",), _ZEROS, dtype, stack)
    if not cfg.qwen3:
      self.gate = make_param(rngs, (d, f), ("embed", "mlp"), _NORMAL, dtype, stack)
      self.gate_bias = make_param(rngs, (f,), ("mlp",), _ZEROS, dtype, stack)
    self.up = make_param(rngs, (d, f), ("embed", "mlp"), _NORMAL, dtype, stack)
    self.up_bias = make_param(rngs, (f,), ("mlp",), _ZEROS, dtype, stack)
    self.down = make_param(rngs, (f, d), ("mlp", "embed"), _NORMAL, dtype, stack)
    self.down_bias = make_param(rngs, (d,), ("embed",), _ZEROS, dtype, stack)

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
    """x [B, N, Dv] (B sequences of patches) with rotary tables [B, N, hd] and attention masks [B, N, N] (True:
    may attend). The weights multiply all B * N patches at once, so their gradients are summed over the batch by
    the matmul itself (a reduce-scatter under FSDP, where a vmap over the rows leaves a sum of per-row gradients
    that the compiler all-reduces)."""
    dt = x.dtype
    heads = lambda a: constrain(a, ("batch", "length", "heads", "head_dim"))  # noqa: E731
    qkv = (jnp.einsum("bnd,dshk->sbnhk", self.norm1(x), self.qkv[...].astype(dt))
           + self.qkv_bias[...].astype(dt)[:, None, None])
    q, k = (heads(rope.apply_rope(part, cos, sin)) for part in (qkv[0], qkv[1]))
    heads_major = lambda a: a.transpose(0, 2, 1, 3)  # noqa: E731  [B, N, H, hd] -> [B, H, N, hd]
    scaled = (q * jnp.asarray(self.cfg.head_dim ** -0.5, dt))[:, :, :, None]  # [B, N, H, 1, hd]
    attended = dense_attention(scaled, heads_major(k), heads_major(heads(qkv[2])), mask)[:, :, :, 0]
    out = jnp.einsum("bnhk,hkd->bnd", heads(attended), self.proj[...].astype(dt)) + self.proj_bias[...].astype(dt)
    x = constrain(x + constrain(out, _RESIDUAL), _RESIDUAL)
    y = self.norm2(x)
    act = ACTIVATIONS[self.cfg.hidden_act]
    hidden_axes = ("batch", "length", "mlp")
    up = constrain(y @ self.up[...].astype(dt) + self.up_bias[...].astype(dt), hidden_axes)
    hidden = act(up) if self.cfg.qwen3 else act(constrain(
        y @ self.gate[...].astype(dt) + self.gate_bias[...].astype(dt), hidden_axes)) * up
    out = hidden @ self.down[...].astype(dt) + self.down_bias[...].astype(dt)
    return constrain(x + constrain(out, _RESIDUAL), _RESIDUAL)


class PatchMerger(nnx.Module):
  """Each m x m block of patches [N, Dv] -> one feature [N / m^2, D]: a norm (over each patch, or over the block's
  concatenation: ``wide``, Qwen3-VL's deepstack mergers), then Linear, exact GELU, Linear (``stack`` at once)."""

  def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs, dtype: Any, wide: bool = False, stack: int | None = None):
    d, unit = cfg.hidden_size, cfg.merge_unit
    self.cfg, self.wide = cfg, wide
    self.norm = _norm(cfg, unit * d if wide else d, rngs, dtype, stack)
    self.fc1 = make_param(rngs, (unit * d, unit * d), ("embed", "mlp"), _NORMAL, dtype, stack)
    self.fc1_bias = make_param(rngs, (unit * d,), ("mlp",), _ZEROS, dtype, stack)
    self.fc2 = make_param(rngs, (unit * d, cfg.out_hidden_size), ("mlp", "embed"), _NORMAL, dtype, stack)
    self.fc2_bias = make_param(rngs, (cfg.out_hidden_size,), ("embed",), _ZEROS, dtype, stack)

  def __call__(self, x: jax.Array) -> jax.Array:
    """x [B, N, Dv] -> [B, N / m^2, D]."""
    dt, width = x.dtype, self.cfg.merge_unit * self.cfg.hidden_size
    merged_shape = (*x.shape[:-2], -1, width)
    merged = self.norm(x.reshape(merged_shape)) if self.wide else self.norm(x).reshape(merged_shape)
    hidden = jax.nn.gelu(merged @ self.fc1[...].astype(dt) + self.fc1_bias[...].astype(dt), approximate=False)
    return hidden @ self.fc2[...].astype(dt) + self.fc2_bias[...].astype(dt)


class PatchEmbed(nnx.Module):
  """Patches [N, C * frames * p * p] -> [N, Dv]: HF's Conv3d (kernel = stride) as one matmul; Qwen3-VL adds its bias
  and its learned positions (``learned_positions``)."""

  def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs, dtype: Any):
    d = cfg.hidden_size
    self.cfg = cfg
    self.patch = make_param(rngs, (*cfg.patch_shape, d), (None, None, None, None, "embed"), _NORMAL, dtype)
    if cfg.qwen3:
      self.bias = make_param(rngs, (d,), ("embed",), _ZEROS, dtype)
      self.positions = make_param(rngs, (cfg.num_position_embeddings, d), (None, "embed"), _NORMAL, dtype)

  def __call__(self, pixels: jax.Array, rotary: jax.Array, dt: Any) -> jax.Array:
    """[B, N, Dv] in dtype ``dt`` of ``pixels`` [B, N, F] at their (row, column, rows, columns) ``rotary``
    [B, N, 4]."""
    cfg = self.cfg
    x = jnp.einsum("bnctpq,ctpqd->bnd", pixels.reshape(*pixels.shape[:2], *cfg.patch_shape).astype(dt),
                   self.patch[...].astype(dt))
    if not cfg.qwen3:
      return x
    return x + self.bias[...].astype(dt) + learned_positions(self.positions[...], rotary, cfg.position_side).astype(dt)


class VisionTower(nnx.Module):
  """Qwen2.5-VL's or Qwen3-VL's vision tower: patches [N, C * frames * p * p] -> merged features [N / m^2, D] (and
  Qwen3-VL's deepstack features [k, N / m^2, D]).

  Under FSDP each block's weights are gathered where it starts (the language model's layers do the same,
  `rljax.models.layers.gather_layer`), so no pass all-reduces the patches' activations; with ``remat`` each
  block is rematerialised in the backward pass."""

  def __init__(self, cfg: VisionConfig, rngs: nnx.Rngs, dtype: Any = jnp.float32, param_dtype: Any = jnp.float32,
               remat: bool = False):
    self.cfg = cfg
    self.dtype = dtype
    self.remat = remat
    self.embed = PatchEmbed(cfg, rngs, param_dtype)
    self.blocks = VisionBlock(cfg, rngs, param_dtype, stack=cfg.depth)
    self.merger = PatchMerger(cfg, rngs, param_dtype)
    if cfg.deepstack_visual_indexes:
      self.deepstack = PatchMerger(cfg, rngs, param_dtype, wide=True, stack=len(cfg.deepstack_visual_indexes))

  def __call__(self, images: Images) -> tuple[jax.Array, jax.Array | None]:
    """(features, deepstack) of ``images``, in the order of the prompts' image-pad tokens: features [N / m^2, D]
    of one sequence of patches, or [B, Q / m^2, D] of each row's own (``row_images``: pixels [B, Q, F]);
    deepstack [k, ...] the same for each deepstack merger (Qwen3-VL), else None."""
    pixels, layout = jnp.asarray(images.pixels), jax.tree.map(jnp.asarray, images.layout)
    if pixels.ndim == 3:
      return self._features(pixels, layout)
    features, deep = self._features(pixels[None], jax.tree.map(lambda a: a[None], layout))
    return features[0], None if deep is None else deep[:, 0]

  def _gathered(self, module: nnx.Module) -> nnx.Module:
    """`module` with its weights FSDP-gathered in the compute dtype inside a gathering context (`gather_layer`;
    as it is outside one)."""
    graphdef, state = nnx.split(module)
    return nnx.merge(graphdef, gather_layer(state, self.dtype))

  def _features(self, pixels: jax.Array, layout: ImageLayout) -> tuple[jax.Array, jax.Array | None]:
    """([B, Q / m^2, D] merged features, [k, B, Q / m^2, D] deepstack ones or None) of B sequences of patches
    ``pixels`` [B, Q, F] laid out by ``layout`` ([B, Q] arrays)."""
    cfg = self.cfg
    in_place = lambda index: jnp.where(index < 0, jnp.arange(index.shape[-1]), index)  # noqa: E731
    x = self._gathered(self.embed)(jnp.take_along_axis(pixels, in_place(layout.order)[..., None], axis=1),
                                   layout.rotary, self.dtype)
    cos, sin = _rotary_tables(layout.rotary, cfg)
    same = lambda ids: ids[:, :, None] == ids[:, None, :]  # noqa: E731
    frames = same(layout.frames)
    windows = frames if cfg.window_size is None else same(layout.windows)  # Qwen3-VL: every block across a frame
    full = jnp.asarray(np.isin(np.arange(cfg.depth), cfg.fullatt_block_indexes))
    graphdef, state = nnx.split(self.blocks)

    def block(x, layer_state, is_full):
      mask = frames if cfg.window_size is None else jnp.where(is_full, frames, windows)
      return nnx.merge(graphdef, gather_layer(layer_state, self.dtype))(x, cos, sin, mask)

    run = jax.checkpoint(block) if self.remat else block
    body = lambda x, xs: (run(x, *xs), None)  # noqa: E731

    blocks = lambda x, start, end: jax.lax.scan(  # noqa: E731
        body, x, jax.tree.map(lambda a: a[start:end], (state, full)))[0]
    deep, start = [], 0
    for j, index in enumerate(cfg.deepstack_visual_indexes):
      x = blocks(x, start, index + 1)
      merger_graph, merger_state = nnx.split(self.deepstack)
      level = gather_layer(jax.tree.map(lambda a, j=j: a[j], merger_state), self.dtype)
      deep.append(nnx.merge(merger_graph, level)(x))
      start = index + 1
    x = blocks(x, start, cfg.depth)
    restore = in_place(layout.restore)[..., None]
    back = lambda merged: jnp.take_along_axis(merged, restore, axis=1)  # noqa: E731
    return back(self._gathered(self.merger)(x)), (jnp.stack([back(d) for d in deep]) if deep else None)


def place_images(embeds: jax.Array, is_image: jax.Array, features: jax.Array, counts: jax.Array | None = None
                 ) -> jax.Array:
  """embeds [B, T, D] with its image-pad positions ``is_image`` [B, T] replaced by ``features`` in order: [M, D]
  row-major over the batch, or [B, M, D] each row's own, of which its first ``counts`` [B] are real: they fill
  its first image-pad tokens (the prompt's), and an image-pad token after them (one a response generated) keeps
  its embedding, as it had when it was decoded. The caller keeps the prompts' counts equal (``rope_index``
  checks that their runs match their grids); inside a jitted pass they cannot be checked."""
  if features.ndim == 3:
    rank = jnp.cumsum(is_image.astype(jnp.int32), axis=1) - 1
    if counts is not None:
      is_image = is_image & (rank < counts[:, None])
    placed = jnp.take_along_axis(features.astype(embeds.dtype), jnp.clip(rank, 0, features.shape[1] - 1)[..., None],
                                 axis=1)
    return jnp.where(is_image[..., None], placed, embeds)
  flat = is_image.reshape(-1)
  rank = jnp.clip(jnp.cumsum(flat.astype(jnp.int32)) - 1, 0, features.shape[0] - 1)
  placed = features.astype(embeds.dtype)[rank].reshape(embeds.shape)
  return jnp.where(is_image[..., None], placed, embeds)
