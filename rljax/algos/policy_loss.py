"""Policy-gradient losses, keyed by verl's `actor.policy_loss.loss_mode`.

Every loss has verl's signature (spec §3)

  fn(old_log_prob, log_prob, advantages, response_mask,
     loss_agg_mode="token-mean", config=None, rollout_is_weights=None,
     *, global_batch_info=None, rng=None) -> (pg_loss, metrics)

with `[B, T]` float arrays, `config` the actor config node
(`actor_rollout_ref.actor`, a ConfigDict read by attribute like verl's
ActorConfig), `rollout_is_weights` an optional `[B, T]` weight multiplied into
the per-token loss before aggregation, `global_batch_info` the
`agg_loss` keywords (`dp_size, batch_num_tokens, global_batch_size,
loss_scale_factor`) for micro-batches (when None, `config.global_batch_info`
as verl's losses read it), and `rng` a `jax.random` key (used by
`clip_cov` only). `metrics` holds float32 scalars under verl's names
(`actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower`).

Notation: `lr = log_prob - old_log_prob`, `lrc = clip(lr, ±20)`,
`r = exp(lrc)`, `A = advantages`, `ε_lo/ε_hi` = `clip_ratio_low/high`
(each falling back to `clip_ratio`), `sg` = stop-gradient.

Deliberate difference from verl: every input is replaced by 0 on padding
positions before use, so garbage (NaN, inf, huge values) at padding never
reaches a value, a metric or a gradient; the gradient wrt `log_prob` is
exactly 0 there. On valid tokens the values are verl's.

Registered names: verl's twelve (`vanilla, dppo_tv, dppo_kl, gspo, sapo, gpg,
clip_cov, kl_cov, geo_mean, dro, cispo, bypass_mode`) and `aipo` (cosmos-rl's
`aipo_rho` truncation, not in verl). `get_policy_loss(name)` returns the
function; unknown names raise a KeyError that lists the registered ones.
`ppo_loss` composes the actor's total loss (policy + entropy bonus + KL loss
+ optional positive-example NLL), and `positive_nll_loss` is cosmos-rl's
positive-example NLL term.
"""

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rljax.algos.config_access import config_get
from rljax.algos.agg import agg_loss
from rljax.algos.kl import kl_penalty
from rljax.algos.masked import masked_mean, masked_sum
from rljax.algos.registry import POLICY_LOSS_REGISTRY
from rljax.algos.rollout_corr import compute_rollout_correction_and_rejection_mask

LOG_RATIO_BOUND = 20.0
Metrics = dict[str, jax.Array]
PolicyLossFn = Callable[..., tuple[jax.Array, Metrics]]


# ------------------------------------------------------------------ config --


def clip_bounds(config: Any) -> tuple[float, float]:
  """`(ε_lo, ε_hi)`: `clip_ratio_low/high`, each None -> `clip_ratio`."""
  clip_ratio = config_get(config, "clip_ratio", 0.2)
  low = config_get(config, "clip_ratio_low")
  high = config_get(config, "clip_ratio_high")
  return (clip_ratio if low is None else low, clip_ratio if high is None else high)


def _policy_loss_config(config: Any, name: str, default: Any = None) -> Any:
  """`config.policy_loss.name`, None -> `default` (verl's fallbacks)."""
  value = config_get(config_get(config, "policy_loss"), name)
  return default if value is None else value


# ----------------------------------------------------------------- helpers --


def _zero_padding(response_mask: jax.Array, *arrays: jax.Array):
  """Each array with padding positions replaced by 0."""
  valid = response_mask.astype(bool)
  return tuple(jnp.where(valid, a, 0.0) for a in arrays)


def _ratio(log_prob, old_log_prob):
  """`(lrc, r)`: the ±20-clamped log-ratio and `r = exp(lrc)`."""
  lrc = jnp.clip(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
  return lrc, jnp.exp(lrc)


def _with_is_weights(pg_losses, rollout_is_weights):
  if rollout_is_weights is None:
    return pg_losses
  return pg_losses * jax.lax.stop_gradient(rollout_is_weights)


def batch_info(global_batch_info: Mapping | None, config: Any) -> Mapping:
  """The `agg_loss` keywords: the `global_batch_info` keyword when given, else the config's
  `global_batch_info` (verl's losses read `config.global_batch_info`), else none (normalise locally)."""
  if global_batch_info is not None:
    return global_batch_info
  return config_get(config, "global_batch_info") or {}


def _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config):
  return agg_loss(pg_losses, response_mask, loss_agg_mode, **batch_info(global_batch_info, config))


def _frac(condition, response_mask):
  """Fraction of valid tokens where `condition` holds."""
  return masked_mean(condition.astype(jnp.float32), response_mask)


