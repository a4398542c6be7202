"""Fixtures: a tiny byte-level BPE tokenizer with a ChatML chat template (Qwen-style tool turns)."""

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from rljax.models.tokenizer import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>\\n' }}"
    "{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '</tools><|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
    "<tool_response>\n5\n</tool_response> What is 2 + 3? The answer is 5.",
    "the quick brown fox jumps over the lazy dog",
]


def make_chatml_tokenizer(template: str = CHATML) -> Tokenizer:
  """rljax's Tokenizer over a byte-level BPE (any text round-trips) with ChatML specials."""
  raw = RawTokenizer(models.BPE())
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  raw.decoder = decoders.ByteLevel()
  raw.train_from_iterator(CORPUS * 3, trainers.BpeTrainer(
      vocab_size=400, show_progress=False, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return Tokenizer(raw, chat_template=template, eos_token="<|im_end|>",
                   extra_eos_ids=[raw.token_to_id("<|endoftext|>")])


@pytest.fixture(scope="session")
def chatml():
  return make_chatml_tokenizer()
