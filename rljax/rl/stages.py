"""A step's stages after its rollout, as free functions of the run's parts, its state and the step's rows:

    experience   forward passes (old and reference log-probs, values) and advantages  -> rows, state
    update       the critic's and then the actor's epochs over the mini-batches        -> state

A step's rows go to device once (`StepData`: each field placed when first needed, a pass's outputs kept where
it computed them). Forward passes and updates gather their micro-batches and mini-batches on device from there
(packed where the run packs, `rljax.rl.packing`, or as their padded twins where those compute less).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator

import jax
import numpy as np
from ml_collections import ConfigDict

from rljax import sharding
from rljax.algos import pf_ppo
from rljax.rl import advantage_stage, experience as experience_lib, packing
from rljax.rl import steps as steps_lib
from rljax.rl.experience import Experience
from rljax.rl.layout import balance_order, spread
from rljax.rl.profiling import timed
from rljax.rl.sequences import prompts_shared
from rljax.rl.sources import Draw, Keys
from rljax.sharding import hosts
from rljax.sharding.placement import Step


@dataclasses.dataclass
class StepParts:
  """What the stages read besides the state: the config, the assembled run (`assembly.RLRun`), the training mesh,
  the run's keys, the advantage stage's program (`advantage_stage.program`) and the mini-batch gathers compiled so
  far (by step name and whether it packs)."""

  config: ConfigDict
  run: Any
  mesh: jax.sharding.Mesh
  keys: Keys
  row_gathers: dict[tuple[str, bool], Any] = dataclasses.field(default_factory=dict)
  advantage: Any = None

  def __post_init__(self):
    self.advantage = advantage_stage.program(self.config)


def packing_of(step: Step) -> Any:
  """A pass's abstract PackedRows (None when it runs padded rows): its batch argument's `packed`."""
  batch = step.args[2] if step.name.endswith("update") else step.args[1]
  return batch.packed


@dataclasses.dataclass
class StepData:
  """One step's rows on device, each field placed once (`experience.OnDevice`), and the packer of its packed
  passes (None when it has none)."""

  device: experience_lib.OnDevice
  packer: packing.Packer | None


@dataclasses.dataclass(frozen=True)
class PassOutputs:
  """A forward pass's outputs on device ([M, k, ...] each) over the micro-batches `arrangement` ([M, k] global
  row numbers, -1 in empty slots) of every host's `local` rows."""

  out: Any
  arrangement: np.ndarray
  local: int

  def host(self) -> Any:
    """This host's rows of every output, in row order ([local, ...] each)."""
    return jax.tree.map(lambda x: packing.process_rows(x, self.arrangement, self.local), self.out)


def place_step(parts: StepParts, rows: Experience) -> StepData:
  """The step's `StepData` for this host's `rows`: nothing placed yet but, when a pass packs, the tokens (and
  every row's span: the hosts exchange [N, 2] integers)."""
  layout = parts.run.layout
  device = experience_lib.OnDevice(layout.rows, layout.prompt_length, layout.response_length, parts.mesh,
                                   sharding.rules_from_config(parts.config))
  data = StepData(device, None)
  if any(packing_of(step) for step in parts.run.steps.all()):
    spans = hosts.process_concat(np.stack(packing.row_spans(rows.attention_mask), axis=1))
    data.packer = packing.Packer.of(device.of(rows, packing.TOKEN_FIELDS), (spans[:, 0], spans[:, 1]),
                                    layout.prompt_length, layout.response_length, device.slot_numbers)
    vision_config = parts.run.model_config.vision
    if vision_config is not None:  # every row's patch count: the hosts exchange [N] integers
      counts = hosts.process_concat(np.sum(np.asarray(rows.patch_order) >= 0, axis=1).astype(np.int32))
      placed = device.of(rows, ("image_slots", *experience_lib.IMAGE_FIELDS))
      data.packer.images = (placed.image_slots, placed.replace(image_slots=None), counts, vision_config.merge_unit)
    replay(parts, data, rows)
  return data


def replay(parts: StepParts, data: StepData, rows: Experience) -> None:
  """Gives the step's packer the experts of `rows` (routed_experts [N, P + R, L_sparse, k]) where a packed pass
  replays them (router replay: the rollout's under R3, the old-log-prob pass's under R2)."""
  if data.packer is None or rows.routed_experts is None or not any(
      packing_of(step) is not None and packing_of(step).experts is not None for step in parts.run.steps.all()):
    return
  data.packer.experts = data.device.of(rows, ("routed_experts",)).routed_experts


