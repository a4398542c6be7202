"""MiMo's multi-token prediction layers in an RL run: their loss as Megatron-LM computes it (against a PyTorch
reference of MiMo's layers), packed equal to padded, what they train, and the config that turns them on."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import rljax.models as M
from rljax.config import ConfigError
from rljax.rl import mtp as mtp_lib, packing
from rljax.rl.sequences import response_log_probs
from tests.models import helpers
from tests.rl import tiny_run
from tests.rl.test_packing import P, R, packed_batch, ragged_rows

DEPTHS = 2


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
  """(HF Qwen2 trunk, its MTP layers, the MiMo directory holding both)."""
  hf, layers = helpers.mimo_model(DEPTHS)
  path = str(tmp_path_factory.mktemp("mimo"))
  helpers.save_mimo(hf, layers, path)
  return hf, layers, path


def test_a_mimo_checkpoint_loads_its_trunk_and_layers_and_saves_them_or_drops_them_as_asked(mimo, tmp_path):
  hf, layers, path = mimo
  ids, mask = helpers.batch()
  model = M.from_pretrained(path)
  trunk = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask))
  assert helpers.max_diff_on_mask(model.logits(trunk), helpers.hf_logits(hf, ids, mask), mask) <= 1e-4
  ours = np.asarray(model.mtp_hidden(trunk, jnp.asarray(ids), jnp.asarray(mask)))
  reference = helpers.mimo_reference(hf, layers, ids, mask)
  for k in range(DEPTHS):  # positions whose token k + 1 places on is real
    ahead = np.concatenate([mask[:, k + 1:], np.zeros_like(mask[:, :k + 1])], axis=1) * mask
    assert helpers.max_diff_on_mask(ours[k], reference[k], ahead) <= 1e-4
  M.save_pretrained(model, str(tmp_path / "kept"))
  again = M.from_pretrained(str(tmp_path / "kept"))
  for a, b in zip(jax.tree.leaves(nnx.state(again.mtp)), jax.tree.leaves(nnx.state(model.mtp)), strict=True):
    np.testing.assert_array_equal(a, b)
  dropped = M.from_pretrained(path, mtp=False)  # verl's model.mtp.enable=false: neither loaded nor saved
  assert dropped.cfg.mtp_layers == 0 and not hasattr(dropped, "mtp")
  M.save_pretrained(dropped, str(tmp_path / "dropped"))
  with open(os.path.join(tmp_path, "dropped", "config.json")) as f:
    assert json.load(f)["num_nextn_predict_layers"] == 0
  assert not any("mtp" in name for name in M.checkpoint.safetensors_source(str(tmp_path / "dropped")).names())


def reference_sums(hf, layers, rows) -> np.ndarray:
  """[K] each depth's summed cross-entropy of the counted response tokens, from MiMo's layers in PyTorch: depth k
  at position i predicts token i + k + 1; a response token counts when its predicting position is a real token."""
  states = helpers.mimo_reference(hf, layers, rows.input_ids, rows.attention_mask)
  head = hf.lm_head.weight.detach().numpy()
  sums = []
  for k in range(1, DEPTHS + 1):
    logits = torch.tensor(states[k - 1] @ head.T)
    log_probs = torch.log_softmax(logits, dim=-1).numpy()
    total = 0.0
    for row in range(rows.input_ids.shape[0]):
      for t in range(R):
        at = P - 1 - k + t
        if rows.response_mask[row, t] and rows.attention_mask[row, at]:
          total -= log_probs[row, at, rows.responses[row, t]]
    sums.append(total)
  return np.array(sums)


def test_the_loss_is_megatrons_cross_entropy_of_each_depth_packed_or_padded(mimo):
  hf, layers, path = mimo
  model = M.from_pretrained(path)
  assert model.cfg.mtp_layers == DEPTHS
  rows = ragged_rows(model.cfg.vocab_size, 8)
  training = mtp_lib.MTPTraining(DEPTHS, 0.1, False)
  _, _, trunk = response_log_probs(model, rows, 1.0, with_trunk=True)
  padded = mtp_lib.cross_entropy_sums(model, rows, trunk, training)
  np.testing.assert_allclose(padded, reference_sums(hf, layers, rows), rtol=2e-5)
  counted = mtp_lib.counted_tokens(rows, DEPTHS)
  short = int(np.sum((rows.attention_mask[:, P - 2] == 0) & (rows.response_mask[:, 0] > 0)))
  assert short > 0 and counted[0] == rows.response_mask.sum() - short  # a 1-token prompt: nothing predicts t=0
  packed = packed_batch(rows, 2, 2)
  micro = [jax.tree.map(lambda x, m=m: x[m], packed) for m in range(2)]
  sums = sum(mtp_lib.cross_entropy_sums(model, b, response_log_probs(model, b, 1.0, with_trunk=True)[2], training)
             for b in micro)
  np.testing.assert_allclose(sums, padded, rtol=2e-5)
  np.testing.assert_array_equal(sum(mtp_lib.counted_tokens(b, DEPTHS) for b in micro), counted)


@pytest.mark.parametrize("detach", [True, False])
def test_no_gradient_reaches_the_head_and_with_detach_encoder_none_reaches_the_trunk(mimo, detach):
  model = M.from_pretrained(mimo[2])
  graphdef, state = nnx.split(model)
  rows = ragged_rows(model.cfg.vocab_size, 4, seed=1)
  training = mtp_lib.MTPTraining(DEPTHS, 0.1, detach)

  def loss(s):
    m = nnx.merge(graphdef, s)
    trunk = response_log_probs(m, rows, 1.0, with_trunk=True)[2]
    return jnp.sum(mtp_lib.cross_entropy_sums(m, rows, trunk, training))

  def second_depth_loss(s):
    m = nnx.merge(graphdef, s)
    trunk = response_log_probs(m, rows, 1.0, with_trunk=True)[2]
    return mtp_lib.cross_entropy_sums(m, rows, trunk, training)[1]

  grads = nnx.to_flat_state(jax.jit(jax.grad(loss))(state))
  norm = lambda g, *prefix: sum(float(jnp.sum(v[...] ** 2)) for p, v in g if p[:len(prefix)] == prefix)  # noqa: E731
  assert norm(grads, "lm_head") == 0.0 and norm(grads, "mtp") > 0
  assert (norm(grads, "layers") == 0.0) == detach and (norm(grads, "embed") == 0.0) == detach
  # verl detaches each MTP layer's inputs: depth 2's loss reaches depth 1's layer only without detach_encoder
  second = nnx.to_flat_state(jax.jit(jax.grad(second_depth_loss))(state))
  assert (norm(second, "mtp", 0) == 0.0) == detach and norm(second, "mtp", 1) > 0


@pytest.fixture(scope="module")
def mimo_dir(tmp_path_factory):
  """A 2-layer MiMo with one MTP layer and `tiny_run.tiny_tokenizer`'s vocabulary and tokenizer."""
  tokenizer = tiny_run.tiny_tokenizer()
  cfg = M.ModelConfig(model_type="mimo", vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, rope_theta=100000.0,
                      mtp_layers=1, bos_token_id=1, eos_token_id=2, pad_token_id=2)
  path = str(tmp_path_factory.mktemp("tiny_mimo"))
  M.save_pretrained(M.CausalLM(cfg, nnx.Rngs(0)), path, tokenizer=tokenizer)
  return path


