"""Independent NumPy reference for verl's advantage estimators and KL kernels.

Written from the spec (`verl_kernels_spec.md` §0, §1, §4.2-4.4) with plain
Python loops over rows, groups and time steps, in float64, without importing
anything from rljax. It reproduces verl's outputs everywhere, padding
included (where verl leaves non-zero values), so tests compare on valid
tokens only.
"""

import math
from collections import defaultdict

import numpy as np


# ----------------------------------------------------------------------------
# §0 helpers.
# ----------------------------------------------------------------------------


def masked_sum(v, m, axis=None):
  v = np.asarray(v, np.float64)
  m = np.asarray(m, np.float64)
  return (np.where(m != 0, v, 0.0) * m).sum(axis=axis)


def masked_mean(v, m, axis=None):
  count = np.asarray(m, np.float64).sum(axis=axis)
  return masked_sum(v, m, axis) / (count + 1e-8)


def masked_var(v, m):
  mu = masked_mean(v, m)
  var = masked_mean((np.asarray(v, np.float64) - mu) ** 2, m)
  n = float(np.asarray(m, np.float64).sum())
  if n < 2:
    raise ValueError("masked_var needs at least 2 valid entries")
  return var * n / (n - 1)


def masked_whiten(v, m):
  mu = masked_mean(v, m)
  var = masked_var(v, m)
  return (np.asarray(v, np.float64) - mu) / math.sqrt(var + 1e-8)


def _scores(r):
  r = np.asarray(r, np.float64)
  return np.array([sum(r[i, t] for t in range(r.shape[1]))
                   for i in range(r.shape[0])])


def _groups(index):
  groups = defaultdict(list)
  for i, g in enumerate(index):
    groups[g].append(i)
  return groups


def _std_unbiased(x):
  x = np.asarray(x, np.float64)
  mean = sum(x) / len(x)
  return math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1))


def _tile(a, m):
  m = np.asarray(m, np.float64)
  return np.asarray(a, np.float64)[:, None] * m


def _reverse_cumsum_rows(x):
  x = np.asarray(x, np.float64)
  out = np.zeros_like(x)
  for i in range(x.shape[0]):
    acc = 0.0
    for t in reversed(range(x.shape[1])):
      acc += x[i, t]
      out[i, t] = acc
  return out


# ----------------------------------------------------------------------------
# §1 estimators.
# ----------------------------------------------------------------------------


def gae(r, values, m, gamma, lam):
  r = np.asarray(r, np.float64)
  values = np.asarray(values, np.float64)
  m = np.asarray(m, np.float64)
  b, t_len = r.shape
  raw = np.zeros_like(r)
  for i in range(b):
    nextvalue, last = 0.0, 0.0
    for t in reversed(range(t_len)):
      delta = r[i, t] + gamma * nextvalue - values[i, t]
      cand = delta + gamma * lam * last
      nextvalue = values[i, t] * m[i, t] + (1 - m[i, t]) * nextvalue
      last = cand * m[i, t] + (1 - m[i, t]) * last
      raw[i, t] = last
  return masked_whiten(raw, m), raw + values


def grpo(r, m, index, epsilon=1e-6, norm=True):
  s = _scores(r)
  a = np.zeros_like(s)
  for members in _groups(index).values():
    if len(members) == 1:
      mean, std = 0.0, 1.0
    else:
      vals = [s[i] for i in members]
      mean, std = sum(vals) / len(vals), _std_unbiased(vals)
    for i in members:
      a[i] = (s[i] - mean) / (std + epsilon) if norm else s[i] - mean
  adv = _tile(a, m)
  return adv, adv


