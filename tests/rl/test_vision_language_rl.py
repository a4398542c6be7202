"""GRPO on images: a tiny Qwen2.5-VL (and Qwen3-VL) trained on geometry3k-format data (verl's multimodal
parquet) on 8 devices.

The rollout engine prefills each prompt with its images' features and decodes at its M-RoPE offset; the trainer's
old-log-prob pass runs the same rows (images, M-RoPE positions) with the shared-prompt forward. Their log-probs
agree (rollout correction's mismatch metrics), the update moves the tower and the language model.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from rljax import rl, sharding
from tests import processes
from tests.rl import golden, tiny_run, vl_run


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
  return vl_run.vl_model_dir(tmp_path_factory.mktemp("vl") / "model")


def vl_overrides(tmp_path, *extra):
  """The tiny runs' overrides for geometry3k-format data on 8 devices, rollout correction reporting the
  mismatch of the rollout's and the trainer's log-probs."""
  train = vl_run.write_geometry3k(tmp_path / "geo_train.parquet", 16)
  test = vl_run.write_geometry3k(tmp_path / "geo_test.parquet", 4, seed=1)
  return (f"data.train_files={train}", f"data.val_files={test}", "data.image_patch_size=4",
          "data.filter_overlong_prompts=true", "trainer.n_gpus_per_node=auto",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2",
          "algorithm.rollout_correction.rollout_is=token", tiny_run.text_scorer(tmp_path), *extra)


def vl_config(vl_dir, data_dir, tmp_path, *extra):
  return tiny_run.run_config("grpo", vl_dir, data_dir, str(tmp_path / "run"), *vl_overrides(tmp_path, *extra))


def flat(state):
  return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(state)}


def test_the_passes_read_a_response_as_decoding_did_image_pad_tokens_it_generated_included(vl_dir, tmp_path):
  """Each row's log-probs (its own prompt pass, and each group's prompt run once) equal decoding's: the prompt
  prefilled with its images, then token by token at its M-RoPE offset; an image-pad token the response holds
  is text to both."""
  import jax.numpy as jnp
  import rljax.models as M
  from rljax.data import dataset as dataset_lib
  from rljax.data.images import ImageProcessing
  from rljax.models import vision
  from rljax.rl.sequences import make_sequences, prompts_shared, response_log_probs, with_images

  model = M.from_pretrained(vl_dir)
  tokenizer = M.load_tokenizer(vl_dir)
  path = vl_run.write_geometry3k(tmp_path / "geo.parquet", 2)
  item = dataset_lib.RLHFDataset(path, tokenizer, {"max_prompt_length": 96, "image_patch_size": 4},
                                 processor=ImageProcessing.of_model(vl_dir))[1]
  pad = model.cfg.image_token_id
  response = np.array([[pad, 5, pad, 9, 2, 0]], np.int32)
  response_mask = np.array([[1, 1, 1, 1, 1, 0]], np.int32)
  rows = with_images(make_sequences(item["input_ids"][None], item["attention_mask"][None], response, response_mask),
                     [item["multi_modal_inputs"]], model.cfg)
  # decoding: the prompt's prefill, then each token fed with the positions the engine gives it
  inputs = item["multi_modal_inputs"]
  ids, mask = item["input_ids"][None], item["attention_mask"][None]
  positions, deltas = vision.rope_index(ids, mask, inputs["image_grid_thw"], pad, 2)
  cache = M.init_cache(model.cfg, 1, ids.shape[1] + 6)._replace(offset=jnp.asarray(deltas))
  logits, cache = model.step(jnp.asarray(ids), cache, jnp.asarray(mask), jnp.asarray(positions), last_only=True,
                             images=vision.Images(inputs["pixel_values"], vision.image_layout(inputs["image_grid_thw"],
                                                                                             model.cfg.vision)))
  want = []
  for token in response[0, :5]:
    want.append(jax.nn.log_softmax(logits[0, -1])[token])
    logits, cache = model.step(jnp.asarray([[token]]), cache)
  for group in (1, 2):
    batch = jax.tree.map(lambda x: np.repeat(x, group, axis=0), rows)
    got, _ = response_log_probs(model, batch, 1.0, group_size=group)
    np.testing.assert_allclose(np.asarray(got)[:, :5], np.broadcast_to(np.asarray(want), (group, 5)), atol=2e-5)
  # a group shares its prompt only when its rows' images are the same too
  assert prompts_shared(batch, 2)
  assert not prompts_shared(batch.replace(pixels=batch.pixels * np.array([1.0, 0.5])[:, None, None]), 2)


def nbytes(tree):
  return sum(x.nbytes for x in jax.tree.leaves(tree))


TRAINED = {"everything": (), "all but the tower": ("actor_rollout_ref.actor.freeze_vision_tower=true",),
           # verl's Qwen2.5-VL LoRA line: adapters on the language model, the tower left out
           "lora": ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                    "actor_rollout_ref.model.exclude_modules=.*visual.*")}


@pytest.mark.parametrize("trained", list(TRAINED))
def test_a_grpo_step_on_images_on_eight_devices(vl_dir, data_dir, tmp_path, trained):
  config = vl_config(vl_dir, data_dir, tmp_path, "trainer.total_training_steps=1", *TRAINED[trained])
  trainer = rl.RLTrainer(config, mesh=sharding.make_mesh(config))
  try:
    assert trainer.mesh.size == 8
    before = flat(trainer.state.actor)
    tower = nbytes(trainer.state.actor["visual"]) if trained != "lora" else 0
    # Adam's two moments of every parameter trained (adapters alone under LoRA; not the frozen tower's)
    frozen = tower if trained == "all but the tower" else 0
    assert abs(nbytes(trainer.state.actor_opt) - 2 * (nbytes(trainer.state.actor) - frozen)) < 64
    base = flat(trainer.run.frozen)
    metrics = trainer.train_step(next(trainer.train_iter))
    after = flat(trainer.state.actor)
    if trained == "lora":
      assert all(np.array_equal(v, flat(trainer.run.frozen)[k]) for k, v in base.items())
      assert any(k.startswith("visual/") for k in base)
  finally:
    trainer.close()
  # the trainer's forward over the rows (images placed, M-RoPE positions) gives the engine's log-probs
  assert abs(metrics["rollout_corr/log_ppl_abs_diff"]) < 1e-4, metrics
  assert abs(metrics["rollout_corr/kl"]) < 1e-5, metrics
  assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
  moved = {k for k in before if not np.array_equal(before[k], after[k])}
  assert any(k.startswith("visual/") for k in moved) == (trained == "everything"), moved
  assert any(k.startswith("layers/") for k in moved), moved


def test_images_stream_under_colocate_async_and_the_run_resumes(vl_dir, data_dir, tmp_path):
  """colocate_async admits each prompt with its images into the open decode stream; the run saves and resumes."""
  streamed = ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=2")
  mesh = lambda config: sharding.make_mesh(config)  # noqa: E731
  config = vl_config(vl_dir, data_dir, tmp_path, *streamed, "trainer.total_training_steps=2")
  first = tiny_run.fit_metrics(config, mesh(config))
  assert [m["step"] for m in first] == [1, 2]
  # the exported model keeps its image processing: it trains on images as the model it came from
  from rljax import export
  from rljax.data.images import ImageProcessing
  out = export.export(str(tmp_path / "run"), str(tmp_path / "exported"))
  assert ImageProcessing.of_model(out) == ImageProcessing.of_model(vl_dir)
  resumed = vl_config(vl_dir, data_dir, tmp_path, *streamed, "trainer.total_training_steps=3",
                      "trainer.resume_mode=auto")
  records = tiny_run.fit_metrics(resumed, mesh(resumed))
  assert records[-1]["step"] == 3 and np.isfinite(records[-1]["actor/pg_loss"])


def test_dynamic_sampling_keeps_each_group_with_its_images(vl_dir, data_dir, tmp_path):
  """DAPO's rounds: rows of several generation rounds (their images as wide as each round's widest) joined."""
  config = vl_config(vl_dir, data_dir, tmp_path, "algorithm.filter_groups.enable=true",
                     "algorithm.filter_groups.metric=seq_final_reward", "data.gen_batch_size=2",
                     "trainer.total_training_steps=1")
  metrics = tiny_run.fit_metrics(config, sharding.make_mesh(config))[-1]
  assert abs(metrics["rollout_corr/log_ppl_abs_diff"]) < 1e-4 and np.isfinite(metrics["actor/pg_loss"]), metrics


@pytest.mark.slow  # a 2-process job of 2 steps beside the same job in this process (37 s in CI)
def test_grpo_on_images_as_two_processes_logs_the_metrics_of_one(vl_dir, data_dir, tmp_path):
  """Each host reads its share of the prompts with their images; the rows' images are as wide as the widest on
  any host (the first host's prompts hold one small image each, the second's two larger ones); validation
  decodes image prompts too.

  About 40 s: each of the two processes compiles the tower, the engine and the passes itself, and the second
  step (decoding under the first update's weights on both hosts) is what shows the hosts stay in step. 2 devices,
  one a process."""
  rows = vl_run.geometry3k_rows(16)
  for i, row in enumerate(rows):
    if i % 8 < 4:  # the first host's half of each batch of 8 (unshuffled)
      row["images"] = [{"bytes": vl_run.drawn("circle", "red", 16, 16), "path": None}]
      row["prompt"][0]["content"] = "<image> Which shape is drawn?"
  extra = (*vl_overrides(tmp_path), f"data.train_files={vl_run.write_rows(tmp_path / 'hosts.parquet', rows)}",
           "data.shuffle=false", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.val_before_train=true",
           "trainer.test_freq=2")
  config = tiny_run.run_config("grpo", vl_dir, data_dir, str(tmp_path / "one"), *extra)
  one = tiny_run.fit_metrics(config, sharding.make_mesh(config, jax.devices()[:2]))
  argv = ["-m", "rljax.train", "--config=configs/grpo.py", *tiny_run.overrides(vl_dir, data_dir, f"{tmp_path}/two"),
          *extra]
  two = processes.run_metrics(argv, 2, f"{tmp_path}/two", devices=2)
  assert any(k.startswith("val-core/") for k in two[0]) and two[-1]["actor/grad_norm"] > 0
  golden.assert_golden(two, [{k: v for k, v in m.items() if not k.startswith(golden.DROPPED)} for m in one], "vl")


@pytest.fixture(scope="module")
def qwen3_vl_moe_dir(tmp_path_factory):
  return vl_run.vl_model_dir(tmp_path_factory.mktemp("qwen3_vl_moe") / "model", "qwen3_vl_moe")


# Qwen3-VL's tower and deepstack through Qwen3-VL-MoE (a layer of experts, a dense layer): one run covers both
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl_moe"])
def test_packed_passes_carry_each_row_s_images_and_give_the_padded_numbers(family, request, data_dir, tmp_path):
  """use_remove_padding: each buffer's tower runs its members' images one after another (windows and frames
  kept apart), their features (and Qwen3-VL's deepstack features) at the prompts' image tokens; the step logs the
  padded passes' numbers, and each pass's log-probs are the engine's."""
  vl_dir = request.getfixturevalue("vl_dir" if family == "qwen2_5_vl" else "qwen3_vl_moe_dir")
  runs = {}
  for packed in (False, True):
    (tmp_path / str(packed)).mkdir()
    config = vl_config(vl_dir, data_dir, tmp_path / str(packed), "trainer.total_training_steps=1",
                       "actor_rollout_ref.model.share_prompt_forward=false",  # packing pays with no shared prompts
                       "data.max_prompt_length=192",  # buffers of 200 tokens: two rows with images each
                       "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                       f"actor_rollout_ref.model.use_remove_padding={str(packed).lower()}")
    runs[packed] = tiny_run.fit_metrics(config, sharding.make_mesh(config))
  assert "perf/packed_compute_ratio" in runs[True][0] and "perf/packed_compute_ratio" not in runs[False][0]
  assert all(abs(run[0]["rollout_corr/log_ppl_abs_diff"]) < 1e-4 for run in runs.values())
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith((*golden.DROPPED, "perf/packed"))}  # noqa: E731
  golden.assert_golden([drop(m) for m in runs[True]], [drop(m) for m in runs[False]], "packed images")


@pytest.mark.slow  # two 2-step runs of the images job (14 s in CI)
def test_separate_async_streams_images_on_devices_of_its_own_as_colocate_async_does(vl_dir, data_dir, tmp_path,
                                                                                   monkeypatch):
  """The rollout's 4 devices prefill each prompt with its images on a thread of their own; the run logs the
  metrics of colocate_async on the trainer's 4 devices under the same schedule (tests/rl/test_separate.py)."""
  from rljax.rl import staleness
  common = ("trainer.total_training_steps=2", "trainer.n_gpus_per_node=4", "trainer.save_freq=-1",
            "trainer.v1.separate_async.parameter_sync_step=1", "trainer.v1.separate_async.num_warmup_batches=1",
            "trainer.v1.colocate_async.num_warmup_batches=1")
  for run in ("separate", "colocated"):
    (tmp_path / run).mkdir()
  config = vl_config(vl_dir, data_dir, tmp_path / "separate", *common, "trainer.v1.trainer_mode=separate_async",
                     "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=4")
  mesh = sharding.make_mesh(config)
  assert list(mesh.devices.flat) == jax.devices()[:4]
  schedule = staleness.schedule_of(config)
  apart = tiny_run.fit_metrics(config, mesh)
  config = vl_config(vl_dir, data_dir, tmp_path / "colocated", *common, "trainer.v1.trainer_mode=colocate_async")
  monkeypatch.setattr(staleness, "schedule_of", lambda config: schedule)
  together = tiny_run.fit_metrics(config, sharding.make_mesh(config, jax.devices()[:4]))
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/"))}  # noqa: E731
  assert [drop(m) for m in apart] == [drop(m) for m in together] and len(apart) == 2
  # the first batch decodes under the weights it trains (later ones under a version behind)
  assert abs(apart[0]["rollout_corr/log_ppl_abs_diff"]) < 1e-4, apart[0]


@pytest.mark.slow  # a 2-process job of 2 steps beside the same job in one process (19 s in CI)
def test_separate_async_on_two_processes_carries_each_group_s_images_and_logs_the_metrics_of_one(vl_dir, data_dir,
                                                                                                  tmp_path):
  """Process 0 trains on its device; process 1 rolls out on its own and sends each step's groups, their
  prompts' images with them, through the coordination service; the metrics are those of the same devices in one
  process (the rollout's log-probs the trainer's: the images reached it)."""
  extra = (*vl_overrides(tmp_path), "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
           "actor_rollout_ref.rollout.n_gpus_per_node=1", "trainer.total_training_steps=2", "trainer.save_freq=-1",
           "trainer.v1.separate_async.parameter_sync_step=1", "trainer.v1.separate_async.num_warmup_batches=1")
  runs = {}
  for count in (1, 2):
    argv = ["-m", "rljax.train", "--config=configs/grpo.py",
            *tiny_run.overrides(vl_dir, data_dir, f"{tmp_path}/{count}"), *extra]
    runs[count] = processes.run_metrics(argv, count, f"{tmp_path}/{count}", devices=2)
  assert [m["step"] for m in runs[2]] == [1, 2] and runs[2][0]["perf/weight_sync_bytes"] > 0
  assert abs(runs[2][0]["rollout_corr/log_ppl_abs_diff"]) < 1e-4, runs[2][0]
  processes.assert_same_metrics(runs[1], runs[2], atol=1e-6)
