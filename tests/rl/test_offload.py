"""verl's param_offload and optimizer_offload: the arrays live in host memory between the steps that use them, and
the run's numbers do not change (`rljax.sharding.offload`)."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rljax import rl, sharding
from rljax.config.errors import ConfigError
from rljax.sharding import offload
from tests.rl import tiny_run

OFFLOADED = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
             "actor_rollout_ref.ref.fsdp_config.param_offload=true", "critic.model.fsdp_config.param_offload=true",
             "critic.megatron.optimizer_offload=true", "reward_model.model.fsdp_config.param_offload=true")


def test_a_fraction_offloads_the_leading_leaves_that_hold_it():
  mesh = sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 1, "sequence": 1}, jax.devices()[:2])
  like = [jax.ShapeDtypeStruct((n,), np.float32) for n in (6, 2, 2)]
  shardings = [NamedSharding(mesh, PartitionSpec("fsdp"))] * 3
  kinds = lambda fraction: [s.memory_kind for s in offload.to_host(shardings, like, fraction)]  # noqa: E731
  assert kinds(0.0) == ["device"] * 3
  assert kinds(0.5) == ["pinned_host", "device", "device"]
  assert kinds(0.7) == ["pinned_host", "pinned_host", "device"]
  assert kinds(1.0) == ["pinned_host"] * 3
  assert [s.memory_kind for s in offload.device_shardings(offload.to_host(shardings, like, 1.0))] == ["device"] * 3


def test_an_offload_fraction_outside_0_1_names_its_key(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path))
  config.actor_rollout_ref.actor.optim.optimizer_offload_fraction = 1.5
  with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.optim\.optimizer_offload_fraction=1\.5"):
    offload.Offload.of(config, jax.devices()[:1])


class NoHostMemory:
  """A device whose client offers no host memory kind (some plugins)."""
  platform = "cpu"

  def addressable_memories(self):
    return []


def test_offload_on_devices_without_host_memory_warns_and_keeps_everything_on_them(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), *OFFLOADED)
  assert offload.Offload.of(config, jax.devices()[:1]).reference  # this CPU client has pinned_host
  with pytest.warns(UserWarning, match="have no pinned_host memory: every array stays in device memory"):
    assert offload.Offload.of(config, [NoHostMemory()]) == offload.Offload()


def in_host(tree):
  return {offload.in_host(x) for x in jax.tree.leaves(tree)}


@pytest.mark.slow  # three short PPO runs with a critic, a reference and a reward model (about 40 s)
def test_offloaded_arrays_stay_in_host_memory_through_updates_and_a_resume_with_the_same_metrics(
    model_dir, data_dir, reward_model_dir, tmp_path):
  common = ("actor_rollout_ref.actor.use_kl_loss=true", "reward_model.enable=true",
            f"reward_model.model.path={reward_model_dir}", "trainer.save_freq=1", tiny_run.text_scorer(tmp_path),
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2")
  mesh = sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 1, "sequence": 1}, jax.devices()[:2])
  plain = tiny_run.fit_metrics(tiny_run.run_config("ppo", model_dir, data_dir, str(tmp_path / "plain"), *common,
                                                   "trainer.total_training_steps=3"), mesh)
  run_dir = str(tmp_path / "offloaded")
  first = tiny_run.fit_metrics(tiny_run.run_config("ppo", model_dir, data_dir, run_dir, *common, *OFFLOADED,
                                                   "trainer.total_training_steps=2"), mesh)
  trainer = rl.RLTrainer(tiny_run.run_config("ppo", model_dir, data_dir, run_dir, *common, *OFFLOADED,
                                             "trainer.total_training_steps=3"), mesh=mesh)
  try:
    trainer.fit()
    state, run = trainer.state, trainer.run
    assert in_host(state.actor_opt) == in_host(state.critic) == in_host(state.critic_opt) == {True}
    assert in_host(run.reference.params) == in_host(run.reward_model.params) == {True}
    assert in_host(state.actor) == {False}  # the rollout reads the actor's weights in place
  finally:
    trainer.close()
  logged = tiny_run.read_metrics(run_dir)
  assert [m["step"] for m in logged] == [1, 2, 3]  # the second run resumed from step 2's checkpoint
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/"))}  # noqa: E731
  assert len(first) == 2
  for got, expected in zip(logged, plain, strict=True):
    assert drop(got) == pytest.approx(drop(expected), rel=1e-6, abs=1e-7)