def grpo_vectorized(r, m, index, epsilon=1e-6, norm=True):
  s = _scores(r)
  _, g = np.unique(np.asarray(index), return_inverse=True)
  n_groups = g.max() + 1
  count = np.bincount(g, minlength=n_groups).astype(np.float64)
  total = np.bincount(g, weights=s, minlength=n_groups)
  mean = total / np.maximum(count, 1)
  sq = np.bincount(g, weights=(s - mean[g]) ** 2, minlength=n_groups)
  var = sq / np.maximum(count - 1, 1)
  std = np.sqrt(np.maximum(var, 0.0))
  mean = np.where(count <= 1, 0.0, mean)
  std = np.where(count <= 1, 1.0, std)
  a = s - mean[g]
  if norm:
    a = a / (std[g] + epsilon)
  adv = _tile(a, m)
  return adv, adv


def gdpo(r, m, index, epsilon=1e-6, norm=True, config=None,
         non_tensor_batch=None, batch=None):
  m = np.asarray(m, np.float64)
  if config is not None and non_tensor_batch is not None and batch is not None:
    keys = config["gdpo_reward_keys"]
    weights = config.get("gdpo_reward_weights") or [1.0] * len(keys)
    prompt_len = np.asarray(batch["prompts"]).shape[1]
    att = np.asarray(batch["attention_mask"])[:, prompt_len:]
    cols = att.sum(axis=1).astype(int) - 1
    components = []
    for key in keys:
      mat = np.zeros(m.shape)
      for i in range(m.shape[0]):
        # a row with no valid token has column -1: wraps, like torch
        mat[i, cols[i]] = float(non_tensor_batch[key][i])
      components.append(mat)
  else:
    components, weights = [np.asarray(r, np.float64)], [1.0]
  total = np.zeros(m.shape)
  for comp, w in zip(components, weights):
    total += w * grpo(comp, m, index, epsilon, norm)[0]
  adv = masked_whiten(total, m) * m
  return adv, adv


def grpo_passk(r, m, index, epsilon=1e-6, config=None):
  norm = (config or {}).get("norm_adv_by_std_in_grpo", True)
  s = _scores(r)
  a = np.zeros_like(s)
  for members in _groups(index).values():
    if len(members) < 2:
      raise ValueError("passk needs >= 2 samples per group")
    order = sorted(members, key=lambda i: -s[i])
    top, second = order[0], order[1]
    adv = s[top] - s[second]
    if norm:
      adv /= _std_unbiased([s[i] for i in members]) + epsilon
    a[top] = adv
  adv = _tile(a, m)
  return adv, adv


def _group_mean_singleton_zero(s, index):
  mean = np.zeros_like(s)
  for members in _groups(index).values():
    if len(members) > 1:
      mu = sum(s[i] for i in members) / len(members)
      for i in members:
        mean[i] = mu
  return mean


def reinforce_plus_plus_baseline(r, m, index):
  s = _scores(r)
  a = s - _group_mean_singleton_zero(s, index)
  tiled = _tile(a, m)
  adv = masked_whiten(tiled, m) * np.asarray(m, np.float64)
  return adv, adv


def rloo(r, m, index):
  s = _scores(r)
  a = np.zeros_like(s)
  for members in _groups(index).values():
    n = len(members)
    if n == 1:
      a[members[0]] = s[members[0]]
      continue
    mean = sum(s[i] for i in members) / n
    for i in members:
      a[i] = s[i] * n / (n - 1) - mean * n / (n - 1)
  adv = _tile(a, m)
  return adv, adv


def rloo_vectorized(r, m, index):
  s = _scores(r)
  _, inv = np.unique(np.asarray(index), return_inverse=True)
  c = np.bincount(inv)[inv].astype(np.float64)
  gsum = np.bincount(inv, weights=s)[inv]
  a = (c * s - gsum) / np.maximum(c - 1, 1) * (c > 1)
  adv = _tile(a, m)
  return adv, adv


