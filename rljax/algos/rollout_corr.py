"""Rollout correction: importance weights, rejection masks, off-policy metrics.

verl's `trainer/ppo/rollout_corr_helper.py` (spec §5). The rollout engine
(inference policy π_roll) and the trainer (π_train) disagree slightly on the
log-probabilities of the same tokens; with `lr = log π_train - log π_roll`
(`old_log_prob - rollout_log_prob`), `SAFETY_BOUND = 20`:

IS weights (`compute_rollout_correction_weights`):
  token     raw_t = exp(clip(lr_t, ±20)) · m_t
  sequence  raw_t = exp(clip(Σ_t lr·m, ±20)) · m_t      (one weight per row)
  TIS       w = min(raw, upper)                          threshold "2.0"
  IcePop    w = raw if lower <= raw <= upper else 0      threshold "0.5_2.0"
  batch normalisation (optional): w /= mean(w) (token: over valid tokens;
  sequence: over non-empty rows of each row's mean), if mean > 1e-8.

Rejection (`compute_rollout_rejection_mask`), per comma-separated option, on
`x = clip(lr, ±20)`: k1 = -x, k2 = x²/2, k3 = exp(x) - 1 - x, at token level
(`token_k*`) or per row (`seq_sum_k*`, `seq_mean_k*`, `seq_max_k2|k3`).
`*_k1` keeps `log(lower) <= stat <= log(upper)` ("lower_upper", or "u" for
lower = 1/u; the bounds apply to π_roll/π_train); k2/k3 keep `stat <= upper`.
A row option keeps or rejects every token of its row; all options must pass.
`mask' = m · Π keep`.

Every function is jit-able: option strings and thresholds are static Python
values, metrics are float32 scalars (verl returns Python floats). verl raises
when `response_mask` has no valid token; that check needs concrete values
and is done only when the mask is concrete (outside `jit`).
"""

import math

import jax
import jax.numpy as jnp

from rljax.algos.masked import masked_mean, masked_sum

SAFETY_BOUND = 20.0
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)

Metrics = dict[str, jax.Array]


# ----------------------------------------------------------------- parsing --


def parse_rollout_is_threshold(spec: str | float) -> tuple[float, float | None]:
  """`rollout_is_threshold` -> `(upper, lower)`; lower is None for TIS.

  A number or a number string is a TIS upper bound; `"lower_upper"` selects
  IcePop with both bounds (0 < lower <= upper).
  """
  if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
    raise TypeError(
        "rollout_is_threshold must be a float or a 'lower_upper' string, "
        f"got {spec!r}"
    )
  lower = None
  try:
    if isinstance(spec, str) and "_" in spec.strip():
      lower_str, upper_str = spec.strip().split("_", 1)
      lower, upper = float(lower_str), float(upper_str)
    else:
      upper = float(spec)
  except ValueError:
    raise ValueError(f"Invalid rollout_is_threshold {spec!r}") from None
  if upper <= 0:
    raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}")
  if lower is not None and not 0 < lower <= upper:
    raise ValueError(
        f"rollout_is_threshold needs 0 < lower <= upper, got {spec!r}"
    )
  return upper, lower


def parse_rollout_rs(rollout_rs: str) -> list[str]:
  """Comma-separated `rollout_rs` -> validated, de-duplicated option list."""
  if not isinstance(rollout_rs, str):
    raise ValueError(
        "rollout_rs must be a non-empty string (comma separated for "
        f"multiple options), got {rollout_rs!r}"
    )
  options = []
  for opt in (o.strip() for o in rollout_rs.split(",")):
    if not opt:
      continue
    if opt not in ROLLOUT_RS_OPTIONS:
      raise ValueError(
          f"Invalid rollout_rs option: {opt!r}; valid options: "
          f"{', '.join(ROLLOUT_RS_OPTIONS)}"
      )
    if opt not in options:
      options.append(opt)
  if not options:
    raise ValueError("rollout_rs must contain at least one valid option.")
  return options