def _clip_metrics(clipfrac, ppo_kl, clipfrac_lower) -> Metrics:
  return {
      "actor/pg_clipfrac": clipfrac,
      "actor/ppo_kl": ppo_kl,
      "actor/pg_clipfrac_lower": clipfrac_lower,
  }


def _ppo_clip_terms(advantages, ratio, low, high):
  """`(l1, l2) = (-A·r, -A·clip(r, 1-ε_lo, 1+ε_hi))`."""
  return -advantages * ratio, -advantages * jnp.clip(ratio, 1 - low, 1 + high)


def _count_fraction(response_mask, ratio: float) -> jax.Array:
  """`max(int(ratio · N), 1)` with `N = Σ m`, exactly as Python computes it.

  The float64 products `ratio · n` are evaluated on the host for every
  possible `n`; only the values of `n` where the count steps up are kept
  (`breaks[j]` = smallest n with count >= j + 2), and the traced N is looked
  up among them. This matches verl's `int(...)` even where a float32 product
  would round across an integer.
  """
  n_max = int(np.prod(response_mask.shape))
  counts = np.floor(ratio * np.arange(n_max + 1, dtype=np.float64))
  breaks = np.searchsorted(counts, np.arange(2, counts[-1] + 1), side="left")
  n = jnp.sum(response_mask.astype(jnp.int32))
  if breaks.size == 0:
    return jnp.int32(1)
  return 1 + jnp.searchsorted(jnp.asarray(breaks, jnp.int32), n, side="right")


def _rank(scores: jax.Array) -> jax.Array:
  """Position of each entry of a flat array in ascending (stable) order."""
  order = jnp.argsort(scores, stable=True)
  return jnp.zeros(scores.shape, jnp.int32).at[order].set(
      jnp.arange(scores.shape[0], dtype=jnp.int32)
  )


# ------------------------------------------------------------------ losses --


