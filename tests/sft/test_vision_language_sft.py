"""SFT of a tiny Qwen2.5-VL (and Qwen3-VL) on prompts with images (verl's multimodal rows: <image> in the prompt, an images
column): the first step's loss is the model's own on each example (its images placed, M-RoPE positions), packed
or one example per row, on 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax.models as M
from rljax.models import vision
from rljax.sft import trainer as trainer_lib
from tests.rl import vl_run
from tests.sft import helpers

DEVICES = 8


def sft_rows(count: int, seed: int) -> list[dict]:
  """geometry3k-format prompts with drawn images, each answered by the names of what is drawn."""
  rows = vl_run.geometry3k_rows(count, seed)
  return [{"prompt": r["prompt"], "images": r["images"], "answer": r["reward_model"]["ground_truth"]} for r in rows]


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
  return vl_run.vl_model_dir(tmp_path_factory.mktemp("vl_sft") / "model")


@pytest.fixture(scope="module")
def qwen3_vl_dir(tmp_path_factory):
  return vl_run.vl_model_dir(tmp_path_factory.mktemp("qwen3_vl_sft") / "model", "qwen3_vl")


def config_of(vl_dir, tmp_path, *extra):
  helpers.write_parquet(tmp_path / "data" / "train.parquet", sft_rows(16, 0))
  helpers.write_parquet(tmp_path / "data" / "test.parquet", sft_rows(8, 1))
  return helpers.run_config(vl_dir, str(tmp_path / "data"), str(tmp_path / "run"), "data.prompt_key=prompt",
                            "data.response_key=answer", "data.max_length=192", "data.image_patch_size=4",
                            "data.micro_batch_size_per_gpu=1", "trainer.total_training_steps=1", *extra,
                            devices=DEVICES)


def own_loss(model, batch):
  """The batch's loss computed example by example (each its own row: its images, its M-RoPE positions from 0),
  -log p of its response tokens over all of them."""
  width = max(len(ids) for ids in batch["token_ids"])
  ids, mask, trained = (np.zeros((len(batch["token_ids"]), width), np.int32) for _ in range(3))
  for r, (tokens, loss_mask) in enumerate(zip(batch["token_ids"], batch["loss_mask"])):
    ids[r, :len(tokens)], mask[r, :len(tokens)], trained[r, :len(tokens)] = tokens, 1, loss_mask
  grids = [g for _, g in batch["images"]]
  positions, _ = vision.rope_index(ids, mask, np.concatenate(grids), model.cfg.image_token_id, 2)
  images = vision.row_images([p for p, _ in batch["images"]], grids, model.cfg.vision)
  logits = jax.jit(lambda m: m(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions), images=images))(model)
  log_probs = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
  picked = np.asarray(jnp.take_along_axis(log_probs, jnp.asarray(ids[:, 1:, None]), axis=-1))[..., 0]
  return -float((picked * trained[:, 1:]).sum()) / float(trained[:, 1:].sum())


@pytest.mark.parametrize("packed,family", [(False, "qwen2_5_vl"), (True, "qwen2_5_vl"), (True, "qwen3_vl")])
def test_the_first_sft_step_s_loss_is_the_model_s_own_on_each_example(request, tmp_path, packed, family):
  vl_dir = request.getfixturevalue("vl_dir" if family == "qwen2_5_vl" else "qwen3_vl_dir")
  config = config_of(vl_dir, tmp_path, f"use_remove_padding={str(packed).lower()}")
  trainer = trainer_lib.SFTTrainer(config, helpers.mesh(DEVICES))
  try:
    batch = next(trainer.train_iter)
    metrics = trainer.train_step(batch)
    rows = trainer.rows(list(zip(batch["token_ids"], batch["loss_mask"], batch["images"])))
  finally:
    trainer.close()
  assert (rows["segment_ids"].max(axis=1) > 1).any() == packed  # rows holding two examples (and their images)
  assert metrics["train/loss"] == pytest.approx(own_loss(M.from_pretrained(vl_dir), batch), rel=1e-5)
