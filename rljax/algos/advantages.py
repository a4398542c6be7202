"""Advantage estimators, registered under verl's `algorithm.adv_estimator`.

Every estimator returns `(advantages, returns)`, both float32 `[B, T]`
(`B` responses, `T` response tokens), and is a pure, `jit`-able function of
arrays. On every valid token (`response_mask == 1`) the values equal verl
0.9.1's `core_algos` estimators, quirks included:

* the outcome score of a row is `s_i = Σ_t token_level_rewards[i, t]` over
  all `T` positions, without the mask;
* group statistics follow verl's loops: singleton groups get mean 0 and std 1,
  the std is unbiased (`N - 1`), and `epsilon` is added to the std;
* whitening (`masked_whiten`) is global over all valid tokens of the batch.

Deliberate differences from verl:

* Outputs at padding positions (`response_mask == 0`) are exactly 0, for both
  advantages and returns (verl leaves whitened values, carried values or
  reward-to-go there; no loss reads them).
* `index` is an int32 `[B]` array of group ids instead of an object array of
  uid strings. Equal ids form a group, in any order and not necessarily
  contiguous. Groups reduce with segment ops into `num_groups` slots, a static
  int (default `B`), so every id must satisfy `0 <= id < num_groups`; map
  arbitrary labels (uuid strings, large ints) with
  `masked.group_ids_from_labels` outside `jit`. Ids are checked whenever
  `index` is concrete.
* Checks that verl makes on values (`grpo_passk` needs >= 2 samples per group)
  run only when `index` is concrete; under `jit` such a group gives 0.
* `compute_advantage` forwards `norm_adv_by_std_in_grpo` to every estimator
  that takes it (verl's trainer drops it for all but `grpo`).

`config` arguments take verl's config node for the estimator (normally the
`algorithm` node: `gamma`, `lam`, `norm_adv_by_std_in_grpo`, `gdpo_reward_keys`,
...), read by attribute like verl's dataclasses; a missing key or `None`
config falls back to verl's default.

cosmos-rl's Dr.GRPO `train_policy.unbiased_advantage` is verl's `grpo` with
`norm_adv_by_std_in_grpo=false` (the config maps it); DAPO's overlong
penalty is the reward manager's (`rljax.rewards.managers.overlong_penalty`).
"""

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.algos.config_access import config_value
from rljax.algos.masked import group_count
from rljax.algos.masked import group_mean_std
from rljax.algos.masked import group_sum
from rljax.algos.masked import masked_whiten
from rljax.algos.masked import resolve_num_groups
from rljax.algos.registry import ADV_ESTIMATOR_REGISTRY

AdvantageFn = Callable[..., tuple[jax.Array, jax.Array]]


# ----------------------------------------------------------------------------
# What an estimator reads.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
  """Everything an estimator may read; each estimator declares what it reads (`estimator_inputs`).

  Attributes:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    group_ids: int `[B]` group ids (verl's `uid`), for group estimators.
    num_groups: static number of group slots; None means `B`.
    values: `[B, T]` critic values (`gae`).
    reward_baselines: `[B]` the greedy response's reward of each row's prompt (`remax`).
    reward_components: name -> `[B]` per-row reward components (`gdpo`).
    old_log_probs: `[B, T]` (optimal token baselines).
    sum_pi_squared: `[B, T]` Σ_v π_v² of the rollout policy per token (optimal token baselines).
    rollout_is_weights: `[B, T]` rollout-correction weights (optimal token baselines).
  """

  token_level_rewards: Any
  response_mask: Any
  group_ids: Any = None
  num_groups: int | None = None
  values: Any = None
  reward_baselines: Any = None
  reward_components: Mapping[str, Any] | None = None
  old_log_probs: Any = None
  sum_pi_squared: Any = None
  rollout_is_weights: Any = None


@dataclasses.dataclass(frozen=True)
class EstimatorInputs:
  """What a registered estimator reads.

  Attributes:
    reads: its verl arguments, in `_ARGUMENT_SOURCES`' names; an argument
      whose source is None is left at the estimator's default.
    needs: the `AdvantageInputs` fields it cannot run without.
    batch_wide: its statistics are over the whole batch (whitening, GPG's non-zero rate), not over one
      group's rows: a multi-host step computes it over every host's rows.
  """

  reads: tuple[str, ...]
  needs: tuple[str, ...] = ()
  batch_wide: bool = False


