"""LoRA in the RL loop: only adapters train, the reference is the base model, checkpoints, resume, exports."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax import export, models, sharding
from rljax.models import lora
from rljax import rl
from rljax.training import checkpointing
from rljax.rl import stages, steps
from rljax.rl.experience import MODEL_FIELDS
from tests.rl import tiny_run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")


def flat(state):
  return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(state)}


def nbytes(tree):
  return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.slow
def test_rl_step_on_eight_devices_trains_only_the_adapters(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), *LORA,
                               "trainer.total_training_steps=1", "trainer.n_gpus_per_node=auto",
                               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", tiny_run.text_scorer(tmp_path))
  trainer = rl.RLTrainer(config, mesh=sharding.make_mesh(config))
  try:
    assert trainer.mesh.size == 8
    assert all(isinstance(v, lora.LoRAParam) for _, v in nnx.to_flat_state(trainer.state.actor))
    adapter_bytes, base_bytes = nbytes(trainer.state.actor), nbytes(nnx.state(trainer.run.frozen, nnx.Param))
    # Adam's two moments of the adapters alone: of every weight they would be twice the base
    assert nbytes(trainer.state.actor_opt) < 2 * adapter_bytes + 64 < base_bytes / 5
    q_a = trainer.state.actor["layers"][0]["attn"]["adapters"]["q"]["a"][...]
    assert q_a.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    frozen_before, trained_before = flat(trainer.run.frozen), flat(trainer.state.actor)
    metrics = trainer.train_step(next(trainer.train_iter))
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean"):
      assert math.isfinite(metrics[key]), key
    assert metrics["actor/grad_norm"] > 0
    after = flat(trainer.state.actor)
    assert all(np.abs(after[k] - trained_before[k]).max() > 0 for k in after if k.endswith("/b"))
    frozen_after = flat(trainer.run.frozen)
    assert frozen_after.keys() == frozen_before.keys()
    for k, v in frozen_before.items():
      np.testing.assert_array_equal(frozen_after[k], v, err_msg=k)
  finally:
    trainer.close()


@pytest.mark.slow
def test_reference_log_probs_are_the_base_models(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), *LORA)
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    keys = jax.random.split(jax.random.key(0), len(jax.tree.leaves(trainer.state.actor)))
    leaves, treedef = jax.tree.flatten(trainer.state.actor)
    trainer.state = trainer.state.replace(actor=jax.tree.unflatten(
        treedef, [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]))
    rows = trainer.source.rows(next(trainer.train_iter), trainer.step, {}, {})
    model_rows = rows.select(MODEL_FIELDS)
    ref = stages.forward(trainer.parts, trainer.run.steps.ref_log_prob, trainer.run.reference[1], model_rows)[0]
    graphdef, base = nnx.split(models.from_pretrained(model_dir))
    log_probs = jax.jit(steps.log_prob_fn(graphdef, 1.0, with_entropy=False))
    expected = np.asarray(log_probs(base, jax.tree.map(jnp.asarray, model_rows))[0])
    # float32 sums of the same terms in another order: agree to a few units in the last place of ~10.
    np.testing.assert_allclose(ref, expected, rtol=1e-6, atol=1e-6)
    actor = stages.forward(trainer.parts, trainer.run.steps.old_log_prob, trainer.actor_params, model_rows)[0]
    assert np.abs(actor - expected)[rows.response_mask > 0].max() > 1e-3
    frozen = {p: v[...] for p, v in nnx.to_flat_state(trainer.run.frozen)}
    assert all(v[...] is frozen[p] for p, v in nnx.to_flat_state(trainer.run.reference[1]))
  finally:
    trainer.close()


def _logits(model, ids):
  return np.asarray(model(jnp.asarray(ids)))


def _hf_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(ids, dtype=torch.long)).logits.numpy()


# verl's Megatron LoRA block (type lora: the fused linear_qkv and linear_fc1 adapters share A)
MEGATRON_LORA = ("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.lora.rank=4",
                 "actor_rollout_ref.model.lora.alpha=8")


@pytest.mark.slow
@pytest.mark.parametrize("lora_keys,saved_per_layer", [(LORA, 2 * 7), (MEGATRON_LORA, 7 + 4)],
                         ids=["peft keys", "megatron block"])
def test_checkpoint_holds_the_adapters_resumes_and_exports(model_dir, data_dir, tmp_path, lora_keys, saved_per_layer):
  run_dir = tmp_path / "run"
  # scores by text (a real policy gradient) and big enough steps that the adapters move the logits
  overrides = (*lora_keys, "actor_rollout_ref.actor.optim.lr=0.05", tiny_run.text_scorer(tmp_path))
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(run_dir), *overrides)
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    trainer.fit()
    final, final_opt = flat(trainer.state.actor), trainer.state.actor_opt
    actor = nnx.merge(trainer.run.graphdef, trainer.actor_params)
  finally:
    trainer.close()
  with checkpointing.Checkpointer(str(run_dir), read_only=True) as ckpt:
    saved = export._names(ckpt.array_metadata(2)["actor"])
  assert len(saved) == len(final) == 2 * saved_per_layer and all("/adapters/" in name for name in saved)

  config = tiny_run.run_config("grpo", model_dir, data_dir, str(run_dir), *overrides, "trainer.total_training_steps=3")
  resumed = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    resumed.restore(checkpointing.resolve_resume(config.trainer))
    assert resumed.step == 2
    restored = flat(resumed.state.actor)
    for k, v in final.items():
      np.testing.assert_array_equal(restored[k], v, err_msg=k)
    for got, want in zip(jax.tree.leaves(resumed.state.actor_opt), jax.tree.leaves(final_opt)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    metrics = resumed.fit()
    assert resumed.step == 3 and math.isfinite(metrics["actor/pg_loss"])
  finally:
    resumed.close()

  ids = np.array([[1, 520, 931, 198, 1017, 1276]], np.int32)
  ours = _logits(actor, ids)
  export.main(["--checkpoint", str(run_dir), "--step", "2", "--out", str(tmp_path / "merged")])
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()
  np.testing.assert_allclose(_hf_logits(merged, ids), ours, atol=1e-4)
  export.main(["--checkpoint", str(run_dir), "--step", "2", "--out", str(tmp_path / "peft"), "--format", "peft"])
  base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
  np.testing.assert_allclose(_hf_logits(adapted, ids), ours, atol=1e-4)
  assert np.abs(_logits(models.from_pretrained(model_dir), ids) - ours).max() > 1e-2


def test_the_actor_starts_from_a_saved_adapter_with_its_settings(model_dir, data_dir, tmp_path):
  # verl's actor_rollout_ref.model.lora_adapter_path alone (no lora_rank on the line): the adapter's rank, alpha and
  # targets replace the line's LoRA keys, and the actor's adapters hold its tensors
  from rljax.rl import run_models  # pylint: disable=import-outside-toplevel
  saved_config = lora.LoRAConfig(rank=2, alpha=6, target_modules=["q_proj", "v_proj", "down_proj"])
  saved = lora.apply_lora(models.from_pretrained(model_dir), saved_config, jax.random.key(3))
  for _, _, _, adapters in lora._adapted(saved):  # pylint: disable=protected-access
    for adapter in adapters.values():
      adapter.b.value = 0.1 * jax.random.normal(jax.random.key(4), adapter.b.value.shape, adapter.b.value.dtype)
  lora.save_peft(saved, saved_config, str(tmp_path / "adapter"), model_dir)
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"),
                               f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}")
  model = config.actor_rollout_ref.model
  assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (2, 6, ["down_proj", "q_proj", "v_proj"])
  mesh = tiny_run.one_device()
  actor = run_models.load_actor(config, mesh, sharding.rules_from_config(config), jax.random.key(0))
  expected = lora.peft_tensors(saved)
  assert lora.peft_tensors(actor).keys() == expected.keys()
  for name, value in lora.peft_tensors(actor).items():
    np.testing.assert_array_equal(value, expected[name], err_msg=name)
