"""One place assembles an RL run: `build_run(config, mesh)` for the trainer and for `rljax.compile`.

The run (`RLRun`) is everything that does not change as training goes on:
the mesh's batch layout, the actor split into what trains and what is
frozen (LoRA), the optimizers, the reference policy, the critic, the reward
model, the jitted steps and the rollout engine. Its state (`RunState`) is
everything that does: one pytree of the trained arrays (actor, its
optimizer state, critic, its optimizer state) with the step, the KL
controller and the data position beside them. Checkpoints are tree
operations on that state (`checkpoint_items`, `restored`).

With `abstract=True` no weight is read and nothing is allocated: the
parameters and optimizer states are ShapeDtypeStructs laid out by the same
rules, so `rljax.compile` lowers exactly the steps the trainer runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import optax
from flax import nnx, struct
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax import models, sharding
from rljax.algos import kl as kl_lib
from rljax.config.errors import ConfigError
from rljax.config.fields import get_node
from rljax.config import validation
from rljax.models import lora as lora_lib
from rljax.rl import reward_model as reward_model_lib, run_models, staleness, steps as steps_lib
from rljax.rl.layout import Layout, make_layout
from rljax.rollout import factory as rollout_factory
from rljax.rollout.engine import Engine
from rljax.sharding import hosts, offload
from rljax.sharding.placement import Step, abstract as abstract_arrays, shardings_of
from rljax.training.optim import MTP_LAYERS, make_optimizer, make_schedule, tower_frozen, with_frozen


@struct.dataclass
class RunState:
  """What training changes: a pytree of the trained arrays, with the step, KL controller and data position as
  static fields beside them (a new step is a new treedef: no step is jitted over the whole state).

  Attributes:
    actor: the actor's trained state (under LoRA: the adapters and modules_to_save).
    actor_opt: its optimizer state.
    critic, critic_opt: the critic's parameters and optimizer state (None without a critic).
    step: steps trained.
    kl_ctrl: the KL-in-reward controller (its coefficient moves under `kl_ctrl.type=adaptive`).
    data_position: the training data iterator's state after step `step`'s batches (None before the first);
      under colocate_async, before the oldest batch with an untrained prompt.
    stream_position: colocate_async's place in the data (`AsyncRollout.position`: that batch's index and the
      prompts from it on already trained or evicted); None in sync mode.
  """

  actor: Any
  actor_opt: Any
  critic: Any = None
  critic_opt: Any = None
  step: int = struct.field(pytree_node=False, default=0)
  kl_ctrl: Any = struct.field(pytree_node=False, default=None)
  data_position: Any = struct.field(pytree_node=False, default=None)
  stream_position: Any = struct.field(pytree_node=False, default=None)


def checkpoint_items(state: RunState, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
  """(arrays, extras) of a checkpoint: the state's arrays by role, and its static fields as JSON."""
  arrays = {"actor": state.actor, "actor_opt": state.actor_opt}
  if state.critic is not None:
    arrays.update(critic=state.critic, critic_opt=state.critic_opt)
  extras = {"step": state.step, "data_state": state.data_position, "seed": seed, "kl_coef": float(state.kl_ctrl.value),
            "stream": state.stream_position}
  return arrays, extras


def restored(state: RunState, arrays: dict[str, Any], extras: dict[str, Any]) -> RunState:
  """`state` with a checkpoint's arrays and static fields (`checkpoint_items`' inverse)."""
  return state.replace(actor=arrays["actor"], actor_opt=arrays["actor_opt"], critic=arrays.get("critic"),
                       critic_opt=arrays.get("critic_opt"), step=int(extras["step"]),
                       kl_ctrl=dataclasses.replace(state.kl_ctrl, value=float(extras["kl_coef"])),
                       data_position=extras["data_state"], stream_position=extras.get("stream"))


def abstract_like(state: RunState) -> RunState:
  """The state as ShapeDtypeStructs with the arrays' shardings (a restore target)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


class ScoringModel(NamedTuple):
  """The reward model's parameters and its scoring pass."""

  params: Any
  step: Step