def adopted(data: StepData, rows: Experience, outputs: PassOutputs, **fields: int | None) -> Experience:
  """`rows` with the pass's `outputs` as the fields named (name -> which output, None for the only one): this
  host's rows of them, and the step's rows on device gathered from them there when first asked for."""
  host = outputs.host()
  out = {}
  for name, i in fields.items():
    out[name] = host if i is None else host[i]
    result = outputs.out if i is None else outputs.out[i]
    routing = tuple(out[name].shape[-2:]) if name == "routed_experts" else None
    abstract = getattr(data.device.spec((name,), routing), name)
    data.device.adopt(name, out[name], functools.partial(
        experience_lib.unarrange, result, data.device.slot_numbers(outputs.arrangement), abstract))
  return rows.replace(**out)


def padded_pays(parts: StepParts, step: Step, plan: packing.PackPlan, abstract: packing.PackedRows,
                rows: int) -> bool:
  """Whether `step`'s padded twin, over `rows` row slots (empty ones computed too), computes less than its packed
  pass of `plan`."""
  layout = parts.run.layout
  return packing.padded_pays(packing.plan_tokens(plan, abstract), rows, layout.prompt_length,
                             layout.response_length, parts.run.steps.padded.groups[step.name])


def gathered(parts: StepParts, step: Step, batch: Experience, data: StepData, rows: Experience,
             index: np.ndarray) -> Experience:
  """`step`'s batch fields (`batch`, abstract [M, k, ...]) of the rows `index` (global row numbers: [k * M], or
  [M', S] with -1 in empty slots), gathered on device from the step's rows (`row_gather`, one per step)."""
  if not batch.present():
    return batch
  cached = (step.name, packing_of(step) is None)
  if cached not in parts.row_gathers:
    parts.row_gathers[cached] = experience_lib.row_gather(batch)
  return parts.row_gathers[cached](data.device.of(rows, batch.present()), data.device.slot_numbers(index))


def forward_pass(parts: StepParts, step: Step, params: Any, rows: Experience, data: StepData) -> PassOutputs:
  """A forward Step over the step's rows (this host's `rows` [N, ...]) in its micro-batches: its outputs on
  device (a packed Step's tokens from the step's packer, or its padded twin where that computes less)."""
  abstract, local = step.args[1], len(rows.response_mask)
  if abstract.packed is None:
    arrangement = packing.forward_arrangement(local, hosts.count(), *abstract.response_mask.shape[:2])
    return PassOutputs(step(params, gathered(parts, step, abstract, data, rows, arrangement)), arrangement, local)
  packer, budget = data.packer, parts.run.layout.budget_of(step.name)
  arrangement = packing.pass_arrangement(packer.ends - packer.starts, local, abstract.packed, budget)
  plan = packer.plan(abstract.packed, arrangement, budget)
  if padded_pays(parts, step, plan, abstract.packed, parts.run.layout.row_slots):
    return forward_pass(parts, getattr(parts.run.steps.padded, step.name), params, rows, data)
  batch = gathered(parts, step, abstract.replace(packed=None), data, rows, arrangement)
  return PassOutputs(step(params, batch.replace(packed=packer.pack(plan, abstract.packed))), arrangement, local)


def forward(parts: StepParts, step: Step, params: Any, rows: Experience, data: StepData | None = None) -> Any:
  """A forward Step's outputs for this host's `rows` ([N, ...] each, on the host; `data`: the step's, else
  placed for this pass)."""
  return forward_pass(parts, step, params, rows, data or place_step(parts, rows)).host()


