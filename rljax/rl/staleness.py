"""How stale a streamed rollout's samples may be (colocate_async, separate_async): the policy, the weight
schedule and the off_policy/* metrics.

Staleness, in verl's terms: a group *spans* `version - start + 1` policy
versions when the update at `version` trains on it, `start` being the
version its first token was sampled under; `trainer.v1.sampler` bounds it:

* `max_off_policy_threshold` T: no trained group spans more than T versions.
* `max_off_policy_strategy`:
  - `drop`: at an update, groups that already span more than T versions are
    evicted (counted in `off_policy/evicted_samples`) and fresh prompts take
    their slots.
  - `wait`: nothing is dropped: an update waits for every group that would
    otherwise span more than T versions at the next one, and admission
    stops at T batches of groups not yet trained (which bounds those to one
    batch).
* `trainer.v1.colocate_async.num_warmup_batches` W: prompts are admitted
  while fewer than (1 + W) batches of groups are untrained (at most T of
  them under `wait`).

T = 1 or W = 0 trains every group on the policy that generated all of it:
with `wait` that is today's synchronous trainer, step for step. An update
picks the oldest finished groups first (by start version, then admission),
and trains them in admission order.

`Schedule` fixes which weights decode each batch (separate_async, or a
lagged colocate_async), so a run is the same whatever the speeds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rljax.algos import advantages as adv_lib
from rljax.config import trainer as config_trainer
from rljax.sharding import hosts

STRATEGIES = ("drop", "wait")


@dataclasses.dataclass(frozen=True)
class StalenessPolicy:
  """How far generation runs ahead of training, and what happens to samples that fall too far behind.

  Attributes:
    groups: prompts (groups of n responses) each update trains on this host.
    threshold: trainer.v1.sampler.max_off_policy_threshold (>= 1).
    strategy: trainer.v1.sampler.max_off_policy_strategy, drop or wait.
    ahead: batches generation runs ahead of training (>= 0): trainer.v1.colocate_async.num_warmup_batches, or
      under verl's fully-async recipe async_training.staleness_threshold (a share of a batch).
  """

  groups: int
  threshold: int
  strategy: str
  ahead: float

  @property
  def capacity(self) -> int:
    """Groups admitted and not yet trained or evicted, at most."""
    batches = 1 + self.ahead
    return math.floor((min(batches, self.threshold) if self.strategy == "wait" else batches) * self.groups)

  @property
  def on_policy(self) -> bool:
    """Every trained group was generated whole by the policy the update starts from."""
    return self.threshold == 1 or self.ahead == 0


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which weights decode the groups each update trains: the update at step b trains groups picked under the
  weights of version `weights_for(b)` (the trainer's state after that many updates).

  colocate_async's is every update's own (sync_every 1, lag 0). separate_async's sends the weights after every
  `sync_every`-th update (trainer.v1.separate_async.parameter_sync_step) and lets the rollout run `lag` batches
  ahead (its num_warmup_batches), so batch b decodes under version sync_every * floor((b - lag) / sync_every):
  a deterministic schedule, whatever the two sides' speeds.
  """

  sync_every: int = 1
  lag: int = 0

  def weights_for(self, step: int) -> int:
    return self.sync_every * (max(0, step - self.lag) // self.sync_every)

  def publishes(self, version: int) -> bool:
    """Whether the weights of `version` are sent to the rollout (some step decodes under them)."""
    return version % self.sync_every == 0

  @property
  def weight_versions(self) -> int:
    """Weight versions the rollout holds at most: the one it decodes under, those sent since up to the update
    that trains its batch, and one arriving before it lets go of the oldest."""
    return (self.lag + self.sync_every - 1) // self.sync_every + 2

  @property
  def every_update(self) -> bool:
    """Each update decodes under its own weights (colocate_async's schedule)."""
    return self.sync_every == 1 and self.lag == 0


def schedule_of(config: Any) -> Schedule:
  """The weight schedule of `config`'s asynchronous mode (`Schedule`)."""
  v1 = config.trainer.v1
  if v1.trainer_mode != "separate_async":
    return Schedule()
  return Schedule(int(v1.separate_async.parameter_sync_step), int(v1.separate_async.num_warmup_batches))


def policy_of(config: Any, groups: int) -> StalenessPolicy | None:
  """The asynchronous modes' policy under `config` for `groups` prompts per update on this host (None in sync
  mode)."""
  v1 = config.trainer.v1
  if v1.trainer_mode == "sync":
    return None
  if config_trainer.fully_async_recipe(config):
    ahead = float(config_trainer.recipe_setting(config, "staleness_threshold"))
  else:
    ahead = int(v1[v1.trainer_mode].num_warmup_batches)
  return StalenessPolicy(groups=groups, threshold=int(v1.sampler.max_off_policy_threshold),
                strategy=v1.sampler.max_off_policy_strategy, ahead=ahead)


def rows_in_flight(config: Any, rows: int, n: int) -> int:
  """Responses admitted and not yet trained, at most: a step's `rows` in sync mode, the policy's capacity of
  groups of `n` under colocate_async (the engine's decode slots need no more)."""
  policy = policy_of(config, rows // n)
  return rows if policy is None else policy.capacity * n


def streams_off_policy(config: Any) -> bool:
  """Whether `config`'s trainer may train on groups generated partly by older weights (the policy off-policy, or
  a schedule that decodes under older weights than the update's: the update must then recompute the old
  log-probs)."""
  policy = policy_of(config, 1)
  return policy is not None and (not policy.on_policy or not schedule_of(config).every_update)


def decodes_beside_the_stream(config: Any) -> bool:
  """Whether a colocate_async run of `config` also decodes while its stream's KV cache is allocated, in a cache of
  its own: validation (data.val_files, with trainer.test_freq > 0 or val_before_train) or an estimator's greedy
  baselines (remax's)."""
  validates = bool(config.data.val_files) and (config.trainer.test_freq > 0 or config.trainer.val_before_train)
  return validates or adv_lib.needs_greedy_baselines(config.algorithm.adv_estimator)


def spans(start: int, version: int) -> int:
  """Policy versions a group first sampled under `start` spans when the update at `version` trains on it."""
  return version - start + 1


# off_policy/staleness/frac_s is logged for s = 1 to the threshold, at most this many (the last: frac_8_or_more)
STALENESS_BUCKETS = 8


def staleness_histogram(span: np.ndarray, threshold: int) -> dict[str, float]:
  """The share of trained groups ([G] `span`: the policy versions each spans) at each span: frac_s for s = 1 to
  min(threshold, STALENESS_BUCKETS) - 1, and the rest, frac_{last}_or_more (the shares sum to 1)."""
  last = min(threshold, STALENESS_BUCKETS)
  shares = {f"off_policy/staleness/frac_{s}": float((span == s).mean()) for s in range(1, last)}
  shares[f"off_policy/staleness/frac_{last}_or_more"] = float((span >= last).mean())
  return shares


def off_policy_metrics(picked: Any, threshold: int) -> dict[str, float]:
  """off_policy/* over every host's trained groups (`picked`: a `streaming.Picked`; every host calls it): versions
  spanned (verl's staleness: 1 is on-policy; mean, max and their histogram up to `threshold`,
  trainer.v1.sampler.max_off_policy_threshold), the share of responses sampled by more than one policy version,
  the mean lag of a trained token, the groups evicted."""
  rollout, version = picked.rollout, picked.version
  span = hosts.process_concat(picked.spans)
  mask = rollout.response_mask > 0
  versions = np.where(mask, rollout.versions, version)
  mixed = hosts.process_concat((versions.min(-1) != versions.max(-1)).astype(np.float32))
  lag = hosts.process_sum([float((version - versions)[mask].sum()), float(mask.sum())])
  return {"off_policy/staleness/mean": float(span.mean()), "off_policy/staleness/max": float(span.max()),
          **staleness_histogram(span, threshold), "off_policy/mixed_version_frac": float(mixed.mean()),
          "off_policy/token_lag/mean": float(lag[0] / max(lag[1], 1.0)),
          "off_policy/evicted_samples": hosts.process_total(float(picked.evicted))}


__all__ = ["STALENESS_BUCKETS", "STRATEGIES", "Schedule", "StalenessPolicy", "decodes_beside_the_stream",
           "off_policy_metrics", "policy_of", "rows_in_flight", "schedule_of", "spans", "staleness_histogram",
           "streams_off_policy"]
