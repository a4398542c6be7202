"""SFT examples: response-only loss masks (single- and multi-turn), truncation, row errors."""

import numpy as np
import pytest
from ml_collections import ConfigDict

from rljax.sft import data as sft_data
from rljax.sft import packing
from rljax.sft.config import get_sft_config
from tests.sft import helpers


def test_multi_turn_mask_covers_exactly_the_assistant_turns():
  tok = helpers.word_tokenizer()
  messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
              {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"},
              {"role": "assistant", "content": "see you"}]
  ids, mask = sft_data.multi_turn_example(tok, messages, "t.parquet row 0")
  words = ("<system> be brief <eos> <user> hi there <eos> <assistant> hello <eos> "
           "<user> bye <eos> <assistant> see you <eos>").split()
  assert ids.tolist() == helpers.ids(tok, " ".join(words))
  # positions 9, 10 ("hello <eos>") and 15, 16, 17 ("see you <eos>"); the "<assistant>" headers are prompt.
  assert np.flatnonzero(mask).tolist() == [9, 10, 15, 16, 17]
  rows = packing.build_rows([(ids, mask)], [[0]], 20, 1, pad_id=0)
  # position t predicts token t + 1: trained at t = 8, 9, 14, 15, 16.
  assert np.flatnonzero(rows["loss_mask"][0]).tolist() == [8, 9, 14, 15, 16]
  assert rows["targets"][0, [8, 9, 14, 15, 16]].tolist() == helpers.ids(tok, "hello <eos> see you <eos>")


def test_template_that_rewrites_past_turns_is_refused():
  hides_past_answers = (
      "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}<assistant> [hidden] <eos> "
      "{% else %}<{{ m['role'] }}> {{ m['content'] }} <eos> {% endif %}{% endfor %}"
      "{% if add_generation_prompt %}<assistant> {% endif %}")
  tok = helpers.word_tokenizer(hides_past_answers)
  messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
              {"role": "user", "content": "bye"}, {"role": "assistant", "content": "see you"}]
  with pytest.raises(ValueError, match=r"f\.parquet row 7: the chat template is not prefix-stable at turn 2"):
    sft_data.multi_turn_example(tok, messages, "f.parquet row 7")


def test_single_turn_trains_the_response_and_eos():
  tok = helpers.word_tokenizer()
  ids, mask = sft_data.single_turn_example(tok, sft_data.as_messages("n1 plus n2", "r", "q"), "n3")
  assert ids.tolist() == helpers.ids(tok, "<user> n1 plus n2 <eos> <assistant> n3 <eos>")
  assert mask.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def _data_config(**changes) -> ConfigDict:
  data = get_sft_config().data
  for key, value in changes.items():
    data[key] = value
  return data


def test_truncation_error_names_the_row(tmp_path):
  rows = helpers.addition_rows(4, seed=0)
  rows[2]["question"] = " ".join(["please"] * 30) + " n1 plus n2"
  path = helpers.write_parquet(tmp_path / "train.parquet", rows)
  tok = helpers.word_tokenizer()
  dataset = sft_data.SFTDataset(path, tok, _data_config(max_length=20))
  row = next(i for i in range(len(dataset)) if dataset._row_numbers[i] == 2)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"train\.parquet row 2: the example is 38 tokens .*data\.max_length=20"):
    dataset[row]
  full = helpers.ids(tok, f"<user> {rows[2]['question']} <eos> <assistant> {rows[2]['answer']} <eos>")
  left = sft_data.SFTDataset(path, tok, _data_config(max_length=20, truncation="left"))[row]
  assert left["token_ids"].tolist() == full[-20:] and left["loss_mask"][-2:].tolist() == [1, 1]
  right = sft_data.SFTDataset(path, tok, _data_config(max_length=20, truncation="right"))
  with pytest.raises(ValueError, match="no response token is left"):
    right[row]
  assert sft_data.truncate_example((np.asarray(full), np.ones(38, np.int32)), 20, "right", "r")[0].tolist() == full[:20]


def test_nested_keys_and_their_errors(tmp_path):
  rows = [{"extra_info": {"question": "n1 plus n1", "answer": "n2"}}]
  path = helpers.write_parquet(tmp_path / "nested.parquet", rows)
  tok = helpers.word_tokenizer()
  config = _data_config(prompt_key="extra_info", prompt_dict_keys=["question"], response_key="extra_info",
                        response_dict_keys=["answer"])
  item = sft_data.SFTDataset(path, tok, config)[0]
  assert item["token_ids"][-2:].tolist() == helpers.ids(tok, "n2 <eos>")
  config.response_dict_keys = ["solution"]
  with pytest.raises(KeyError, match=r"nested\.parquet row 0: extra_info has no key 'solution'"):
    sft_data.SFTDataset(path, tok, config)[0]
