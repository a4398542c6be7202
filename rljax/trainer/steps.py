"""The jitted steps of a run, built in one place for the trainer, SFT and `rljax.compile`.

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
optimizer once (`accumulate_gradients`, `apply_gradients`); the actor and
critic updates scan their micro-batches inside one jit, SFT (whose
micro-batch count varies with packing) calls the same two cores from the
host.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from rljax.algos import agg, policy_loss, value_loss
from rljax.models import lora, moe
from rljax.sharding import rules as rules_lib
from rljax.sharding.placement import Step, abstract, gradient_compiler_options, key_struct, shardings_of
from rljax.trainer.layout import Layout
from rljax.trainer.sequences import response_log_probs

Metrics = dict[str, jax.Array]

MODEL_KEYS = ("input_ids", "attention_mask", "positions", "responses", "response_mask")
# [.., P + R] (routed_experts: [.., P + R, L_sparse, k]); the rest are [.., R] or per row
_ROW_KEYS = ("input_ids", "attention_mask", "positions", "routed_experts")
_PER_ROW = ("positive",)
_DTYPES = {"input_ids": jnp.int32, "attention_mask": jnp.int32, "positions": jnp.int32, "responses": jnp.int32,
           "response_mask": jnp.int32, "positive": jnp.bool_, "routed_experts": jnp.int32}


def place(host: dict[str, Any], spec: dict[str, jax.ShapeDtypeStruct]) -> dict[str, jax.Array]:
  """The arrays of `host` that `spec` names, placed by its shardings (a multi-host job passes its own rows)."""
  missing = [k for k in spec if k not in host]
  if missing:
    raise KeyError(f"the batch lacks {missing} (has {sorted(host)})")
  return {k: jax.make_array_from_process_local_data(s.sharding, np.asarray(host[k]), s.shape)
          for k, s in spec.items()}


# ----- batches ---------------------------------------------------------------------------------


def row_shape(key: str, rows: int, prompt_length: int, response_length: int) -> tuple[int, ...]:
  """Shape of the array `key` for `rows` rows: [rows, P + R], [rows, R] or [rows]."""
  if key in _ROW_KEYS:
    return (rows, prompt_length + response_length)
  if key in _PER_ROW:
    return (rows,)
  return (rows, response_length)


def micro_batch_spec(keys: tuple[str, ...], micro_batches: int, rows: int, prompt_length: int, response_length: int,
                     mesh: Mesh, rules: Any, routing: tuple[int, int] | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """[micro_batches, rows / micro_batches, ...] arrays named `keys` (rows of P + R tokens), rows over the batch rule.

  `routing`: (L_sparse, k), the trailing dimensions of `routed_experts`.
  """
  per = rows // micro_batches
  out = {}
  for key in keys:
    trailing = tuple(routing) if key == "routed_experts" else ()
    shape = (micro_batches, *row_shape(key, per, prompt_length, response_length), *trailing)
    spec = rules_lib.logical_to_spec((None, "batch") + (None,) * (len(shape) - 2), shape, mesh, rules)
    out[key] = jax.ShapeDtypeStruct(shape, _DTYPES.get(key, jnp.float32), sharding=NamedSharding(mesh, spec))
  return out


def replays_routing(config: ConfigDict, on_policy: bool) -> bool:
  """Whether the update replays the old-log-prob pass's expert choices (router_replay.mode=R2, off-policy)."""
  return config.actor_rollout_ref.actor.router_replay.mode == "R2" and not on_policy


def replays_rollout_routing(config: ConfigDict) -> bool:
  """Whether every actor pass (old, reference, update) replays the rollout's expert choices (verl's R3)."""
  return config.actor_rollout_ref.actor.router_replay.mode == "R3"


def actor_batch_keys(config: ConfigDict, on_policy: bool) -> tuple[str, ...]:
  """What an actor mini-batch holds besides the model rows and advantages (see `build_rl_steps`)."""
  actor, corr = config.actor_rollout_ref.actor, config.algorithm.rollout_correction
  keys = MODEL_KEYS + ("advantages",)
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


CRITIC_KEYS = MODEL_KEYS + ("values", "returns")


# ----- the update core ---------------------------------------------------------------------------


def constrained_grad(loss_fn: Callable, params: Any, shardings: Any, *args) -> tuple[Any, Any]:
  """(loss_fn's (loss, aux), its gradient in `params` laid out by `shardings`: reduce-scattered, not all-reduced)."""
  out, grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *args)
  return out, jax.lax.with_sharding_constraint(grads, shardings)


