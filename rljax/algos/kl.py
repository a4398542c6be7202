"""KL penalties between the policy and the reference, and KL controllers.

Per-token estimators of KL(π || π_ref) from the sampled tokens' log-probs,
`d = logprob - ref_logprob` (verl's `kl_penalty`, spec §4.2):

  kl, k1           d
  abs              |d|
  mse, k2          ½ d²
  low_var_kl, k3   clip(e^x - x - 1, -10, 10),  x = clip(-d, -20, 20)
  full             Σ_v p_v (log p_v - log q_v)  from full logits

`<name>+` (e.g. `k3+`) is the straight-through variant: the value of
`<name>`, the gradient of `k2` (`∂/∂logprob = d`).

verl leaves `full` unimplemented; here it is exact, from the two models'
logits (`kl_penalty_full`, or `kl_penalty(..., "full", logits=...,
ref_logits=...)`).

KL in the reward (`algorithm.use_kl_in_reward`): `apply_kl_penalty` subtracts
`β·kl` from the token scores, with β from a controller. Controllers are
immutable pytrees: `update` returns a new controller, so they can live in a
jitted train state.

  FixedKLController      β constant
  AdaptiveKLController   β ← β·(1 + clip(kl/target - 1, ±0.2)·n_steps/horizon)
"""

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rljax.algos.masked import masked_mean

_Estimator = Callable[[jax.Array], jax.Array]


def _k1(delta: jax.Array) -> jax.Array:
  return delta


def _abs(delta: jax.Array) -> jax.Array:
  # d·sign(d) = |d| with gradient sign(d), 0 at 0 as in torch (jnp.abs gives 1).
  return delta * jnp.sign(delta)


def _k2(delta: jax.Array) -> jax.Array:
  return 0.5 * jnp.square(delta)


def _clamp(x: jax.Array, low: float, high: float) -> jax.Array:
  """torch.clamp: gradient 1 on `[low, high]` (bounds included), else 0.

  (`jnp.clip` splits the gradient 1/2-1/2 at a bound.)
  """
  return jnp.where(x < low, low, jnp.where(x > high, high, x))


def _k3(delta: jax.Array) -> jax.Array:
  x = _clamp(-delta, -20.0, 20.0)
  return _clamp(jnp.exp(x) - x - 1.0, -10.0, 10.0)


_ESTIMATORS: dict[str, _Estimator] = {
    "kl": _k1,
    "k1": _k1,
    "abs": _abs,
    "mse": _k2,
    "k2": _k2,
    "low_var_kl": _k3,
    "k3": _k3,
}

KL_PENALTY_NAMES: tuple[str, ...] = tuple(
    sorted([*_ESTIMATORS, "full"] + [f"{n}+" for n in [*_ESTIMATORS, "full"]])
)


def kl_penalty_full(logits: jax.Array, ref_logits: jax.Array) -> jax.Array:
  """Exact per-token KL(p || q) from full logits.

    KL_t = Σ_v p_v (log p_v - log q_v),   p = softmax(logits),
                                          q = softmax(ref_logits)

  computed in float32. Differentiable in both arguments.

  Args:
    logits: `[B, T, V]` policy logits.
    ref_logits: `[B, T, V]` reference logits.

  Returns:
    float32 `[B, T]`, each entry >= 0 (up to rounding).
  """
  log_p = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  log_q = jax.nn.log_softmax(jnp.asarray(ref_logits, jnp.float32), axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def _straight_through(delta: jax.Array, value: jax.Array) -> jax.Array:
  """`value` forward, the k2 gradient `d` backward.

  `½d² - sg(½d²) + sg(value)`.
  """
  k2 = _k2(delta)
  return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)


def kl_penalty(
    logprob: jax.Array,
    ref_logprob: jax.Array,
    kl_penalty: str,
    *,
    logits: jax.Array | None = None,
    ref_logits: jax.Array | None = None,
) -> jax.Array:
  """Per-token KL penalty between the policy and the reference.

  See the module docstring for the estimators. Elementwise and unmasked:
  padding positions hold whatever their inputs give.

  Gradients wrt `logprob`: k1 → 1; abs → sign(d) (0 at 0); k2 → d;
  k3 → 1 - e^{-d} where no clip is active, 0 where one is; any `+` name → d.

  Args:
    logprob: `[B, T]` policy log-probs of the sampled tokens.
    ref_logprob: `[B, T]` reference log-probs of the same tokens.
    kl_penalty: estimator name (`actor.kl_loss_type` or
      `algorithm.kl_penalty`), one of `KL_PENALTY_NAMES`.
    logits: `[B, T, V]` policy logits, required by `full` / `full+`.
    ref_logits: `[B, T, V]` reference logits, required by `full` / `full+`.

  Returns:
    float32 `[B, T]`.

  Raises:
    ValueError: unknown name, or `full` without both logits.
  """
  straight_through = kl_penalty.endswith("+")
  base = kl_penalty[:-1] if straight_through else kl_penalty
  delta = jnp.asarray(logprob, jnp.float32) - jnp.asarray(
      ref_logprob, jnp.float32
  )
  if base == "full":
    if logits is None or ref_logits is None:
      raise ValueError(
          f"kl_penalty {kl_penalty!r} needs the full distributions: pass "
          "logits= and ref_logits= ([B, T, V]) or call kl_penalty_full"
      )
    value = kl_penalty_full(logits, ref_logits)
  elif base in _ESTIMATORS:
    value = _ESTIMATORS[base](delta)
  else:
    raise ValueError(
        f"unknown kl_penalty {kl_penalty!r}; valid names: "
        f"{', '.join(KL_PENALTY_NAMES)}"
    )
  if straight_through:
    return _straight_through(delta, value)
  return value


