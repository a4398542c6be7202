"""The tiny RL models' tokenizer (`tiny_run.tiny_tokenizer`): SmolLM2's, cut, writing the tests' texts as SmolLM2
does, so the lengths the tests choose (prompt caps, token budgets, buffers) mean what they were chosen for."""

from rljax.data import synthetic
from rljax.models import load_tokenizer
from tests.rl import tiny_run


def test_the_tests_texts_tokenize_as_smollm2_tokenizes_them_and_every_id_decodes():
  tiny, full = tiny_run.tiny_tokenizer(), load_tokenizer("smollm2-135m-instruct")
  assert tiny.vocab_size % 128 == 0 and tiny.vocab_size < 2048
  assert (tiny.bos_token_id, tiny.eos_token_id, tiny.pad_token_id) == (full.bos_token_id, full.eos_token_id,
                                                                       full.pad_token_id)
  # the last rows of a 10,000-row mixed-style train split, beyond the 600 of each style the cut was made from
  lengthened = [row["prompt"] for row in synthetic.make_rows("train", 10000, (1, 2, 3, 4, 5), "mixed")[-64:]]
  for messages in lengthened:
    messages[0]["content"] += " Think." * 9
  for messages in lengthened:
    text = full.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tiny.tok.encode(text, add_special_tokens=False).tokens == full.tok.encode(text,
                                                                                     add_special_tokens=False).tokens
  # any other text still round-trips (in more tokens), and every id of the models' vocabulary decodes
  other = "Zebras quietly juggle 12 ünïcødé quarks."
  assert tiny.decode(tiny.encode(other, add_special_tokens=False)) == other
  assert len(tiny.decode(list(range(tiny.vocab_size)))) > tiny.vocab_size