def accumulate_gradients(loss_fn: Callable, params: Any, micro_batches: dict[str, jax.Array], keys: jax.Array,
                         shardings: Any) -> tuple[Any, Metrics]:
  """Sum over micro-batches of grad `loss_fn(params, micro, key)` (in the parameters' dtypes), and the
  stacked metrics.

  Args:
    loss_fn: (params, micro-batch, key) -> (loss, metrics).
    micro_batches: [M, rows, ...] arrays.
    keys: [M] PRNG keys.
    shardings: the parameters' shardings (gradients and the sum are laid out by them).
  """
  as_params = lambda grads: jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)  # noqa: E731
  if keys.shape[0] == 1:  # one micro-batch: no accumulator to hold beside the gradient
    (_, metrics), grads = constrained_grad(loss_fn, params, shardings, *jax.tree.map(lambda x: x[0],
                                                                                     (micro_batches, keys)))
    return as_params(grads), jax.tree.map(lambda m: m[None], metrics)

  def body(total, xs):
    micro, key = xs
    (_, metrics), grads = constrained_grad(loss_fn, params, shardings, micro, key)
    return jax.tree.map(lambda t, g: t + g.astype(t.dtype), total, grads), metrics

  zeros = jax.lax.with_sharding_constraint(jax.tree.map(jnp.zeros_like, params), shardings)
  return jax.lax.scan(body, zeros, (micro_batches, keys))


def apply_gradients(tx: optax.GradientTransformation, params: Any, opt_state: Any, grads: Any):
  """(params, opt_state) after one optimizer update, and the global gradient norm before clipping."""
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, optax.tree.norm(grads)


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, mesh: Mesh, rules: Any, param_shardings: Any,
                    opt_shardings: Any, batch_shardings: Any) -> Callable:
  """jitted `(params, opt_state, batch) -> (params, opt_state, loss, aux)`: one gradient and one update.

  `loss_fn(params, batch) -> (loss, aux)`; the update cores of the RL and SFT
  steps on a single batch (params and optimizer state donated).
  """
  def step(params, opt_state, batch):
    (loss, aux), grads = constrained_grad(loss_fn, params, param_shardings, batch)
    params, opt_state, _ = apply_gradients(tx, params, opt_state, grads)
    return params, opt_state, loss, aux

  return jax.jit(traced_in(mesh, rules, step), in_shardings=(param_shardings, opt_shardings, batch_shardings),
                 out_shardings=(param_shardings, opt_shardings, None, None), donate_argnums=(0, 1),
                 compiler_options=gradient_compiler_options(mesh))


def traced_in(mesh: Mesh, rules: Any, fn: Callable) -> Callable:
  """`fn` whose body is traced inside `activation_sharding(mesh, rules)`."""
  @functools.wraps(fn)
  def wrapped(*args):
    with rules_lib.activation_sharding(mesh, rules):
      return fn(*args)
  return wrapped


# ----- RL steps ----------------------------------------------------------------------------------


def _global_info(mask: jax.Array) -> dict[str, Any]:
  """verl's global_batch_info for a mini-batch mask [micro_batches, rows, R]."""
  return {"dp_size": 1, "batch_num_tokens": jnp.sum(mask), "global_batch_size": mask.shape[0] * mask.shape[1]}


def _reduce_metrics(metrics: Metrics) -> Metrics:
  """Loss terms are shares of the mini-batch loss (summed); other metrics are averaged."""
  return {k: (jnp.sum(v) if k.endswith("_loss") else jnp.mean(v)) for k, v in metrics.items()}


def training_model(graphdef: nnx.GraphDef, params: Any, frozen: Any, key: jax.Array) -> Any:
  """The model from its trained and frozen state, in training mode.

  Training mode turns LoRA dropout on, its masks drawn from `key`
  (rljax.models.lora.seed_dropout); a model without dropout is unchanged.
  """
  frozen = nnx.State({}) if frozen is None else lora.seed_dropout(frozen, jax.random.fold_in(key, 1))
  model = nnx.merge(graphdef, params, frozen)
  model.train()
  return model


