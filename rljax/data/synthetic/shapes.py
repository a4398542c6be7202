"""The synthetic shapes task: name the colour and shape drawn in an image, in verl's multimodal parquet schema.

Each image is one shape (circle, square or triangle) in one colour (red, green, blue or yellow) drawn on white
at a random size and place, the image itself of a random size; the prompt asks "What is drawn?" after an
`<image>` placeholder, and the answer is "COLOUR SHAPE" ("red circle"). A small vision-language model learns
it on CPU: a short SFT warm start, then GRPO (`benchmarks/visual_task.py`).

`generate` writes into one directory:

* `train.parquet`, `test.parquet`: the RL rows, verl's columns data_source ("rljax/shapes"), prompt (one user
  message), images (a list of one {"bytes": PNG, "path": None}, as verl's geometry3k preprocessing writes
  them), ability, reward_model {"style": "rule", "ground_truth": "COLOUR SHAPE"}, extra_info {split, index,
  colour, shape}.
* `sft_train.parquet`, `sft_test.parquet`: the same prompts and images with the answer as the response
  (`data.prompt_key=prompt`, `data.response_key=answer`).

Rewards: `rljax.rewards.shapes` (data_source "rljax/shapes"). The same arguments and seed always give the same
files.

    python -m rljax.data.synthetic shapes --local_dir DIR
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

DATA_SOURCE = "rljax/shapes"
DEFAULT_LOCAL_DIR = "~/data/rljax/shapes"
FILES = ("train.parquet", "test.parquet", "sft_train.parquet", "sft_test.parquet")
SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30)}
QUESTION = "<image>What is drawn? Answer with its colour and shape, e.g. red circle."


def draw(shape: str, colour: str, rng: np.random.Generator) -> bytes:
  """A PNG of one `colour` `shape` on white: the image 32-56 pixels a side, the shape three quarters to all of
  its shorter side, anywhere inside it."""
  width, height = (int(v) for v in rng.integers(32, 57, size=2))
  side = int(rng.integers(min(width, height) * 3 // 4, min(width, height) + 1))
  left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
  image = Image.new("RGB", (width, height), "white")
  pen = ImageDraw.Draw(image)
  box = (left, top, left + side - 1, top + side - 1)
  fill = COLOURS[colour]
  if shape == "circle":
    pen.ellipse(box, fill=fill)
  elif shape == "square":
    pen.rectangle(box, fill=fill)
  else:
    pen.polygon([(left + side // 2, top), (left, top + side - 1), (left + side - 1, top + side - 1)], fill=fill)
  out = io.BytesIO()
  image.save(out, format="PNG")
  return out.getvalue()


def make_rows(split: str, size: int, seed: int) -> list[dict[str, Any]]:
  """`size` RL rows of `split` (the module docstring's columns)."""
  rng = np.random.default_rng([seed, 0 if split == "train" else 1])
  rows = []
  for index in range(size):
    shape, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
    rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": QUESTION}],
                 "images": [{"bytes": draw(shape, colour, rng), "path": None}], "ability": "vision",
                 "reward_model": {"style": "rule", "ground_truth": f"{colour} {shape}"},
                 "extra_info": {"split": split, "index": index, "colour": colour, "shape": shape}})
  return rows


def make_sft_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The SFT rows of RL `rows`: prompt, images and the answer."""
  return [{"prompt": r["prompt"], "images": r["images"], "answer": r["reward_model"]["ground_truth"]} for r in rows]


def generate(local_dir: str, train_size: int = 2000, test_size: int = 200, seed: int = 0) -> tuple[str, ...]:
  """Writes `local_dir`/{train,test,sft_train,sft_test}.parquet; returns the four paths."""
  if train_size <= 0 or test_size <= 0:
    raise ValueError("train_size and test_size must be positive")
  local_dir = os.path.expanduser(local_dir)
  os.makedirs(local_dir, exist_ok=True)
  for split, size in (("train", train_size), ("test", test_size)):
    rows = make_rows(split, size, seed)
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(local_dir, f"{split}.parquet"))
    pq.write_table(pa.Table.from_pylist(make_sft_rows(rows)), os.path.join(local_dir, f"sft_{split}.parquet"))
  return tuple(os.path.join(local_dir, f) for f in FILES)
