"""The jitted steps of an RL run, built in one place for the trainer and `rljax.compile`.

A `Step` is a jitted function together with the abstract arguments a run
calls it with (shapes, dtypes and shardings): the trainer places its host
arrays by those shardings and calls it, and `rljax.compile` lowers the same
function on the same abstract arguments for a TPU topology, so what is
compiled there is what runs.

Every step traces the model inside `rljax.sharding.activation_sharding`, so
activations keep the batch sharding and FSDP weights are gathered rather
than activations all-reduced. An update computes each micro-batch's
gradient, constrains it to its parameter's sharding (XLA reduce-scatters
it), adds it to an accumulator laid out the same way, and applies the
optimizer once (`rljax.training.updates`); the actor and critic updates
scan their micro-batches inside one jit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax.algos import agg, policy_loss, value_loss
from rljax.config import kernel_names, validation
from rljax.config.fields import routers_frozen
from rljax.models import moe
from rljax.sharding import offload, rules as rules_lib
from rljax.sharding.placement import Step, abstract, gradient_compiler_options, key_struct, shardings_of
from rljax.training import optim as optim_lib
from rljax.training.updates import accumulate_gradients, apply_gradients, traced_in, training_model
from rljax.rl import experience as experience_lib, mtp as mtp_lib, packing, staleness
from rljax.rl.experience import MODEL_FIELDS, Experience
from rljax.rl.layout import Layout
from rljax.rl.sequences import response_log_probs

Metrics = dict[str, jax.Array]

def replays_routing(config: ConfigDict, on_policy: bool) -> bool:
  """Whether the update replays the old-log-prob pass's expert choices (router_replay.mode=R2, off-policy)."""
  return config.actor_rollout_ref.actor.router_replay.mode == "R2" and not on_policy


def replays_rollout_routing(config: ConfigDict) -> bool:
  """Whether every actor pass (old, reference, update) replays the rollout's expert choices (verl's R3)."""
  return config.actor_rollout_ref.actor.router_replay.mode == "R3"


def actor_update_fields(config: ConfigDict, on_policy: bool) -> tuple[str, ...]:
  """The `Experience` fields an actor mini-batch holds: the model rows, advantages and what the loss adds."""
  actor, corr = config.actor_rollout_ref.actor, config.algorithm.rollout_correction
  keys = MODEL_FIELDS + ("advantages",)
  if not on_policy:
    keys += ("old_log_probs",)
  if replays_routing(config, on_policy) or replays_rollout_routing(config):
    keys += ("routed_experts",)
  if actor.use_kl_loss:
    keys += ("ref_log_prob",)
  if (corr.rollout_is or corr.rollout_rs) and corr.rollout_is is not None and corr.rollout_is_threshold is not None:
    keys += ("rollout_is_weights",)
  if actor.positive_nll_coef:
    keys += ("positive",)
  return keys


def forward_fields(config: ConfigDict) -> tuple[str, ...]:
  """The `Experience` fields the old and reference log-prob passes read (the rollout's routing under R3)."""
  return MODEL_FIELDS + (("routed_experts",) if replays_rollout_routing(config) else ())


CRITIC_UPDATE_FIELDS = MODEL_FIELDS + ("values", "returns")

# What a packed pass's tokens (`rl.packing.PackedRows`) stand for in its batch.
PACKED_FIELDS = ("input_ids", "attention_mask", "positions", "responses", "routed_experts")


def packs_actor(config: ConfigDict) -> bool:
  """Whether the actor's passes (old and reference log-probs, the update) are packed: verl's
  actor.use_remove_padding (following actor_rollout_ref.model.use_remove_padding)."""
  return bool(config.actor_rollout_ref.actor.use_remove_padding)


def packs_critic(config: ConfigDict) -> bool:
  """Whether the critic's passes (values, the update) are packed: critic.model.use_remove_padding."""
  return bool(config.critic.model.use_remove_padding)


# ----- RL steps ----------------------------------------------------------------------------------


def _global_info(mask: jax.Array, rows: int) -> dict[str, Any]:
  """verl's global_batch_info for a mini-batch mask [micro_batches, slots, R] of `rows` rows (the slots past
  them, where a token budget forms the micro-batches, are empty: no mask)."""
  return {"dp_size": 1, "batch_num_tokens": jnp.sum(mask), "global_batch_size": rows}


