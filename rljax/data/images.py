"""Images as Qwen2-VL's image processor prepares them: decoded, resized, normalised, cut into patches.

An image becomes ``pixel_values`` [N, C * frames * p * p] (N = rows x
columns of p x p patches, each m x m block of patches together, an image
repeated over the temporal patch's frames) and its grid (1, rows, columns).
The resize keeps the aspect ratio as closely as sides that are multiples of
p * m allow, within ``min_pixels`` and ``max_pixels`` (Pillow's bicubic filter
on the 8-bit image, as transformers' Pillow processor resamples: its
torchvision one, the default where torchvision is installed, resamples
otherwise and its pixels differ in the last bits); then pixels / 255,
normalised by the CLIP mean and deviation. A transparent image is laid over
white first. A prompt holds
rows x columns / m^2 image-pad tokens per image.

verl's multimodal parquet stores an image as ``{"bytes": ...}`` or
``{"path": ...}`` (its geometry3k preprocessing writes the bytes), or a
path string: ``load_image`` reads each.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from typing import Any, Mapping

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200


@dataclasses.dataclass(frozen=True)
class ImageProcessing:
  """How a model's images are prepared (its ``preprocessor_config.json``; Qwen2-VL's defaults).

  Attributes:
    patch_size: p, pixels per patch side.
    merge_size: m, patches per side of a merged block (one image-pad token each).
    temporal_patch_size: frames per patch (an image fills them with copies).
    min_pixels, max_pixels: the resized image's pixel count stays within these.
    image_mean, image_std: per-channel normalisation of pixels in [0, 1].
  """

  patch_size: int = 14
  merge_size: int = 2
  temporal_patch_size: int = 2
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  image_mean: tuple[float, ...] = CLIP_MEAN
  image_std: tuple[float, ...] = CLIP_STD

  @property
  def factor(self) -> int:
    """p * m: both resized sides are multiples of it."""
    return self.patch_size * self.merge_size

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ImageProcessing":
    """From a ``preprocessor_config.json`` dict (``size.shortest_edge``/``longest_edge`` or ``min_pixels``/
    ``max_pixels``)."""
    for field, want in (("do_resize", True), ("do_rescale", True), ("do_normalize", True),
                        ("do_convert_rgb", True), ("resample", 3)):
      if d.get(field, want) != want:
        raise ValueError(f"preprocessor_config.json sets {field}={d[field]!r}; rljax prepares images as Qwen2-VL's "
                         f"processor does by default ({field}={want!r}): set it so, or drop it")
    if not math.isclose(float(d.get("rescale_factor", 1 / 255)), 1 / 255):
      raise ValueError(f"preprocessor_config.json sets rescale_factor={d['rescale_factor']!r}; rljax divides pixels "
                       "by 255: set it to 1/255, or drop it")
    size = d.get("size") or {}
    return cls(patch_size=int(d.get("patch_size", 14)), merge_size=int(d.get("merge_size", 2)),
               temporal_patch_size=int(d.get("temporal_patch_size", 2)),
               min_pixels=int(d.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
               max_pixels=int(d.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
               image_mean=tuple(float(x) for x in d.get("image_mean", CLIP_MEAN)),
               image_std=tuple(float(x) for x in d.get("image_std", CLIP_STD)))

  @classmethod
  def of_model(cls, path: Any) -> "ImageProcessing | None":
    """A model directory's image processing when it has a ``preprocessor_config.json`` (a vision-language
    model's), else None."""
    if not isinstance(path, str) or not os.path.isfile(os.path.join(os.path.expanduser(path),
                                                                    "preprocessor_config.json")):
      return None
    return cls.from_dir(os.path.expanduser(path))

  @classmethod
  def from_dir(cls, path: str) -> "ImageProcessing":
    """From a model directory's ``preprocessor_config.json`` (Qwen2-VL's defaults where it has none)."""
    file = os.path.join(path, "preprocessor_config.json")
    if not os.path.exists(file):
      return cls()
    with open(file) as f:
      return cls.from_dict(json.load(f))


def smart_resize(height: int, width: int, proc: ImageProcessing) -> tuple[int, int]:
  """(height, width) of the resized image: multiples of p * m, near the aspect ratio, pixels within bounds."""
  if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
    raise ValueError(f"an image of {height} x {width} pixels: its aspect ratio is over {MAX_ASPECT_RATIO} "
                     "(Qwen2-VL's processor refuses it too); crop or pad it")
  f = proc.factor
  h, w = round(height / f) * f, round(width / f) * f
  if h * w > proc.max_pixels:
    beta = math.sqrt(height * width / proc.max_pixels)
    h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
  elif h * w < proc.min_pixels:
    beta = math.sqrt(proc.min_pixels / (height * width))
    h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
  return h, w


