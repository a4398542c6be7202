"""Images prepared as transformers' Qwen2-VL processor prepares them (its Pillow backend), from what verl's
multimodal parquet holds (bytes, paths), with the processor's own configuration file; unreadable images named."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from rljax.data import images

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402


def picture(height, width, mode="RGB", seed=0):
  """A random image of height x width pixels: smooth gradients plus noise, so a resize's filter shows."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:height, 0:width]
  base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], -1)
  pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
  image = Image.fromarray(pixels)
  if mode == "RGBA":  # transparent on the left, opaque on the right
    alpha = (x * 255 / max(width - 1, 1)).astype(np.uint8)
    return Image.fromarray(np.concatenate([pixels, alpha[..., None]], -1), "RGBA")
  return image.convert(mode)


def png(image):
  out = io.BytesIO()
  image.save(out, format="PNG")
  return out.getvalue()


# (height, width, mode): sides not multiples of 28, a wide strip, one over max_pixels, one under min_pixels,
# grey and transparent images
CASES = [(37, 211, "RGB"), (500, 12, "RGB"), (900, 700, "RGB"), (10, 13, "RGB"), (61, 90, "L"), (70, 45, "RGBA")]


@pytest.mark.parametrize("height,width,mode", CASES)
def test_pixels_and_grids_are_the_qwen2_vl_processors(height, width, mode, tmp_path):
  reference = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256)
  reference.save_pretrained(tmp_path)
  proc = images.ImageProcessing.from_dir(str(tmp_path))
  assert proc.max_pixels == 28 * 28 * 256 and proc.min_pixels == 56 * 56
  image = picture(height, width, mode)
  want = reference(images=[image], return_tensors="np")
  for stored in ({"bytes": png(image)}, png(image)):
    pixels, grid = images.preprocess(images.load_image(stored), proc)
    np.testing.assert_array_equal(grid, want["image_grid_thw"][0])
    np.testing.assert_allclose(pixels, want["pixel_values"], atol=1e-6)
  if mode == "RGBA":  # laid over white: not the colours under the transparent pixels
    assert not np.allclose(images.preprocess(image.convert("RGB"), proc)[0], pixels, atol=1e-3)
  rows, cols = grid[1:]
  assert rows % 2 == cols % 2 == 0 and 56 * 56 <= rows * cols * 14 * 14 <= 28 * 28 * 256
  assert images.image_tokens(grid, proc) == rows * cols // 4


@pytest.mark.parametrize("height,width,mode", CASES[:3])
def test_qwen3_vl_settings_patches_of_16_and_mean_one_half(height, width, mode, tmp_path):
  # Qwen3-VL's preprocessor_config.json: the same processor with 16-pixel patches, its own normalisation and
  # pixel bounds given as size.shortest_edge / longest_edge
  reference = Qwen2VLImageProcessorPil(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                       size={"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 256})
  reference.save_pretrained(tmp_path)
  proc = images.ImageProcessing.from_dir(str(tmp_path))
  assert (proc.factor, proc.min_pixels, proc.max_pixels) == (32, 64 * 64, 32 * 32 * 256)
  image = picture(height, width, mode)
  want = reference(images=[image], return_tensors="np")
  pixels, grid = images.preprocess(image, proc)
  np.testing.assert_array_equal(grid, want["image_grid_thw"][0])
  np.testing.assert_allclose(pixels, want["pixel_values"], atol=1e-6)
  assert pixels.shape[1] == 3 * 2 * 16 * 16


def test_an_image_path_and_the_default_processing(tmp_path):
  image = picture(300, 200)
  image.save(tmp_path / "a.png")
  proc = images.ImageProcessing.from_dir(str(tmp_path))  # no preprocessor_config.json: Qwen2-VL's defaults
  assert proc == images.ImageProcessing()
  want = Qwen2VLImageProcessorPil()(images=[image], return_tensors="np")
  for stored in (str(tmp_path / "a.png"), {"path": str(tmp_path / "a.png"), "bytes": None},
                 f"file://{tmp_path / 'a.png'}"):
    pixels, grid = images.preprocess(images.load_image(stored), proc)
    np.testing.assert_array_equal(grid, want["image_grid_thw"][0])
    np.testing.assert_allclose(pixels, want["pixel_values"], atol=1e-6)


def test_unreadable_images_and_settings_say_what_is_wrong(tmp_path):
  with pytest.raises(ValueError, match="could not be read"):
    images.load_image({"bytes": b"not an image"})
  with pytest.raises(ValueError, match="could not be read"):
    images.load_image(str(tmp_path / "missing.png"))
  with pytest.raises(ValueError, match=r"holds neither 'bytes' nor 'path'"):
    images.load_image({"url": "http://example.com/a.png"})
  with pytest.raises(ValueError, match="found int"):
    images.load_image(3)
  with pytest.raises(ValueError, match="aspect ratio is over 200"):
    images.smart_resize(2, 500, images.ImageProcessing())
  (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_normalize": False}))
  with pytest.raises(ValueError, match="do_normalize=False"):
    images.ImageProcessing.from_dir(str(tmp_path))
  with pytest.raises(ValueError, match="rescale_factor=1.0"):
    images.ImageProcessing.from_dict({"rescale_factor": 1.0})
