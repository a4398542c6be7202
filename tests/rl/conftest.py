"""Fixtures the trainer test modules share, one per module: a tiny model directory, a data directory, a tiny
mixture-of-experts model and a tiny reward model."""

import os
import shutil

import pytest
from flax import nnx

from rljax.models import CausalLM, ModelConfig, save_pretrained
from tests.rl import tiny_run

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return tiny_run.tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
  return tiny_moe_dir(tmp_path_factory.mktemp("tiny_moe"))


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, model_dir):
  return tiny_reward_model_dir(tmp_path_factory.mktemp("reward_model"), model_dir)


def tiny_moe_dir(path) -> str:
  """Saves a 2-layer qwen3_moe (4 experts, 2 per token) with `tiny_run.tiny_tokenizer` in `path`."""
  tokenizer = tiny_run.tiny_tokenizer()
  cfg = ModelConfig(model_type="qwen3_moe", vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=100000.0,
                    tie_word_embeddings=True, qk_norm=True, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, norm_topk_prob=True, router_aux_loss_coef=0.01, bos_token_id=1,
                    eos_token_id=2, pad_token_id=2)
  save_pretrained(CausalLM(cfg, nnx.Rngs(0)), str(path), tokenizer=tokenizer)
  return str(path)


def tiny_reward_model_dir(path, model_dir: str) -> str:
  """Saves a random transformers LlamaForSequenceClassification (num_labels=1) with `model_dir`'s tokenizer."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  vocab_size = tiny_run.tiny_tokenizer().vocab_size
  cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=100000.0,
                                 tie_word_embeddings=True, num_labels=1, pad_token_id=vocab_size - 1)
  model = transformers.LlamaForSequenceClassification(cfg).eval()
  with torch.no_grad():
    model.score.weight.normal_(0.0, 1.0)
  model.save_pretrained(path, safe_serialization=True)
  for name in TOKENIZER_FILES:
    if os.path.exists(os.path.join(model_dir, name)):
      shutil.copy(os.path.join(model_dir, name), path / name)
  return str(path)
