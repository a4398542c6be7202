"""Every jitted step of an RL run, built abstractly for a mesh, ready to lower and compile.

`rl_steps(config, mesh)` builds what `RLTrainer` builds, with the trainer's
own factories (`rljax.trainer.policy`, `rljax.trainer.steps`,
`rljax.rollout.factory`), but with abstract parameters and optimizer
state: no weights are read and nothing is allocated. Each step comes with
the bound `rljax.compile.report` holds it to.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax import sharding
from rljax.compile import report
from rljax.models import lora as lora_lib
from rljax.rollout import factory as rollout_factory
from rljax.rollout.sampler import RolloutSampler
from rljax.sharding.placement import Step
from rljax.trainer import policy, steps as steps_lib
from rljax.trainer.layout import make_layout
from rljax.trainer.optim import make_optimizer


@dataclasses.dataclass
class PlannedStep:
  """A step to compile and the bound its figures are compared with (None: no bound)."""

  step: Step
  bound: tuple[str, float] | None = None


def _opt_shardings(tx, params, mesh) -> Any:
  return sharding.optimizer_shardings(tx, params, steps_lib.shardings_of(params), mesh)


def rl_steps(config: ConfigDict, mesh: Mesh) -> list[PlannedStep]:
  """The steps of an RL run of `config` on `mesh`: updates, forward passes, prefill, insert and decode."""
  rules = sharding.rules_from_config(config)
  arr = config.actor_rollout_ref
  data_parallel = sharding.data_parallel_size(mesh)
  layout = make_layout(config, 1, data_parallel)
  model = policy.abstract_actor(config, mesh, rules)
  sharding.check_model_fits(mesh, model.cfg.num_heads, model.cfg.num_kv_heads, num_experts=model.cfg.num_experts)
  lora = policy.lora_config(config)
  graphdef, trainable, frozen = lora_lib.split_trainable(model)
  actor_params = nnx.merge_state(trainable, frozen)
  updates_per_step = arr.actor.ppo_epochs * layout.minis
  actor_tx = make_optimizer(arr.actor.optim, arr.actor.grad_clip, layout.total_steps, updates_per_step)
  reference = policy.reference(model, graphdef, actor_params, lora) if steps_lib.needs_reference(config) else None
  critic = None
  if steps_lib.uses_critic(config):
    critic_graphdef, critic_params = nnx.split(policy.abstract_critic(config, mesh, rules))
    critic_tx = make_optimizer(config.critic.optim, config.critic.grad_clip, layout.total_steps,
                               config.critic.ppo_epochs * layout.minis)
    critic = (critic_graphdef, critic_params, critic_tx, _opt_shardings(critic_tx, critic_params, mesh))
  lora_dropout = lora is not None and lora.dropout > 0
  built = steps_lib.build_rl_steps(
      config, layout, mesh, rules, graphdef=graphdef, trainable=trainable, frozen=frozen, actor_tx=actor_tx,
      actor_opt_sh=_opt_shardings(actor_tx, trainable, mesh), lora_dropout=lora_dropout, reference=reference,
      critic=critic, routing=model.cfg.routing_shape)
  compute = model.cfg.dtype
  planned = [PlannedStep(built.actor_update, ("FSDP min", report.fsdp_minimum(
      actor_params, trainable, layout.micro_batches, compute, mesh.shape["data"])))]
  if built.critic_update is not None:
    planned.append(PlannedStep(built.critic_update, ("FSDP min", report.fsdp_minimum(
        critic[1], critic[1], layout.micro_batches, compute, mesh.shape["data"]))))
  planned += [PlannedStep(s) for s in (built.old_log_prob, built.ref_log_prob, built.values) if s is not None]
  rollout_mesh = rollout_factory.rollout_mesh(mesh, arr.rollout.tensor_model_parallel_size)
  sharding.check_model_fits(rollout_mesh, model.cfg.num_heads, model.cfg.num_kv_heads,
                            "actor_rollout_ref.rollout.tensor_model_parallel_size", model.cfg.num_experts)
  engine = rollout_factory.build_engine(
      model, arr.rollout, prompt_length=config.data.max_prompt_length,
      slots=min(arr.rollout.max_num_seqs, layout.rows), mesh=rollout_mesh, rules=rules,
      stop=rollout_factory.stop_ids(None, model.cfg), record_routing=steps_lib.replays_rollout_routing(config),
      multi_turn=arr.rollout.multi_turn.enable)
  sampler_steps = RolloutSampler(engine, pad_id=0).steps_per_sync
  rollout_params = engine.compute_params(actor_params)
  for step in engine.lowering_steps(actor_params, sampler_steps, samples_per_prompt=layout.n):
    bound = None
    if step.name.startswith("decode_step"):
      bound = ("param+cache", report.decode_minimum(rollout_params, engine.abstract_decode_state()))
    planned.append(PlannedStep(step, bound))
  return planned


def compile_step(planned: PlannedStep, hbm: int) -> tuple[report.StepReport, Any]:
  """(its report, the compiled executable or None when the compiler refused it)."""
  start = time.perf_counter()
  try:
    compiled = planned.step.lower().compile()
  except jax.errors.JaxRuntimeError as error:
    result = report.from_error(planned.step.name, error, hbm)
    result.compile_seconds = time.perf_counter() - start
    return result, None
  result = report.from_compiled(planned.step.name, compiled, hbm, planned.step.args[0])
  result.bound = planned.bound
  result.compile_seconds = time.perf_counter() - start
  return result, compiled