def _positive_float(text: str, option: str) -> float:
  """`float(text)`, which must be > 0, with the option named in errors."""
  try:
    value = float(text)
  except ValueError:
    raise ValueError(
        f"Invalid numeric threshold {text!r} for option {option!r}"
    ) from None
  if value <= 0:
    raise ValueError(f"Thresholds for option {option!r} must be positive, got {text!r}")
  return value


def _option_threshold(option: str, part: str) -> tuple[float | None, float]:
  """One option's `(lower, upper)`; lower only for k1 options."""
  if option.endswith("k1"):
    if "_" in part:
      lower_str, upper_str = part.split("_", 1)
      return _positive_float(lower_str, option), _positive_float(upper_str, option)
    upper = _positive_float(part, option)
    return 1.0 / upper, upper
  if "_" in part:
    raise ValueError(
        f"rollout_rs_threshold for {option!r} must be a single upper bound "
        f"without '_', got {part!r}"
    )
  return None, _positive_float(part, option)


def parse_rollout_rs_thresholds(
    options: list[str], spec: str | float | None
) -> dict[str, tuple[float | None, float]]:
  """`rollout_rs_threshold` -> `{option: (lower, upper)}` (lower only for k1).

  One threshold per option, comma-separated, or a single one for all. For
  `*_k1`: `"lower_upper"`, or `"u"` meaning lower = 1/u. Others: one
  positive upper bound.
  """
  if spec is None:
    raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
  if isinstance(spec, (int, float)) and not isinstance(spec, bool):
    parts = [str(spec)]
  elif isinstance(spec, str):
    parts = [p.strip() for p in spec.split(",") if p.strip()]
  else:
    raise TypeError(f"rollout_rs_threshold must be a string or number, got {spec!r}")
  if len(parts) not in (1, len(options)):
    raise ValueError(
        "rollout_rs_threshold expects one threshold shared by all options or "
        f"exactly {len(options)} (one per rollout_rs option), got {spec!r}"
    )
  if len(parts) == 1:
    parts = parts * len(options)
  return {opt: _option_threshold(opt, part) for opt, part in zip(options, parts)}


def _check_any_valid(response_mask: jax.Array) -> None:
  """verl's `response_mask.any()` check, when the mask is concrete."""
  try:
    has_valid = bool(jnp.any(response_mask))
  except jax.errors.ConcretizationTypeError:
    return
  if not has_valid:
    raise ValueError("response_mask must contain at least one valid token (1).")


# ------------------------------------------------------------- small stats --


def _fmask(response_mask: jax.Array) -> jax.Array:
  return response_mask.astype(jnp.float32)


def _masked_max(x: jax.Array, valid: jax.Array) -> jax.Array:
  return jnp.max(jnp.where(valid, x, -jnp.inf))


def _masked_min(x: jax.Array, valid: jax.Array) -> jax.Array:
  return jnp.min(jnp.where(valid, x, jnp.inf))


def _mean_over(x: jax.Array, valid: jax.Array) -> jax.Array:
  """Plain mean of `x[valid]` (`x.mean()` on the selected entries)."""
  v = valid.astype(jnp.float32)
  return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.sum(v)


def _std_over(x: jax.Array, valid: jax.Array) -> jax.Array:
  """Unbiased std of `x[valid]` (`torch.std`), 0 when fewer than 2 entries."""
  n = jnp.sum(valid.astype(jnp.float32))
  mu = _mean_over(x, valid)
  ss = jnp.sum(jnp.where(valid, (x - mu) ** 2, 0.0))
  return jnp.where(n > 1, jnp.sqrt(ss / jnp.maximum(n - 1.0, 1.0)), 0.0)


