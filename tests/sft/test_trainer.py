"""The SFT loop end to end on a tiny model: loss goes down, resume equals an uninterrupted run, export."""

import json
import os
import signal

import jax
import numpy as np
import pytest
from flax import nnx

from rljax import export, models
from rljax.sft import packing
from rljax.sft import trainer as trainer_lib
from tests.sft import helpers

DEVICES = 8  # every run shards the batch and the parameters over 8 CPU devices


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return helpers.tiny_model_dir(tmp_path_factory.mktemp("sft_model"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return helpers.data_dir(tmp_path_factory.mktemp("sft_data"))


def _config(model_dir, data, run_dir, *extra):
  return helpers.run_config(model_dir, data, str(run_dir), "data.micro_batch_size_per_gpu=1", *extra,
                            devices=DEVICES)


def _history(run_dir):
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return {row["step"]: row for row in map(json.loads, f)}


def _fit(trainer, stop_after=None):
  """Runs fit(); with `stop_after`, SIGTERM arrives while that step is logged (a preemption)."""
  if stop_after is not None:
    log = trainer.tracker.log

    def log_then_preempt(metrics, step):
      log(metrics, step)
      if step == stop_after:
        os.kill(os.getpid(), signal.SIGTERM)

    trainer.tracker.log = log_then_preempt
  try:
    return trainer.fit()
  finally:
    trainer.close()


@pytest.fixture(scope="module")
def reference(model_dir, data, tmp_path_factory):
  """4 uninterrupted steps (validation at 2 and 4, checkpoints at 2 and 4), and the validation loss before them."""
  run_dir = tmp_path_factory.mktemp("reference")
  trainer = trainer_lib.SFTTrainer(_config(model_dir, data, run_dir), helpers.mesh(DEVICES))
  before = trainer.validate()["val/loss"]
  _fit(trainer)
  params = jax.tree.map(np.asarray, trainer.trainable)
  return {"dir": str(run_dir), "before": before, "history": _history(run_dir), "params": params}


@pytest.mark.slow
def test_training_lowers_train_and_validation_loss(reference):
  history = reference["history"]
  assert sorted(history) == [1, 2, 3, 4]
  assert history[4]["train/loss"] < history[1]["train/loss"]
  assert history[4]["val/loss"] < history[2]["val/loss"] < reference["before"]
  assert "val/loss" not in history[1] and "val/loss" not in history[3]
  for key in ("train/lr", "train/grad_norm", "train/tokens", "timing_s/step", "perf/throughput"):
    assert key in history[1]
  assert history[1]["train/lr"] == pytest.approx(1e-2)  # cosine, no warm-up: lr * (1 + cos(pi * s / 4)) / 2
  assert history[2]["train/lr"] == pytest.approx(1e-2 * (1 + np.cos(np.pi / 4)) / 2)
  for name in ("global_step_2", "global_step_4", "curves.png", "config.yaml", "sft_config.yaml"):
    assert os.path.exists(os.path.join(reference["dir"], name)), name


@pytest.mark.slow
def test_resume_continues_exactly(reference, model_dir, data, tmp_path):
  first = trainer_lib.SFTTrainer(_config(model_dir, data, tmp_path), helpers.mesh(DEVICES))
  _fit(first, stop_after=1)
  assert sorted(_history(tmp_path)) == [1] and os.path.isdir(tmp_path / "global_step_1")
  _fit(trainer_lib.SFTTrainer(_config(model_dir, data, tmp_path, "trainer.resume_mode=auto"), helpers.mesh(DEVICES)))
  resumed, want = _history(tmp_path), reference["history"]
  assert sorted(resumed) == [1, 2, 3, 4]
  for step in (2, 3, 4):
    for key in ("train/loss", "train/grad_norm", "train/lr"):
      assert resumed[step][key] == pytest.approx(want[step][key], rel=1e-6), (step, key)
  assert resumed[4]["val/loss"] == pytest.approx(want[4]["val/loss"], rel=1e-6)


def test_export_of_an_sft_checkpoint_loads(reference, tmp_path):
  out = export.export(reference["dir"], str(tmp_path / "hf"))
  model = models.from_pretrained(out)
  _, params = nnx.split(model)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(reference["params"])):
    np.testing.assert_array_equal(np.asarray(got), want)
  assert models.load_tokenizer(out).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


def test_packed_step_matches_unpacked(reference, model_dir, data, tmp_path):
  trainer = trainer_lib.SFTTrainer(_config(model_dir, data, tmp_path, "use_remove_padding=true"), helpers.mesh(DEVICES))
  try:
    batch = next(trainer.train_iter)
    metrics = trainer.train_step(batch)
  finally:
    trainer.close()
  assert len(packing.first_fit_decreasing([len(ids) for ids in batch["token_ids"]], 24)) < 8  # really packed
  want = reference["history"][1]
  for key in ("train/loss", "train/grad_norm"):
    assert metrics[key] == pytest.approx(want[key], rel=1e-5), key


@pytest.mark.slow
def test_lora_trains_only_adapters_and_exports(model_dir, data, tmp_path):
  """LoRA SFT: the optimizer holds adapters only, the base stays put, loss falls, both export formats load."""
  config = _config(model_dir, data, tmp_path, "model.lora_rank=4", "model.lora_alpha=8", "model.lora_dropout=0.1",
                   "model.target_modules=[q_proj,v_proj,down_proj]")
  trainer = trainer_lib.SFTTrainer(config, helpers.mesh(DEVICES))
  base = jax.tree.map(np.asarray, trainer.frozen)
  before = trainer.validate()["val/loss"]
  names = {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(trainer.trainable)}
  assert names and all("adapters" in name for name in names), names
  size = lambda tree: sum(leaf.size for leaf in jax.tree.leaves(tree) if leaf.ndim)  # noqa: E731
  assert size(trainer.opt_state) == 2 * size(trainer.trainable)  # AdamW's mu and nu, over the adapters only
  _fit(trainer)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.frozen), base)
  assert _history(tmp_path)[4]["val/loss"] < before

  merged = models.from_pretrained(export.export(str(tmp_path), str(tmp_path / "merged")))
  adapted = nnx.merge(trainer.graphdef, trainer.trainable, trainer.frozen)
  tokens = np.arange(2, 14, dtype=np.int32)[None]
  np.testing.assert_allclose(np.asarray(merged(tokens)), np.asarray(adapted(tokens)), atol=1e-5)
  peft_dir = export.export(str(tmp_path), str(tmp_path / "peft"), fmt="peft")
  with open(os.path.join(peft_dir, "adapter_config.json")) as f:
    adapter = json.load(f)
  assert adapter["r"] == 4 and set(adapter["target_modules"]) == {"q_proj", "v_proj", "down_proj"}


def test_an_moe_model_asking_for_the_load_balancing_loss_is_refused(data, tmp_path):
  # config.json's output_router_logits=true asks for a loss the SFT trainer does not add: an error, not a silent skip
  model_dir = helpers.tiny_model_dir(tmp_path / "dense")
  config = json.load(open(os.path.join(model_dir, "config.json")))
  config.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=16, output_router_logits=True, router_aux_loss_coef=0.01)
  moe_dir = tmp_path / "moe"
  models.save_pretrained(models.CausalLM(models.config.from_hf_dict(config), nnx.Rngs(0)), str(moe_dir))
  for name in ("tokenizer.json", "tokenizer_config.json"):
    os.replace(os.path.join(model_dir, name), moe_dir / name)
  with pytest.raises(Exception, match="output_router_logits=true, but the SFT trainer does not add"):
    trainer_lib.SFTTrainer(helpers.run_config(str(moe_dir), data, str(tmp_path / "run")), helpers.mesh(1))
