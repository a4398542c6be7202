"""Arrays kept in host memory between the steps that use them: verl's `param_offload` and `optimizer_offload`.

An offloaded array lives in the devices' host memory (JAX's `pinned_host` memory kind), laid out as it would be
in device memory. A step that takes it brings it in (`brought_in`) and its outputs go back out (the step's output
shardings keep the host memory kind), so between steps it holds no device memory. As in verl's FSDP offload,
an update brings its whole optimizer state in for the optimizer step: offloading it frees device memory for the
rollout and the forward passes, not within the update (XLA starts the copies in as the update starts).

What is offloaded (`Offload.of`): the optimizer state of the actor and of the critic, and the parameters of the
reference, the critic and the reward model. The actor's parameters stay in device memory: every step of a run
reads them (the rollout in place), so there is no step outside which they could leave.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

import jax
from jax.sharding import Sharding

from rljax.config.errors import ConfigError

HOST = "pinned_host"
DEVICE = "device"


def host_memory(devices: Sequence[jax.Device]) -> bool:
  """Whether every one of `devices` has host memory its programs can address (`pinned_host`): TPUs and GPUs do
  (the devices `rljax.compile` lays out for a TPU slice have no memories to ask), CPUs where the client has it."""
  return all(d.platform in ("tpu", "gpu") or any(m.kind == HOST for m in d.addressable_memories()) for d in devices)


def in_host(leaf: Any) -> bool:
  """Whether an array or ShapeDtypeStruct lives in host memory."""
  sharding = getattr(leaf, "sharding", None)
  return sharding is not None and getattr(sharding, "memory_kind", None) == HOST


def to_host(shardings: Any, like: Any, fraction: float = 1.0) -> Any:
  """`shardings` (a tree matching `like`, arrays or ShapeDtypeStructs) with the host memory kind on the leading
  leaves, in tree order, that hold at least `fraction` of `like`'s bytes (all of them at 1, none at 0)."""
  leaves = jax.tree.leaves(like)
  sizes = [x.size * x.dtype.itemsize for x in leaves]
  wanted, taken, moved = fraction * sum(sizes), 0, []
  for size in sizes:
    moved.append(fraction > 0 and taken < wanted)
    taken += size if moved[-1] else 0
  flat, treedef = jax.tree.flatten(shardings)
  return jax.tree.unflatten(treedef, [s.with_memory_kind(HOST) if m else s for s, m in zip(flat, moved)])


def device_shardings(shardings: Any) -> Any:
  """`shardings` with every host memory kind replaced by device memory (the layout in a step)."""
  return jax.tree.map(lambda s: s.with_memory_kind(DEVICE) if s.memory_kind == HOST else s, shardings,
                      is_leaf=lambda s: isinstance(s, Sharding))


def brought_in(tree: Any, like: Any) -> Any:
  """Inside a step: each leaf of `tree` whose abstract twin in `like` lives in host memory, moved to device memory
  in the same layout; the others as they are."""
  return jax.tree.map(lambda x, a: jax.device_put(x, a.sharding.with_memory_kind(DEVICE)) if in_host(a) else x,
                      tree, like)


def placed(tree: Any, offloaded: bool) -> Any:
  """`tree`'s arrays moved to host memory when `offloaded` (ShapeDtypeStructs take the host sharding), else as
  they are."""
  if not offloaded:
    return tree
  shardings = jax.tree.map(lambda x: x.sharding.with_memory_kind(HOST), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                      if isinstance(x, jax.ShapeDtypeStruct) else jax.device_put(x, s), tree, shardings)


@dataclasses.dataclass(frozen=True)
class Offload:
  """What a run keeps in host memory between the steps that use it.

  Attributes:
    actor_optimizer, critic_optimizer: the fraction of the optimizer state's bytes offloaded (0 to 1).
    reference, critic, reward_model: whether that model's parameters are offloaded.
  """

  actor_optimizer: float = 0.0
  critic_optimizer: float = 0.0
  reference: bool = False
  critic: bool = False
  reward_model: bool = False

  @classmethod
  def of(cls, config: Any, devices: Sequence[jax.Device]) -> "Offload":
    """The offload `config` asks for (fsdp_config's and megatron's keys alike; optim.optimizer_offload_fraction,
    verl's Megatron override, for a part of the optimizer state). On devices with no host memory (`host_memory`)
    everything stays in device memory, with a warning naming the keys."""
    arr, critic, rm = config.actor_rollout_ref, config.critic, config.reward_model

    def engine_flag(node: Any, megatron: Any, key: str) -> bool:
      return bool(node.get(key)) or bool(megatron.get(key))

    def optimizer(role: Any, fsdp: Any, name: str) -> float:
      fraction = role.optim.get("optimizer_offload_fraction")
      if fraction is not None and not 0 <= fraction <= 1:
        raise ConfigError(f"{name}.optim.optimizer_offload_fraction", fraction, "is a fraction of the optimizer "
                          "state's bytes", "set it between 0 and 1 (1 keeps all of it in host memory)")
      flagged = engine_flag(fsdp, role.megatron, "optimizer_offload")
      return 1.0 if flagged else float(fraction or 0.0)

    wanted = cls(actor_optimizer=optimizer(arr.actor, arr.actor.fsdp_config, "actor_rollout_ref.actor"),
                 critic_optimizer=optimizer(critic, critic.model.fsdp_config, "critic"),
                 reference=engine_flag(arr.ref.fsdp_config, arr.ref.megatron, "param_offload"),
                 critic=engine_flag(critic.model.fsdp_config, critic.megatron, "param_offload"),
                 reward_model=engine_flag(rm.model.fsdp_config, rm.megatron, "param_offload"))
    if wanted == cls() or host_memory(devices):
      return wanted
    warnings.warn(f"offload asked ({wanted}), but {devices[0].platform} devices have no {HOST} memory: every array "
                  "stays in device memory", stacklevel=2)
    return cls()


__all__ = ["DEVICE", "HOST", "Offload", "brought_in", "device_shardings", "host_memory", "in_host", "placed",
           "to_host"]
