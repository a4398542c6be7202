"""Algorithm names the config accepts, read from the kernels' registries (`rljax.algos`).

Each function imports `rljax.algos` when called: it loads JAX, which reading,
printing or overriding a config does not need.
"""

from __future__ import annotations

import inspect


def adv_estimators() -> tuple[str, ...]:
  """`algorithm.adv_estimator`: the registered advantage estimators."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  return tuple(algos.ADV_ESTIMATOR_REGISTRY.names())


def _adv_estimators_taking(argument: str) -> tuple[str, ...]:
  """The advantage estimators whose kernel takes `argument`."""
  from rljax import algos  # pylint: disable=import-outside-toplevel
  registry = algos.ADV_ESTIMATOR_REGISTRY
  return tuple(name for name in registry.names() if argument in inspect.signature(registry.get(name)).parameters)


def group_estimators() -> tuple[str, ...]:
  """Estimators that compare the n responses of one prompt with each other: their kernels take group ids."""
  return _adv_estimators_taking("index")


def trainer_unsupported_estimators() -> tuple[str, ...]:
  """Estimators whose extra input (sum_pi_squared) the RL loop does not produce."""
  return _adv_estimators_taking("sum_pi_squared")


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