def mtp_run(mimo_dir, data_dir, run_dir, *extra):
  """A 2-step GRPO run of the tiny MiMo (its checkpoint saved after each step): (metrics, the last step's actor)."""
  from rljax import export  # pylint: disable=import-outside-toplevel
  config = tiny_run.run_config("grpo", mimo_dir, data_dir, str(run_dir), "actor_rollout_ref.model.mtp.enable=true",
                               tiny_run.text_scorer(run_dir.parent), *extra)
  metrics = tiny_run.fit_metrics(config)
  return metrics, export.restore_actor(str(run_dir))[0]


def leaves(model, prefix: str) -> list[np.ndarray]:
  return [np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param)) if p[0] == prefix]


@pytest.mark.parametrize("train", [True, False])
def test_a_run_trains_the_mtp_layers_only_when_asked_and_keeps_them_in_its_checkpoints(mimo_dir, data_dir, tmp_path,
                                                                                        train):
  metrics, actor = mtp_run(mimo_dir, data_dir, tmp_path / "run", f"actor_rollout_ref.model.mtp.enable_train={train}",
                           "actor_rollout_ref.model.mtp.detach_encoder=true")
  start = M.from_pretrained(mimo_dir)
  moved = [not np.allclose(a, b) for a, b in zip(leaves(actor, "mtp"), leaves(start, "mtp"), strict=True)]
  assert all(moved) if train else not any(moved)
  assert not np.allclose(leaves(actor, "layers")[0], leaves(start, "layers")[0])
  losses = [m.get("mtp_losses/mtp_1_loss") for m in metrics]
  if train:  # the token-mean cross-entropy of a near-uniform tiny model: about log(vocab)
    assert all(0.5 * np.log(start.cfg.vocab_size) < loss < 2 * np.log(start.cfg.vocab_size) for loss in losses)
  else:
    assert losses == [None, None]


def test_mtp_keys_that_cannot_apply_are_config_errors_naming_them(model_dir, mimo_dir, data_dir, tmp_path):
  with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.mtp\.enable.*no multi-token prediction layers"):
    tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "actor_rollout_ref.model.mtp.enable=true")
  with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.mtp\.enable_train.*LoRA"):
    tiny_run.run_config("grpo", mimo_dir, data_dir, str(tmp_path), "actor_rollout_ref.model.mtp.enable=true",
                        "actor_rollout_ref.model.mtp.enable_train=true", "actor_rollout_ref.model.lora_rank=4")


@pytest.mark.slow  # two 2-step runs (about 18 s): the packed depth positions under a token budget's empty slots
def test_packed_micro_batches_under_a_token_budget_give_the_padded_runs_mtp_losses(mimo_dir, data_dir, tmp_path,
                                                                                   monkeypatch):
  # as tests/rl/test_packing.py's budget test: 208-token rows of 46-186 real tokens, 416 tokens a device
  tiny_run.ensure_synthetic_data(data_dir)
  tiny_run.prompts_of_many_lengths(data_dir, tmp_path / "varied.parquet")
  budget = ("actor_rollout_ref.model.mtp.enable_train=true", "data.max_prompt_length=200",
            f"data.train_files={tmp_path}/varied.parquet", "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=416",
            "actor_rollout_ref.model.share_prompt_forward=false")
  arrangements = []
  arrange = packing.budget_arrangement
  monkeypatch.setattr(packing, "budget_arrangement", lambda *a, **k: arrangements.append(arrange(*a, **k))
                      or arrangements[-1])
  packed, _ = mtp_run(mimo_dir, data_dir, tmp_path / "packed", *budget)
  assert any((a < 0).any() for a in arrangements)  # micro-batches with empty row slots
  padded, _ = mtp_run(mimo_dir, data_dir, tmp_path / "padded", *budget,
                      "actor_rollout_ref.model.use_remove_padding=false")
  for a, b in zip(packed, padded, strict=True):
    for key in ("mtp_losses/mtp_1_loss", "actor/pg_loss", "actor/grad_norm"):
      assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