# verl's argument -> the AdvantageInputs field it comes from (config-derived arguments: `_argument`).
_FIELD_OF_ARGUMENT = {"index": "group_ids", "non_tensor_batch": "reward_components"}
_NEEDED = {
    "values": "the critic's values [B, T] (critic.enable)",
    "reward_baselines": "the greedy response's reward of each row's prompt [B]",
    "group_ids": "the group id of each row [B]",
    "old_log_probs": "the rollout policy's log-probs [B, T]",
    "sum_pi_squared": "Σ_v π_v² of the rollout policy per token [B, T]",
}
_OUTCOME = ("token_level_rewards", "response_mask", "config")
_GAE = ("token_level_rewards", "values", "response_mask", "config")
_REMAX = ("token_level_rewards", "reward_baselines", "response_mask", "config")
_GROUP = ("token_level_rewards", "response_mask", "index", "config", "num_groups")
_NORMALISED_GROUP = _GROUP + ("norm_adv_by_std_in_grpo",)
_GDPO = _NORMALISED_GROUP + ("non_tensor_batch", "batch")
_OTB = ("token_level_rewards", "response_mask", "index", "old_log_probs", "sum_pi_squared", "rollout_is_weights",
        "num_groups")
_OTB_NEEDS = ("group_ids", "old_log_probs", "sum_pi_squared")
_ESTIMATOR_INPUTS: dict[str, EstimatorInputs] = {}


def estimator(*names: str, reads: tuple[str, ...], needs: tuple[str, ...] = (), batch_wide: bool = False
              ) -> Callable:
  """Registers an estimator under verl's `names`, with the arguments it reads, the inputs it needs and whether
  its statistics are over the whole batch (`EstimatorInputs`)."""
  unknown = sorted(set(needs) - set(_NEEDED))
  if unknown:
    raise ValueError(f"estimator {names[0]!r} needs {unknown}, which AdvantageInputs does not describe; "
                     f"needs may name: {', '.join(_NEEDED)}")

  def register(fn: AdvantageFn) -> AdvantageFn:
    ADV_ESTIMATOR_REGISTRY.register(*names)(fn)
    for name in names:
      _ESTIMATOR_INPUTS[name] = EstimatorInputs(reads, needs, batch_wide)
    return fn
  return register


def _argument(name: str, inputs: AdvantageInputs, config: Any) -> Any:
  """The value of verl's argument `name` for an estimator call (None: leave the default)."""
  if name == "config":
    return config
  if name == "norm_adv_by_std_in_grpo":
    return config_value(config, "norm_adv_by_std_in_grpo", True)
  if name == "batch":  # verl's tensor batch: gdpo reads its components only when it is given
    return None if inputs.reward_components is None else inputs.token_level_rewards
  return getattr(inputs, _FIELD_OF_ARGUMENT.get(name, name))


# ----------------------------------------------------------------------------
# Small shared pieces.
# ----------------------------------------------------------------------------


def _as_mask(response_mask: jax.Array) -> jax.Array:
  """The response mask as float32 `[B, T]`."""
  return jnp.asarray(response_mask).astype(jnp.float32)


def _zero_padding(values: jax.Array, mask: jax.Array) -> jax.Array:
  """`values` where `mask != 0`, exactly 0 elsewhere (NaN-safe)."""
  return jnp.where(mask != 0, values, 0.0)


def _per_token(row_values: jax.Array, mask: jax.Array) -> jax.Array:
  """Broadcasts per-row `[B]` values over the valid tokens of `[B, T]`."""
  return _zero_padding(row_values[:, None], mask)


def outcome_scores(token_level_rewards: jax.Array) -> jax.Array:
  """Per-row outcome score `s_i = Σ_t r[i, t]` over all positions: `[B]`.

  The mask is not applied, as in verl: rewards placed at padding count.
  """
  return jnp.sum(jnp.asarray(token_level_rewards, jnp.float32), axis=-1)


def reverse_cumsum(values: jax.Array) -> jax.Array:
  """Reward-to-go on the last axis: `out[..., t] = Σ_{t' >= t} x[..., t']`."""
  return jax.lax.cumsum(values, axis=values.ndim - 1, reverse=True)


def _concrete(x: Any) -> np.ndarray | None:
  """`x` as a NumPy array if its value is known now, else None (traced)."""
  if isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x)


def as_group_ids(index: Any, num_groups: int | None = None) -> jax.Array:
  """Validates and converts `index` to int32 group ids `[B]`.

  Raises ValueError when `index` is missing, or concrete with an id outside
  `[0, num_groups)` (ids out of range would be silently dropped by the
  segment ops).
  """
  if index is None:
    raise ValueError(
        "this advantage estimator needs `index`: an int [B] array of group ids"
        " (one id per prompt, shared by its samples)"
    )
  concrete = _concrete(index)
  if concrete is not None:
    if not np.issubdtype(concrete.dtype, np.integer):
      raise ValueError(
          f"`index` must hold integer group ids, got dtype {concrete.dtype}; "
          "map labels with rljax.algos.masked.group_ids_from_labels"
      )
    slots = resolve_num_groups(concrete, num_groups)
    if concrete.size and (concrete.min() < 0 or concrete.max() >= slots):
      raise ValueError(
          f"group ids must lie in [0, num_groups={slots}), got "
          f"[{concrete.min()}, {concrete.max()}]; pass a larger num_groups or "
          "remap with rljax.algos.masked.group_ids_from_labels"
      )
  return jnp.asarray(index).astype(jnp.int32)


