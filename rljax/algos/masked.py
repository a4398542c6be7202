"""Masked reductions and per-group statistics shared by the RL kernels.

Masked helpers follow verl's `verl.utils.torch_functional` exactly (spec §0):

  masked_sum(v, m)    = Σ where(m, v, 0) * m     (NaN/inf under m == 0 vanish)
  masked_mean(v, m)   = masked_sum(v, m) / (Σ m + 1e-8)
  masked_var(v, m)    = masked_mean((v - μ)², m) * N / (N - 1),  N = Σ m
  masked_whiten(v, m) = (v - μ) * rsqrt(masked_var(v, m) + 1e-8)

`masked_whiten` does not re-mask its output, as in verl; callers that want
zeros at padding multiply by the mask themselves.

Groups of responses (the samples of one prompt) are named by an integer array
`group_ids[B]`; equal ids form a group, in any order, contiguous or not. The
group statistics reduce with `jax.ops.segment_sum` into `num_groups` slots, so
`num_groups` must be static under `jit` and every id must satisfy
`0 <= id < num_groups` (ids outside that range are silently dropped by the
segment ops). `num_groups=None` means `B`, which is enough whenever ids are
below `B`. Arbitrary labels (uuid strings, large ints) are turned into compact
ids outside `jit` with `group_ids_from_labels`.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_WHITEN_EPS = 1e-8
_MEAN_EPS = 1e-8


def masked_sum(
    values: jax.Array, mask: jax.Array, axis: int | None = None
) -> jax.Array:
  """Sum of `values` where `mask` is set.

  `out = Σ where(mask != 0, values, 0) * mask` over `axis` (all axes if None).
  Non-finite values at masked positions do not leak into the sum.

  Args:
    values: array of any shape, e.g. `[B, T]`.
    mask: array broadcastable to `values` (1 = keep, 0 = drop).
    axis: axis to reduce over; None reduces over everything.

  Returns:
    The masked sum, with `axis` removed.
  """
  mask = jnp.asarray(mask)
  kept = jnp.where(mask.astype(bool), values, 0.0)
  return jnp.sum(kept * mask.astype(kept.dtype), axis=axis)


def masked_mean(
    values: jax.Array, mask: jax.Array, axis: int | None = None
) -> jax.Array:
  """Mean of `values` where `mask` is set.

  `out = masked_sum(values, mask, axis) / (Σ_axis mask + 1e-8)`; an all-zero
  mask gives 0, not NaN.

  Args:
    values: array of any shape, e.g. `[B, T]`.
    mask: array of the same shape (1 = keep, 0 = drop).
    axis: axis to reduce over; None reduces over everything.

  Returns:
    The masked mean, with `axis` removed.
  """
  total = masked_sum(values, mask, axis)
  count = jnp.sum(jnp.asarray(mask).astype(total.dtype), axis=axis)
  return total / (count + _MEAN_EPS)


def masked_var(
    values: jax.Array, mask: jax.Array, unbiased: bool = True
) -> jax.Array:
  """Variance of `values` over all positions where `mask` is set.

  `μ = masked_mean(v, m)`, `var = masked_mean((v - μ)², m)`, and with
  `unbiased` the Bessel factor `N / (N - 1)`, `N = Σ m`. A global (whole
  array) statistic, as in verl.

  verl raises when `unbiased` and `N < 2`; a jitted function cannot raise on
  values, so the result is NaN in that case instead.

  Args:
    values: array of any shape, e.g. `[B, T]`.
    mask: array of the same shape.
    unbiased: apply Bessel's correction.

  Returns:
    Scalar variance.
  """
  mean = masked_mean(values, mask)
  var = masked_mean((values - mean) ** 2, mask)
  if not unbiased:
    return var
  count = jnp.sum(jnp.asarray(mask).astype(var.dtype))
  bessel = count / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(count > 1.0, var * bessel, jnp.nan)


def masked_whiten(
    values: jax.Array, mask: jax.Array, shift_mean: bool = True
) -> jax.Array:
  """Whitens `values` with statistics over the positions where `mask` is set.

  `out = (v - μ) * rsqrt(masked_var(v, m, unbiased=True) + 1e-8)`, plus `μ`
  again when `shift_mean` is False. The output is not re-masked: padding
  positions get `(v_pad - μ) * rsqrt(var + 1e-8)`, exactly as in verl.

  Args:
    values: array of any shape, e.g. `[B, T]`.
    mask: array of the same shape, at least 2 set entries.
    shift_mean: if False, the mean is added back (scale-only whitening).

  Returns:
    Array shaped like `values`.
  """
  mean = masked_mean(values, mask)
  var = masked_var(values, mask, unbiased=True)
  whitened = (values - mean) * jax.lax.rsqrt(var + _WHITEN_EPS)
  if not shift_mean:
    whitened = whitened + mean
  return whitened


def resolve_num_groups(group_ids: jax.Array, num_groups: int | None) -> int:
  """The static number of group slots: `num_groups`, or `B` when None."""
  if num_groups is None:
    return group_ids.shape[0]
  return int(num_groups)


def group_sum(
    values: jax.Array, group_ids: jax.Array, num_groups: int | None = None
) -> jax.Array:
  """Per-group sums of a per-row quantity.

  `out[g] = Σ_{i : group_ids[i] = g} values[i]`.

  Args:
    values: `[B]` or `[B, ...]` array.
    group_ids: int `[B]`, each in `[0, num_groups)`.
    num_groups: number of group slots (static); None means `B`.

  Returns:
    `[num_groups, ...]` array; empty slots hold 0.
  """
  num_groups = resolve_num_groups(group_ids, num_groups)
  return jax.ops.segment_sum(values, group_ids, num_segments=num_groups)


def group_count(
    group_ids: jax.Array,
    num_groups: int | None = None,
    dtype: Any = jnp.float32,
) -> jax.Array:
  """Number of rows in each group: `[num_groups]`, in `dtype`."""
  ones = jnp.ones(group_ids.shape, dtype)
  return group_sum(ones, group_ids, num_groups)


def group_mean_std(
    scores: jax.Array,
    group_ids: jax.Array,
    num_groups: int | None = None,
    eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
  """Per-group mean and unbiased standard deviation of per-row scores.

  With `n_g` rows in group g:

    mean_g = Σ x / n_g
    std_g  = sqrt(max(Σ (x - mean_g)² / (n_g - 1), eps))

  and singleton groups (and empty slots) get `mean_g = 0`, `std_g = 1`,
  matching verl's `group_mean_std` (spec §0).

  The sums run on scores shifted by the group maximum, so a group of equal
  scores has mean exactly equal to that score and std exactly 0 (plain
  float32 summation can leave a 1e-8 residue that a later `/(std + 1e-6)`
  would blow up to 1e-2).

  Args:
    scores: float `[B]` per-row scores (cast to float32).
    group_ids: int `[B]`, each in `[0, num_groups)`.
    num_groups: number of group slots (static); None means `B`.
    eps: floor on the variance before the square root.

  Returns:
    `(mean, std)`, each float32 `[num_groups]`; index with `group_ids` to get
    per-row values.
  """
  scores = jnp.asarray(scores, jnp.float32)
  num_groups = resolve_num_groups(group_ids, num_groups)
  count = group_count(group_ids, num_groups)
  multi = count > 1.0
  top = jax.ops.segment_max(scores, group_ids, num_segments=num_groups)
  top = jnp.where(multi, top, 0.0)
  shifted = scores - top[group_ids]
  shifted_mean = group_sum(shifted, group_ids, num_groups) / jnp.maximum(
      count, 1.0
  )
  sq_dev = (shifted - shifted_mean[group_ids]) ** 2
  var = group_sum(sq_dev, group_ids, num_groups) / jnp.maximum(count - 1.0, 1.0)
  std = jnp.sqrt(jnp.maximum(var, eps))
  mean = top + shifted_mean
  return jnp.where(multi, mean, 0.0), jnp.where(multi, std, 1.0)


def group_ids_from_labels(labels: Any) -> tuple[np.ndarray, int]:
  """Maps arbitrary group labels to compact int32 ids (host side, not jitted).

  Equal labels get equal ids; ids are `0 .. G-1` in sorted-label order (the
  inverse of `np.unique`), like verl's `as_torch_index` for string uids. Use
  this on verl's `uid` strings, or on int ids that may reach `B` or beyond,
  before calling a jitted estimator with `num_groups=G`.

  Args:
    labels: `[B]` sequence of hashable, sortable labels (strings, ints).

  Returns:
    `(group_ids, num_groups)`: int32 `[B]` array and the number of groups.
  """
  uniq, inverse = np.unique(np.asarray(labels), return_inverse=True)
  return inverse.astype(np.int32).reshape(-1), int(uniq.shape[0])