def opo(r, m, index):
  s = _scores(r)
  m = np.asarray(m, np.float64)
  lengths = m.sum(axis=1)
  a = np.zeros_like(s)
  for members in _groups(index).values():
    if len(members) == 1:
      b = 0.0
    else:
      b = (sum(lengths[i] * s[i] for i in members)
           / sum(lengths[i] for i in members))
    for i in members:
      a[i] = s[i] - b
  adv = _tile(a, m)
  return adv, adv


def reinforce_plus_plus(r, m, gamma):
  r = np.asarray(r, np.float64)
  m = np.asarray(m, np.float64)
  returns = np.zeros_like(r)
  for i in range(r.shape[0]):
    run = 0.0
    for t in reversed(range(r.shape[1])):
      new = r[i, t] + gamma * run
      returns[i, t] = new * m[i, t]
      run = new * m[i, t] + run * (1 - m[i, t])
  return masked_whiten(returns, m) * m, returns


def remax(r, reward_baselines, m):
  m = np.asarray(m, np.float64)
  returns = _reverse_cumsum_rows(np.asarray(r, np.float64) * m)
  adv = returns - np.asarray(reward_baselines, np.float64)[:, None] * m
  return adv, returns


def gpg(r, m, index, f_norm=1.0):
  s = _scores(r)
  nonzero = sum(1 for v in s if v != 0)
  alpha = len(s) / max(nonzero, 1)
  a = alpha * (s - _group_mean_singleton_zero(s, index)) / f_norm
  adv = _tile(a, m)
  return adv, adv


def _otb_parts(r, m, old_log_probs, sum_pi_squared, rollout_is_weights):
  m = np.asarray(m, np.float64)
  returns = _reverse_cumsum_rows(np.asarray(r, np.float64) * m)
  w = 1 - 2 * np.exp(np.asarray(old_log_probs, np.float64))
  w = w + np.asarray(sum_pi_squared, np.float64)
  if rollout_is_weights is not None:
    w = w * np.asarray(rollout_is_weights, np.float64) ** 2
  cum = np.zeros_like(w)
  for i in range(w.shape[0]):
    acc = 0.0
    for t in range(w.shape[1]):
      acc += w[i, t] * m[i, t]
      cum[i, t] = acc
  return m, returns, cum


def _zero_tail_row(lengths):
  """(member position of the unique longest, second-longest) or None."""
  order = sorted(lengths)
  longest, second = order[-1], order[-2]
  at_max = [k for k, v in enumerate(lengths) if v == longest]
  if len(at_max) == 1 and longest > second:
    return at_max[0], int(second)
  return None


def optimal_token_baseline(r, m, index, old_log_probs, sum_pi_squared,
                           rollout_is_weights=None, handle_zero_tail=True,
                           epsilon=1e-8):
  m, returns, cum = _otb_parts(r, m, old_log_probs, sum_pi_squared,
                               rollout_is_weights)
  b_len, t_len = m.shape
  baselines = np.zeros_like(returns)
  for members in _groups(index).values():
    if len(members) == 1:
      continue
    for t in range(t_len):
      num = sum(returns[i, t] * cum[i, t] * m[i, t] for i in members)
      den = sum(cum[i, t] * m[i, t] for i in members) + epsilon
      for i in members:
        baselines[i, t] = num / den
    if handle_zero_tail:
      tail = _zero_tail_row([m[i].sum() for i in members])
      if tail is not None:
        baselines[members[tail[0]], tail[1]:] = 0.0
  return (returns - baselines) * m, returns