@dataclasses.dataclass(frozen=True)
class RLRun:
  """An RL run's fixed parts (see the module docstring).

  Attributes:
    layout: the batch geometry.
    model_config: the actor's ModelConfig.
    graphdef: the actor's graph; `frozen` its untrained state (LoRA's base weights; empty otherwise).
    reference: the reference policy, or None when the run needs none.
    reward_model: its parameters and scoring Step, or None without reward_model.enable.
    steps: the jitted steps.
    engine: the rollout engine over the actor's graph.
    on_policy: the update uses its own log-probs as the old ones (`steps.on_policy`).
    actor_lr: the actor's learning rate by optimizer step.
    rollout_engine: the engine of the first rollout process (separate_async on several processes, built on a
      trainer process to address the weights it sends; `engine` then decodes on the trainer's mesh, for
      validation and remax's baselines), else None.
  """

  layout: Layout
  model_config: models.ModelConfig
  graphdef: nnx.GraphDef
  frozen: Any
  reference: steps_lib.SplitModel | None
  reward_model: ScoringModel | None
  steps: steps_lib.RLSteps
  engine: Engine
  on_policy: bool
  actor_lr: Callable[[int], Any]
  rollout_engine: Engine | None = None

  def actor_params(self, state: RunState) -> nnx.State:
    """The actor's whole state: what trains and, under LoRA, the frozen base (one view, no copy)."""
    return nnx.merge_state(state.actor, self.frozen)

  def compiled_steps(self) -> list[Step]:
    """Every step the run jits, the reward model's included."""
    return self.steps.all() + ([self.reward_model.step] if self.reward_model is not None else [])


def _checked_routing(config: ConfigDict, model_config: models.ModelConfig) -> None:
  """Router replay needs a mixture-of-experts actor."""
  mode = config.actor_rollout_ref.actor.router_replay.mode
  if mode != "disabled" and not model_config.num_experts:
    raise ConfigError("actor_rollout_ref.actor.router_replay.mode", mode,
                      f"router replay needs a mixture-of-experts model; {config.actor_rollout_ref.model.path} is a "
                      f"dense {model_config.model_type}", "set it to disabled")


def _trainable_with_optimizer(tx: optax.GradientTransformation, params: Any, mesh: Mesh,
                              abstract: bool, offloaded: float = 0.0) -> tuple[Any, Any]:
  """(optimizer state, its shardings) for `params`: created in place, or abstract; the `offloaded` fraction of
  its bytes in host memory (`rljax.sharding.offload`)."""
  shape = jax.eval_shape(tx.init, params)
  shardings = offload.to_host(sharding.optimizer_shardings(tx, params, shardings_of(params), mesh), shape, offloaded)
  if abstract:
    return abstract_arrays(shape, shardings), shardings
  return jax.jit(tx.init, out_shardings=shardings)(params), shardings


ACTOR = "actor_rollout_ref.actor"


def megatron_key(config: ConfigDict, role: str) -> str | None:
  """`role`'s optim node path where its strategy is megatron (its learning rate follows Megatron's scheduler,
  `rljax.training.optim.megatron_schedule`), else None (verl's FSDP schedule)."""
  return f"{role}.optim" if get_node(config, f"{role}.strategy") == "megatron" else None


def _critic(config: ConfigDict, mesh: Mesh, rules: Any, layout: Layout, abstract: bool,
            offloads: offload.Offload) -> tuple[steps_lib.CriticParts, Any]:
  """The critic's parts and its optimizer state."""
  value_model = (run_models.abstract_critic if abstract else run_models.load_critic)(config, mesh, rules)
  graphdef, params = nnx.split(value_model)
  tx = make_optimizer(config.critic.optim, config.critic.grad_clip, layout.total_steps,
                      config.critic.ppo_epochs * layout.minis, megatron_key(config, "critic"))
  opt_state, opt_sh = _trainable_with_optimizer(tx, params, mesh, abstract, offloads.critic_optimizer)
  params = offload.placed(params, offloads.critic)
  return steps_lib.CriticParts(graphdef, params, tx, opt_sh), opt_state


