"""Name -> function registries, keyed by the names users type in verl configs.

`algorithm.adv_estimator: grpo` and `actor.policy_loss.loss_mode: vanilla`
select a kernel by name. A registry maps each name to its function and, for an
unknown name, raises an error that lists every valid name.
"""

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
  """A named table of kernels.

  `register("grpo")` is a decorator; `get("grpo")` returns the function;
  `names()` lists what is registered, sorted.
  """

  def __init__(self, kind: str, config_key: str):
    self.kind = kind
    self.config_key = config_key
    self._table: dict[str, Callable] = {}

  def register(self, *names: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
      for name in names:
        if name in self._table:
          raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._table[name] = fn
      return fn

    return decorator

  def get(self, name: str) -> Callable:
    try:
      return self._table[name]
    except KeyError:
      raise KeyError(
          f"unknown {self.kind} {name!r} (config key {self.config_key}); "
          f"valid names: {', '.join(self.names())}"
      ) from None

  def names(self) -> list[str]:
    return sorted(self._table)

  def __contains__(self, name: str) -> bool:
    return name in self._table


ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", "algorithm.adv_estimator")
POLICY_LOSS_REGISTRY = Registry(
    "policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode"
)