def experience(parts: StepParts, state: Any, rows: Experience, timing: dict[str, float], step_metrics: dict,
               data: StepData) -> tuple[Experience, Any]:
  """`rows` with the old and reference log-probs, values, rewards, advantages and returns the run uses
  (`data`: the step's on device), and the state (its KL controller moved on)."""
  run, config = parts.run, parts.config
  steps, group = run.steps, run.layout.group
  if not prompts_shared(rows, group):
    raise RuntimeError(f"rows are not in groups of {group} sharing a prompt; set "
                       "actor_rollout_ref.model.share_prompt_forward=false and report this")
  if not run.on_policy:
    with timed(timing, "old_log_prob"):
      old = forward_pass(parts, steps.old_log_prob, run.actor_params(state), rows, data)
      fields = dict(old_log_probs=0, sum_pi_squared=1) if steps_lib.needs_sum_pi_squared(config) else dict(
          old_log_probs=0)
      if steps_lib.replays_routing(config, run.on_policy):
        rows = adopted(data, rows, old, **fields, routed_experts=2)
        replay(parts, data, rows)
      else:
        rows = adopted(data, rows, old, **fields)
  if steps.ref_log_prob is not None:
    with timed(timing, "ref"):
      rows = adopted(data, rows, forward_pass(parts, steps.ref_log_prob, run.reference.params, rows, data),
                     ref_log_prob=0)
  if steps.values is not None:
    with timed(timing, "values"):
      rows = adopted(data, rows, forward_pass(parts, steps.values, state.critic, rows, data), values=None)
  with timed(timing, "adv"):
    return advantages(parts, state, rows, step_metrics)


