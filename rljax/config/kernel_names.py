"""Algorithm names the config accepts, read from the kernels' registries (`rljax.algos`).

Each function imports `rljax.algos` when called: it loads JAX, which reading,
printing or overriding a config does not need.
"""

from __future__ import annotations

from typing import Any, Callable


def adv_estimators() -> tuple[str, ...]:
  """`algorithm.adv_estimator`: the registered advantage estimators."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  return tuple(algos.adv_estimator_names())


def _adv_estimators_where(test: Callable[[Any], bool]) -> tuple[str, ...]:
  """The advantage estimators whose declared inputs (`algos.estimator_inputs`) pass `test`."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  return tuple(name for name in algos.adv_estimator_names() if test(algos.estimator_inputs(name)))


def group_estimators() -> tuple[str, ...]:
  """Estimators that compare the n responses of one prompt with each other: they read group ids."""
  return _adv_estimators_where(lambda inputs: "index" in inputs.reads)


def needs_values(estimator: str) -> bool:
  """Whether advantage estimator `estimator` reads a critic's values (GAE)."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  return algos.advantages.needs_values(estimator)


def sum_pi_squared_estimators() -> tuple[str, ...]:
  """Estimators that read Σ_v π_v² of the old-log-prob pass (the optimal token baselines)."""
  return _adv_estimators_where(lambda inputs: "sum_pi_squared" in inputs.needs)


def policy_losses() -> tuple[str, ...]:
  """`actor_rollout_ref.actor.policy_loss.loss_mode`: the registered policy losses."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  return tuple(algos.POLICY_LOSS_REGISTRY.names())


def loss_agg_modes() -> tuple[str, ...]:
  """`loss_agg_mode`: the aggregation modes `rljax.algos.agg_loss` implements."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  return tuple(algos.LOSS_AGG_MODES)


def kl_types() -> tuple[str, ...]:
  """`algorithm.kl_penalty` and `actor.kl_loss_type`: the KL estimators `rljax.algos.kl_penalty` implements."""
  from rljax.algos import kl  # pylint: disable=import-outside-toplevel
  return kl.KL_PENALTY_NAMES