def tir_optimal_token_baseline(r, m, index, old_log_probs, sum_pi_squared,
                               rollout_is_weights=None, handle_zero_tail=True,
                               epsilon=1e-8):
  m, returns, cum = _otb_parts(r, m, old_log_probs, sum_pi_squared,
                               rollout_is_weights)
  b_len = m.shape[0]
  lengths = [int(m[i].sum()) for i in range(b_len)]
  l_max = max(lengths)
  comp_w = np.zeros((b_len, l_max))
  comp_r = np.zeros((b_len, l_max))
  for i in range(b_len):
    valid = [t for t in range(m.shape[1]) if m[i, t] != 0]
    for k, t in enumerate(valid):
      comp_w[i, k] = cum[i, t]
      comp_r[i, k] = returns[i, t]
  groups = defaultdict(list)
  for i in range(b_len):
    if lengths[i] > 0:
      groups[index[i]].append(i)
  base = np.zeros((b_len, l_max))
  for members in groups.values():
    if len(members) == 1:
      continue
    for k in range(l_max):
      num = sum(comp_r[i, k] * comp_w[i, k] for i in members)
      den = sum(comp_w[i, k] for i in members) + epsilon
      for i in members:
        base[i, k] = num / den
    if handle_zero_tail:
      tail = _zero_tail_row([lengths[i] for i in members])
      if tail is not None:
        base[members[tail[0]], tail[1]:] = 0.0
  adv = np.zeros_like(returns)
  for i in range(b_len):
    valid = [t for t in range(m.shape[1]) if m[i, t] != 0]
    for k, t in enumerate(valid):
      adv[i, t] = comp_r[i, k] - base[i, k]
  return adv * m, returns


# ----------------------------------------------------------------------------
# §4.2-4.4 KL.
# ----------------------------------------------------------------------------


def kl_penalty_forward(logprob, ref_logprob, name):
  d = np.asarray(logprob, np.float64) - np.asarray(ref_logprob, np.float64)
  if name in ("kl", "k1"):
    return d
  if name == "abs":
    return np.abs(d)
  if name in ("mse", "k2"):
    return 0.5 * d * d
  if name in ("low_var_kl", "k3"):
    x = np.clip(-d, -20, 20)
    return np.clip(np.exp(x) - x - 1, -10, 10)
  raise NotImplementedError(name)


def kl_penalty(logprob, ref_logprob, name):
  """Forward value only (the `+` variants share the base value)."""
  return kl_penalty_forward(logprob, ref_logprob, name.rstrip("+"))


def kl_penalty_grad(logprob, ref_logprob, name):
  """d kl / d logprob, elementwise, as the spec states it."""
  d = np.asarray(logprob, np.float64) - np.asarray(ref_logprob, np.float64)
  if name.endswith("+"):
    return d
  if name in ("kl", "k1"):
    return np.ones_like(d)
  if name == "abs":
    return np.sign(d)
  if name in ("mse", "k2"):
    return d
  x = -d
  inner = np.exp(np.clip(x, -20, 20)) - np.clip(x, -20, 20) - 1
  active = (np.abs(x) > 20) | (inner < -10) | (inner > 10)
  return np.where(active, 0.0, 1 - np.exp(-d))


def compute_rewards(scores, old, ref, kl_ratio):
  return np.asarray(scores, np.float64) - (
      np.asarray(old, np.float64) - np.asarray(ref, np.float64)) * kl_ratio


class FixedKL:

  def __init__(self, kl_coef):
    self.value = kl_coef

  def update(self, current_kl, n_steps):
    pass


class AdaptiveKL:

  def __init__(self, init_kl_coef, target_kl, horizon):
    assert horizon > 0
    self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

  def update(self, current_kl, n_steps):
    err = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
    self.value *= 1 + err * n_steps / self.horizon


def apply_kl_penalty(scores, old, ref, m, kl_ctrl, name="kl"):
  m = np.asarray(m, np.float64)
  kld = kl_penalty(old, ref, name) * m
  beta = kl_ctrl.value
  rewards = np.asarray(scores, np.float64) - beta * kld
  per_row = [masked_mean(kld[i], m[i]) for i in range(m.shape[0])]
  current = sum(per_row) / len(per_row)
  kl_ctrl.update(current, n_steps=m.shape[0])
  return rewards, {"actor/reward_kl_penalty": current,
                   "actor/reward_kl_penalty_coeff": beta}
