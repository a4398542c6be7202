"""RLHFDataset: schema, templating, padding, truncation, filtering, bad input."""

import os
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import data
from rljax.config import get_base_config
from rljax.data import tokenization
from tests.data.conftest import prompt_row, write_rows


def data_config(**overrides):
  config = get_base_config().data
  config.update(overrides)
  return config


def test_schema_round_trip(tmp_path, tokenizer):
  rows = [prompt_row(i, 3) for i in range(4)]
  rows[1]["prompt"].insert(0, {"role": "system", "content": "be brief"})
  path = write_rows(tmp_path / "train.parquet", rows)
  assert data.read_parquet(path).to_pylist() == rows
  dataset = data.make_dataset(path, tokenizer, data_config(max_prompt_length=8))
  item = dataset[1]
  for key in ("data_source", "ability", "reward_model", "extra_info"):
    assert item[key] == rows[1][key]
  assert "prompt" not in item
  assert item["index"] == 1
  text = "<system> be brief <user> w0 w1 w2 <assistant>"
  assert list(item["raw_prompt_ids"]) == tokenizer.encode(text, add_special_tokens=False)


def test_file_list_and_home_expansion(tmp_path, tokenizer, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  write_rows(tmp_path / "a.parquet", [prompt_row(i, 2) for i in range(3)])
  write_rows(tmp_path / "b.parquet", [prompt_row(i + 10, 2) for i in range(2)])
  dataset = data.make_dataset(["~/a.parquet", "~/b.parquet"], tokenizer,
                              data_config(max_prompt_length=8))
  assert [dataset[i]["index"] for i in range(len(dataset))] == [0, 1, 2, 10, 11]


def test_errors_name_the_file_and_its_row(tmp_path, tokenizer):
  write_rows(tmp_path / "a.parquet", [prompt_row(i, 2) for i in range(3)])
  write_rows(tmp_path / "b.parquet", [prompt_row(i, 2 + 5 * i) for i in range(2)])
  dataset = data.make_dataset(
      [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], tokenizer,
      data_config(max_prompt_length=6))
  with pytest.raises(ValueError, match=r"b.parquet row 1: prompt is 9 tokens"):
    dataset[4]


def test_left_padding_mask_and_positions(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet", [prompt_row(0, 2)])
  item = data.make_dataset(path, tokenizer, data_config(max_prompt_length=7))[0]
  ids = tokenizer.encode("<user> w0 w1 <assistant>", add_special_tokens=False)
  pad = tokenizer.pad_token_id
  np.testing.assert_array_equal(item["input_ids"], [pad] * 3 + ids)
  np.testing.assert_array_equal(item["attention_mask"], [0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(item["position_ids"], [0, 0, 0, 0, 1, 2, 3])
  assert item["input_ids"].dtype == np.int32


@pytest.mark.parametrize("mode,keep", [
    ("left", lambda ids: ids[-5:]),
    ("right", lambda ids: ids[:5]),
    ("middle", lambda ids: ids[:2] + ids[-3:]),
])
def test_truncation_modes(tmp_path, tokenizer, mode, keep):
  # 6 words + "<user>" + "<assistant>" = 8 tokens, cut to 5.
  path = write_rows(tmp_path / "t.parquet", [prompt_row(0, 6)])
  full = tokenizer.encode("<user> w0 w1 w2 w3 w4 w5 <assistant>",
                          add_special_tokens=False)
  assert len(full) == 8
  item = data.make_dataset(
      path, tokenizer, data_config(max_prompt_length=5, truncation=mode))[0]
  assert list(item["raw_prompt_ids"]) == keep(full)
  np.testing.assert_array_equal(item["input_ids"], keep(full))
  np.testing.assert_array_equal(item["attention_mask"], [1] * 5)


def test_truncation_pure_function():
  ids = list(range(7))
  assert tokenization.truncate(ids, 4, "middle") == [0, 1, 5, 6]
  assert tokenization.truncate(ids, 3, "middle") == [0, 5, 6]
  assert tokenization.truncate(ids, 7, "error") == ids
  with pytest.raises(ValueError, match="one of"):
    tokenization.truncate(ids, 3, "sideways")


def test_truncation_error_names_row_and_length(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet", [prompt_row(0, 1), prompt_row(1, 9)])
  dataset = data.make_dataset(path, tokenizer, data_config(max_prompt_length=5))
  dataset[0]
  with pytest.raises(ValueError, match=r"t.parquet row 1: prompt is 11 tokens.*=5"):
    dataset[1]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_filter_overlong_counts(tmp_path, tokenizer, workers):
  # Prompt i has i % 5 + 1 words -> i % 5 + 3 tokens; keep those <= 5 tokens.
  rows = [prompt_row(i, i % 5 + 1) for i in range(20)]
  path = write_rows(tmp_path / "t.parquet", rows)
  dataset = data.make_dataset(path, tokenizer, data_config(
      max_prompt_length=5, filter_overlong_prompts=True,
      filter_overlong_prompts_workers=workers))
  assert dataset.num_filtered == 8
  kept = [dataset[i]["index"] for i in range(len(dataset))]
  assert kept == [i for i in range(20) if i % 5 + 3 <= 5]


def test_filter_everything_is_an_error(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet", [prompt_row(i, 9) for i in range(3)])
  with pytest.raises(ValueError, match="all 3 prompts"):
    data.make_dataset(path, tokenizer, data_config(
        max_prompt_length=4, filter_overlong_prompts=True))


def test_max_samples(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet", [prompt_row(i, 2) for i in range(10)])
  first = data.make_dataset(path, tokenizer, data_config(shuffle=False),
                            max_samples=3)
  assert [first[i]["index"] for i in range(3)] == [0, 1, 2]
  picked = data.make_dataset(path, tokenizer, data_config(seed=3), max_samples=4)
  again = data.make_dataset(path, tokenizer, data_config(seed=3), max_samples=4)
  indices = [picked[i]["index"] for i in range(4)]
  assert len(picked) == 4 and len(set(indices)) == 4
  assert indices == [again[i]["index"] for i in range(4)]


def test_return_flags(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet", [prompt_row(0, 2)])
  plain = data.make_dataset(path, tokenizer, data_config())[0]
  assert not {"raw_prompt", "full_prompts", "raw_input_ids"} & set(plain)
  item = data.make_dataset(path, tokenizer, data_config(
      return_raw_chat=True, return_full_prompt=True,
      return_raw_input_ids=True))[0]
  assert item["raw_prompt"] == [{"role": "user", "content": "w0 w1"}]
  assert item["full_prompts"] == "<user> w0 w1 <assistant>"
  assert list(item["raw_input_ids"]) == tokenizer.encode("w0 w1",
                                                   add_special_tokens=False)


def test_custom_prompt_key(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet",
                    [prompt_row(0, 2, prompt_key="question")])
  item = data.make_dataset(path, tokenizer, data_config(prompt_key="question"))[0]
  assert item["attention_mask"].sum() == 4


def test_missing_file_names_path(tmp_path, tokenizer):
  missing = str(tmp_path / "nowhere.parquet")
  with pytest.raises(FileNotFoundError, match="nowhere.parquet"):
    data.make_dataset(missing, tokenizer, data_config())


def test_missing_column_names_it_and_lists_present(tmp_path, tokenizer):
  path = write_rows(tmp_path / "t.parquet", [prompt_row(0, 2)])
  with pytest.raises(KeyError, match=r"'messages'.*data_source.*prompt"):
    data.make_dataset(path, tokenizer, data_config(prompt_key="messages"))


@pytest.mark.parametrize("bad", [[], [{"role": "user"}]])
def test_malformed_prompt_names_row(tmp_path, tokenizer, bad):
  rows = [prompt_row(i, 2) for i in range(3)]
  rows[2]["prompt"] = bad
  path = write_rows(tmp_path / "t.parquet", rows)
  dataset = data.make_dataset(path, tokenizer, data_config())
  dataset[0]
  with pytest.raises(ValueError, match="t.parquet row 2: column .prompt."):
    dataset[2]


def test_malformed_string_prompt_column(tmp_path, tokenizer):
  rows = [{**prompt_row(i, 2), "prompt": "plain text"} for i in range(2)]
  path = write_rows(tmp_path / "t.parquet", rows)
  dataset = data.make_dataset(path, tokenizer, data_config())
  with pytest.raises(ValueError, match="t.parquet row 0: column .prompt."):
    dataset[0]


def test_empty_dataset_is_an_error(tmp_path, tokenizer):
  path = str(tmp_path / "empty.parquet")
  pq.write_table(pa.Table.from_pylist([prompt_row(0, 1)]).slice(0, 0), path)
  with pytest.raises(ValueError, match="no rows"):
    data.make_dataset(path, tokenizer, data_config())


CUSTOM_CLS = textwrap.dedent("""
    from rljax.data import RLHFDataset

    class Shouting(RLHFDataset):
      def process_row(self, row, row_number):
        for message in row[self.prompt_key]:
          message["content"] = message["content"].upper()
        item = super().process_row(row, row_number)
        item["shouted"] = True
        return item

    class Minimal:
      def __init__(self, data_files, tokenizer, config):
        self.files = data_files
      def __len__(self):
        return 2
      def __getitem__(self, i):
        return {"input_ids": [0, 1], "attention_mask": [1, 1],
                "position_ids": [0, 1], "index": i}
""")


def test_custom_cls_from_file(tmp_path, tokenizer):
  cls_path = tmp_path / "my_dataset.py"
  cls_path.write_text(CUSTOM_CLS)
  path = write_rows(tmp_path / "t.parquet", [prompt_row(0, 2)])
  config = data_config(custom_cls={"path": str(cls_path), "name": "Shouting"})
  item = data.make_dataset(path, tokenizer, config)[0]
  assert item["shouted"]
  assert list(item["raw_prompt_ids"]) == tokenizer.encode(
      "<user> W0 W1 <assistant>", add_special_tokens=False)
  minimal = data.make_dataset(path, tokenizer, data_config(
      custom_cls={"path": str(cls_path), "name": "Minimal"}))
  assert len(minimal) == 2 and minimal.files == path
  with pytest.raises(AttributeError, match="'Nope'.*Minimal"):
    data.make_dataset(path, tokenizer, data_config(
        custom_cls={"path": str(cls_path), "name": "Nope"}))
  with pytest.raises(FileNotFoundError, match="absent.py"):
    data.make_dataset(path, tokenizer, data_config(
        custom_cls={"path": os.path.join(tmp_path, "absent.py"),
                    "name": "X"}))


def test_media_columns_are_an_error_naming_the_row_not_silently_dropped(tmp_path, tokenizer):
  rows = [dict(prompt_row(i, 2), images=[]) for i in range(3)]
  text_only = write_rows(tmp_path / "a.parquet", rows)
  assert len(data.make_dataset(text_only, tokenizer, data_config(max_prompt_length=8))) == 3
  rows[2]["images"] = [{"bytes": b"\x89PNG"}]
  with_images = write_rows(tmp_path / "b.parquet", rows)
  with pytest.raises(ValueError, match=r"b.parquet row 2: column 'images' \(data.image_key\) holds images, and the "
                     r"model directory \(actor_rollout_ref.model.path\) has no preprocessor_config.json"):
    data.make_dataset([text_only, with_images], tokenizer, data_config(max_prompt_length=8))
  for row in rows:
    row.update(images=[], videos=[])
  rows[2]["videos"] = [{"bytes": b"..."}]
  with pytest.raises(ValueError, match=r"c.parquet row 2: column 'videos' \(data.video_key\) holds videos"):
    data.make_dataset(write_rows(tmp_path / "c.parquet", rows), tokenizer, data_config(max_prompt_length=8))
  for row in rows:
    row.update(videos=[], sounds=[])
  rows[1]["sounds"] = [{"bytes": b"RIFF"}]  # verl 0.9's audio column, under the name data.audio_key gives
  with pytest.raises(ValueError, match=r"d.parquet row 1: column 'sounds' \(data.audio_key\) holds audio"):
    data.make_dataset(write_rows(tmp_path / "d.parquet", rows), tokenizer,
                      data_config(max_prompt_length=8, audio_key="sounds"))


def test_images_become_their_tokens_and_count_in_the_prompt_length(tmp_path):
  """verl's multimodal rows: each <image> becomes vision-start, its image-pad tokens, vision-end; the lengths
  (max_prompt_length, filter_overlong_prompts) count them; no prompt with images is cut."""
  from rljax.data.images import ImageProcessing
  from tests.rl import vl_run
  tokenizer = vl_run.vl_tokenizer()
  proc = ImageProcessing(patch_size=4, merge_size=2, min_pixels=64, max_pixels=1024)
  pad = tokenizer.tok.token_to_id("<|image_pad|>")
  rows = vl_run.geometry3k_rows(4)
  rows[0]["images"] = [{"bytes": vl_run.drawn("circle", "red", 40, 24), "path": None}]  # 5 x 3 merged patches
  rows[3]["images"][1] = {"bytes": vl_run.drawn("square", "blue", 200, 200), "path": None, "max_pixels": 4096}
  rows[2].update(images=[], prompt=[{"role": "user", "content": "No image here."}])
  path = str(tmp_path / "geo.parquet")
  pq.write_table(pa.Table.from_pylist(rows), path)
  config = data_config(max_prompt_length=96, image_patch_size=4)
  ds = data.make_dataset(path, tokenizer, config, processor=proc)
  item = ds[0]
  assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 6, 10]]
  assert item["multi_modal_inputs"]["pixel_values"].shape == (60, 96) and "images" not in item
  ids = item["raw_prompt_ids"].tolist()
  start, end = tokenizer.tok.token_to_id("<|vision_start|>"), tokenizer.tok.token_to_id("<|vision_end|>")
  assert ids[ids.index(start):ids.index(end) + 1] == [start, *[pad] * 15, end]
  # an entry's own max_pixels bounds verl's first resize (64 x 64), the processor's then 1024 pixels
  assert ds[3]["multi_modal_inputs"]["image_grid_thw"][1].tolist() == [1, 8, 8]
  # a row without images beside rows with them: its entry is None, and a batch it leads keeps the others'
  batch = data.collate([ds[2], ds[0]])
  assert batch["multi_modal_inputs"][0] is None and batch["multi_modal_inputs"][1]["pixel_values"].shape == (60, 96)
  lengths = [len(ds[i]["raw_prompt_ids"]) for i in range(4)]
  with pytest.raises(ValueError, match=r"geo.parquet row 0: prompt is \d+ tokens with its images' 15, longer than "
                     r"data.max_prompt_length=40; a prompt with images is never cut"):
    data.make_dataset(path, tokenizer, data_config(max_prompt_length=40, image_patch_size=4, truncation="left"),
                      processor=proc)[0]
  limit = sorted(lengths)[1]
  kept = data.make_dataset(path, tokenizer, data_config(max_prompt_length=limit, image_patch_size=4,
                                                        filter_overlong_prompts=True), processor=proc)
  assert len(kept) == sum(n <= limit for n in lengths) == 2
  rows[1]["prompt"][0]["content"] = "No placeholder here."
  pq.write_table(pa.Table.from_pylist(rows), path)
  with pytest.raises(ValueError, match=r"geo.parquet row 1: the prompt holds 0 <image> placeholder\(s\) for 2 "
                     r"image\(s\)"):
    data.make_dataset(path, tokenizer, config, processor=proc)[1]


def test_prompts_are_rendered_with_the_tool_config_s_schemas(tmp_path):
  """data.tool_config_path (verl's copy of multi_turn.tool_config_path): the chat template gets `tools`, for the
  prompt and for the overlong filter alike; the tool classes are not imported to read their schemas."""
  from tests.data.conftest import make_tokenizer
  tokenizer = make_tokenizer(["tool:calculator", "tool:lookup"])
  tokenizer.chat_template = ("{% for t in tools or [] %}tool:{{ t['function']['name'] }} {% endfor %}"
                             + tokenizer.chat_template)
  tools = tmp_path / "tools.yaml"
  tools.write_text(textwrap.dedent("""\
      tools:
        - class_name: not.imported.Calculator
          config: {type: native}
          tool_schema:
            type: function
            function: {name: calculator, description: adds, parameters: {type: object, properties: {}, required: []}}
        - class_name: not.imported.Lookup
          config: {type: native}
          tool_schema:
            type: function
            function: {name: lookup, description: finds, parameters: {type: object, properties: {}, required: []}}
      """))
  path = write_rows(tmp_path / "train.parquet", [prompt_row(i, 3 + i) for i in range(3)])
  config = data_config(max_prompt_length=8, tool_config_path=str(tools), return_full_prompt=True,
                       filter_overlong_prompts=True)
  dataset = data.make_dataset(path, tokenizer, config)
  assert len(dataset) == 2  # 2 tool words + 3 or 4 prompt words + 2 fit in 8; 5 prompt words do not
  assert dataset[0]["full_prompts"] == "tool:calculator tool:lookup <user> w0 w1 w2 <assistant>"