def micro_rows(micro: Experience, empty_slots: bool = False) -> jax.Array | int:
  """The rows one micro-batch holds: a packed one's segments (empty slots have none), a padded one's slots, or
  where some may be empty (`empty_slots`) those holding a token."""
  if micro.packed is not None:
    return jnp.sum(jnp.max(micro.packed.segment_ids, axis=-1))
  if empty_slots:
    return jnp.sum(jnp.any(micro.attention_mask != 0, axis=-1))
  return micro.response_mask.shape[0]


def _reduce_metrics(metrics: Metrics) -> Metrics:
  """Loss terms are shares of the mini-batch loss (summed); other metrics are averaged."""
  return {k: (jnp.sum(v) if k.endswith("_loss") else jnp.mean(v)) for k, v in metrics.items()}


def actor_loss(graphdef: nnx.GraphDef, actor_config: Any, temperature: float, group_size: int,
               freeze: Callable[[tuple], bool] | None = None, mtp: mtp_lib.MTPTraining | None = None,
               empty_slots: bool = False) -> Callable:
  """(params, micro, info, key, frozen) -> (loss, metrics) of verl's PPO actor loss on one micro-batch
  (`freeze`: the leaves no gradient reaches, `actor_frozen_leaves`; `mtp`: plus the multi-token prediction
  loss, `rljax.rl.mtp`, whose counted tokens info["mtp_tokens"] holds; `empty_slots`: a padded micro-batch
  may hold slots of no row, `micro_rows`)."""
  entropy_in_loss = bool(actor_config.entropy_coeff)

  def loss_fn(params, micro: Experience, info, key, frozen=None):
    if freeze is not None:
      params = optim_lib.without_gradients(params, freeze)
    info = dict(info)
    mtp_tokens = info.pop("mtp_tokens", None)
    model = training_model(graphdef, params, frozen, key)
    log_prob, entropy, routing, *trunk = response_log_probs(model, micro, temperature, group_size=group_size,
                                                            with_routing=True, with_trunk=mtp is not None)
    old = jax.lax.stop_gradient(log_prob) if micro.old_log_probs is None else micro.old_log_probs
    loss, metrics = policy_loss.ppo_loss(
        actor_config, policy_loss.PolicyInputs(
            log_prob, old, micro.advantages, micro.response_mask, entropy=entropy if entropy_in_loss else None,
            ref_log_prob=micro.ref_log_prob, rollout_is_weights=micro.rollout_is_weights, positive=micro.positive,
            rows=None if micro.packed is None and not empty_slots else micro_rows(micro, empty_slots)),
        global_batch_info=info, rng=key)
    mask = micro.response_mask.astype(jnp.float32)
    metrics["actor/entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if routing is not None:
      share = micro_rows(micro, empty_slots) / info["global_batch_size"]
      aux, moe_metrics = router_loss(model.cfg, routing.stats, routing.tokens)
      loss = loss + model.cfg.router_aux_loss_coef * share * aux
      metrics = {**metrics, **moe_metrics, "actor/moe_aux_loss": share * aux}
    if mtp is not None:
      mtp_loss, mtp_metrics = mtp_lib.loss_and_metrics(mtp_lib.cross_entropy_sums(model, micro, trunk[0], mtp),
                                                       mtp_tokens, mtp)
      loss, metrics = loss + mtp_loss, {**metrics, **mtp_metrics}
    return loss, metrics

  return loss_fn


def mtp_info(depths: int) -> Callable[[Experience], dict[str, jax.Array]]:
  """mini-batch [M, rows, ...] -> {"mtp_tokens": [K] the tokens each depth's loss counts in it}."""
  def info(mini: Experience) -> dict[str, jax.Array]:
    return {"mtp_tokens": jnp.sum(jax.vmap(lambda micro: mtp_lib.counted_tokens(micro, depths))(mini), axis=0)}
  return info


def router_loss(cfg: Any, stats: jax.Array, tokens: jax.Array) -> tuple[jax.Array, Metrics]:
  """A mixture-of-experts model's load-balancing loss over one micro-batch, and its expert-load metrics.

  Args:
    cfg: the ModelConfig.
    stats: [L_sparse, 2, E] router stats; tokens: the token positions they cover.

  Returns:
    (HF's auxiliary loss (`moe.load_balancing_loss`), {actor/moe_max_load:
    the busiest expert's copies over the mean, worst layer;
    actor/moe_max_load/layer_{i}: the same per sparse layer i}).
  """
  loads = jax.lax.stop_gradient(moe.max_load(stats))
  metrics = {f"actor/moe_max_load/layer_{i}": loads[j] for j, i in enumerate(cfg.sparse_layers)}
  return moe.load_balancing_loss(stats, tokens), {"actor/moe_max_load": jnp.max(loads), **metrics}


def critic_loss(graphdef: nnx.GraphDef, critic_config: Any, group_size: int) -> Callable:
  """(params, micro, info, key) -> (loss, metrics) of verl's clipped value loss on one micro-batch (its
  seq-mean-token-sum-norm divisor critic.loss_scale_factor, which follows the actor's, as in verl 0.9.1)."""
  def loss_fn(params, micro: Experience, info, key):
    del key
    vpreds = nnx.merge(graphdef, params).response_values(micro, group_size)
    loss, clipfrac = value_loss.compute_value_loss(
        vpreds, micro.returns, micro.values, micro.response_mask, critic_config.cliprange_value,
        loss_agg_mode=critic_config.loss_agg_mode, loss_scale_factor=critic_config.loss_scale_factor, **info)
    mask = micro.response_mask.astype(jnp.float32)
    vpred_mean = agg.agg_loss(vpreds, mask, "token-mean")
    return loss, {"critic/vf_loss": loss, "critic/vf_clipfrac": clipfrac, "critic/vpred_mean": vpred_mean}

  return loss_fn


def update_step(loss_fn: Callable, tx: optax.GradientTransformation, shardings: Any, metric_prefix: str,
                rows: int, homes: tuple[Any, Any] | None = None,
                info_of: Callable[[Experience], dict[str, jax.Array]] | None = None) -> Callable:
  """(params, opt_state, mini, rng, *extra) -> (params, opt_state, metrics): accumulate, then one update.

  `loss_fn(params, micro, info, key, *extra)`; info is verl's global batch
  info of the whole mini-batch (`rows` rows), so every micro-batch's loss is its share, and what `info_of`
  adds from the mini-batch.
  `shardings`: the parameters' in device memory. `homes`: the abstract params and optimizer state as the step
  takes them; those in host memory are brought in (the optimizer state for the optimizer step,
  `rljax.sharding.offload`).
  """
  def step(params, opt_state, mini: Experience, rng, *extra):
    if homes is not None:
      params = offload.brought_in(params, homes[0])
    info = {**_global_info(mini.response_mask, rows), **(info_of(mini) if info_of is not None else {})}
    keys = jax.random.split(rng, mini.response_mask.shape[0])
    grads, metrics = accumulate_gradients(lambda p, micro, key: loss_fn(p, micro, info, key, *extra), params, mini,
                                          keys, shardings)
    if homes is not None:
      opt_state = offload.brought_in(opt_state, homes[1])
    params, opt_state, grad_norm = apply_gradients(tx, params, opt_state, grads)
    return params, opt_state, {**_reduce_metrics(metrics), f"{metric_prefix}/grad_norm": grad_norm}

  return step


def make_update(name: str, loss_fn: Callable, tx: optax.GradientTransformation, mesh: Mesh, rules: Any,
                params: Any, opt_shardings: Any, batch: Experience, rows: int, frozen: Any = None,
                metric_prefix: str = "actor", info_of: Callable | None = None) -> Step:
  """The jitted update Step over mini-batches of `rows` rows (in `batch`'s slots): params and optimizer state
  donated, laid out as they came (in host memory where offloaded: brought in for the step and back out after
  it); `info_of` as in `update_step`."""
  param_sh = shardings_of(params)
  args = (abstract(params), abstract(jax.eval_shape(tx.init, params), opt_shardings), batch, key_struct(mesh))
  step = traced_in(mesh, rules, update_step(loss_fn, tx, offload.device_shardings(param_sh), metric_prefix,
                                            rows=rows, homes=args[:2],
                                            info_of=info_of))
  if frozen is not None:
    args += (abstract(frozen),)
  fn = jax.jit(step, in_shardings=jax.tree.map(lambda x: x.sharding, args),
               out_shardings=(param_sh, opt_shardings, None), donate_argnums=(0, 1),
               compiler_options=gradient_compiler_options(mesh))
  return Step(name, fn, args)


def make_forward(name: str, fn: Callable, mesh: Mesh, rules: Any, params: Any, batch: Any) -> Step:
  """A jitted forward pass `fn(params, micro)` over every micro-batch of `batch` (a pytree of abstract
  [M, rows, ...] arrays), one at a time; its [M, rows, ...] outputs keep the rows where the batch put them
  (each host's rows on its own devices). Parameters in host memory are brought in for the pass."""
  args = (abstract(params), batch)

  def forward(params, batch):
    params = offload.brought_in(params, args[0])
    out = jax.lax.map(lambda micro: fn(params, micro), batch)
    return jax.tree.map(lambda x: rules_lib.constrain(x, (None, "batch") + (None,) * (x.ndim - 2)), out)

  return Step(name, jax.jit(traced_in(mesh, rules, forward), in_shardings=jax.tree.map(lambda x: x.sharding, args)),
              args)


def log_prob_fn(graphdef: nnx.GraphDef, temperature: float, with_entropy: bool = True,
                group_size: int = 1, record_routing: bool = False, sum_pi_squared: bool = False) -> Callable:
  """(params, rows) -> (log_probs [N, R], entropy [N, R][, routed experts [N, P + R, L_sparse, k]]).

  group_size: see `response_hidden`; record_routing: also each token's experts (router replay);
  sum_pi_squared: Σ_v π_v² in the entropy's place (the optimal-token-baseline estimators read it).
  """
  def fn(params, batch):
    log_probs, entropy, routing = response_log_probs(nnx.merge(graphdef, params), batch, temperature, with_entropy,
                                                     group_size=group_size, with_routing=True,
                                                     sum_pi_squared=sum_pi_squared)
    return (log_probs, entropy, routing.experts) if record_routing else (log_probs, entropy)
  return fn


def value_fn(graphdef: nnx.GraphDef, group_size: int = 1) -> Callable:
  """(critic params, rows) -> values [N, R]."""
  return lambda params, batch: nnx.merge(graphdef, params).response_values(batch, group_size)


class SplitModel(NamedTuple):
  """A model as its graph and its parameters (`nnx.split`)."""

  graphdef: nnx.GraphDef
  params: Any


class CriticParts(NamedTuple):
  """What the critic's steps are built from."""

  graphdef: nnx.GraphDef
  params: Any
  tx: optax.GradientTransformation
  opt_shardings: Any


@dataclasses.dataclass
class RLSteps:
  """The jitted steps of an RL run (None where the run has no such step).

  Attributes:
    groups: rows per shared prompt of each padded step, by its name.
    padded: where any step packs, every step reading padded rows (each step runs whichever of the two
      computes fewer tokens for the step's rows, `rl.packing.padded_pays`; `rljax.compile` lowers the
      packed ones, at their largest).
  """

  actor_update: Step
  old_log_prob: Step
  ref_log_prob: Step | None
  critic_update: Step | None
  values: Step | None
  groups: dict[str, int] = dataclasses.field(default_factory=dict)
  padded: "RLSteps | None" = None

  def all(self) -> list[Step]:
    return [s for s in (self.actor_update, self.critic_update, self.old_log_prob, self.ref_log_prob, self.values)
            if s is not None]


def on_policy(config: ConfigDict, layout: Layout, lora_dropout: bool) -> bool:
  """Whether the old log-probs equal the update's own (one epoch, one mini-batch, nothing reading them before:
  not the KL in the reward, rollout correction or an optimal-token-baseline estimator; every response generated
  by the weights the update starts from: not by their 8-bit copy, whose mismatch the step reports from the old
  log-probs)."""
  arr, alg = config.actor_rollout_ref, config.algorithm
  corr = alg.rollout_correction
  return (arr.actor.ppo_epochs == 1 and layout.minis == 1 and not alg.use_kl_in_reward
          and not (corr.rollout_is or corr.rollout_rs) and not corr.bypass_mode and not lora_dropout
          and not staleness.streams_off_policy(config) and not arr.rollout.get("quantization")
          and not needs_sum_pi_squared(config))


def needs_sum_pi_squared(config: ConfigDict) -> bool:
  """Whether the old-log-prob pass also computes Σ_v π_v² per response token (verl's
  actor.calculate_sum_pi_squared, read by the optimal-token-baseline estimators)."""
  return config.algorithm.adv_estimator in kernel_names.sum_pi_squared_estimators()


def uses_critic(config: ConfigDict) -> bool:
  """critic.enable, or by default whether the estimator needs values (GAE)."""
  return validation.has_a_critic(config)


def needs_reference(config: ConfigDict) -> bool:
  return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


def image_trailing(vision: Any) -> dict[str, tuple[int, ...]]:
  """The trailing axes of a vision-language run's batches' fields as its steps are built and compiled ahead (one
  merged patch per row; a step's own rows are as wide as its widest and compile once per width)."""
  q = vision.merge_unit
  return {"positions": (3,), "pixels": (q, int(np.prod(vision.patch_shape))), "patch_order": (q,),
          "patch_rotary": (q, 4), "patch_windows": (q,), "patch_frames": (q,), "merge_restore": (1,)}


def actor_frozen_leaves(config: ConfigDict, vision: bool, moe: bool) -> Callable[[tuple], bool] | None:
  """The actor's leaves that neither take a gradient nor move (`optim.frozen_leaves`): a vision-language model's
  tower under actor.freeze_vision_tower, a mixture of experts' routers under Megatron's freeze_moe_router
  (`config.fields.routers_frozen`)."""
  arr = config.actor_rollout_ref
  return optim_lib.frozen_leaves(vision and bool(arr.actor.freeze_vision_tower),
                                 moe and routers_frozen(config) is not None)


def build_rl_steps(config: ConfigDict, layout: Layout, mesh: Mesh, rules: Any, *, graphdef: nnx.GraphDef,
                   trainable: Any, frozen: Any, actor_tx: optax.GradientTransformation, actor_opt_sh: Any,
                   lora_dropout: bool, reference: SplitModel | None = None, critic: CriticParts | None = None,
                   routing: tuple[int, int] | None = None, packing_allowed: bool = True,
                   vision: Any = None, mtp_layers: int = 0) -> RLSteps:
  """Every jitted step of an RL run.

  Args:
    config, layout: the run's config and batch geometry.
    mesh, rules: the job's mesh and logical-axis rules.
    graphdef, trainable, frozen: the actor (`lora.split_trainable`), real
      arrays or ShapeDtypeStructs with shardings.
    actor_tx, actor_opt_sh: the actor's optimizer and its state's shardings.
    lora_dropout: LoRA dropout draws a mask per row (no shared-prompt update).
    reference: the reference policy, when the run needs one.
    critic: the critic, when the run has one.
    routing: (L_sparse, k) of a mixture-of-experts actor (None for a dense one).
    packing_allowed: False builds every step over padded rows.
    vision: a vision-language actor's tower config: the actor's passes read the rows' images
      (`experience.IMAGE_FIELDS`, as wide as each step's widest row; a packed pass's buffers their members')
      and M-RoPE positions [N, P + R, 3].
    mtp_layers: the actor's multi-token prediction layers (the update trains them where the config says,
      `rljax.rl.mtp`).
  """
  arr = config.actor_rollout_ref
  temperature = float(arr.rollout.temperature) or 1.0
  lengths = dict(prompt_length=layout.prompt_length, response_length=layout.response_length, mesh=mesh, rules=rules)
  trailing = None if vision is None else image_trailing(vision)

  def batch_of(fields: tuple[str, ...], micro_batches: int, rows: int, packed: bool,
               recorded: bool = False) -> Experience:
    """The abstract [M, rows / M, ...] batch of `fields`, their tokens packed when `packed` (with the experts
    they replay, and where `recorded` the index reading the pass's routing back into rows)."""
    if not packed:
      if vision is not None and "positions" in fields:
        fields = (*fields, *experience_lib.IMAGE_FIELDS)
      return experience_lib.spec(fields, micro_batches, rows, routing=routing, trailing=trailing, **lengths)
    batch = experience_lib.spec([f for f in fields if f not in PACKED_FIELDS], micro_batches, rows, **lengths)
    replayed = routing if "routed_experts" in fields else None
    return batch.replace(packed=packing.spec(micro_batches, rows, replayed=replayed, recorded=recorded,
                                             vision_config=vision, **lengths))

  shuffled = bool(arr.actor.shuffle)
  off_policy = not on_policy(config, layout, lora_dropout)
  actor_packed = packing_allowed and packs_actor(config)
  critic_packed = packing_allowed and packs_critic(config)
  actor_batch = batch_of(actor_update_fields(config, not off_policy), layout.micro_batches, layout.mini_slots,
                         actor_packed)
  mtp = None if mtp_layers == 0 else mtp_lib.training_of(config, mtp_layers)
  # the multi-token prediction layers read every position's trunk state: whole rows, no shared prompt
  actor_group = 1 if lora_dropout or actor_packed or mtp is not None else layout.update_group(shuffled)
  actor_update = make_update("actor_update",
                             actor_loss(graphdef, arr.actor, temperature, actor_group,
                                        actor_frozen_leaves(config, vision is not None, routing is not None), mtp,
                                        empty_slots=layout.mini_slots != layout.mini_rows),
                             actor_tx, mesh, rules, trainable, actor_opt_sh, actor_batch, layout.mini_rows, frozen=frozen,
                             info_of=None if mtp is None else mtp_info(mtp.depths))

  def forward_rows(phase: str, packed: bool, keys: tuple[str, ...] = forward_fields(config),
                   recorded: bool = False) -> Experience:
    if packed:  # the packed tokens stand for the rows; the experts they replay go into them too
      keys = tuple(k for k in keys if k in PACKED_FIELDS)
    return batch_of(keys, layout.forward_micros[phase], layout.row_slots, packed, recorded)

  def group_of(phase: str, packed: bool) -> int:
    return 1 if packed else layout.forward_group(phase)

  actor_params = nnx.merge_state(trainable, frozen) if frozen is not None else trainable
  records = replays_routing(config, not off_policy)
  old = make_forward("old_log_prob", log_prob_fn(graphdef, temperature, False, group_of("old_log_prob", actor_packed),
                                                 record_routing=records, sum_pi_squared=needs_sum_pi_squared(config)),
                     mesh, rules, actor_params, forward_rows("old_log_prob", actor_packed, recorded=records))
  ref = None
  if reference is not None:
    ref = make_forward("ref_log_prob", log_prob_fn(reference.graphdef, temperature, False,
                                                   group_of("ref", actor_packed)),
                       mesh, rules, reference.params, forward_rows("ref", actor_packed))
  critic_update = values = None
  critic_group = 1 if critic_packed else layout.update_group(shuffled)
  if critic is not None:
    critic_update = make_update(
        "critic_update", critic_loss(critic.graphdef, config.critic, critic_group), critic.tx, mesh,
        rules, critic.params, critic.opt_shardings,
        batch_of(CRITIC_UPDATE_FIELDS, layout.micro_batches, layout.mini_slots, critic_packed), layout.mini_rows,
        metric_prefix="critic")
    values = make_forward("values", value_fn(critic.graphdef, group_of("values", critic_packed)), mesh, rules,
                          critic.params, forward_rows("values", critic_packed, MODEL_FIELDS))
  groups = {"actor_update": actor_group, "old_log_prob": group_of("old_log_prob", actor_packed),
            "ref_log_prob": group_of("ref", actor_packed), "values": group_of("values", critic_packed),
            "critic_update": critic_group}
  padded = None
  if actor_packed or critic_packed:
    padded = build_rl_steps(config, layout, mesh, rules, graphdef=graphdef, trainable=trainable, frozen=frozen,
                            actor_tx=actor_tx, actor_opt_sh=actor_opt_sh, lora_dropout=lora_dropout,
                            reference=reference, critic=critic, routing=routing, packing_allowed=False,
                            vision=vision, mtp_layers=mtp_layers)
  return RLSteps(actor_update=actor_update, old_log_prob=old, ref_log_prob=ref, critic_update=critic_update,
                 values=values, groups=groups, padded=padded)
