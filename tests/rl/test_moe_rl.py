"""GRPO on a tiny Qwen3-MoE: the load-balancing loss and expert-load metrics, and expert parallelism equal to none."""

import jax
import numpy as np
import pytest
from flax import nnx

from rljax import config as config_lib
from rljax import models
from rljax import sharding
from rljax import rl
from tests.rl import tiny_run
from tests.rl.test_trainer import train


@pytest.mark.slow
def test_expert_parallel_grpo_equals_one_device(moe_dir, data_dir, tmp_path):
  # the load-balancing loss is a product of sums over a micro-batch: both runs take the 8 rows as one micro-batch
  one = train(tiny_run.run_config("grpo", moe_dir, data_dir, str(tmp_path / "one"), "trainer.total_training_steps=1",
                                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                                  "actor_rollout_ref.model.use_remove_padding=false"))  # the other run packs
  config = tiny_run.run_config("grpo", moe_dir, data_dir, str(tmp_path / "ep"), "trainer.total_training_steps=1",
                               "trainer.n_gpus_per_node=auto", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                               "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4")
  mesh = sharding.make_mesh(config)
  # 2 of 8 experts per device: every pass that gathers its weights takes its copies half at a time
  # (`moe.capacity`, twice an even share), the devices routed more in several chunks
  assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 1, "sequence": 1, "expert": 4}
  ep = train(config, mesh=mesh)
  metrics = one[0]
  assert 0 < metrics["actor/moe_aux_loss"] < 4 and metrics["actor/moe_max_load"] >= 1
  # the worst layer per micro-batch, averaged: at least each layer's own average
  assert metrics["actor/moe_max_load"] >= max(metrics["actor/moe_max_load/layer_0"],
                                              metrics["actor/moe_max_load/layer_1"]) - 1e-6
  for key in ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
              "actor/entropy", "actor/moe_aux_loss", "actor/moe_max_load/layer_0"):
    assert ep[0][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
  assert jax.device_count() == 8


@pytest.mark.slow
def test_router_replay_feeds_the_old_passes_experts_to_the_update(moe_dir, data_dir, tmp_path):
  # two mini-batches, two epochs: every update after the first compares with old log-probs whose routing
  # the update replays (R2); without it the update routes by its own, moved, router
  off_policy = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_epochs=2",
                "actor_rollout_ref.actor.optim.lr=3e-2", "trainer.total_training_steps=1"]
  runs = {mode: train(tiny_run.run_config("grpo", moe_dir, data_dir, str(tmp_path / mode), *off_policy,
                                          f"actor_rollout_ref.actor.router_replay.mode={mode}"))[0]
          for mode in ("disabled", "R2")}
  assert runs["R2"]["actor/ppo_kl"] != runs["disabled"]["actor/ppo_kl"]


@pytest.mark.slow
def test_rollout_router_replay_feeds_the_rollouts_experts_to_every_actor_pass(moe_dir, data_dir, tmp_path):
  # R3: the old, reference and update passes' batches carry the rollout's routing (a step whose batch lacked it
  # would stop with a KeyError), and a run with it trains
  config = tiny_run.run_config("grpo", moe_dir, data_dir, str(tmp_path / "r3"), "trainer.total_training_steps=1",
                               "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                               "actor_rollout_ref.actor.router_replay.mode=R3",
                               "actor_rollout_ref.rollout.enable_rollout_routing_replay=true")
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    steps = trainer.run.steps
    for step, batch in ((steps.old_log_prob, 1), (steps.ref_log_prob, 1), (steps.actor_update, 2)):
      assert step.args[batch].packed.experts is not None, step.name  # packed with the tokens (verl's default)
      assert getattr(steps.padded, step.name).args[batch].routed_experts is not None, step.name
    trainer.fit()
  finally:
    trainer.close()
  assert trainer.sampler.engine.record_routing


@pytest.mark.slow
def test_router_replay_on_a_dense_model_is_a_config_error(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"),
                               "actor_rollout_ref.actor.router_replay.mode=R2")
  with pytest.raises(config_lib.ConfigError, match="router_replay.mode='R2': router replay needs a mixture-of-experts"):
    train(config)


@pytest.mark.slow  # two 1-step runs of the tiny MoE per mode (about 40 s)
@pytest.mark.parametrize("mode, extra", [
    # two mini-batches, two epochs: the update replays the old pass's routing, recorded from packed buffers
    ("R2", ("actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.optim.lr=3e-2")),
    # every actor pass replays the rollout's routing, packed with its tokens
    ("R3", ("actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
            "actor_rollout_ref.actor.use_kl_loss=true")),
])
def test_a_packed_run_under_router_replay_gives_the_padded_runs_metrics(moe_dir, data_dir, tmp_path, mode, extra):
  from tests.rl.test_packing import run_metrics, same_metrics  # pylint: disable=import-outside-toplevel
  extra += (f"actor_rollout_ref.actor.router_replay.mode={mode}", "trainer.total_training_steps=1",
            "data.max_prompt_length=200")  # buffers of 208 tokens hold several rows of the synthetic prompts
  packed = run_metrics(moe_dir, data_dir, tmp_path / "packed", "grpo", *extra,
                       "actor_rollout_ref.model.use_remove_padding=true")
  padded = run_metrics(moe_dir, data_dir, tmp_path / "padded", "grpo", *extra,
                       "actor_rollout_ref.model.use_remove_padding=false")
  same_metrics(packed, padded, 208)


def _trained(config):
  """(metrics of the run's one step, {path: array} of the actor after it)."""
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    metrics = trainer.fit()
    return metrics, {"/".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(trainer.state.actor)}
  finally:
    trainer.close()


@pytest.mark.slow  # two 1-step runs of the tiny MoE (about 15 s)
def test_megatron_s_freeze_moe_router_keeps_the_routers_and_takes_them_out_of_the_gradient(moe_dir, data_dir, tmp_path):
  # verl's Megatron engine sets requires_grad=False on each router (moe_config.freeze_moe_router): the routers neither move nor hold moments, and
  # the gradient norm is the other parameters'; the experts train as before (scored by text: a real policy gradient)
  before = {"/".join(map(str, p)): np.asarray(v[...])
            for p, v in nnx.to_flat_state(nnx.state(models.from_pretrained(moe_dir)))}
  runs = {}
  for frozen in (False, True):
    runs[frozen] = _trained(tiny_run.run_config(
        "grpo", moe_dir, data_dir, str(tmp_path / str(frozen)), "trainer.total_training_steps=1",
        "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.optim.lr=3e-2",
        tiny_run.text_scorer(tmp_path),  # verl 0.9.1's place of the key
        f"+actor_rollout_ref.actor.megatron.override_mcore_model_config.moe_config.freeze_moe_router={frozen}"))
  routers = [name for name in before if name.endswith("mlp/router")]
  experts = [name for name in before if name.endswith("mlp/gate")]
  assert len(routers) == len(experts) == 2
  for name in routers:
    np.testing.assert_array_equal(runs[True][1][name], before[name])
    assert np.abs(runs[False][1][name] - before[name]).max() > 1e-3
  for name in experts:
    assert np.abs(runs[True][1][name] - before[name]).max() > 1e-3
  # the same loss (one step from the same weights), less gradient: the routers' share is gone
  assert runs[True][0]["actor/pg_loss"] == pytest.approx(runs[False][0]["actor/pg_loss"], rel=1e-6)
  assert runs[True][0]["actor/grad_norm"] < runs[False][0]["actor/grad_norm"]
