"""A step's rewards, rollout correction, advantages and returns: one pure function of the step's rows,
compiled as one program (`program`).

verl computes them on one driver over the whole batch; the statistics some
of them take (a whitening mean and variance, the mean KL the controller
steers by, the IS weights' batch mean, a group's mean) are over every row
of the step. Where `reads_every_row`, a multi-process job runs `stage` on
every host's rows (`rljax.sharding.hosts.gathered_rows`: the fields of
`inputs`, [N, R] each, sent to every host) and each host keeps its own
rows' results: the numbers one process gets, to the bit. Otherwise each
host runs it on its own rows (group statistics: a group is on one host).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from rljax.algos import advantages as adv_lib
from rljax.algos import kl as kl_lib
from rljax.algos import rollout_corr
from rljax.rl.experience import Experience

# the record's field each estimator argument (verl's name) comes from
_ESTIMATOR_FIELDS = {"index": "group", "values": "values", "reward_baselines": "reward_baselines",
                     "non_tensor_batch": "reward_components", "old_log_probs": "old_log_probs",
                     "sum_pi_squared": "sum_pi_squared"}


def inputs(config: ConfigDict) -> tuple[str, ...]:
  """The fields of a step's rows `stage` reads under `config`."""
  alg, corr = config.algorithm, config.algorithm.rollout_correction
  names = ["token_level_scores", "response_mask", "group"]
  if alg.use_kl_in_reward:
    names += ["old_log_probs", "ref_log_prob"]
  if corr.rollout_is or corr.rollout_rs or reports_mismatch(config):
    names += ["old_log_probs", "rollout_log_probs"]
  names += [_ESTIMATOR_FIELDS[n] for n in adv_lib.estimator_inputs(alg.adv_estimator).reads if n in _ESTIMATOR_FIELDS]
  return tuple(dict.fromkeys(names))


def reports_mismatch(config: ConfigDict) -> bool:
  """Whether the step reports the rollout's log-prob mismatch (`rollout_corr/*`) without correcting it: a
  quantized rollout (`rollout.quantization`) samples from other weights than the trainer's."""
  corr = config.algorithm.rollout_correction
  return bool(config.actor_rollout_ref.rollout.get("quantization")) and not (corr.rollout_is or corr.rollout_rs)


def reads_every_row(config: ConfigDict) -> bool:
  """Whether a statistic of `stage` is over the whole batch (not over one group's rows): a batch-wide
  estimator, the KL controller's mean KL, rollout correction's batch statistics (or its mismatch metrics)."""
  alg, corr = config.algorithm, config.algorithm.rollout_correction
  return bool(adv_lib.estimator_inputs(alg.adv_estimator).batch_wide or alg.use_kl_in_reward or corr.rollout_is
              or corr.rollout_rs or reports_mismatch(config))


def stage(config: ConfigDict, rows: Experience, kl_ctrl: Any) -> tuple[Experience, tuple[Any, dict[str, Any]]]:
  """The KL penalty in the reward, rollout correction, advantages and returns of a step's rows.

  Args:
    config: the run's config (algorithm.*, data.train_batch_size).
    rows: the fields `inputs(config)` names, [N, R] / [N] (`group` numbering the step's prompts
      0..data.train_batch_size - 1).
    kl_ctrl: the KL-in-reward controller.

  Returns:
    (rows' token_level_rewards, response_mask (under rollout correction: narrowed by rejection sampling),
    rollout_is_weights, advantages, returns), and (the controller after this step, metrics {name: scalar}).
  """
  alg, metrics = config.algorithm, {}
  token_rewards = jnp.asarray(rows.token_level_scores, jnp.float32)
  if alg.use_kl_in_reward:
    token_rewards, kl_ctrl, kl_metrics = kl_lib.apply_kl_penalty(
        token_rewards, rows.old_log_probs, rows.ref_log_prob, rows.response_mask, kl_ctrl, alg.kl_penalty)
    metrics.update(kl_metrics)
  mask, weights, corr = rows.response_mask, None, alg.rollout_correction
  if corr.rollout_is or corr.rollout_rs:
    weights, mask, corr_metrics = rollout_corr.compute_rollout_correction_and_rejection_mask(
        rows.old_log_probs, rows.rollout_log_probs, rows.response_mask, rollout_is=corr.rollout_is,
        rollout_is_threshold=corr.rollout_is_threshold, rollout_is_batch_normalize=corr.rollout_is_batch_normalize,
        rollout_rs=corr.rollout_rs, rollout_rs_threshold=corr.rollout_rs_threshold)
    metrics.update(corr_metrics)
    mask = jnp.asarray(mask, jnp.int32)
  elif reports_mismatch(config):
    metrics.update({f"rollout_corr/{k}": v for k, v in rollout_corr.compute_offpolicy_metrics(
        rows.old_log_probs, rows.rollout_log_probs, rows.response_mask).items()})
  adv, ret = adv_lib.compute_advantage(alg.adv_estimator, adv_lib.AdvantageInputs(
      token_rewards, mask, group_ids=rows.group, num_groups=config.data.train_batch_size, values=rows.values,
      reward_baselines=rows.reward_baselines, reward_components=rows.reward_components,
      old_log_probs=rows.old_log_probs, sum_pi_squared=rows.sum_pi_squared, rollout_is_weights=weights), alg)
  narrowed = mask if corr.rollout_is or corr.rollout_rs else None
  out = Experience(token_level_rewards=token_rewards, response_mask=narrowed, rollout_is_weights=weights,
                   advantages=jnp.asarray(adv, jnp.float32), returns=jnp.asarray(ret, jnp.float32))
  return out, (kl_ctrl, metrics)


def program(config: ConfigDict) -> Callable[[Experience, Any], tuple[Experience, tuple[Any, dict[str, Any]]]]:
  """`stage` under `config` as one jitted program, `(rows, kl_ctrl) -> stage's outputs` (compiled once per
  row count and set of reward components). The controller's coefficient enters as a float32 array, so its first
  step (a Python float) and the later ones (arrays) run the same program."""
  jitted = jax.jit(functools.partial(stage, config))

  def run(rows: Experience, kl_ctrl: Any) -> tuple[Experience, tuple[Any, dict[str, Any]]]:
    return jitted(rows, jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), kl_ctrl))

  return run