def _offloaded_reference(params: Any, trainable: Any, frozen: Any, offloaded: bool, lora: bool) -> Any:
  """The reference's parameters, in host memory when `offloaded`: its own copies only (under LoRA it reads the
  actor's frozen base in place, which the rollout reads too, so that stays in device memory)."""
  if not offloaded:
    return params
  shared = {id(x) for x in jax.tree.leaves([trainable, frozen])} if lora else set()
  return jax.tree.map(lambda x: x if id(x) in shared else offload.placed(x, True), params)


def _reward_model(config: ConfigDict, mesh: Mesh, rules: Any, layout: Layout, abstract: bool,
                  offloaded: bool) -> ScoringModel:
  """`reward_model.model.path` and its scoring pass."""
  model = (run_models.abstract_reward_model if abstract else run_models.load_reward_model)(config, mesh, rules)
  graphdef, params = nnx.split(model)
  params = offload.placed(params, offloaded)
  return ScoringModel(params, reward_model_lib.scoring_step(config, graphdef, params, layout, mesh, rules))


def _engine(config: ConfigDict, model: models.CausalLM, layout: Layout, mesh: Mesh, rules: Any,
            tokenizer: Any, rollout_devices: Sequence[jax.Device] = ()) -> Engine:
  """The rollout engine on the rollout's mesh (`rollout.tensor_model_parallel_size`) over the training mesh's
  devices, or `rollout_devices` (separate_async's own), with a slot for each response in flight at once on a host
  (`staleness.rows_in_flight` of its share of the rows: a mesh over several hosts rolls out on each host's own
  devices), at most rollout.max_num_seqs. A process that holds none of `rollout_devices` (a trainer process of
  `rljax.rl.remote`) gets the engine of the first process that does: every one's is alike."""
  arr = config.actor_rollout_ref
  rolling = hosts.processes(rollout_devices or mesh.devices.flat)
  if rollout_devices:
    if jax.process_index() not in rolling:
      rollout_devices = hosts.process_devices(rolling[0], rollout_devices)
    mesh = sharding.build_mesh({"data": 1, "fsdp": len(rollout_devices), "tensor": 1, "sequence": 1, "expert": 1},
                               list(rollout_devices))
  rollout_mesh = rollout_factory.rollout_mesh(mesh, arr.rollout.tensor_model_parallel_size)
  sharding.check_model_fits(rollout_mesh, model.cfg.num_heads, model.cfg.num_kv_heads,
                            "actor_rollout_ref.rollout.tensor_model_parallel_size", model.cfg.num_experts)
  host_rows = layout.rows // len(rolling)
  slots = min(arr.rollout.max_num_seqs, staleness.rows_in_flight(config, host_rows, layout.n))
  return rollout_factory.build_engine(
      model, arr.rollout, prompt_length=config.data.max_prompt_length, slots=slots,
      mesh=rollout_mesh, rules=rules,
      stop=rollout_factory.stop_ids(tokenizer, model.cfg, arr.rollout.multi_turn.format
                                    if arr.rollout.multi_turn.enable else None),
      record_routing=steps_lib.replays_rollout_routing(config), multi_turn=arr.rollout.multi_turn.enable)


