"""verl's `data` node: the prompt files and how they become batches."""

from __future__ import annotations

from ml_collections import ConfigDict

from rljax.config.fields import any_value, follow, null


def build_data() -> ConfigDict:
  """verl's `data` node; gen_batch_size follows train_batch_size."""
  data = ConfigDict({
      "tokenizer": null(str),
      "use_shm": False,
      "train_files": any_value("~/data/rlhf/gsm8k/train.parquet"),
      "val_files": any_value("~/data/rlhf/gsm8k/test.parquet"),
      "train_max_samples": -1,
      "val_max_samples": -1,
      "prompt_key": "prompt",
      "reward_fn_key": "data_source",
      "max_prompt_length": 512,
      "max_response_length": 512,
      "train_batch_size": 1024,
      "val_batch_size": null(int),
      "return_raw_input_ids": False,
      "return_raw_chat": False,
      "return_full_prompt": False,
      "shuffle": True,
      "validation_shuffle": False,
      "seed": 42,
      "filter_overlong_prompts": False,
      "filter_overlong_prompts_workers": 1,
      "dataloader_num_workers": 0,
      "truncation": "error",
      "image_key": "images",
      "video_key": "videos",
      "audio_key": "audios",
      "trust_remote_code": False,
      "custom_cls": {"path": null(str), "name": null(str)},
      "image_patch_size": 14,
      "return_multi_modal_inputs": True,
      "sampler": {"class_path": null(str), "class_name": null(str)},
      "datagen": {"path": null(str), "name": null(str)},
      "apply_chat_template_kwargs": {},
  })
  data.gen_batch_size = follow(data, "train_batch_size")
  return data