@POLICY_LOSS_REGISTRY.register("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """PPO clipped objective with dual-clip (always on) and clip-higher.

    l1 = -A·r,  l2 = -A·clip(r, 1-ε_lo, 1+ε_hi),  c1 = max(l1, l2)
    l3 = -A·c,  c2 = min(l3, c1)                  (c = clip_ratio_c > 1)
    L  = where(A < 0, c2, c1) [· w]  -> agg_loss
    pg_clipfrac = frac(l2 > l1), pg_clipfrac_lower = frac(c1 > l3 ∧ A < 0),
    ppo_kl = masked_mean(-lrc)

  dL/dlog_prob = -A·r where unclipped, 0 where either clip is active.
  Reads `clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c`.
  `rng` is unused.
  """
  del rng
  low, high = clip_bounds(config)
  clip_c = config_get(config, "clip_ratio_c", 3.0)
  if not clip_c > 1.0:
    raise ValueError(
        "actor_rollout_ref.actor.clip_ratio_c (dual-clip lower bound) must be "
        f"> 1.0, got {clip_c}"
    )
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  lrc, ratio = _ratio(log_prob, old_log_prob)
  l1, l2 = _ppo_clip_terms(advantages, ratio, low, high)
  c1 = jnp.maximum(l1, l2)
  l3 = -advantages * clip_c
  c2 = jnp.minimum(l3, c1)
  pg_losses = _with_is_weights(jnp.where(advantages < 0, c2, c1), rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, _clip_metrics(
      _frac(l2 > l1, response_mask),
      masked_mean(-lrc, response_mask),
      _frac((c1 > l3) & (advantages < 0), response_mask),
  )


def _dppo_loss(
    valid_fn,
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode,
    config,
    rollout_is_weights,
    global_batch_info,
):
  """DPPO-Binary: `L = -A · sg(min(r, c)) · log_prob · sg(valid)`."""
  low, high = clip_bounds(config)
  clip_c = config_get(config, "clip_ratio_c", 20.0)
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  lrc, ratio = _ratio(log_prob, old_log_prob)
  truncated = jax.lax.stop_gradient(jnp.minimum(ratio, clip_c))
  valid = valid_fn(log_prob, old_log_prob, advantages, low, high)
  valid = jax.lax.stop_gradient(valid.astype(jnp.float32))
  pg_losses = -advantages * truncated * log_prob * valid
  pg_losses = _with_is_weights(pg_losses, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, _clip_metrics(
      masked_mean(1.0 - valid, response_mask),
      masked_mean(-lrc, response_mask),
      masked_mean((ratio > clip_c).astype(jnp.float32) * valid, response_mask),
  )


def _tv_trust_region(log_prob, old_log_prob, advantages, low, high):
  """A > 0: p - p0 <= ε_hi; otherwise p - p0 >= -ε_lo (p = exp(log_prob))."""
  delta = jnp.exp(log_prob) - jnp.exp(old_log_prob)
  return jnp.where(advantages > 0, delta <= high, delta >= -low)


def binary_kl(log_prob: jax.Array, old_log_prob: jax.Array) -> jax.Array:
  """Bernoulli KL(p0 ‖ p) of the sampled token (DPPO-Binary-KL).

  `p0·(log p0 - log p) + (1 - p0)·log((1 - p0 + 1e-8) / (1 - p + 1e-8))`.
  """
  p = jnp.exp(log_prob)
  p0 = jnp.exp(old_log_prob)
  return p0 * (old_log_prob - log_prob) + (1 - p0) * jnp.log(
      (1.0 - p0 + 1e-8) / (1.0 - p + 1e-8)
  )


def _kl_trust_region(log_prob, old_log_prob, advantages, low, high):
  """A > 0: bkl <= ε_hi or p <= p0; otherwise bkl <= ε_lo or p >= p0."""
  bkl = binary_kl(log_prob, old_log_prob)
  p = jnp.exp(log_prob)
  p0 = jnp.exp(old_log_prob)
  return jnp.where(advantages > 0, (bkl <= high) | (p <= p0), (bkl <= low) | (p >= p0))


@POLICY_LOSS_REGISTRY.register("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """DPPO-Binary-TV: a total-variation trust region on token probabilities.

    valid = A > 0 ? (p - p0 <= ε_hi) : (p - p0 >= -ε_lo)     (A = 0: negative branch)
    L = -A · sg(min(r, c)) · log_prob · valid [· w]  -> agg_loss
    pg_clipfrac = frac(!valid), pg_clipfrac_lower = frac(r > c ∧ valid),
    ppo_kl = masked_mean(-lrc)

  `c = clip_ratio_c` (verl's intended default 20 is shadowed by ActorConfig's
  3.0). dL/dlog_prob = -A·sg(min(r, c))·valid. `rng` is unused.
  """
  del rng
  return _dppo_loss(
      _tv_trust_region,
      old_log_prob,
      log_prob,
      advantages,
      response_mask,
      loss_agg_mode,
      config,
      rollout_is_weights,
      global_batch_info,
  )


@POLICY_LOSS_REGISTRY.register("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """DPPO-Binary-KL: a Bernoulli-KL trust region on token probabilities.

    bkl = binary_kl(log_prob, old_log_prob)
    valid = A > 0 ? (bkl <= ε_hi ∨ p <= p0) : (bkl <= ε_lo ∨ p >= p0)
    L = -A · sg(min(r, c)) · log_prob · valid [· w]  -> agg_loss

  Metrics as `dppo_tv`. `rng` is unused.
  """
  del rng
  return _dppo_loss(
      _kl_trust_region,
      old_log_prob,
      log_prob,
      advantages,
      response_mask,
      loss_agg_mode,
      config,
      rollout_is_weights,
      global_batch_info,
  )


@POLICY_LOSS_REGISTRY.register("gspo")
def compute_policy_loss_gspo(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """GSPO: a sequence-level (length-normalised) importance ratio.

    s_b  = Σ_t lr·m / max(Σ_t m, 1)                     (lr NOT clamped)
    sr   = exp(min(log_prob - sg(log_prob) + sg(s_b), 10))   (value exp(s_b))
    L    = max(-A·sr, -A·clip(sr, 1-ε_lo, 1+ε_hi)) [· w]  -> agg_loss
    pg_clipfrac = frac(l2 > l1), pg_clipfrac_lower = 0, ppo_kl = masked_mean(-lr)

  dL/dlog_prob is token-local: -A·sr where unclipped, 0 where clipped or
  `s_b > 10`. `rng` is unused.
  """
  del rng
  low, high = clip_bounds(config)
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  mask = response_mask.astype(log_prob.dtype)
  log_ratio = log_prob - old_log_prob
  lengths = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
  seq_log_ratio = jnp.sum(log_ratio * mask, axis=-1) / lengths
  log_seq_ratio = (
      log_prob
      - jax.lax.stop_gradient(log_prob)
      + jax.lax.stop_gradient(seq_log_ratio)[:, None]
  )
  seq_ratio = jnp.exp(jnp.minimum(log_seq_ratio, 10.0))
  l1, l2 = _ppo_clip_terms(advantages, seq_ratio, low, high)
  pg_losses = _with_is_weights(jnp.maximum(l1, l2), rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, _clip_metrics(
      _frac(l2 > l1, response_mask),
      masked_mean(-log_ratio, response_mask),
      jnp.float32(0.0),
  )


@POLICY_LOSS_REGISTRY.register("sapo")
def compute_policy_loss_sapo(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """SAPO: a smooth sigmoid gate instead of a hard clip.

    τ = A > 0 ? tau_pos : tau_neg
    L = -sigmoid(τ·(r - 1)) · 4/τ · A [· w]  -> agg_loss("seq-mean-token-mean")
    pg_clipfrac = pg_clipfrac_lower = 0, ppo_kl = masked_mean(-lrc)

  As in verl the aggregation is always "seq-mean-token-mean" (the
  `loss_agg_mode` argument is ignored; `global_batch_info` applies).
  dL/dlog_prob = -A · 4·σ(1-σ) · r with σ the gate's sigmoid.
  Reads `tau_pos` (1.0), `tau_neg` (1.05). `rng` is unused.
  """
  del rng, loss_agg_mode
  tau_pos = jnp.float32(config_get(config, "tau_pos", 1.0))
  tau_neg = jnp.float32(config_get(config, "tau_neg", 1.05))
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  lrc, ratio = _ratio(log_prob, old_log_prob)
  tau = jnp.where(advantages > 0, tau_pos, tau_neg)
  gate = jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
  pg_losses = _with_is_weights(-gate * advantages, rollout_is_weights)
  pg_loss = _aggregate(
      pg_losses, response_mask, "seq-mean-token-mean", global_batch_info, config
  )
  return pg_loss, _clip_metrics(
      jnp.float32(0.0), masked_mean(-lrc, response_mask), jnp.float32(0.0)
  )


@POLICY_LOSS_REGISTRY.register("gpg")
def compute_policy_loss_gpg(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """GPG: plain policy gradient, `L = -log_prob · A [· w]` -> agg_loss.

  Metrics: `{}` (as verl). `old_log_prob` and `rng` are unused.
  """
  del old_log_prob, rng
  log_prob, advantages = _zero_padding(response_mask, log_prob, advantages)
  pg_losses = _with_is_weights(-log_prob * advantages, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, {}


def clip_cov_detach_mask(
    advantages: jax.Array,
    log_prob: jax.Array,
    response_mask: jax.Array,
    clipped: jax.Array,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    rng: jax.Array,
) -> jax.Array:
  """Clip-Cov's randomly chosen high-covariance tokens (bool `[B, T]`).

    cov = (A - masked_mean(A)) · (sg(log_prob) - masked_mean(sg(log_prob)))
    candidates: valid, not PPO-clipped, lb < cov < ub
    choose min(max(int(clip_cov_ratio · N), 1), #candidates) of them
    uniformly at random (verl uses torch's global RNG; here `rng`).
  """
  log_prob = jax.lax.stop_gradient(log_prob)
  valid = response_mask.astype(bool)
  cov = (advantages - masked_mean(advantages, response_mask)) * (
      log_prob - masked_mean(log_prob, response_mask)
  )
  candidate = valid & ~clipped & (cov < clip_cov_ub) & (cov > clip_cov_lb)
  clip_num = _count_fraction(response_mask, clip_cov_ratio)
  noise = jax.random.uniform(rng, candidate.shape)
  scores = jnp.where(candidate, noise, 2.0).reshape(-1)
  rank = _rank(scores).reshape(candidate.shape)
  return candidate & (rank < clip_num)


@POLICY_LOSS_REGISTRY.register("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """Clip-Cov: PPO clip plus gradient detaching of random high-cov tokens.

    r = exp(lr) (no clamp), l1 = -A·r, l2 = -A·clip(r, 1-ε_lo, 1+ε_hi)
    corr = 0 on `clip_cov_detach_mask(...)` tokens, else 1
    L = max(l1, l2) · corr [· w]  -> agg_loss          (no dual clip)
    pg_clipfrac = frac(corr == 0) (the detached fraction), ppo_kl = masked_mean(-lr)
    (no pg_clipfrac_lower key, as verl)

  Reads `policy_loss.clip_cov_ratio` (2e-4), `clip_cov_lb` (1.0),
  `clip_cov_ub` (5.0). `rng` (a `jax.random` key) is required.
  """
  if rng is None:
    raise ValueError("clip_cov selects tokens at random: pass rng=jax.random.key(...)")
  low, high = clip_bounds(config)
  clip_cov_ratio = _policy_loss_config(config, "clip_cov_ratio", 0.0002)
  clip_cov_lb = _policy_loss_config(config, "clip_cov_lb", 1.0)
  clip_cov_ub = _policy_loss_config(config, "clip_cov_ub", 5.0)
  if not clip_cov_ratio > 0:
    raise ValueError(
        f"actor_rollout_ref.actor.policy_loss.clip_cov_ratio must be > 0, got {clip_cov_ratio}"
    )
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  log_ratio = log_prob - old_log_prob
  l1, l2 = _ppo_clip_terms(advantages, jnp.exp(log_ratio), low, high)
  clipped = (l2 > l1) & response_mask.astype(bool)
  detach = clip_cov_detach_mask(
      advantages, log_prob, response_mask, clipped,
      clip_cov_ratio, clip_cov_lb, clip_cov_ub, rng,
  )
  corr = 1.0 - detach.astype(log_prob.dtype)
  pg_losses = _with_is_weights(jnp.maximum(l1, l2) * corr, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, {
      "actor/pg_clipfrac": _frac(detach, response_mask),
      "actor/ppo_kl": masked_mean(-log_ratio, response_mask),
  }


def kl_cov_select_mask(
    advantages: jax.Array,
    log_prob: jax.Array,
    response_mask: jax.Array,
    kl_cov_ratio: float,
) -> jax.Array:
  """KL-Cov's top-k covariance tokens (bool `[B, T]`).

    over valid tokens: cov = (A - mean(A)) · (sg(log_prob) - mean(sg(log_prob)))
    select the k = max(1, int(N · kl_cov_ratio)) largest (none if N = 0)

  Ties are broken by row-major position (lower first).
  """
  log_prob = jax.lax.stop_gradient(log_prob)
  valid = response_mask.astype(bool)
  n = jnp.sum(valid.astype(jnp.float32))
  mean_a = jnp.sum(jnp.where(valid, advantages, 0.0)) / n
  mean_lp = jnp.sum(jnp.where(valid, log_prob, 0.0)) / n
  cov = (advantages - mean_a) * (log_prob - mean_lp)
  scores = jnp.where(valid, -cov, jnp.inf).reshape(-1)
  rank = _rank(scores).reshape(valid.shape)
  return valid & (rank < _count_fraction(response_mask, kl_cov_ratio))


@POLICY_LOSS_REGISTRY.register("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """KL-Cov: a |log-ratio| penalty on the highest-covariance tokens.

    r = exp(lr) (no clamp), l1 = -A·r, lkl = -A·r + ppo_kl_coef·|lr|
    L = lkl on `kl_cov_select_mask(...)` tokens, l1 elsewhere [· w] -> agg_loss
    ppo_kl = masked_mean(|lr|)   (absolute value; the only metric)

  Reads `policy_loss.kl_cov_ratio` (2e-4), `policy_loss.ppo_kl_coef` (0.1 when
  absent; an explicit None means 1.0, as in verl). `rng` is unused.
  """
  del rng
  kl_cov_ratio = _policy_loss_config(config, "kl_cov_ratio", 0.0002)
  ppo_kl_coef = config_get(config_get(config, "policy_loss"), "ppo_kl_coef", 0.1)
  if ppo_kl_coef is None:
    ppo_kl_coef = 1.0
  if not kl_cov_ratio > 0:
    raise ValueError(
        f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}"
    )
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  log_ratio = log_prob - old_log_prob
  abs_kl = jnp.abs(log_ratio)
  l1 = -advantages * jnp.exp(log_ratio)
  lkl = l1 + ppo_kl_coef * abs_kl
  select = kl_cov_select_mask(advantages, log_prob, response_mask, kl_cov_ratio)
  pg_losses = _with_is_weights(jnp.where(select, lkl, l1), rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, {"actor/ppo_kl": masked_mean(abs_kl, response_mask)}


@POLICY_LOSS_REGISTRY.register("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """GMPO: geometric mean of token ratios, clipped in log space.

    s = sign(A), lcl = clip(lr, -ε_lo, ε_hi), lmin = s·min(s·lr, s·lcl)
    ratio_b = exp(Σ_t lmin·m / (L_b + 1e-8)),  adv_b = Σ_t A·m / (L_b + 1e-8)
    pg_b = -adv_b · ratio_b [· exp(Σ_t log(w + 1e-10)·m / (L_b + 1e-8))]
    pg_loss = mean_b pg_b      (over all B rows; loss_agg_mode and
                                global_batch_info are ignored, as verl)
    pg_clipfrac = frac(lr != lcl ∧ A > 0), pg_clipfrac_lower = frac(lr != lcl ∧ A < 0),
    ppo_kl = masked_mean(-lr)

  `rng` is unused.
  """
  del rng, loss_agg_mode, global_batch_info
  low, high = clip_bounds(config)
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  mask = response_mask.astype(log_prob.dtype)
  log_ratio = log_prob - old_log_prob
  sign = jnp.sign(advantages)
  clamped = jnp.clip(log_ratio, -low, high)
  log_ratio_min = sign * jnp.minimum(sign * log_ratio, sign * clamped)
  denom = jnp.sum(mask, axis=-1) + 1e-8
  ratio = jnp.exp(jnp.sum(log_ratio_min * mask, axis=-1) / denom)
  seq_adv = jnp.sum(advantages * mask, axis=-1) / denom
  pg_losses = -seq_adv * ratio
  if rollout_is_weights is not None:
    log_w = jnp.log(jax.lax.stop_gradient(rollout_is_weights) + 1e-10)
    log_w = jnp.where(response_mask.astype(bool), log_w, 0.0)
    pg_losses = pg_losses * jnp.exp(jnp.sum(log_w * mask, axis=-1) / denom)
  clipped = log_ratio != clamped
  return jnp.mean(pg_losses), _clip_metrics(
      _frac(clipped & (advantages > 0), response_mask),
      masked_mean(-log_ratio, response_mask),
      _frac(clipped & (advantages < 0), response_mask),
  )


@POLICY_LOSS_REGISTRY.register("dro")
def compute_policy_loss_dro(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """DRO: policy gradient with a quadratic log-ratio penalty.

    L = -(log_prob·A - ½·β·lr²) [· w]  -> agg_loss,  ppo_kl = masked_mean(-lr)

  `β = policy_loss.dro_beta` must be > 0. dL/dlog_prob = -A + β·lr.
  `rng` is unused.
  """
  del rng
  beta = _policy_loss_config(config, "dro_beta")
  if beta is None or beta <= 0:
    raise ValueError(
        "actor_rollout_ref.actor.policy_loss.dro_beta must be a positive value "
        f"when using DRO, got {beta!r}"
    )
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  log_ratio = log_prob - old_log_prob
  pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio**2)
  pg_losses = _with_is_weights(pg_losses, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, {"actor/ppo_kl": masked_mean(-log_ratio, response_mask)}


@POLICY_LOSS_REGISTRY.register("cispo")
def compute_policy_loss_cispo(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """CISPO: clipped importance weight as a detached coefficient.

    cr = clip(r, 1-ε_lo, 1+ε_hi),  L = -sg(cr)·A·log_prob [· w]  -> agg_loss
    pg_clipfrac = frac(r != cr), pg_clipfrac_lower = 0, ppo_kl = masked_mean(-lrc)

  dL/dlog_prob = -sg(cr)·A on every token. `rng` is unused.
  """
  del rng
  low, high = clip_bounds(config)
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  lrc, ratio = _ratio(log_prob, old_log_prob)
  clipped_ratio = jnp.clip(ratio, 1 - low, 1 + high)
  pg_losses = -jax.lax.stop_gradient(clipped_ratio) * advantages * log_prob
  pg_losses = _with_is_weights(pg_losses, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, _clip_metrics(
      _frac(ratio != clipped_ratio, response_mask),
      masked_mean(-lrc, response_mask),
      jnp.float32(0.0),
  )


def compute_policy_loss_reinforce(
    rollout_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
) -> tuple[jax.Array, Metrics]:
  """REINFORCE with optional IS weights (bypass mode's "reinforce").

    L = -A · log_prob [· w]  -> agg_loss,  ppo_kl = masked_mean(rollout_log_prob - log_prob)
  """
  rollout_log_prob, log_prob, advantages = _zero_padding(
      response_mask, rollout_log_prob, log_prob, advantages
  )
  pg_losses = _with_is_weights(-advantages * log_prob, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, {
      "actor/ppo_kl": masked_mean(-(log_prob - rollout_log_prob), response_mask)
  }


@POLICY_LOSS_REGISTRY.register("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """Bypass mode: `old_log_prob` is the rollout policy's; correct in the loss.

  From `policy_loss.rollout_correction` (`loss_type` "ppo_clip" | "reinforce",
  `rollout_is`, `rollout_is_threshold`, `rollout_is_batch_normalize`,
  `rollout_rs`, `rollout_rs_threshold`):

    w, m' = compute_rollout_correction_and_rejection_mask(
                sg(log_prob), old_log_prob, m, ...)     (π_current / π_rollout)
    reinforce: compute_policy_loss_reinforce(old_log_prob, log_prob, A, m', w)
    ppo_clip:  compute_policy_loss_vanilla(old_log_prob, log_prob, A, m', no w)

  The `rollout_is_weights` argument is ignored. Metrics: the loss's plus the
  `rollout_corr/*` metrics. `rng` is unused.
  """
  del rollout_is_weights, rng
  rollout_corr = config_get(config_get(config, "policy_loss"), "rollout_correction")
  if rollout_corr is None:
    raise ValueError(
        "loss_mode='bypass_mode' needs actor_rollout_ref.actor.policy_loss."
        "rollout_correction (the algorithm.rollout_correction settings)."
    )
  loss_type = config_get(rollout_corr, "loss_type", "ppo_clip")
  if loss_type not in ("reinforce", "ppo_clip"):
    raise ValueError(
        f"Invalid rollout_correction.loss_type: {loss_type!r}. Must be "
        "'reinforce' or 'ppo_clip'."
    )
  weights, new_mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
      jax.lax.stop_gradient(log_prob),
      old_log_prob,
      response_mask,
      rollout_is=config_get(rollout_corr, "rollout_is"),
      rollout_is_threshold=config_get(rollout_corr, "rollout_is_threshold", 2.0),
      rollout_is_batch_normalize=config_get(
          rollout_corr, "rollout_is_batch_normalize", False
      ),
      rollout_rs=config_get(rollout_corr, "rollout_rs"),
      rollout_rs_threshold=config_get(rollout_corr, "rollout_rs_threshold"),
  )
  if loss_type == "reinforce":
    pg_loss, metrics = compute_policy_loss_reinforce(
        old_log_prob, log_prob, advantages, new_mask, loss_agg_mode, config,
        weights, global_batch_info=global_batch_info,
    )
  else:
    pg_loss, metrics = compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, new_mask, loss_agg_mode, config,
        None, global_batch_info=global_batch_info,
    )
  return pg_loss, {**metrics, **corr_metrics}


@POLICY_LOSS_REGISTRY.register("aipo")
def compute_policy_loss_aipo(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
    *,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """AIPO (cosmos-rl's `aipo_rho`; not in verl): one-sided ratio truncation.

    L = -min(r, ρ) · A [· w]  -> agg_loss       (r = exp(clip(lr, ±20)))
    pg_clipfrac = frac(r > ρ), pg_clipfrac_lower = 0, ppo_kl = masked_mean(-lrc)

  For off-policy (asynchronous) data: the IS ratio is capped at ρ
  (`policy_loss.aipo_rho`, suggested 2-10) with no lower clip and no
  advantage-sign case split. dL/dlog_prob = -A·r where r < ρ, else 0.
  `rng` is unused. Reference: https://arxiv.org/abs/2505.24034.
  """
  del rng
  rho = _policy_loss_config(config, "aipo_rho")
  if rho is None or rho <= 0:
    raise ValueError(
        "loss_mode='aipo' needs actor_rollout_ref.actor.policy_loss.aipo_rho > 0, "
        f"got {rho!r}"
    )
  old_log_prob, log_prob, advantages = _zero_padding(
      response_mask, old_log_prob, log_prob, advantages
  )
  lrc, ratio = _ratio(log_prob, old_log_prob)
  pg_losses = _with_is_weights(-jnp.minimum(ratio, rho) * advantages, rollout_is_weights)
  pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, global_batch_info, config)
  return pg_loss, _clip_metrics(
      _frac(ratio > rho, response_mask),
      masked_mean(-lrc, response_mask),
      jnp.float32(0.0),
  )


def get_policy_loss(name: str) -> PolicyLossFn:
  """The policy loss registered under `name` (verl's `get_policy_loss_fn`)."""
  return POLICY_LOSS_REGISTRY.get(name)


# ----------------------------------------------------------- extra terms --


def positive_nll_loss(
    log_prob: jax.Array,
    response_mask: jax.Array,
    positive: jax.Array,
) -> jax.Array:
  """cosmos-rl's positive-example NLL (`positive_nll_coef`), not in verl.

    P = {(b, t): m_bt = 1 and positive_b}
    loss = -Σ_P log_prob / |P|        (0 when P is empty)

  An SFT-style term on the responses judged good (cosmos-rl: reward > 0);
  the caller adds `positive_nll_coef · loss` to the policy loss.

  Args:
    log_prob: float `[B, T]`.
    response_mask: `[B, T]`.
    positive: bool `[B]`, e.g. `rewards > 0` or `advantages[:, 0] > 0`.

  Returns:
    Scalar loss.
  """
  pos_mask = response_mask.astype(bool) & positive.astype(bool)[:, None]
  count = jnp.sum(pos_mask.astype(log_prob.dtype))
  return -masked_sum(log_prob, pos_mask) / jnp.maximum(count, 1.0)


@dataclasses.dataclass(frozen=True)
class PolicyInputs:
  """What the actor's loss reads for one (micro-)batch.

  Attributes:
    log_prob: float `[B, T]` the current policy's log-probs.
    old_log_prob: float `[B, T]` the behaviour policy's.
    advantages: float `[B, T]`.
    response_mask: `[B, T]`.
    entropy: optional float `[B, T]` token entropy of the current policy
      (the entropy bonus; None leaves it out).
    ref_log_prob: float `[B, T]`, required when `use_kl_loss`.
    rollout_is_weights: optional `[B, T]` rollout-correction weights.
    positive: optional bool `[B]` marking positive examples.
    rows: the rows the batch holds when some of its B are empty slots (a packed micro-batch under a token
      budget); a loss that is a plain mean over rows (GMPO's, as verl's) divides by these. None: all B.
  """

  log_prob: jax.Array
  old_log_prob: jax.Array
  advantages: jax.Array
  response_mask: jax.Array
  entropy: jax.Array | None = None
  ref_log_prob: jax.Array | None = None
  rollout_is_weights: jax.Array | None = None
  positive: jax.Array | None = None
  rows: jax.Array | int | None = None


# Losses that average over the batch's rows with no regard to the mask (verl's `torch.mean`).
ROW_MEAN_LOSSES = ("geo_mean",)


def ppo_loss(
    config: Any,
    inputs: PolicyInputs,
    global_batch_info: Mapping | None = None,
    rng: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """The actor's total loss, verl's `workers/utils/losses.ppo_loss` (§3.13).

    g = global_batch_info with loss_scale_factor = config.loss_scale_factor
    pg, metrics = get_policy_loss(policy_loss.loss_mode)(..., loss_agg_mode, g)
    loss = pg
         - entropy_coeff · agg_loss(entropy, m, loss_agg_mode, **g)   if entropy given
         + kl_loss_coef · agg_loss(kl_penalty(log_prob, ref, kl_loss_type), m, ..., **g)
                                                               if use_kl_loss
         + positive_nll_coef · positive_nll_loss(log_prob, m, positive)
                                       if positive given and positive_nll_coef > 0

  Metrics: the policy loss's, `actor/pg_loss`, `actor/entropy_loss`,
  `actor/kl_loss`, `actor/kl_coef` (verl's `ppo_loss` writes the last two
  without the `actor/` prefix; its trainers log them as `actor/...`), and
  `actor/positive_nll_loss`.

  Reads `loss_agg_mode, loss_scale_factor, policy_loss.loss_mode,
  entropy_coeff, use_kl_loss, kl_loss_coef, kl_loss_type, positive_nll_coef`
  and whatever the chosen policy loss reads.

  Args:
    config: the actor config node.
    inputs: the batch's log-probs, advantages, mask and optional terms.
    global_batch_info: `dp_size, batch_num_tokens, global_batch_size` of the
      mini-batch (see `agg_loss`); None reads `config.global_batch_info`, and without one normalises locally.
    rng: `jax.random` key for `clip_cov`.

  Returns:
    `(loss, metrics)`.
  """
  log_prob, old_log_prob, advantages, response_mask = (
      inputs.log_prob, inputs.old_log_prob, inputs.advantages, inputs.response_mask)
  entropy, ref_log_prob, positive = inputs.entropy, inputs.ref_log_prob, inputs.positive
  info = dict(batch_info(global_batch_info, config))
  info["loss_scale_factor"] = config_get(config, "loss_scale_factor")
  mode = config_get(config, "loss_agg_mode", "token-mean")
  loss_mode = config_get(config_get(config, "policy_loss"), "loss_mode", "vanilla")
  pg_loss, pg_metrics = get_policy_loss(loss_mode)(
      old_log_prob,
      log_prob,
      advantages,
      response_mask,
      mode,
      config,
      inputs.rollout_is_weights,
      global_batch_info=info,
      rng=rng,
  )
  if inputs.rows is not None and loss_mode in ROW_MEAN_LOSSES:
    pg_loss = pg_loss * response_mask.shape[0] / inputs.rows  # the mean over the real rows, not the slots
  metrics = {**pg_metrics, "actor/pg_loss": pg_loss}
  loss = pg_loss
  if entropy is not None:
    entropy_loss = agg_loss(entropy, response_mask, mode, **info)
    loss = loss - config_get(config, "entropy_coeff", 0.0) * entropy_loss
    metrics["actor/entropy_loss"] = entropy_loss
  if config_get(config, "use_kl_loss", False):
    if ref_log_prob is None:
      raise ValueError("actor_rollout_ref.actor.use_kl_loss=True needs ref_log_prob")
    kl_coef = config_get(config, "kl_loss_coef", 0.001)
    log_prob_v, ref_v = _zero_padding(response_mask, log_prob, ref_log_prob)
    kld = kl_penalty(log_prob_v, ref_v, config_get(config, "kl_loss_type", "low_var_kl"))
    kl_loss = agg_loss(kld, response_mask, mode, **info)
    loss = loss + kl_loss * kl_coef
    metrics["actor/kl_loss"] = kl_loss
    metrics["actor/kl_coef"] = jnp.float32(kl_coef)
  nll_coef = config_get(config, "positive_nll_coef")
  if positive is not None and nll_coef is not None and nll_coef > 0:
    nll = positive_nll_loss(log_prob, response_mask, positive)
    loss = loss + nll_coef * nll
    metrics["actor/positive_nll_loss"] = nll
  return loss, metrics
