"""One place builds an RL run: the trainer and `rljax.compile` get the same steps, and the state is one pytree."""

import dataclasses

import jax
import numpy as np
import pytest

from rljax import rl, sharding
from rljax.compile import engine_steps as engine_programs, plan
from rljax.rl import assembly
from rljax.rollout.sampler import RolloutSampler
from tests.rl import tiny_run


def leaf(x):
  """An abstract argument's shape, dtype and sharding (a static argument as it is)."""
  return (x.shape, x.dtype, x.sharding) if hasattr(x, "shape") else x


def signatures(steps):
  """name -> (the abstract arguments' tree, each leaf's `leaf`) of each step."""
  return {s.name: (jax.tree.structure(s.args), [leaf(x) for x in jax.tree.leaves(s.args)]) for s in steps}


def rollout_steps(run, state):
  """The rollout's steps: its copy of the weights (here a cast and reshard to the tensor axis), then the engine's."""
  copies = [step for step, _ in run.engine.weights.sync_steps(run.actor_params(state))]
  return copies + engine_programs.engine_steps(run.engine, run.actor_params(state),
                                                RolloutSampler(run.engine, pad_id=0).steps_per_sync,
                                                samples_per_prompt=run.layout.n)


@pytest.mark.slow
def test_one_build_for_the_trainer_and_compile_and_a_checkpoint_is_the_state_tree(model_dir, data_dir,
                                                                                 reward_model_dir, tmp_path):
  # a critic, a reference, a reward model and an adaptive KL controller on 8 devices with a rollout tensor axis
  config = tiny_run.run_config(
      "grpo", model_dir, data_dir, str(tmp_path / "run"), "trainer.n_gpus_per_node=auto",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
      "critic.ppo_micro_batch_size_per_gpu=1", "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
      "algorithm.kl_ctrl.type=adaptive", "reward_model.enable=true", f"reward_model.model.path={reward_model_dir}")
  mesh = sharding.make_mesh(config)
  trainer = rl.RLTrainer(config, mesh=mesh)
  try:
    run, state = trainer.run, trainer.state
    compiled, compiled_state = assembly.build_run(config, mesh, abstract=True, tokenizer=trainer.tokenizer,
                                                  batches_per_epoch=trainer.train_iter.batches_per_epoch)
    assert compiled.layout == run.layout and compiled.engine.eos_ids == run.engine.eos_ids
    trained = signatures(run.compiled_steps() + list(rollout_steps(run, state)))
    assert trained == signatures(compiled.compiled_steps() + list(rollout_steps(compiled, compiled_state)))
    assert signatures(item.step for item in plan.rl_steps(config, mesh)) == trained
    assert {"actor_update", "critic_update", "old_log_prob", "ref_log_prob", "values", "reward_model"} <= set(trained)
    assert any(name.startswith("decode_step") for name in trained) and "rollout_weights" in trained
    # the initial states agree leaf by leaf (shapes, dtypes, shardings) and in their static fields
    assert jax.tree.map(leaf, state) == jax.tree.map(leaf, compiled_state)

    # a checkpoint is the state tree: a moved state saved, then restored over the initial one
    initial = trainer.train_iter.get_state()
    next(trainer.train_iter)
    moved = jax.tree.map(lambda x: x + 1 if x.dtype.kind == "f" else x, state)
    trainer.state = moved.replace(kl_ctrl=dataclasses.replace(state.kl_ctrl, value=0.25), step=2)
    trainer.count_step()  # counting a step records the data position
    trainer.tracker.log({"critic/score/mean": 0.5, "response_length/mean": 4.0}, 3)  # the curves save() draws
    trainer.save()
    trainer.checkpointer.wait()
    saved = trainer.state
    trainer.state = state
    trainer.train_iter.set_state(initial)
    trainer.restore(f"{tmp_path}/run/global_step_3")
    got, position = trainer.state, trainer.train_iter.get_state()
  finally:
    trainer.close()
  assert jax.tree.structure(got) == jax.tree.structure(saved)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(saved)):
    assert a.sharding == b.sharding
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (got.step, got.kl_ctrl.value, got.data_position) == (3, 0.25, saved.data_position)
  assert position == saved.data_position != initial  # the data resumes after the batch the state had read