def _clamped_std(stat, response_mask, lo, hi) -> jax.Array:
  """`sqrt(max(E[c²] - E[c]², 0))`, `c = clip(stat, lo, hi)` over valid tokens.

  0 when there is at most one valid token (verl's `mask_count > 1` branch).
  """
  c = jnp.minimum(jnp.maximum(stat, lo), hi)
  mean = masked_mean(c, response_mask)
  var = masked_mean(c * c, response_mask) - mean * mean
  count = jnp.sum(_fmask(response_mask))
  return jnp.where(count > 1, jnp.sqrt(jnp.maximum(var, 0.0)), 0.0)


# -------------------------------------------------------------- IS weights --


def _raw_is_weights(log_ratio, response_mask, rollout_is):
  """`(raw weights [B, T], log-ratio used by the metrics)` for a level."""
  m = _fmask(response_mask)
  if rollout_is == "token":
    clipped = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    return jnp.exp(clipped) * m, log_ratio
  seq_log_ratio = masked_sum(log_ratio, response_mask, axis=-1)[:, None]
  clipped = jnp.clip(seq_log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
  return jnp.exp(clipped) * m, seq_log_ratio


def _truncate_is_weights(raw, upper, lower):
  """TIS (`min(raw, upper)`) or, with `lower`, IcePop (0 outside the band)."""
  if lower is None:
    return jnp.minimum(raw, upper)
  return jnp.where((raw >= lower) & (raw <= upper), raw, 0.0)


def compute_is_metrics(
    rollout_is_weights: jax.Array,
    raw_rollout_is_weights: jax.Array,
    log_ratio_for_metrics: jax.Array,
    response_mask: jax.Array,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> Metrics:
  """`rollout_is_*` statistics of the applied and raw IS weights.

  Keys: `rollout_is_mean, _max, _min, _ratio_fraction_high, _low, _std,
  _eff_sample_size, _seq_mean, _seq_std, _seq_max, _seq_min,
  _seq_max_deviation, _seq_fraction_high, _seq_fraction_low`. Token level:
  max/min of applied weights over valid tokens, fractions of raw weights
  outside `[lower, upper]` (lower defaults to 1/upper). Sequence level:
  max = exp(min(max_b lr_b, 20)), min = exp(min_b lr_b), fractions of rows
  whose log-ratio is outside `[log lower, log upper]`.
  """
  m = _fmask(response_mask)
  valid = response_mask.astype(bool)
  upper = rollout_is_threshold
  lower = 1.0 / upper if rollout_is_threshold_lower is None else rollout_is_threshold_lower
  w = rollout_is_weights
  metrics = {"rollout_is_mean": masked_mean(w, m)}
  if rollout_is == "sequence":
    log_upper = jnp.log(jnp.float32(upper))
    log_lower = jnp.log(jnp.float32(lower))
    metrics["rollout_is_max"] = jnp.exp(
        jnp.minimum(jnp.max(log_ratio_for_metrics), SAFETY_BOUND)
    )
    metrics["rollout_is_min"] = jnp.exp(jnp.min(log_ratio_for_metrics))
    metrics["rollout_is_ratio_fraction_high"] = jnp.mean(
        (log_ratio_for_metrics > log_upper).astype(jnp.float32)
    )
    metrics["rollout_is_ratio_fraction_low"] = jnp.mean(
        (log_ratio_for_metrics < log_lower).astype(jnp.float32)
    )
  else:
    raw = raw_rollout_is_weights
    metrics["rollout_is_ratio_fraction_high"] = masked_mean(
        (raw > upper).astype(jnp.float32), m
    )
    metrics["rollout_is_ratio_fraction_low"] = masked_mean(
        (raw < lower).astype(jnp.float32), m
    )
    metrics["rollout_is_max"] = _masked_max(w, valid)
    metrics["rollout_is_min"] = _masked_min(w, valid)
  metrics["rollout_is_std"] = _clamped_std(w, m, 0.0, upper)
  w_ess = jnp.clip(w, 0.0, upper)
  normalized = w_ess / (masked_mean(w_ess, m) + 1e-8)
  metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalized**2, m)
  seq_w = masked_mean(w, m, axis=-1)
  all_rows = jnp.ones(seq_w.shape, bool)
  metrics["rollout_is_seq_mean"] = jnp.mean(seq_w)
  metrics["rollout_is_seq_std"] = _std_over(seq_w, all_rows)
  metrics["rollout_is_seq_max"] = jnp.max(seq_w)
  metrics["rollout_is_seq_min"] = jnp.min(seq_w)
  metrics["rollout_is_seq_max_deviation"] = jnp.max(jnp.abs(seq_w - 1.0))
  raw_seq_w = masked_mean(raw_rollout_is_weights, m, axis=-1)
  metrics["rollout_is_seq_fraction_high"] = jnp.mean(
      (raw_seq_w > upper).astype(jnp.float32)
  )
  metrics["rollout_is_seq_fraction_low"] = jnp.mean(
      (raw_seq_w < lower).astype(jnp.float32)
  )
  return metrics


def _batch_normalize(w, response_mask, rollout_is):
  """`(w / mean, factor)`; unchanged with factor 1 when mean <= 1e-8."""
  m = _fmask(response_mask)
  if rollout_is == "token":
    mean = masked_mean(w, m)
  else:
    seq_w = masked_mean(w, m, axis=-1)
    seq_mask = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
    mean = jnp.sum(seq_w * seq_mask) / jnp.maximum(jnp.sum(seq_mask), 1e-8)
  ok = mean > 1e-8
  return jnp.where(ok, w / jnp.where(ok, mean, 1.0), w), jnp.where(ok, mean, 1.0)


def compute_rollout_correction_weights(
    log_ratio: jax.Array,
    response_mask: jax.Array,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[jax.Array, Metrics]:
  """Truncated (TIS) or band-passed (IcePop) importance weights.

  See the module docstring for the formulas. The weights carry no gradient.

  Args:
    log_ratio: float `[B, T]`, `log π_train - log π_roll`.
    response_mask: `[B, T]`.
    rollout_is: "token" or "sequence".
    rollout_is_threshold: TIS upper bound, or "lower_upper" for IcePop.
    rollout_is_batch_normalize: divide by the batch mean weight.

  Returns:
    `(weights [B, T] float32, exactly 0 on padding; metrics)` with the
    `rollout_is_*` keys of `compute_is_metrics`, plus `rollout_is_oob_ratio`
    (IcePop) and `rollout_is_batch_norm_factor` (batch normalisation).
  """
  if rollout_is not in ROLLOUT_IS_LEVELS:
    raise ValueError(
        f"Invalid rollout_is: {rollout_is!r}. Must be one of {ROLLOUT_IS_LEVELS}."
    )
  upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
  log_ratio = jnp.where(response_mask.astype(bool), log_ratio, 0.0)
  raw, lr_metrics = _raw_is_weights(log_ratio, response_mask, rollout_is)
  weights = _truncate_is_weights(raw, upper, lower)
  metrics = compute_is_metrics(
      weights, raw, lr_metrics, response_mask, rollout_is, upper, lower
  )
  if lower is not None:
    oob = (raw < lower) | (raw > upper)
    metrics["rollout_is_oob_ratio"] = masked_mean(
        oob.astype(jnp.float32), response_mask
    )
  weights = jax.lax.stop_gradient(weights)
  if rollout_is_batch_normalize:
    weights, factor = _batch_normalize(weights, response_mask, rollout_is)
    metrics["rollout_is_batch_norm_factor"] = factor
  return weights, metrics


# --------------------------------------------------------------- rejection --


def _token_divergences(log_ratio):
  """`{k1, k2, k3}` per token of `x = clip(lr, ±20)`, in float32."""
  x = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
  return {"k1": -x, "k2": 0.5 * x**2, "k3": jnp.exp(x) - 1.0 - x}


def _seq_statistic(kind: str, token_stat, response_mask):
  """Row statistic `[B]`: masked sum, mean, or max (0 for an empty row)."""
  if kind == "sum":
    return masked_sum(token_stat, response_mask, axis=-1)
  if kind == "mean":
    return masked_mean(token_stat, response_mask, axis=-1)
  row_max = jnp.max(
      jnp.where(response_mask.astype(bool), token_stat, -jnp.inf), axis=-1
  )
  return jnp.where(row_max == -jnp.inf, 0.0, row_max)


def compute_rs_metrics(
    option_name: str,
    rs_statistic: jax.Array,
    response_mask: jax.Array,
    per_sequence_values: jax.Array | None,
    upper: float,
    lower: float,
    apply_lower_threshold: bool,
) -> Metrics:
  """`rollout_rs_<option>_*` statistics of one rejection option.

  Keys: `_mean, _max, _min, _fraction_high, _fraction_low, _std, _seq_mean,
  _seq_std, _seq_max, _seq_min, _seq_max_deviation, _seq_fraction_high`, and
  `_seq_fraction_low` for k1 options. `upper`/`lower` are the thresholds in
  the statistic's units (log-space for k1; lower 0 when unused).
  Sequence-level options report max/min/fractions over non-empty rows.
  """
  prefix = f"rollout_rs_{option_name}"
  m = _fmask(response_mask)
  valid = response_mask.astype(bool)
  seq_valid = jnp.sum(m, axis=-1) > 0
  if per_sequence_values is None:
    seq_values = masked_mean(rs_statistic, m, axis=-1)
  else:
    seq_values = per_sequence_values
  f32 = lambda b: b.astype(jnp.float32)
  metrics = {f"{prefix}_mean": masked_mean(rs_statistic, m)}
  if per_sequence_values is not None:
    metrics[f"{prefix}_max"] = _masked_max(seq_values, seq_valid)
    metrics[f"{prefix}_min"] = _masked_min(seq_values, seq_valid)
    metrics[f"{prefix}_fraction_high"] = _mean_over(f32(seq_values > upper), seq_valid)
    low = _mean_over(f32(seq_values < lower), seq_valid)
  else:
    metrics[f"{prefix}_max"] = _masked_max(rs_statistic, valid)
    metrics[f"{prefix}_min"] = _masked_min(rs_statistic, valid)
    metrics[f"{prefix}_fraction_high"] = masked_mean(f32(rs_statistic > upper), m)
    low = masked_mean(f32(rs_statistic < lower), m)
  metrics[f"{prefix}_fraction_low"] = low if apply_lower_threshold else jnp.float32(0.0)
  metrics[f"{prefix}_std"] = _clamped_std(
      rs_statistic, m, lower if apply_lower_threshold else 0.0, upper
  )
  metrics[f"{prefix}_seq_mean"] = _mean_over(seq_values, seq_valid)
  metrics[f"{prefix}_seq_std"] = _std_over(seq_values, seq_valid)
  metrics[f"{prefix}_seq_max"] = _masked_max(seq_values, seq_valid)
  metrics[f"{prefix}_seq_min"] = _masked_min(seq_values, seq_valid)
  metrics[f"{prefix}_seq_max_deviation"] = _masked_max(jnp.abs(seq_values), seq_valid)
  metrics[f"{prefix}_seq_fraction_high"] = _mean_over(f32(seq_values > upper), seq_valid)
  if apply_lower_threshold:
    metrics[f"{prefix}_seq_fraction_low"] = _mean_over(
        f32(seq_values < lower), seq_valid
    )
  return metrics


def _option_keep(option, divergences, response_mask, lower, upper):
  """`(keep [B, T] bool, token statistic [B, T], row statistic [B] | None)`."""
  kind = option.rsplit("_", 1)[-1]
  token_stat = divergences[kind]
  if option.startswith("token_"):
    stat, seq_stat = token_stat, None
  else:
    seq_stat = _seq_statistic(option.split("_")[1], token_stat, response_mask)
    stat = jnp.broadcast_to(seq_stat[:, None], token_stat.shape)
  if kind == "k1":
    keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
  else:
    keep = stat <= upper
  return keep, stat, seq_stat


def compute_rollout_rejection_mask(
    log_ratio: jax.Array,
    response_mask: jax.Array,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[jax.Array, Metrics]:
  """Hard trust-region mask from divergence statistics (see module docstring).

  Args:
    log_ratio: float `[B, T]`, `log π_train - log π_roll`.
    response_mask: `[B, T]`.
    rollout_rs: comma-separated options from `ROLLOUT_RS_OPTIONS`.
    rollout_rs_threshold: one threshold per option, or one for all.

  Returns:
    `(mask' [B, T] in response_mask's dtype, metrics)`: per option the
    `compute_rs_metrics` keys plus `rollout_rs_<opt>_masked_fraction` and
    `_seq_masked_fraction`, and overall `rollout_rs_masked_fraction`,
    `rollout_rs_seq_masked_fraction`.
  """
  options = parse_rollout_rs(rollout_rs)
  thresholds = parse_rollout_rs_thresholds(options, rollout_rs_threshold)
  valid = response_mask.astype(bool)
  m = _fmask(response_mask)
  log_ratio = jnp.where(valid, log_ratio, 0.0)
  divergences = _token_divergences(log_ratio)
  seq_valid = jnp.sum(m, axis=-1) > 0
  combined = jnp.ones(log_ratio.shape, jnp.float32)
  metrics = {}
  for option in options:
    lower, upper = thresholds[option]
    is_k1 = option.endswith("k1")
    keep, stat, seq_stat = _option_keep(option, divergences, response_mask, lower, upper)
    keep_f = keep.astype(jnp.float32)
    combined = combined * keep_f
    metrics.update(
        compute_rs_metrics(
            option,
            stat,
            response_mask,
            seq_stat,
            upper=math.log(upper) if is_k1 else upper,
            lower=math.log(lower) if is_k1 else 0.0,
            apply_lower_threshold=is_k1,
        )
    )
    seq_keep = jnp.all(keep | ~valid, axis=-1)
    metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1.0 - keep_f, m)
    metrics[f"rollout_rs_{option}_seq_masked_fraction"] = jnp.sum(
        (~seq_keep & seq_valid).astype(jnp.float32)
    ) / jnp.maximum(jnp.sum(seq_valid.astype(jnp.float32)), 1.0)
  metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - combined, m)
  row_has_rejected = jnp.any((combined <= 0.5) & valid, axis=-1)
  metrics["rollout_rs_seq_masked_fraction"] = jnp.mean(
      row_has_rejected.astype(jnp.float32)
  )
  new_mask = (m * combined).astype(response_mask.dtype)
  return new_mask, metrics


# ----------------------------------------------------------------- metrics --


def compute_offpolicy_metrics(
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
) -> Metrics:
  """Training-vs-rollout diagnostics (no prefix).

  With `lr = old - rollout`, per-row means `μ_old = masked_mean(old, m, -1)`,
  `μ_roll` likewise, `d = μ_roll - μ_old`:
    training_ppl = mean_b exp(-μ_old)      training_log_ppl = mean_b(-μ_old)
    rollout_ppl  = mean_b exp(-μ_roll)     rollout_log_ppl  = mean_b(-μ_roll)
    kl = masked_mean(rollout - old)        k3_kl = masked_mean(exp(lr) - lr - 1)
    log_ppl_diff = mean_b d, log_ppl_abs_diff = mean_b |d|, log_ppl_diff_max/min
    ppl_ratio = mean_b exp(d)
    chi2_token = masked_mean(exp(clip(lr, ±20))²) - 1
    chi2_seq = mean_b exp(2·clip(Σ_t lr·m, ±20)) - 1
  Means over b run over all B rows, as in verl.

  Args:
    old_log_prob: float `[B, T]` training-policy log-probs.
    rollout_log_prob: float `[B, T]` rollout-policy log-probs.
    response_mask: `[B, T]`.

  Returns:
    dict of float32 scalars.
  """
  valid = response_mask.astype(bool)
  m = _fmask(response_mask)
  old = jnp.where(valid, old_log_prob, 0.0)
  roll = jnp.where(valid, rollout_log_prob, 0.0)
  mu_old = masked_mean(old, m, axis=-1)
  mu_roll = masked_mean(roll, m, axis=-1)
  lr = old - roll
  diff = mu_roll - mu_old
  seq_lr = jnp.clip(masked_sum(lr, m, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
  token_rho = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
  return {
      "training_ppl": jnp.mean(jnp.exp(-mu_old)),
      "training_log_ppl": jnp.mean(-mu_old),
      "kl": masked_mean(roll - old, m),
      "k3_kl": masked_mean(jnp.exp(lr) - lr - 1, m),
      "rollout_ppl": jnp.mean(jnp.exp(-mu_roll)),
      "rollout_log_ppl": jnp.mean(-mu_roll),
      "log_ppl_diff": jnp.mean(diff),
      "log_ppl_abs_diff": jnp.mean(jnp.abs(diff)),
      "log_ppl_diff_max": jnp.max(diff),
      "log_ppl_diff_min": jnp.min(diff),
      "ppl_ratio": jnp.mean(jnp.exp(diff)),
      "chi2_token": masked_mean(token_rho**2, m) - 1.0,
      "chi2_seq": jnp.mean(jnp.exp(2.0 * seq_lr)) - 1.0,
  }


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[jax.Array | None, jax.Array, Metrics]:
  """IS weights + rejection mask + off-policy metrics, all `rollout_corr/`-prefixed.

  Args:
    old_log_prob: float `[B, T]` training-policy log-probs (π_train).
    rollout_log_prob: float `[B, T]` rollout-policy log-probs (π_roll).
    response_mask: `[B, T]`.
    rollout_is: None (no weights), "token" or "sequence".
    rollout_is_threshold: see `compute_rollout_correction_weights`; None
      disables the weights.
    rollout_is_batch_normalize: normalise weights to batch mean 1.
    rollout_rs: None (no rejection) or comma-separated options.
    rollout_rs_threshold: required with `rollout_rs`.

  Returns:
    `(weights [B, T] or None, mask' [B, T], metrics)`. verl wraps the
    weights in a DataProto under key `rollout_is_weights`; here they are the
    array itself. `mask'` is `response_mask` when `rollout_rs` is None.
  """
  if old_log_prob.shape != rollout_log_prob.shape:
    raise ValueError(
        f"old_log_prob shape {old_log_prob.shape} does not match "
        f"rollout_log_prob shape {rollout_log_prob.shape}."
    )
  if old_log_prob.shape != response_mask.shape:
    raise ValueError(
        f"log_prob shape {old_log_prob.shape} does not match response_mask "
        f"shape {response_mask.shape}."
    )
  _check_any_valid(response_mask)
  log_ratio = old_log_prob - rollout_log_prob
  metrics = {}
  weights = None
  if rollout_is is not None and rollout_is_threshold is not None:
    weights, is_metrics = compute_rollout_correction_weights(
        log_ratio,
        response_mask,
        rollout_is,
        rollout_is_threshold,
        rollout_is_batch_normalize,
    )
    metrics.update(is_metrics)
  new_mask = response_mask
  if rollout_rs is not None:
    if rollout_rs_threshold is None:
      raise ValueError(
          "rollout_rs_threshold must be explicitly provided when rollout_rs "
          "is enabled (config key rollout_correction.rollout_rs_threshold)."
      )
    new_mask, rs_metrics = compute_rollout_rejection_mask(
        log_ratio, response_mask, rollout_rs, rollout_rs_threshold
    )
    metrics.update(rs_metrics)
  metrics.update(
      compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask)
  )
  return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}