# `apply_kl_penalty` takes verl's keyword `kl_penalty`, which shadows the
# function inside it.
_penalty_by_name = kl_penalty


def compute_rewards(
    token_level_scores: jax.Array,
    old_log_prob: jax.Array,
    ref_log_prob: jax.Array,
    kl_ratio: float | jax.Array,
) -> jax.Array:
  """Token rewards with a k1 KL penalty: `scores - (old - ref)·kl_ratio`.

  Unmasked. Shapes `[B, T]`.
  """
  return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


# ----------------------------------------------------------------------------
# KL controllers.
# ----------------------------------------------------------------------------


def _clip_error(x: Any) -> Any:
  """`clip(x, -0.2, 0.2)`: jnp for arrays, Python floats stay Python floats."""
  if isinstance(x, jax.Array):
    return jnp.clip(x, -0.2, 0.2)
  return min(max(float(x), -0.2), 0.2)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["value"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class FixedKLController:
  """A constant KL coefficient.

  Attributes:
    value: the coefficient β (`algorithm.kl_ctrl.kl_coef`).
  """

  value: float | jax.Array

  def update(
      self, current_kl: float | jax.Array, n_steps: int
  ) -> "FixedKLController":
    """Returns self: a fixed coefficient never changes."""
    del current_kl, n_steps
    return self


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["value"],
    meta_fields=["target", "horizon"],
)
@dataclasses.dataclass(frozen=True)
class AdaptiveKLController:
  """The adaptive KL coefficient of Ziegler et al. (2019).

    e = clip(current_kl / target - 1, -0.2, 0.2)
    β ← β · (1 + e · n_steps / horizon)

  Attributes:
    value: the current coefficient β.
    target: the KL the controller steers to (`kl_ctrl.target_kl`).
    horizon: steps over which a full error is corrected (`kl_ctrl.horizon`).
  """

  value: float | jax.Array
  target: float
  horizon: int

  def __post_init__(self):
    if self.horizon <= 0:
      raise ValueError(
          f"algorithm.kl_ctrl.horizon must be > 0, got {self.horizon}"
      )

  def update(
      self, current_kl: float | jax.Array, n_steps: int
  ) -> "AdaptiveKLController":
    """Returns the controller after observing `current_kl` over `n_steps`."""
    error = _clip_error(current_kl / self.target - 1.0)
    factor = 1.0 + error * n_steps / self.horizon
    return dataclasses.replace(self, value=self.value * factor)


KLController = FixedKLController | AdaptiveKLController


def get_kl_controller(kl_ctrl_config: Any) -> KLController:
  """Builds the controller described by the `algorithm.kl_ctrl` node.

  Reads `type` ("fixed" | "adaptive"), `kl_coef` (default 0.001),
  `target_kl` (0.1), `horizon` (10000).

  Raises:
    ValueError: unknown type, or `horizon <= 0` for "adaptive".
  """
  def read(key: str, default: Any) -> Any:
    value = getattr(kl_ctrl_config, key, None)
    if value is None and isinstance(kl_ctrl_config, dict):
      value = kl_ctrl_config.get(key)
    return default if value is None else value

  kind = read("type", "fixed")
  kl_coef = float(read("kl_coef", 0.001))
  if kind == "fixed":
    return FixedKLController(value=kl_coef)
  if kind == "adaptive":
    return AdaptiveKLController(
        value=kl_coef,
        target=float(read("target_kl", 0.1)),
        horizon=int(read("horizon", 10000)),
    )
  raise ValueError(
      f"unknown algorithm.kl_ctrl.type {kind!r}; valid types: adaptive, fixed"
  )


def apply_kl_penalty(
    token_level_scores: jax.Array,
    old_log_probs: jax.Array,
    ref_log_prob: jax.Array,
    response_mask: jax.Array,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
) -> tuple[jax.Array, KLController, dict[str, jax.Array]]:
  """KL in the reward, as verl's trainer `apply_kl_penalty` (spec §4.3).

    kld     = kl_penalty(old, ref) · m
    rewards = scores - β · kld        (β = kl_ctrl.value, before the update)
    kl      = mean_b( Σ_t kld·m / (Σ_t m + 1e-8) )
    kl_ctrl ← kl_ctrl.update(kl, n_steps=B)

  Args:
    token_level_scores: `[B, T]` reward-model / rule scores.
    old_log_probs: `[B, T]` rollout-policy log-probs.
    ref_log_prob: `[B, T]` reference log-probs.
    response_mask: `[B, T]`, 1 on valid tokens.
    kl_ctrl: the current controller.
    kl_penalty: estimator name (`algorithm.kl_penalty`).

  Returns:
    `(token_level_rewards [B, T], updated controller, metrics)`, metrics
    `{"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": β}`.
  """
  mask = jnp.asarray(response_mask).astype(jnp.float32)
  kld = _penalty_by_name(old_log_probs, ref_log_prob, kl_penalty) * mask
  beta = kl_ctrl.value
  rewards = jnp.asarray(token_level_scores, jnp.float32) - beta * kld
  current_kl = jnp.mean(masked_mean(kld, mask, axis=-1))
  new_ctrl = kl_ctrl.update(current_kl, n_steps=mask.shape[0])
  metrics = {
      "actor/reward_kl_penalty": current_kl,
      "actor/reward_kl_penalty_coeff": jnp.asarray(beta, jnp.float32),
  }
  return rewards, new_ctrl, metrics