def build_run(config: ConfigDict, mesh: Mesh, *, abstract: bool, tokenizer: Any, batches_per_epoch: int,
              rollout_devices: Sequence[jax.Device] = (), remote_rollout: bool = False) -> tuple[RLRun, RunState]:
  """The run of `config` on `mesh` and its initial state.

  Args:
    config: a finalized, validated config.
    mesh: the job's mesh.
    abstract: build with abstract parameters and optimizer states (no weights read, nothing allocated).
    tokenizer: the actor's tokenizer (its EOS ids end responses; None: the model config's alone).
    batches_per_epoch: sets the run's length when trainer.total_training_steps is unset.
    Neither changes a shape: `rljax.compile`, which reads no data, passes None and 1.
    rollout_devices: the rollout's own devices (separate_async; default: the mesh's).
    remote_rollout: `rollout_devices` are another process's (`rljax.rl.remote`): the engine decodes on the mesh,
      and `rollout_engine` is the one on those devices.

  Raises:
    ConfigError: naming the key, when the model does not fit the mesh or router replay meets a dense model.
  """
  arr = config.actor_rollout_ref
  rules = sharding.rules_from_config(config)
  layout = make_layout(config, batches_per_epoch, sharding.data_parallel_size(mesh))
  model = (run_models.abstract_actor(config, mesh, rules) if abstract
           else run_models.load_actor(config, mesh, rules, jax.random.key(config.trainer.seed)))
  sharding.check_model_fits(mesh, model.cfg.num_heads, model.cfg.num_kv_heads, num_experts=model.cfg.num_experts,
                            expert_axes=sharding.expert_rule_axes(config))
  _checked_routing(config, model.cfg)
  validation.check_mtp(config, model.cfg.mtp_layers)
  lora = run_models.lora_config(config)
  graphdef, trainable, frozen = lora_lib.split_trainable(model)
  updates_per_step = arr.actor.ppo_epochs * layout.minis
  schedule = (layout.total_steps, updates_per_step, megatron_key(config, ACTOR))
  actor_tx = make_optimizer(arr.actor.optim, arr.actor.grad_clip, *schedule)
  freeze = steps_lib.actor_frozen_leaves(config, model.cfg.vision is not None, model.cfg.routing_shape is not None)
  if freeze is not None:
    actor_tx = with_frozen(actor_tx, freeze)
  if model.cfg.mtp_layers and not arr.model.mtp.enable_train:
    actor_tx = tower_frozen(actor_tx, MTP_LAYERS)
  offloads = offload.Offload.of(config, list(mesh.devices.flat))
  actor_opt, actor_opt_sh = _trainable_with_optimizer(actor_tx, trainable, mesh, abstract, offloads.actor_optimizer)
  reference = (run_models.reference(model, graphdef, nnx.merge_state(trainable, frozen), lora)
               if steps_lib.needs_reference(config) else None)
  if reference is not None:
    reference = reference._replace(params=_offloaded_reference(reference.params, trainable, frozen,
                                                               offloads.reference, lora is not None))
  critic, critic_opt = (_critic(config, mesh, rules, layout, abstract, offloads) if steps_lib.uses_critic(config)
                        else (None, None))
  lora_dropout = lora is not None and lora.dropout > 0
  steps = steps_lib.build_rl_steps(
      config, layout, mesh, rules, graphdef=graphdef, trainable=trainable, frozen=frozen, actor_tx=actor_tx,
      actor_opt_sh=actor_opt_sh, lora_dropout=lora_dropout, reference=reference,
      critic=critic, routing=model.cfg.routing_shape, vision=model.cfg.vision, mtp_layers=model.cfg.mtp_layers)
  run = RLRun(layout=layout, model_config=model.cfg, graphdef=graphdef, frozen=frozen, reference=reference,
              reward_model=(_reward_model(config, mesh, rules, layout, abstract, offloads.reward_model)
                            if config.reward_model.enable else None),
              steps=steps, engine=_engine(config, model, layout, mesh, rules, tokenizer,
                                          () if remote_rollout else rollout_devices),
              on_policy=steps_lib.on_policy(config, layout, lora_dropout),
              actor_lr=make_schedule(arr.actor.optim, *schedule),
              rollout_engine=(_engine(config, model, layout, mesh, rules, tokenizer, rollout_devices)
                              if remote_rollout else None))
  state = RunState(actor=trainable, actor_opt=actor_opt, critic=None if critic is None else critic.params,
                   critic_opt=critic_opt,
                   kl_ctrl=kl_lib.get_kl_controller(config.algorithm.kl_ctrl))
  return run, state


__all__ = ["RLRun", "RunState", "ScoringModel", "abstract_like", "build_run", "checkpoint_items", "restored"]
