"""A tiny Qwen2.5-VL (or Qwen3-VL) model directory and geometry3k-format data with drawn images, for the RL tests.

The model has tiny_run's tokenizer with Qwen-VL's vision tokens added, 2 text layers of width 64 and a 2-block
vision tower of 4-pixel patches; its image processor keeps images within 32 x 32 pixels (at most 16 image
tokens). The data are verl's geometry3k layout: a prompt whose text holds `<image>` where each image goes, an
`images` column of {"bytes": PNG} entries, a reward_model ground truth.
"""

import copy
import io
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from flax import nnx
from PIL import Image, ImageDraw

from rljax.models import CausalLM, save_pretrained
from rljax.models.config import from_hf_dict
from tests.rl import tiny_run

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
SHAPES = ("circle", "square")
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220)}


def vl_tokenizer():
  """tiny_run's tokenizer (a copy: that one is shared) with Qwen-VL's vision tokens added as special tokens."""
  tokenizer = copy.copy(tiny_run.tiny_tokenizer())
  tokenizer.tok = tokenizers.Tokenizer.from_str(tokenizer.tok.to_str())
  tokenizer.tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in VISION_TOKENS])
  return tokenizer


def vl_model_dir(path: pathlib.Path, family: str = "qwen2_5_vl") -> str:
  """Saves a tiny vision-language model of ``family`` (qwen2_5_vl, qwen3_vl or qwen3_vl_moe; random weights), its
  tokenizer and preprocessor_config.json in `path`."""
  tokenizer = vl_tokenizer()
  ids = {t: tokenizer.tok.token_to_id(t) for t in VISION_TOKENS}
  text = dict(vocab_size=1408, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=2048, rms_norm_eps=1e-6,
              tie_word_embeddings=True, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, bos_token_id=1,
              eos_token_id=2, pad_token_id=2)
  tower = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
               spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
  if family.startswith("qwen3_vl"):  # a 4 x 4 learned position table; deepstack features into both text layers
    tower.update(hidden_act="gelu_pytorch_tanh", num_position_embeddings=16, deepstack_visual_indexes=[0, 1])
    text.update(head_dim=16)
  if family == "qwen3_vl_moe":  # layer 0 routes each token to 2 of 4 experts, layer 1 is dense
    text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1])
  else:
    tower.update(window_size=16, fullatt_block_indexes=[1])
  cfg = from_hf_dict({
      "model_type": family, "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
      "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
      "text_config": text, "vision_config": tower})
  save_pretrained(CausalLM(cfg, nnx.Rngs(0)), str(path), tokenizer=tokenizer)
  (path / "preprocessor_config.json").write_text(json.dumps(
      {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 64, "max_pixels": 1024}))
  return str(path)


def drawn(shape: str, colour: str, width: int, height: int) -> bytes:
  """A PNG of one `colour` `shape` on white."""
  image = Image.new("RGB", (width, height), "white")
  draw = ImageDraw.Draw(image)
  box = (width // 5, height // 5, 4 * width // 5, 4 * height // 5)
  (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
  out = io.BytesIO()
  image.save(out, format="PNG")
  return out.getvalue()


def geometry3k_rows(rows: int, seed: int = 0) -> list[dict]:
  """`rows` rows in verl's geometry3k layout, each with one or two drawn images of assorted sizes."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(rows):
    count = 1 + i % 2
    images, names = [], []
    for _ in range(count):
      shape, colour = SHAPES[rng.integers(2)], list(COLOURS)[rng.integers(2)]
      width, height = (int(v) for v in rng.integers(12, 48, size=2))
      images.append({"bytes": drawn(shape, colour, width, height), "path": None})
      names.append(f"{colour} {shape}")
    question = " ".join(["<image>"] * count) + " Which shapes are drawn? Answer in \\boxed{}."
    out.append({"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": question}],
                "images": images, "ability": "math", "reward_model": {"style": "rule", "ground_truth": names[0]},
                "extra_info": {"index": i, "split": "train"}})
  return out


def write_geometry3k(path: pathlib.Path, rows: int, seed: int = 0) -> str:
  """Writes `geometry3k_rows` as a parquet file at `path`."""
  return write_rows(path, geometry3k_rows(rows, seed))


def write_rows(path: pathlib.Path, rows: list[dict]) -> str:
  """Writes `rows` as a parquet file at `path`."""
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)
