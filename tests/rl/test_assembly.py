"""One place builds an RL run: the trainer and `rljax.compile` get the same steps, and the state is one pytree."""

import jax
import numpy as np
import pytest

from rljax import rl, sharding
from rljax.compile import plan
from rljax.rl import assembly
from rljax.rollout.sampler import RolloutSampler
from tests.rl import tiny_run
from tests.rl.test_trainer_paths import reward_model_dir  # noqa: F401  (fixture)


def leaf(x):
  """An abstract argument's shape, dtype and sharding (a static argument as it is)."""
  return (x.shape, x.dtype, x.sharding) if hasattr(x, "shape") else x


def signatures(steps):
  """name -> (the abstract arguments' tree, each leaf's `leaf`) of each step."""
  return {s.name: (jax.tree.structure(s.args), [leaf(x) for x in jax.tree.leaves(s.args)]) for s in steps}


def engine_steps(run, state):
  return run.engine.lowering_steps(run.actor_params(state), RolloutSampler(run.engine, pad_id=0).steps_per_sync,
                                   samples_per_prompt=run.layout.n)


@pytest.mark.parametrize("case", ["critic_and_reward_model", "lora"])
def test_the_trainer_and_compile_build_the_same_steps(case, model_dir, data_dir, reward_model_dir, tmp_path):
  extra = (["algorithm.adv_estimator=gae", "reward_model.enable=true", f"reward_model.model.path={reward_model_dir}"]
           if case == "critic_and_reward_model" else
           ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.ppo_epochs=2"])
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), "trainer.n_gpus_per_node=auto",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
                               *extra)
  mesh = sharding.make_mesh(config)
  trainer = rl.RLTrainer(config, mesh=mesh)
  try:
    run, state = trainer.run, trainer.state
    compiled, compiled_state = assembly.build_run(config, mesh, abstract=True)
    planned = signatures(item.step for item in plan.rl_steps(config, mesh))
    trained = signatures(run.compiled_steps() + list(engine_steps(run, state)))
  finally:
    trainer.close()
  assert trained == signatures(compiled.compiled_steps() + list(engine_steps(compiled, compiled_state)))
  assert planned == trained
  expected = {"actor_update", "old_log_prob", "ref_log_prob"}
  expected |= {"critic_update", "values", "reward_model"} if case == "critic_and_reward_model" else set()
  assert expected <= set(trained) and any(n.startswith("decode_step") for n in trained)
  # the initial states agree leaf by leaf (shapes, dtypes, shardings) and hold the same static fields
  assert jax.tree.map(leaf, state) == jax.tree.map(leaf, compiled_state)


def test_a_checkpoint_is_the_state_tree(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("ppo", model_dir, data_dir, str(tmp_path / "run"), "trainer.total_training_steps=1",
                               "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive")
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    trainer.fit()
    saved = trainer.state
    resumed = rl.RLTrainer(config, mesh=tiny_run.one_device())
    try:
      resumed.restore(f"{tmp_path}/run/global_step_1")
      got = resumed.state
    finally:
      resumed.close()
  finally:
    trainer.close()
  assert jax.tree.structure(got) == jax.tree.structure(saved)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (got.step, got.kl_ctrl, got.data_position) == (saved.step, saved.kl_ctrl, saved.data_position) != (0, None, None)
  assert got.kl_ctrl.value != trainer.run.config.algorithm.kl_ctrl.kl_coef  # the adaptive coefficient moved