def actor_loss(graphdef: nnx.GraphDef, actor_config: Any, temperature: float, group_size: int) -> Callable:
  """(params, micro, info, key, frozen) -> (loss, metrics) of verl's PPO actor loss on one micro-batch."""
  entropy_in_loss = bool(actor_config.entropy_coeff)

  def loss_fn(params, micro, info, key, frozen=None):
    model = training_model(graphdef, params, frozen, key)
    log_prob, entropy, routing = response_log_probs(model, micro, temperature, group_size=group_size,
                                                    with_routing=True)
    old = micro.get("old_log_probs", jax.lax.stop_gradient(log_prob))
    loss, metrics = policy_loss.ppo_loss(
        actor_config, log_prob, old, micro["advantages"], micro["response_mask"],
        entropy=entropy if entropy_in_loss else None, ref_log_prob=micro.get("ref_log_prob"),
        rollout_is_weights=micro.get("rollout_is_weights"), positive=micro.get("positive"),
        global_batch_info=info, rng=key)
    mask = micro["response_mask"].astype(jnp.float32)
    metrics["actor/entropy"] = jnp.sum(jax.lax.stop_gradient(entropy) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if routing is not None:
      share = micro["response_mask"].shape[0] / info["global_batch_size"]
      aux, moe_metrics = router_loss(model.cfg, routing.stats, routing.tokens)
      loss = loss + model.cfg.router_aux_loss_coef * share * aux
      metrics = {**metrics, **moe_metrics, "actor/moe_aux_loss": share * aux}
    return loss, metrics

  return loss_fn


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
  """(params, micro, info, key) -> (loss, metrics) of verl's clipped value loss on one micro-batch."""
  def loss_fn(params, micro, info, key):
    del key
    vpreds = nnx.merge(graphdef, params).response_values(micro, group_size)
    loss, clipfrac = value_loss.compute_value_loss(
        vpreds, micro["returns"], micro["values"], micro["response_mask"], critic_config.cliprange_value,
        loss_agg_mode=critic_config.loss_agg_mode, **info)
    mask = micro["response_mask"].astype(jnp.float32)
    vpred_mean = agg.agg_loss(vpreds, mask, "token-mean")
    return loss, {"critic/vf_loss": loss, "critic/vf_clipfrac": clipfrac, "critic/vpred_mean": vpred_mean}

  return loss_fn


def update_step(loss_fn: Callable, tx: optax.GradientTransformation, shardings: Any, metric_prefix: str) -> Callable:
  """(params, opt_state, mini, rng, *extra) -> (params, opt_state, metrics): accumulate, then one update.

  `loss_fn(params, micro, info, key, *extra)`; info is verl's global batch
  info of the whole mini-batch, so every micro-batch's loss is its share.
  """
  def step(params, opt_state, mini, rng, *extra):
    info = _global_info(mini["response_mask"])
    keys = jax.random.split(rng, mini["response_mask"].shape[0])
    grads, metrics = accumulate_gradients(lambda p, micro, key: loss_fn(p, micro, info, key, *extra), params, mini,
                                          keys, shardings)
    params, opt_state, grad_norm = apply_gradients(tx, params, opt_state, grads)
    return params, opt_state, {**_reduce_metrics(metrics), f"{metric_prefix}/grad_norm": grad_norm}

  return step


def make_update(name: str, loss_fn: Callable, tx: optax.GradientTransformation, mesh: Mesh, rules: Any,
                params: Any, opt_shardings: Any, batch: dict[str, jax.ShapeDtypeStruct], frozen: Any = None,
                metric_prefix: str = "actor") -> Step:
  """The jitted update Step: params and optimizer state donated, laid out as they came."""
  param_sh = shardings_of(params)
  step = traced_in(mesh, rules, update_step(loss_fn, tx, param_sh, metric_prefix))
  args = (abstract(params), abstract(jax.eval_shape(tx.init, params), opt_shardings), batch, key_struct(mesh))
  if frozen is not None:
    args += (abstract(frozen),)
  fn = jax.jit(step, in_shardings=jax.tree.map(lambda x: x.sharding, args),
               out_shardings=(param_sh, opt_shardings, None), donate_argnums=(0, 1),
               compiler_options=gradient_compiler_options(mesh))
  return Step(name, fn, args)


def make_forward(name: str, fn: Callable, mesh: Mesh, rules: Any, params: Any,
                 batch: dict[str, jax.ShapeDtypeStruct]) -> Step:
  """A jitted forward pass `fn(params, micro)` over every micro-batch of `batch` ([M, rows, ...]), one at a time."""
  def forward(params, batch):
    return jax.lax.map(lambda micro: fn(params, micro), batch)

  args = (abstract(params), batch)
  return Step(name, jax.jit(traced_in(mesh, rules, forward), in_shardings=jax.tree.map(lambda x: x.sharding, args)),
              args)


def log_prob_fn(graphdef: nnx.GraphDef, temperature: float, with_entropy: bool = True,
                group_size: int = 1, record_routing: bool = False) -> Callable:
  """(params, rows) -> (log_probs [N, R], entropy [N, R][, routed experts [N, P + R, L_sparse, k]]).

  group_size: see `response_hidden`; record_routing: also each token's experts (router replay).
  """
  def fn(params, batch):
    log_probs, entropy, routing = response_log_probs(nnx.merge(graphdef, params), batch, temperature, with_entropy,
                                                     group_size=group_size, with_routing=True)
    return (log_probs, entropy, routing.experts) if record_routing else (log_probs, entropy)
  return fn


def value_fn(graphdef: nnx.GraphDef, group_size: int = 1) -> Callable:
  """(critic params, rows) -> values [N, R]."""
  return lambda params, batch: nnx.merge(graphdef, params).response_values(batch, group_size)


@dataclasses.dataclass
class RLSteps:
  """The jitted steps of an RL run (None where the run has no such step)."""

  actor_update: Step
  old_log_prob: Step
  ref_log_prob: Step | None
  critic_update: Step | None
  values: Step | None

  def all(self) -> list[Step]:
    return [s for s in (self.actor_update, self.critic_update, self.old_log_prob, self.ref_log_prob, self.values)
            if s is not None]


def on_policy(config: ConfigDict, layout: Layout, lora_dropout: bool) -> bool:
  """Whether the old log-probs equal the update's own (one epoch, one mini-batch, nothing reading them before)."""
  arr, alg = config.actor_rollout_ref, config.algorithm
  corr = alg.rollout_correction
  return (arr.actor.ppo_epochs == 1 and layout.minis == 1 and not alg.use_kl_in_reward
          and not (corr.rollout_is or corr.rollout_rs) and not corr.bypass_mode and not lora_dropout)


def uses_critic(config: ConfigDict) -> bool:
  """critic.enable, or by default whether the estimator is GAE."""
  enable = config.critic.enable
  return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def needs_reference(config: ConfigDict) -> bool:
  return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


def build_rl_steps(config: ConfigDict, layout: Layout, mesh: Mesh, rules: Any, *, graphdef: nnx.GraphDef,
                   trainable: Any, frozen: Any, actor_tx: optax.GradientTransformation, actor_opt_sh: Any,
                   lora_dropout: bool, reference: tuple[nnx.GraphDef, Any] | None = None,
                   critic: tuple[nnx.GraphDef, Any, optax.GradientTransformation, Any] | None = None,
                   routing: tuple[int, int] | None = None) -> RLSteps:
  """Every jitted step of an RL run.

  Args:
    config, layout: the run's config and batch geometry.
    mesh, rules: the job's mesh and logical-axis rules.
    graphdef, trainable, frozen: the actor (`lora.split_trainable`), real
      arrays or ShapeDtypeStructs with shardings.
    actor_tx, actor_opt_sh: the actor's optimizer and its state's shardings.
    lora_dropout: LoRA dropout draws a mask per row (no shared-prompt update).
    reference: (graphdef, params) of the reference policy, when the run needs one.
    critic: (graphdef, params, optimizer, optimizer-state shardings) of the critic.
    routing: (L_sparse, k) of a mixture-of-experts actor (None for a dense one).
  """
  arr = config.actor_rollout_ref
  temperature = float(arr.rollout.temperature) or 1.0
  micro_rows = functools.partial(micro_batch_spec, prompt_length=layout.prompt_length,
                                 response_length=layout.response_length, mesh=mesh, rules=rules, routing=routing)
  shuffled = bool(arr.actor.shuffle)
  off_policy = not on_policy(config, layout, lora_dropout)
  actor_batch = micro_rows(actor_batch_keys(config, not off_policy), layout.micro_batches, layout.mini_rows)
  actor_group = 1 if lora_dropout else layout.update_group(shuffled)
  actor_update = make_update("actor_update", actor_loss(graphdef, arr.actor, temperature, actor_group), actor_tx,
                             mesh, rules, trainable, actor_opt_sh, actor_batch, frozen=frozen)
  forward_keys = MODEL_KEYS + (("routed_experts",) if replays_rollout_routing(config) else ())
  forward_rows = lambda phase, keys=forward_keys: micro_rows(keys, layout.forward_micros[phase], layout.rows)  # noqa: E731
  actor_params = nnx.merge_state(trainable, frozen) if frozen is not None else trainable
  old = make_forward("old_log_prob", log_prob_fn(graphdef, temperature, False, layout.forward_group("old_log_prob"),
                                                 record_routing=replays_routing(config, not off_policy)),
                     mesh, rules, actor_params, forward_rows("old_log_prob"))
  ref = None
  if reference is not None:
    ref = make_forward("ref_log_prob", log_prob_fn(reference[0], temperature, False, layout.forward_group("ref")),
                       mesh, rules, reference[1], forward_rows("ref"))
  critic_update = values = None
  if critic is not None:
    critic_graphdef, critic_params, critic_tx, critic_opt_sh = critic
    critic_update = make_update(
        "critic_update", critic_loss(critic_graphdef, config.critic, layout.update_group(shuffled)), critic_tx, mesh,
        rules, critic_params, critic_opt_sh, micro_rows(CRITIC_KEYS, layout.micro_batches, layout.mini_rows),
        metric_prefix="critic")
    values = make_forward("values", value_fn(critic_graphdef, layout.forward_group("values")), mesh, rules,
                          critic_params, forward_rows("values", MODEL_KEYS))
  return RLSteps(actor_update=actor_update, old_log_prob=old, ref_log_prob=ref, critic_update=critic_update,
                 values=values)