def _rgb(image: Image.Image) -> Image.Image:
  """The image in RGB; a transparent one laid over white first (as transformers' ``convert_to_rgb``)."""
  if "A" not in image.getbands() and image.info.get("transparency") is None:
    return image.convert("RGB")
  white = Image.new("RGBA", image.size, (255, 255, 255, 255))
  return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")


def load_image(value: Any, convert: bool = True) -> Image.Image:
  """An RGB image from what a data row holds: ``{"bytes": ...}``, ``{"path": ...}``, a path, bytes or an image
  (``convert=False``: as opened, its pixels not decoded yet, for its size).

  Raises:
    ValueError: saying what was there and what is accepted.
  """
  if isinstance(value, Mapping):
    if value.get("bytes") is not None:
      value = value["bytes"]
    elif value.get("path"):
      value = value["path"]
    else:
      raise ValueError(f"an image entry with keys {sorted(value)} holds neither 'bytes' nor 'path'")
  try:
    if isinstance(value, Image.Image):
      image = value
    elif isinstance(value, (bytes, bytearray)):
      image = Image.open(io.BytesIO(value))
    elif isinstance(value, str):
      image = Image.open(os.path.expanduser(value.removeprefix("file://")))
    else:
      raise ValueError(f"an image is {{'bytes': ...}}, {{'path': ...}}, a path or bytes; found {type(value).__name__}")
    return _rgb(image) if convert else image
  except (OSError, Image.DecompressionBombError) as e:
    raise ValueError(f"the image could not be read: {e}") from e


def verl_size(height: int, width: int, patch_size: int, entry: Any = None) -> tuple[int, int]:
  """(height, width) verl's dataset resizes an image to before the processor sees it (qwen_vl_utils'
  ``fetch_image``): sides that are multiples of 2 x ``patch_size`` (``data.image_patch_size``), within the entry's
  own ``min_pixels``/``max_pixels`` when it holds them, else 4 and 16384 merged patches."""
  factor = 2 * patch_size
  entry = entry if isinstance(entry, Mapping) else {}
  bounds = ImageProcessing(patch_size=patch_size, merge_size=2, min_pixels=int(entry.get("min_pixels") or 4 * factor ** 2),
                           max_pixels=int(entry.get("max_pixels") or 16384 * factor ** 2))
  return smart_resize(height, width, bounds)


def prompt_image(entry: Any, proc: ImageProcessing, patch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(pixel_values [N, F], grid [3]) of one entry of a row's image column, as verl prepares it: read, resized to
  ``verl_size`` (Pillow's default bicubic), then by the model's processor (``preprocess``)."""
  image = load_image(entry)
  height, width = verl_size(image.height, image.width, patch_size, entry)
  return preprocess(image.resize((width, height), resample=Image.Resampling.BICUBIC), proc)


def prompt_images(entries: list[Any], proc: ImageProcessing, patch_size: int
                  ) -> tuple[np.ndarray, np.ndarray] | None:
  """(pixel_values [N, F] float32, image_grid_thw [I, 3] int64) of a prompt's image `entries` (`prompt_image`
  each, in order), or None without any."""
  if not entries:
    return None
  prepared = [prompt_image(e, proc, patch_size) for e in entries]
  return np.concatenate([p for p, _ in prepared]), np.stack([g for _, g in prepared])


def entry_tokens(entry: Any, proc: ImageProcessing, patch_size: int) -> int:
  """The image-pad tokens ``prompt_image`` gives an entry, from its size alone (its pixels are not decoded)."""
  image = load_image(entry, convert=False)
  height, width = smart_resize(*verl_size(image.height, image.width, patch_size, entry), proc)
  return image_tokens(np.array([1, height // proc.patch_size, width // proc.patch_size]), proc)


def preprocess(image: Image.Image, proc: ImageProcessing) -> tuple[np.ndarray, np.ndarray]:
  """(pixel_values [N, 3 * frames * p * p] float32, grid [3] = (1, rows, columns)) of an RGB image."""
  height, width = smart_resize(image.height, image.width, proc)
  resized = np.asarray(image.resize((width, height), resample=Image.Resampling.BICUBIC))
  pixels = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
  pixels = (pixels - np.asarray(proc.image_mean, np.float32)) / np.asarray(proc.image_std, np.float32)
  p, m, frames = proc.patch_size, proc.merge_size, proc.temporal_patch_size
  rows, cols = height // p, width // p
  blocks = pixels.transpose(2, 0, 1).reshape(3, rows // m, m, p, cols // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
  patches = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], frames, p, p))
  return patches.reshape(rows * cols, 3 * frames * p * p), np.array([1, rows, cols], np.int64)


def image_tokens(grid: np.ndarray, proc: ImageProcessing) -> int:
  """The image-pad tokens a prompt holds for an image of patch grid ``grid`` (frames, rows, columns)."""
  return int(np.prod(grid)) // proc.merge_size ** 2