def _scan_backward(
    step: Callable, init: Any, *columns: jax.Array
) -> jax.Array:
  """Runs `step` over time from `T-1` to 0 on `[B, T]` columns; `[B, T]` out."""
  _, outs = jax.lax.scan(
      step, init, tuple(c.T for c in columns), reverse=True
  )
  return outs.T


def _grpo_row_advantage(
    scores: jax.Array,
    group_ids: jax.Array,
    num_groups: int | None,
    epsilon: float,
    norm_adv_by_std_in_grpo: bool,
) -> jax.Array:
  """GRPO per-row advantage `(s - mean_g) / (std_g + epsilon)`: `[B]`."""
  mean, std = group_mean_std(scores, group_ids, num_groups, eps=0.0)
  centred = scores - mean[group_ids]
  if norm_adv_by_std_in_grpo:
    return centred / (std[group_ids] + epsilon)
  return centred


def _group_size(group_ids: jax.Array, num_groups: int | None) -> jax.Array:
  """Number of rows in each row's group: float32 `[B]`."""
  return group_count(group_ids, num_groups)[group_ids]


# ----------------------------------------------------------------------------
# Estimators with a critic or a discount.
# ----------------------------------------------------------------------------


@estimator("gae", reads=_GAE, needs=("values",), batch_wide=True)
def compute_gae_advantage_return(
    token_level_rewards: jax.Array,
    values: jax.Array,
    response_mask: jax.Array,
    gamma: float | jax.Array | None = None,
    lam: float | jax.Array | None = None,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation (PPO with a critic).

  A backward scan over `t = T-1 .. 0` per row, with `next = 0`, `acc = 0`:

    δ_t   = r_t + γ·next - V_t
    acc   ← m_t·(δ_t + γλ·acc) + (1 - m_t)·acc
    next  ← m_t·V_t + (1 - m_t)·next
    A_t   = acc

  so masked steps are skipped (not discounted) and the value is carried over
  them. `returns = A + V`; `advantages = masked_whiten(A, m)` over all valid
  tokens of the batch.

  Args:
    token_level_rewards: `[B, T]` rewards.
    values: `[B, T]` critic values.
    response_mask: `[B, T]`, 1 on valid tokens; at least 2 valid tokens.
    gamma: discount; None reads `config.gamma` (default 1.0).
    lam: GAE λ; None reads `config.lam` (default 1.0).
    config: the `algorithm` config node, or None.

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, 0 at padding.
  """
  gamma = config_value(config, "gamma", 1.0) if gamma is None else gamma
  lam = config_value(config, "lam", 1.0) if lam is None else lam
  rewards = jnp.asarray(token_level_rewards, jnp.float32)
  values = jnp.asarray(values, jnp.float32)
  mask = _as_mask(response_mask)

  def step(carry, xs):
    next_value, acc = carry
    r_t, v_t, m_t = xs
    delta = r_t + gamma * next_value - v_t
    candidate = delta + gamma * lam * acc
    next_value = v_t * m_t + (1.0 - m_t) * next_value
    acc = candidate * m_t + (1.0 - m_t) * acc
    return (next_value, acc), acc

  zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
  raw = _scan_backward(step, (zeros, zeros), rewards, values, mask)
  returns = raw + values
  advantages = masked_whiten(raw, mask)
  return _zero_padding(advantages, mask), _zero_padding(returns, mask)


@estimator("reinforce_plus_plus", reads=_OUTCOME, batch_wide=True)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """REINFORCE++: whitened discounted returns.

  Backward scan with `run = 0`:

    G_t = m_t·(r_t + γ·run)        run ← m_t·(r_t + γ·run) + (1 - m_t)·run

  (rewards at masked steps are dropped, `run` is carried through holes);
  `advantages = masked_whiten(G, m)`.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens; at least 2 valid tokens.
    config: the `algorithm` node; reads `gamma` (default 1.0).

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, 0 at padding.
  """
  gamma = config_value(config, "gamma", 1.0)
  rewards = jnp.asarray(token_level_rewards, jnp.float32)
  mask = _as_mask(response_mask)

  def step(run, xs):
    r_t, m_t = xs
    new = r_t + gamma * run
    return new * m_t + run * (1.0 - m_t), new * m_t

  init = jnp.zeros(rewards.shape[:1], jnp.float32)
  returns = _scan_backward(step, init, rewards, mask)
  advantages = masked_whiten(returns, mask)
  return _zero_padding(advantages, mask), returns


@estimator("remax", reads=_REMAX, needs=("reward_baselines",))
def compute_remax_outcome_advantage(
    token_level_rewards: jax.Array,
    reward_baselines: jax.Array,
    response_mask: jax.Array,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """ReMax: reward-to-go minus the greedy rollout's reward.

    G_t = Σ_{t' >= t} r_t'·m_t'        A_t = G_t - b

  with no whitening. `config` is accepted for verl's call and unused.

  Args:
    token_level_rewards: `[B, T]` rewards.
    reward_baselines: `[B]` reward of each prompt's greedy response.
    response_mask: `[B, T]`, 1 on valid tokens.
    config: unused.

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, 0 at padding.
  """
  del config
  mask = _as_mask(response_mask)
  rewards = jnp.asarray(token_level_rewards, jnp.float32)
  returns = reverse_cumsum(rewards * mask)
  baseline = jnp.asarray(reward_baselines, jnp.float32)[:, None]
  advantages = returns - baseline
  return _zero_padding(advantages, mask), _zero_padding(returns, mask)


# ----------------------------------------------------------------------------
# Group-relative outcome estimators.
# ----------------------------------------------------------------------------


@estimator("grpo", "grpo_vectorized", reads=_NORMALISED_GROUP, needs=("group_ids",))
def compute_grpo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """GRPO: outcome score standardised within its group.

    A_i = (s_i - mean_g) / (std_g + ε)      (norm_adv_by_std_in_grpo)
    A_i =  s_i - mean_g                     (otherwise: Dr.GRPO)

  `std_g` is unbiased; a singleton group has mean 0 and std 1 (`A = s/(1+ε)`
  or `s`), a group of equal scores gives 0. Registered as both `grpo` and
  `grpo_vectorized`: verl's two versions differ only in summation order.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: added to the std.
    norm_adv_by_std_in_grpo: divide by the group std.
    config: unused (verl's signature).
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  del config
  group_ids = as_group_ids(index, num_groups)
  mask = _as_mask(response_mask)
  scores = outcome_scores(token_level_rewards)
  row = _grpo_row_advantage(
      scores, group_ids, num_groups, epsilon, norm_adv_by_std_in_grpo
  )
  advantages = _per_token(row, mask)
  return advantages, advantages


def _as_row_values(values: Any) -> jax.Array:
  """Per-row scalars (a jax array, or verl's NumPy object array) as float32."""
  if isinstance(values, jax.Array):
    return values.astype(jnp.float32)
  return jnp.asarray(np.asarray(values, np.float32))


def _gdpo_components(
    token_level_rewards: jax.Array,
    config: Any,
    non_tensor_batch: Mapping[str, Any] | None,
    batch: Any,
) -> tuple[list[jax.Array], list[float]]:
  """GDPO's per-row reward components `[B]` and their weights."""
  if config is None or non_tensor_batch is None or batch is None:
    return [outcome_scores(token_level_rewards)], [1.0]
  keys = list(config_value(config, "gdpo_reward_keys", []))
  if not keys:
    raise ValueError(
        "gdpo needs algorithm.gdpo_reward_keys: the non_tensor_batch keys of "
        "the per-sample reward components"
    )
  missing = [key for key in keys if key not in non_tensor_batch]
  if missing:
    raise ValueError(
        f"algorithm.gdpo_reward_keys names {missing}, but the reward "
        f"components are {sorted(non_tensor_batch) or 'none'}; return a dict "
        "with a number for each key from the reward function "
        "(custom_reward_function) or change algorithm.gdpo_reward_keys."
    )
  weights = list(config_value(config, "gdpo_reward_weights", [1.0] * len(keys)))
  if len(weights) != len(keys):
    raise ValueError(
        f"gdpo_reward_weights has {len(weights)} entries for "
        f"{len(keys)} gdpo_reward_keys"
    )
  components = [_as_row_values(non_tensor_batch[key]) for key in keys]
  return components, [float(w) for w in weights]


@estimator("gdpo", reads=_GDPO, needs=("group_ids",), batch_wide=True)
def compute_gdpo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """GDPO: GRPO per reward component, weighted sum, then global whitening.

    A = masked_whiten(Σ_k w_k · GRPO(c_k), m)

  When `config`, `non_tensor_batch` and `batch` are all given (verl's
  condition), the components are `non_tensor_batch[key]` ([B] scalars) for
  `key in config.gdpo_reward_keys`, weighted by `config.gdpo_reward_weights`
  (default all 1); otherwise the single component is the outcome score.
  verl writes each scalar into one token of a zero `[B, T]` reward matrix; an
  outcome score sums all positions, so the column (which is all `batch` is
  read for in verl) cannot change the result, and only `batch`'s presence
  matters here.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens; at least 2 valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: added to each group std.
    norm_adv_by_std_in_grpo: divide by the group std inside each GRPO.
    config: the `algorithm` node (`gdpo_reward_keys`, `gdpo_reward_weights`).
    non_tensor_batch: mapping from key to per-row component `[B]`.
    batch: verl's tensor batch; only its presence is checked.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  group_ids = as_group_ids(index, num_groups)
  mask = _as_mask(response_mask)
  components, weights = _gdpo_components(
      token_level_rewards, config, non_tensor_batch, batch
  )
  combined = sum(
      w
      * _grpo_row_advantage(
          c, group_ids, num_groups, epsilon, norm_adv_by_std_in_grpo
      )
      for c, w in zip(components, weights)
  )
  whitened = masked_whiten(_per_token(combined, mask), mask)
  advantages = _zero_padding(whitened, mask)
  return advantages, advantages


def _check_min_group_size(index: Any, minimum: int, name: str) -> None:
  """Raises ValueError if a concrete `index` has a group below `minimum`."""
  concrete = _concrete(index)
  if concrete is None:
    return
  _, counts = np.unique(concrete, return_counts=True)
  if counts.size and counts.min() < minimum:
    raise ValueError(
        f"{name} needs at least {minimum} samples per group "
        f"(actor_rollout_ref.rollout.n >= {minimum}); smallest group has "
        f"{counts.min()}"
    )


@estimator("grpo_passk", reads=_NORMALISED_GROUP, needs=("group_ids",))
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Pass@k GRPO: only the group's best response gets an advantage.

    A_best = (s_(1) - s_(2)) / (std_g + ε)      (or without the division)

  where `s_(1) >= s_(2)` are the group's two highest scores and `std_g` is
  unbiased; every other row gets 0, and a tie at the top gives 0. Needs >= 2
  rows per group (checked when `index` is concrete; 0 under `jit`).

  verl reads the norm flag only from `config.norm_adv_by_std_in_grpo`; here
  an explicit `norm_adv_by_std_in_grpo` wins and None falls back to the
  config (default True).

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: added to the std.
    norm_adv_by_std_in_grpo: divide by the std; None reads the config.
    config: the `algorithm` node.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  _check_min_group_size(index, 2, "grpo_passk")
  if norm_adv_by_std_in_grpo is None:
    norm_adv_by_std_in_grpo = config_value(
        config, "norm_adv_by_std_in_grpo", True
    )
  group_ids = as_group_ids(index, num_groups)
  slots = resolve_num_groups(group_ids, num_groups)
  mask = _as_mask(response_mask)
  scores = outcome_scores(token_level_rewards)
  best = jax.ops.segment_max(scores, group_ids, num_segments=slots)[group_ids]
  is_best = scores == best
  n_best = group_sum(is_best.astype(jnp.float32), group_ids, slots)[group_ids]
  runner_up = jax.ops.segment_max(
      jnp.where(is_best, -jnp.inf, scores), group_ids, num_segments=slots
  )[group_ids]
  size = _group_size(group_ids, slots)
  gap = jnp.where((n_best == 1.0) & (size >= 2.0), best - runner_up, 0.0)
  if norm_adv_by_std_in_grpo:
    _, std = group_mean_std(scores, group_ids, slots, eps=0.0)
    gap = gap / (std[group_ids] + epsilon)
  row = jnp.where(is_best, gap, 0.0)
  advantages = _per_token(row, mask)
  return advantages, advantages


@estimator("reinforce_plus_plus_baseline", reads=_GROUP, needs=("group_ids",), batch_wide=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """REINFORCE++ with a group-mean baseline, whitened over tokens.

    a_i = s_i - mean_g          A = masked_whiten(a_i·m, m)

  (singleton mean 0; the whitening is token-weighted, so long responses
  weigh more). `epsilon` and `config` are unused, as in verl.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens; at least 2 valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: unused.
    config: unused.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  del epsilon, config
  group_ids = as_group_ids(index, num_groups)
  mask = _as_mask(response_mask)
  scores = outcome_scores(token_level_rewards)
  mean, _ = group_mean_std(scores, group_ids, num_groups, eps=0.0)
  tokens = _per_token(scores - mean[group_ids], mask)
  advantages = _zero_padding(masked_whiten(tokens, mask), mask)
  return advantages, advantages


def _leave_one_out(
    token_level_rewards: jax.Array,
    index: jax.Array,
    num_groups: int | None,
    singleton_keeps_score: bool,
) -> jax.Array:
  """RLOO per-row advantage `(s_i - mean_g)·n/(n-1)`: `[B]`."""
  group_ids = as_group_ids(index, num_groups)
  scores = outcome_scores(token_level_rewards)
  mean, _ = group_mean_std(scores, group_ids, num_groups, eps=0.0)
  size = _group_size(group_ids, num_groups)
  scale = size / jnp.maximum(size - 1.0, 1.0)
  loo = (scores - mean[group_ids]) * scale
  singleton = scores if singleton_keeps_score else jnp.zeros_like(scores)
  return jnp.where(size > 1.0, loo, singleton)


@estimator("rloo", reads=_GROUP, needs=("group_ids",))
def compute_rloo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """RLOO: score minus the mean of the other members of its group.

    A_i = s_i·n/(n-1) - mean_g·n/(n-1) = s_i - mean_{j != i} s_j

  A singleton keeps its raw score (`A = s`). `epsilon`, `config` unused.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: unused.
    config: unused.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  del epsilon, config
  row = _leave_one_out(token_level_rewards, index, num_groups, True)
  advantages = _per_token(row, _as_mask(response_mask))
  return advantages, advantages


@estimator("rloo_vectorized", reads=_GROUP, needs=("group_ids",))
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Vectorised RLOO: as `rloo`, but a singleton group gets 0.

    A_i = (n·s_i - Σ_g s) / max(n - 1, 1) · [n > 1]

  `epsilon`, `config` unused.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: unused.
    config: unused.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  del epsilon, config
  row = _leave_one_out(token_level_rewards, index, num_groups, False)
  advantages = _per_token(row, _as_mask(response_mask))
  return advantages, advantages


@estimator("opo", reads=_GROUP, needs=("group_ids",))
def compute_opo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """OPO: length-weighted group baseline.

    L_i = Σ_t m_it      b_g = Σ_g L_i·s_i / Σ_g L_i      A_i = s_i - b_g

  (singleton `b = 0`). `epsilon`, `config` unused.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: unused.
    config: unused.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  del epsilon, config
  group_ids = as_group_ids(index, num_groups)
  mask = _as_mask(response_mask)
  scores = outcome_scores(token_level_rewards)
  lengths = jnp.sum(mask, axis=-1)
  weighted = group_sum(lengths * scores, group_ids, num_groups)[group_ids]
  total = group_sum(lengths, group_ids, num_groups)[group_ids]
  size = _group_size(group_ids, num_groups)
  has_baseline = (size > 1.0) & (total > 0.0)
  safe_total = jnp.where(has_baseline, total, 1.0)
  baseline = jnp.where(has_baseline, weighted / safe_total, 0.0)
  advantages = _per_token(scores - baseline, mask)
  return advantages, advantages


@estimator("gpg", reads=_GROUP, needs=("group_ids",), batch_wide=True)
def compute_gpg_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """GPG: group-mean baseline scaled by the batch's nonzero-score rate.

    α = B / max(#{i : s_i != 0}, 1)      A_i = α·(s_i - mean_g) / f_norm

  (singleton mean 0). As in verl, the `alpha` argument is overwritten by the
  formula above; `epsilon` and `config` are unused.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    epsilon: unused.
    f_norm: divisor of the advantage.
    alpha: ignored (recomputed).
    config: unused.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, equal, float32 `[B, T]`, 0 at padding.
  """
  del epsilon, alpha, config
  group_ids = as_group_ids(index, num_groups)
  mask = _as_mask(response_mask)
  scores = outcome_scores(token_level_rewards)
  nonzero = jnp.sum((scores != 0.0).astype(jnp.float32))
  batch_alpha = scores.shape[0] / jnp.maximum(nonzero, 1.0)
  mean, _ = group_mean_std(scores, group_ids, num_groups, eps=0.0)
  row = batch_alpha * (scores - mean[group_ids]) / f_norm
  advantages = _per_token(row, mask)
  return advantages, advantages


# ----------------------------------------------------------------------------
# Optimal token baselines.
# ----------------------------------------------------------------------------


def _path_variance(
    old_log_probs: jax.Array,
    sum_pi_squared: jax.Array,
    rollout_is_weights: jax.Array | None,
    mask: jax.Array,
) -> jax.Array:
  """OTB's cumulative path-variance proxy `W_t = Σ_{t'<=t} w_t'·m_t'`: `[B, T]`.

  `w = (1 - 2·exp(old_log_probs) + Σπ²)·ρ²` with `ρ` the rollout IS weights.
  """
  w = 1.0 - 2.0 * jnp.exp(jnp.asarray(old_log_probs, jnp.float32))
  w = w + jnp.asarray(sum_pi_squared, jnp.float32)
  if rollout_is_weights is not None:
    w = w * jnp.asarray(rollout_is_weights, jnp.float32) ** 2
  return jnp.cumsum(w * mask, axis=-1)


def _zero_tail(
    lengths: jax.Array,
    member: jax.Array,
    group_ids: jax.Array,
    num_groups: int,
) -> tuple[jax.Array, jax.Array]:
  """Finds each group's unique longest member and the runner-up length.

  Among `member` rows of a group with >= 2 members: if one row is strictly
  longest, that row is flagged and its cutoff is the second-longest length.

  Returns:
    `(is_tail_row [B] bool, cutoff [B] float32)`.
  """
  member_f = member.astype(jnp.float32)
  size = group_sum(member_f, group_ids, num_groups)[group_ids]
  masked_len = jnp.where(member, lengths, -1.0)
  longest = jax.ops.segment_max(masked_len, group_ids, num_segments=num_groups)
  at_longest = member & (lengths == longest[group_ids])
  n_longest = group_sum(
      at_longest.astype(jnp.float32), group_ids, num_groups
  )[group_ids]
  others = jnp.where(at_longest, -1.0, masked_len)
  runner_up = jax.ops.segment_max(others, group_ids, num_segments=num_groups)
  is_tail_row = at_longest & (n_longest == 1.0) & (size > 1.0)
  return is_tail_row, runner_up[group_ids]


def _check_otb_inputs(old_log_probs: Any, sum_pi_squared: Any) -> None:
  if old_log_probs is None or sum_pi_squared is None:
    raise ValueError(
        "optimal token baseline estimators need old_log_probs and "
        "sum_pi_squared [B, T] (Σ_v π_v² of the rollout policy per token)"
    )


@estimator("optimal_token_baseline", reads=_OTB, needs=_OTB_NEEDS)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    old_log_probs: jax.Array | None = None,
    sum_pi_squared: jax.Array | None = None,
    rollout_is_weights: jax.Array | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Optimal token baseline (OTB): a per-position, variance-weighted baseline.

    G_t = Σ_{t'>=t} r_t'·m_t'
    W_t = Σ_{t'<=t} (1 - 2π_t' + Σ_v π_v²)·ρ_t'²·m_t'
    B_t = Σ_g G_t·W_t·m_t / (Σ_g W_t·m_t + ε)        (same for every member)
    A_t = (G_t - B_t)·m_t

  `π_t = exp(old_log_probs)`, `ρ` the rollout IS weights (1 if None). A
  singleton group has `B = 0`. With `handle_zero_tail`, when a group's
  longest response (by valid-token count) is unique, its baseline is 0 from
  position `L2` on, `L2` the second-longest count.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid tokens.
    index: int `[B]` group ids in `[0, num_groups)`.
    old_log_probs: `[B, T]` rollout-policy log-probs of the sampled tokens
      (required; None raises ValueError).
    sum_pi_squared: `[B, T]` Σ_v π_v² of the rollout policy (required).
    rollout_is_weights: optional `[B, T]` IS weights.
    handle_zero_tail: zero the longest response's unshared tail baseline.
    epsilon: added to the baseline's denominator.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, 0 at padding.
  """
  _check_otb_inputs(old_log_probs, sum_pi_squared)
  group_ids = as_group_ids(index, num_groups)
  slots = resolve_num_groups(group_ids, num_groups)
  mask = _as_mask(response_mask)
  rewards = jnp.asarray(token_level_rewards, jnp.float32)
  returns = reverse_cumsum(rewards * mask)
  weights = _path_variance(
      old_log_probs, sum_pi_squared, rollout_is_weights, mask
  )
  numer = group_sum(returns * weights * mask, group_ids, slots)
  denom = group_sum(weights * mask, group_ids, slots) + epsilon
  baseline = (numer / denom)[group_ids]
  size = _group_size(group_ids, slots)
  baseline = jnp.where((size > 1.0)[:, None], baseline, 0.0)
  if handle_zero_tail:
    lengths = jnp.sum(mask, axis=-1)
    member = jnp.ones(lengths.shape, bool)
    is_tail, cutoff = _zero_tail(lengths, member, group_ids, slots)
    position = jnp.arange(mask.shape[-1], dtype=jnp.float32)[None, :]
    in_tail = is_tail[:, None] & (position >= cutoff[:, None])
    baseline = jnp.where(in_tail, 0.0, baseline)
  advantages = returns - baseline
  return _zero_padding(advantages, mask), _zero_padding(returns, mask)


@estimator("tir_optimal_token_baseline", reads=_OTB, needs=_OTB_NEEDS)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: jax.Array,
    old_log_probs: jax.Array | None = None,
    sum_pi_squared: jax.Array | None = None,
    rollout_is_weights: jax.Array | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    num_groups: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Multi-turn OTB: the OTB baseline over each row's k-th valid token.

  `G` and `W` as in `optimal_token_baseline`. Positions are aligned by their
  rank among the row's valid tokens, `k = (Σ_{t'<=t} m_t') - 1`, so tool
  outputs (mask holes) do not shift the turns:

    b_k = Σ_g G_k·W_k / (Σ_g W_k + ε)      A_t = G_t - b_k(t)

  over the group's rows that have at least one valid token (rows without
  valid tokens are left out of the group, so a group with one non-empty row
  is a singleton: `b = 0`). The zero-tail rule applies on ranks.

  Args:
    token_level_rewards: `[B, T]` rewards.
    response_mask: `[B, T]`, 1 on valid (model) tokens, 0 on observation
      spans and padding.
    index: int `[B]` group ids in `[0, num_groups)`.
    old_log_probs: `[B, T]` rollout-policy log-probs of the sampled tokens
      (required; None raises ValueError).
    sum_pi_squared: `[B, T]` Σ_v π_v² of the rollout policy (required).
    rollout_is_weights: optional `[B, T]` IS weights.
    handle_zero_tail: zero the longest response's unshared tail baseline.
    epsilon: added to the baseline's denominator.
    num_groups: static number of group slots; None means `B`.

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, 0 at padding.
  """
  _check_otb_inputs(old_log_probs, sum_pi_squared)
  group_ids = as_group_ids(index, num_groups)
  slots = resolve_num_groups(group_ids, num_groups)
  mask = _as_mask(response_mask)
  horizon = mask.shape[-1]
  rewards = jnp.asarray(token_level_rewards, jnp.float32)
  returns = reverse_cumsum(rewards * mask)
  weights = _path_variance(
      old_log_probs, sum_pi_squared, rollout_is_weights, mask
  )
  rank = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1.0, 0.0)
  slot = group_ids[:, None] * horizon + rank.astype(jnp.int32)
  numer = jax.ops.segment_sum(
      (returns * weights * mask).ravel(), slot.ravel(), slots * horizon
  )
  denom = jax.ops.segment_sum(
      (weights * mask).ravel(), slot.ravel(), slots * horizon
  )
  baseline = (numer / (denom + epsilon))[slot]
  lengths = jnp.sum(mask, axis=-1)
  member = lengths > 0.0
  size = group_sum(member.astype(jnp.float32), group_ids, slots)[group_ids]
  baseline = jnp.where((size > 1.0)[:, None], baseline, 0.0)
  if handle_zero_tail:
    is_tail, cutoff = _zero_tail(lengths, member, group_ids, slots)
    in_tail = is_tail[:, None] & (rank >= cutoff[:, None])
    baseline = jnp.where(in_tail, 0.0, baseline)
  advantages = returns - baseline
  return _zero_padding(advantages, mask), _zero_padding(returns, mask)


# ----------------------------------------------------------------------------
# Lookup and dispatch.
# ----------------------------------------------------------------------------


def get_adv_estimator(name: str) -> AdvantageFn:
  """The estimator registered as `name` (verl's `algorithm.adv_estimator`).

  Raises:
    KeyError: unknown name; the message lists every valid name.
  """
  return ADV_ESTIMATOR_REGISTRY.get(str(getattr(name, "value", name)))


def adv_estimator_names() -> Sequence[str]:
  """All registered estimator names, sorted."""
  return ADV_ESTIMATOR_REGISTRY.names()


def estimator_inputs(name: str) -> EstimatorInputs:
  """What the estimator registered as `name` reads and needs.

  Raises:
    KeyError: an unknown name (listing the valid ones), or one registered without declaring its inputs.
  """
  get_adv_estimator(name)
  name = str(getattr(name, "value", name))
  if name not in _ESTIMATOR_INPUTS:
    raise KeyError(f"advantage estimator {name!r} was registered without its inputs: register it with "
                   "rljax.algos.estimator(name, reads=..., needs=...)")
  return _ESTIMATOR_INPUTS[name]


def needs_values(name: str) -> bool:
  """Whether the estimator registered as `name` reads a critic's values (GAE); False for a name registered
  without its inputs or not at all (config validation names those)."""
  inputs = _ESTIMATOR_INPUTS.get(str(getattr(name, "value", name)))
  return inputs is not None and "values" in inputs.needs


def needs_greedy_baselines(name: str) -> bool:
  """Whether the estimator registered as `name` needs each prompt's greedy response's reward (remax's
  `reward_baselines`): a rollout then decodes greedily too."""
  return "reward_baselines" in estimator_inputs(name).needs


def compute_advantage(adv_estimator: str, inputs: AdvantageInputs, config: Any = None
                      ) -> tuple[jax.Array, jax.Array]:
  """Runs the estimator named `adv_estimator` on `inputs`, as verl's trainer does.

  The counterpart of verl's `ray_trainer.compute_advantage`: the estimator
  gets the arguments it declared when it was registered (`estimator`), from
  `inputs` and `config` (the `algorithm` node: `gamma`, `lam`,
  `norm_adv_by_std_in_grpo`, `gdpo_reward_keys`, ...).

  Deliberate difference: verl's trainer forwards `norm_adv_by_std_in_grpo`
  only to `grpo` (and `grpo_passk` reads it from the config), so through
  verl's trainer `grpo_vectorized` and `gdpo` are always std-normalised.
  Here the flag (`config.norm_adv_by_std_in_grpo`, default True) reaches
  every estimator that takes it (`grpo`, `grpo_vectorized`, `gdpo`,
  `grpo_passk`).

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, 0 at padding.

  Raises:
    KeyError: an unknown estimator, listing the valid names.
    ValueError: an input the estimator needs is None, naming it.
  """
  fn = get_adv_estimator(adv_estimator)
  declared = estimator_inputs(adv_estimator)
  for field in declared.needs:
    if getattr(inputs, field) is None:
      raise ValueError(f"adv_estimator {adv_estimator!r} needs `{field}`: {_NEEDED[field]}")
  arguments = {name: _argument(name, inputs, config) for name in declared.reads}
  return fn(**{name: value for name, value in arguments.items() if value is not None})
