"""A word-level tokenizer with a chat template, a tiny model saved with it, SFT parquet data and run configs."""

import json
import os
import pathlib
import random

import jax
import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from flax import nnx

from rljax import config as config_lib
from rljax import sharding
from rljax.models import CausalLM, ModelConfig, save_pretrained
from rljax.models.tokenizer import Tokenizer
from rljax.sft import config as sft_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Each message is "<role> content <eos>"; the generation prompt is "<assistant>".
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos> {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")
SPECIAL = ["[PAD]", "<eos>", "<system>", "<user>", "<assistant>"]
WORDS = (["plus", "please", "be", "brief", "hi", "there", "hello", "bye", "see", "you", "[hidden]"]
         + [f"n{i}" for i in range(19)] + [f"w{i}" for i in range(40)])


def word_tokenizer(template: str = TEMPLATE) -> Tokenizer:
  """One token per whitespace-separated word; ids: SPECIAL first, then WORDS."""
  vocab = {word: i for i, word in enumerate(SPECIAL + WORDS)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[PAD]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  return Tokenizer(tok, chat_template=template, eos_token="<eos>", pad_token="[PAD]")


def ids(tokenizer: Tokenizer, text: str) -> list[int]:
  return tokenizer.encode(text, add_special_tokens=False)


def tiny_model_dir(path: pathlib.Path) -> str:
  """A 2-layer width-32 Llama over the word vocabulary, saved with its tokenizer."""
  tokenizer = word_tokenizer()
  cfg = ModelConfig(model_type="llama", vocab_size=len(SPECIAL + WORDS), hidden_size=32, intermediate_size=64,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, tie_word_embeddings=True,
                    eos_token_id=1, pad_token_id=0)
  save_pretrained(CausalLM(cfg, nnx.Rngs(0)), str(path))
  tokenizer.tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<eos>", "pad_token": "[PAD]", "chat_template": TEMPLATE}, f)
  return str(path)


def addition_rows(count: int, seed: int) -> list[dict]:
  """verl's default SFT columns: "question" ("nA plus nB" after 0-9 fillers) and "answer" ("nC")."""
  rng = random.Random(seed)
  rows = []
  for _ in range(count):
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    filler = " ".join(["please"] * rng.randint(0, 9))
    rows.append({"question": f"{filler} n{a} plus n{b}".strip(), "answer": f"n{a + b}"})
  return rows


def write_parquet(path, rows) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)


def data_dir(path: pathlib.Path) -> str:
  write_parquet(path / "train.parquet", addition_rows(64, seed=0))
  write_parquet(path / "test.parquet", addition_rows(16, seed=1))
  return str(path)


def run_config(model_dir: str, data: str, run_dir: str, *extra: str, devices: int = 1):
  """configs/sft.py with the tiny model and data: 4 steps of 8 examples, finalized and validated."""
  config = config_lib.load_config_file(str(ROOT / "configs" / "sft.py"))
  config_lib.apply_overrides(config, [
      f"model.partial_pretrain={model_dir}", f"data.train_files={data}/train.parquet",
      f"data.val_files={data}/test.parquet", "data.prompt_key=question", "data.response_key=answer",
      "data.response_dict_keys=null", "data.max_length=24", "data.train_batch_size=8",
      "data.micro_batch_size_per_gpu=2", "data.val_max_samples=-1", "optim.lr=1e-2", "optim.warmup_steps_ratio=0.0",
      "trainer.total_epochs=1", "trainer.total_training_steps=4", "trainer.test_freq=2", "trainer.save_freq=2",
      "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}", f"trainer.n_gpus_per_node={devices}", *extra])
  sft_config.finalize(config, devices)
  return sft_config.validate(config, devices)


def mesh(devices: int = 1):
  return sharding.build_mesh({"data": 1, "fsdp": devices, "tensor": 1, "sequence": 1}, jax.devices()[:devices])