def advantages(parts: StepParts, state: Any, rows: Experience, step_metrics: dict) -> tuple[Experience, Any]:
  """`rows` with the token-level rewards (KL in the reward), rollout correction, advantages and returns
  (`advantage_stage`: each host's own rows, or every host's where a statistic is over the whole batch), and the
  state with its KL controller moved on."""
  config, stage = parts.config, parts.advantage
  inputs = rows.select(advantage_stage.inputs(config))
  if advantage_stage.reads_every_row(config):
    inputs = inputs.replace(group=inputs.group + hosts.index() * (len(inputs.group) // parts.run.layout.n))
    out, (kl_ctrl, metrics) = hosts.gathered_rows(stage, inputs, state.kl_ctrl)
  else:
    out, (kl_ctrl, metrics) = stage(inputs, state.kl_ctrl)
  step_metrics.update({k: float(v) for k, v in metrics.items()})
  rows = rows.replace(**{k: np.asarray(getattr(out, k), experience_lib.FIELDS[k][1]) for k in out.present()})
  if config.actor_rollout_ref.actor.positive_nll_coef:
    rows = rows.replace(positive=rows.token_level_scores.sum(-1) > 0)
  return rows, state.replace(kl_ctrl=kl_ctrl)


def balanced_order(parts: StepParts, rows: Experience) -> np.ndarray:
  """[rows] the step's global row numbers in update order: trainer.balance_batch deals the prompts' groups to the
  data-parallel ranks by token totals (the hosts exchange their rows' lengths, [N] integers)."""
  data_parallel = sharding.data_parallel_size(parts.mesh)
  if not (parts.config.trainer.balance_batch and data_parallel > 1):
    return np.arange(parts.run.layout.rows)
  lengths = hosts.process_concat(rows.attention_mask.sum(-1).astype(np.int32))
  return balance_order(lengths, data_parallel, parts.run.layout.group)


def resampled(parts: StepParts, state: Any, rows: Experience, order: np.ndarray) -> np.ndarray:
  """[rows] `order`, or under algorithm.use_pf_ppo (with gae) its rows drawn again by their sequence scores
  (`rljax.algos.pf_ppo`; the hosts exchange their rows' scores, [N] floats)."""
  algorithm = parts.config.algorithm
  if not pf_ppo.applies(algorithm.use_pf_ppo, algorithm.adv_estimator):
    return order
  scores = hosts.process_concat(rows.token_level_scores.sum(-1).astype(np.float32))
  return pf_ppo.resampled_order(parts.keys.at(state.step, Draw.PF_PPO), order, scores,
                                algorithm.pf_ppo.reweight_method, algorithm.pf_ppo.weight_pow)


def minibatches(parts: StepParts, state: Any, rows: Experience, step: Step, epochs: int, order: np.ndarray,
                data: StepData) -> Iterator[tuple[int, int, Experience]]:
  """(epoch, index, mini-batch) over `epochs` epochs of `rows`, each mini-batch as `step` takes it (its batch
  argument's fields and shardings).

  Each mini-batch is gathered on device from the step's rows (`data`) by the global row numbers of `order`
  (permuted per epoch under actor.shuffle), so it holds the same rows whatever the number of hosts; a packed
  step's tokens are packed from those rows by the step's packer.
  """
  layout, batch = parts.run.layout, step.args[2].replace(packed=None)
  size, abstract, budget = layout.mini_rows, step.args[2].packed, layout.budget_of(step.name)
  for epoch in range(epochs):
    epoch_order = order
    if parts.config.actor_rollout_ref.actor.shuffle:
      permutation = jax.random.permutation(parts.keys.at(state.step, Draw.SHUFFLE, epoch), layout.rows)
      epoch_order = order[np.asarray(permutation)]
    for m in range(layout.minis):
      index = epoch_order[m * size:(m + 1) * size]
      if abstract is None:
        yield epoch, m, gathered(parts, step, batch, data, rows, spread(index, *batch.response_mask.shape[:2]))
        continue
      arrangement = data.packer.arrangement(abstract, index, budget)
      plan = data.packer.plan(abstract, arrangement, budget)
      yield epoch, m, gathered(parts, step, batch, data, rows, arrangement).replace(
          packed=data.packer.pack(plan, abstract))


def update_step(parts: StepParts, step: Step, order: np.ndarray, packer: packing.Packer | None) -> Step:
  """`step`, or its padded twin when the step's first mini-batch costs less padded (`packing.padded_pays`)."""
  abstract = step.args[2].packed
  if abstract is None:
    return step
  layout = parts.run.layout
  index = order[:layout.mini_rows]
  budget = layout.budget_of(step.name)
  plan = packer.plan(abstract, packer.arrangement(abstract, index, budget), budget)
  padded = padded_pays(parts, step, plan, abstract, layout.mini_slots)
  return getattr(parts.run.steps.padded, step.name) if padded else step


def critic_only_steps(config: ConfigDict) -> int:
  """Training steps that update only the critic, as verl counts trainer.critic_warmup: its actor updates from
  global step critic_warmup on (1-based), so 0 and 1 both update it from the first step."""
  return max(0, int(config.trainer.critic_warmup) - 1)


def update(parts: StepParts, state: Any, rows: Experience, timing: dict[str, float], step_metrics: dict,
           data: StepData) -> Any:
  """The critic's and then the actor's epochs over the mini-batches of `rows` (`data`: the step's on device);
  the state they leave. Their metrics, averaged over the mini-batches, go into `step_metrics`."""
  config, run = parts.config, parts.run
  actor, steps, layout = config.actor_rollout_ref.actor, run.steps, run.layout
  collected: list[dict] = []
  order = resampled(parts, state, rows, balanced_order(parts, rows))
  if steps.critic_update is not None:
    with timed(timing, "update_critic"):
      step = update_step(parts, steps.critic_update, order, data.packer)
      for epoch, i, mini in minibatches(parts, state, rows, step, config.critic.ppo_epochs, order, data):
        critic, critic_opt, m = step(state.critic, state.critic_opt, mini,
                                     parts.keys.at(state.step, Draw.CRITIC_UPDATE, epoch, i))
        state = state.replace(critic=critic, critic_opt=critic_opt)
        collected.append(m)
      jax.block_until_ready(state.critic)
  skipped = critic_only_steps(config)
  if state.step >= skipped:
    with timed(timing, "update_actor"):
      step = update_step(parts, steps.actor_update, order, data.packer)
      for epoch, i, mini in minibatches(parts, state, rows, step, actor.ppo_epochs, order, data):
        trained, actor_opt, m = step(state.actor, state.actor_opt, mini,
                                     parts.keys.at(state.step, Draw.ACTOR_UPDATE, epoch, i), run.frozen)
        state = state.replace(actor=trained, actor_opt=actor_opt)
        collected.append(m)
      jax.block_until_ready(state.actor)
    # the rate the actor's next update takes, as verl logs its scheduler's after stepping it
    step_metrics["actor/lr"] = float(run.actor_lr((state.step + 1 - skipped) * actor.ppo_epochs * layout.minis))
  for m in jax.device_get(collected):
    for k, v in m.items():
      step_metrics.setdefault(k, []).append(float(v))
  for k, v in list(step_metrics.items()):
    if isinstance(v, list):
      step_metrics[k] = float(np.mean(v))
  return state


__all__ = ["PassOutputs", "StepData", "StepParts", "advantages", "experience", "forward", "forward_pass",
           "packing_of", "place_step", "update"]
