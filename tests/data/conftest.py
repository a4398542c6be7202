"""Fixtures: a word-level tokenizer built here, and verl-format parquet files."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
SPECIAL = ["[PAD]", "[UNK]", "<eos>", "<user>", "<system>", "<assistant>"]


def make_tokenizer(words=()):
  """A WordLevel tokenizer: one token per whitespace-separated word.

  The template wraps each message as "<role> content" and ends with
  "<assistant>", so a one-message prompt of k words is k + 2 tokens.
  """
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  import transformers

  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  corpus = [" ".join(words)] + [" ".join(f"w{i}" for i in range(300))]
  corpus += [" ".join(str(i) for i in range(200))]
  tok.train_from_iterator(
      corpus, trainers.WordLevelTrainer(special_tokens=SPECIAL, min_frequency=1))
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
      eos_token="<eos>")
  fast.chat_template = CHAT_TEMPLATE
  return fast


@pytest.fixture(scope="session")
def tokenizer():
  return make_tokenizer()


def prompt_row(i, num_words, data_source="openai/gsm8k", prompt_key="prompt"):
  """Row i in verl's schema whose prompt is `num_words` words w0 .. w{n-1}."""
  content = " ".join(f"w{j}" for j in range(num_words))
  return {
      "data_source": data_source,
      prompt_key: [{"role": "user", "content": content}],
      "ability": "math",
      "reward_model": {"style": "rule", "ground_truth": str(i)},
      "extra_info": {"split": "train", "index": i},
  }


def write_rows(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)
