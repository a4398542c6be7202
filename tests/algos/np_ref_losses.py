"""Independent NumPy reference for spec §2, §3, §4.1 and §5 (float64, loops).

Written from /work/shared/reference/verl_kernels_spec.md alone, one token at a
time, without calling rljax. Every function takes NumPy arrays and returns
float64 NumPy values / Python floats and plain dicts keyed like verl.
"""

import math

import numpy as np

BOUND = 20.0


def f64(x):
  return np.asarray(x, dtype=np.float64)


def clamp(x, lo=None, hi=None):
  if lo is not None and x < lo:
    x = lo
  if hi is not None and x > hi:
    x = hi
  return x


# --------------------------------------------------------------- §0 helpers --


def msum(v, m):
  total = 0.0
  for idx in np.ndindex(v.shape):
    if m[idx]:
      total += float(v[idx]) * float(m[idx])
  return total


def mmean(v, m):
  return msum(v, m) / (float(np.sum(m)) + 1e-8)


def row_msum(v, m, b):
  return sum(float(v[b, t]) for t in range(v.shape[1]) if m[b, t])


def row_mmean(v, m, b):
  return row_msum(v, m, b) / (float(np.sum(m[b])) + 1e-8)


# ------------------------------------------------------------- §2 agg_loss --


def agg_loss(L, m, mode, dp_size=1, batch_num_tokens=None,
             global_batch_size=None, loss_scale_factor=None):
  L, m = f64(L), f64(m)
  B, T = L.shape
  if mode == "token-mean":
    n = float(m.sum()) if batch_num_tokens is None else batch_num_tokens
    return msum(L, m) / n * dp_size
  if mode == "token-sum":
    return msum(L, m) * dp_size
  seqs, nonempty = [], []
  for b in range(B):
    count = float(m[b].sum())
    s = sum(L[b, t] * m[b, t] for t in range(T) if m[b, t])
    if mode == "seq-mean-token-mean":
      s = s / (count + 1e-8)
    seqs.append(s)
    nonempty.append(count > 0)
  gbs = float(sum(nonempty)) if global_batch_size is None else global_batch_size
  loss = sum(s for s, ok in zip(seqs, nonempty) if ok) / gbs * dp_size
  if mode == "seq-mean-token-sum-norm":
    loss /= T if loss_scale_factor is None else loss_scale_factor
  elif mode not in ("seq-mean-token-sum", "seq-mean-token-mean"):
    raise ValueError(mode)
  return loss


def agg_weights(m, mode, dp_size=1, batch_num_tokens=None,
                global_batch_size=None, loss_scale_factor=None):
  """d agg_loss / d L[b, t] (the aggregation is linear in L)."""
  m = f64(m)
  B, T = m.shape
  W = np.zeros((B, T))
  for b in range(B):
    for t in range(T):
      E = np.zeros((B, T))
      E[b, t] = 1.0
      W[b, t] = agg_loss(E, m, mode, dp_size, batch_num_tokens,
                         global_batch_size, loss_scale_factor)
  return W


# ---------------------------------------------------------- §3 policy losses --


def _bounds(cfg):
  base = cfg.get("clip_ratio", 0.2)
  low, high = cfg.get("clip_ratio_low"), cfg.get("clip_ratio_high")
  return (base if low is None else low), (base if high is None else high)


def _apply_w(L, w):
  return L if w is None else L * f64(w)


def vanilla(old, lp, A, m, mode, cfg, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  c = cfg.get("clip_ratio_c", 3.0)
  B, T = lp.shape
  L = np.zeros((B, T))
  cf, cfl, kl = np.zeros((B, T)), np.zeros((B, T)), np.zeros((B, T))
  for b in range(B):
    for t in range(T):
      lrc = clamp(lp[b, t] - old[b, t], -BOUND, BOUND)
      r = math.exp(lrc)
      a = A[b, t]
      l1 = -a * r
      l2 = -a * clamp(r, 1 - low, 1 + high)
      c1 = max(l1, l2)
      l3 = -a * c
      c2 = min(l3, c1)
      L[b, t] = c2 if a < 0 else c1
      cf[b, t] = float(l2 > l1)
      cfl[b, t] = float(c1 > l3 and a < 0)
      kl[b, t] = -lrc
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/pg_clipfrac": mmean(cf, m), "actor/ppo_kl": mmean(kl, m),
                "actor/pg_clipfrac_lower": mmean(cfl, m)}


def vanilla_grad(old, lp, A, m, mode, cfg, w=None, **gbi):
  """Analytic d loss / d log_prob: -A·r·w·W where the unclipped branch is active."""
  old, lp, A = f64(old), f64(lp), f64(A)
  low, high = _bounds(cfg)
  c = cfg.get("clip_ratio_c", 3.0)
  W = agg_weights(m, mode, **gbi)
  G = np.zeros(lp.shape)
  for b, t in np.ndindex(lp.shape):
    lr = lp[b, t] - old[b, t]
    if abs(lr) > BOUND:
      continue
    r = math.exp(lr)
    a = A[b, t]
    inside = 1 - low < r < 1 + high
    l1, l2 = -a * r, -a * clamp(r, 1 - low, 1 + high)
    active = inside or l1 > l2
    if a < 0 and max(l1, l2) > -a * c:
      active = False
    if active:
      G[b, t] = -a * r * (1.0 if w is None else w[b, t]) * W[b, t]
  return G


def dppo(kind, old, lp, A, m, mode, cfg, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  c = cfg.get("clip_ratio_c", 20.0)
  B, T = lp.shape
  L, valid, kl, lowfrac = (np.zeros((B, T)) for _ in range(4))
  for b, t in np.ndindex(B, T):
    lrc = clamp(lp[b, t] - old[b, t], -BOUND, BOUND)
    r = math.exp(lrc)
    p, p0 = math.exp(lp[b, t]), math.exp(old[b, t])
    a = A[b, t]
    if kind == "tv":
      ok = (p - p0 <= high) if a > 0 else (p - p0 >= -low)
    else:
      bkl = p0 * (old[b, t] - lp[b, t]) + (1 - p0) * math.log(
          (1 - p0 + 1e-8) / (1 - p + 1e-8))
      ok = (bkl <= high or p <= p0) if a > 0 else (bkl <= low or p >= p0)
    valid[b, t] = float(ok)
    L[b, t] = -a * min(r, c) * lp[b, t] * valid[b, t]
    kl[b, t] = -lrc
    lowfrac[b, t] = float(r > c) * valid[b, t]
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  metrics = {"actor/pg_clipfrac": mmean(1 - valid, m), "actor/ppo_kl": mmean(kl, m),
             "actor/pg_clipfrac_lower": mmean(lowfrac, m)}
  grad = np.zeros((B, T))
  W = agg_weights(m, mode, **gbi)
  for b, t in np.ndindex(B, T):
    r = math.exp(clamp(lp[b, t] - old[b, t], -BOUND, BOUND))
    grad[b, t] = -A[b, t] * min(r, c) * valid[b, t] * (1.0 if w is None else w[b, t]) * W[b, t]
  return loss, metrics, grad


def gspo(old, lp, A, m, mode, cfg, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  B, T = lp.shape
  L, cf, kl, G = (np.zeros((B, T)) for _ in range(4))
  W = agg_weights(m, mode, **gbi)
  for b in range(B):
    n = max(m[b].sum(), 1.0)
    s = sum((lp[b, t] - old[b, t]) * m[b, t] for t in range(T)) / n
    lsr = min(s, 10.0)
    sr = math.exp(lsr)
    for t in range(T):
      a = A[b, t]
      l1, l2 = -a * sr, -a * clamp(sr, 1 - low, 1 + high)
      L[b, t] = max(l1, l2)
      cf[b, t] = float(l2 > l1)
      kl[b, t] = -(lp[b, t] - old[b, t])
      unclipped = (1 - low < sr < 1 + high) or l1 > l2
      if unclipped and s < 10.0:
        G[b, t] = -a * sr * (1.0 if w is None else w[b, t]) * W[b, t]
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/pg_clipfrac": mmean(cf, m), "actor/ppo_kl": mmean(kl, m),
                "actor/pg_clipfrac_lower": 0.0}, G


def sapo(old, lp, A, m, mode, cfg, w=None, **gbi):
  del mode
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  tau_pos, tau_neg = cfg.get("tau_pos", 1.0), cfg.get("tau_neg", 1.05)
  B, T = lp.shape
  L, kl = np.zeros((B, T)), np.zeros((B, T))
  for b, t in np.ndindex(B, T):
    lrc = clamp(lp[b, t] - old[b, t], -BOUND, BOUND)
    r = math.exp(lrc)
    tau = tau_pos if A[b, t] > 0 else tau_neg
    gate = 1.0 / (1.0 + math.exp(-tau * (r - 1.0))) * 4.0 / tau
    L[b, t] = -gate * A[b, t]
    kl[b, t] = -lrc
  loss = agg_loss(_apply_w(L, w), m, "seq-mean-token-mean", **gbi)
  return loss, {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": mmean(kl, m),
                "actor/pg_clipfrac_lower": 0.0}


def gpg(old, lp, A, m, mode, cfg, w=None, **gbi):
  del old, cfg
  L = -f64(lp) * f64(A)
  return agg_loss(_apply_w(L, w), m, mode, **gbi), {}


def clip_cov(old, lp, A, m, mode, cfg, selected, w=None, **gbi):
  """Clip-Cov given the set of detached tokens (`selected`, bool [B, T])."""
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  B, T = lp.shape
  L, kl = np.zeros((B, T)), np.zeros((B, T))
  for b, t in np.ndindex(B, T):
    r = math.exp(lp[b, t] - old[b, t])
    l1, l2 = -A[b, t] * r, -A[b, t] * clamp(r, 1 - low, 1 + high)
    L[b, t] = max(l1, l2) * (0.0 if selected[b, t] else 1.0)
    kl[b, t] = -(lp[b, t] - old[b, t])
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/pg_clipfrac": mmean(f64(selected), m), "actor/ppo_kl": mmean(kl, m)}


def clip_cov_candidates(old, lp, A, m, cfg):
  """(candidate bool [B, T], clip_num) per spec §3.7."""
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  pl = cfg.get("policy_loss", {})
  lb, ub = pl.get("clip_cov_lb", 1.0), pl.get("clip_cov_ub", 5.0)
  ma, mlp = mmean(A, m), mmean(lp, m)
  cand = np.zeros(lp.shape, bool)
  for b, t in np.ndindex(lp.shape):
    r = math.exp(lp[b, t] - old[b, t])
    l1, l2 = -A[b, t] * r, -A[b, t] * clamp(r, 1 - low, 1 + high)
    if not m[b, t] or l2 > l1:
      continue
    cov = (A[b, t] - ma) * (lp[b, t] - mlp)
    cand[b, t] = lb < cov < ub
  clip_num = max(int(pl.get("clip_cov_ratio", 2e-4) * float(m.sum())), 1)
  return cand, clip_num


def kl_cov(old, lp, A, m, mode, cfg, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  pl = cfg.get("policy_loss", {})
  ratio, coef = pl.get("kl_cov_ratio", 2e-4), pl.get("ppo_kl_coef", 0.1)
  B, T = lp.shape
  pos = [(b, t) for b in range(B) for t in range(T) if m[b, t] > 0]
  a_mean = sum(A[p] for p in pos) / len(pos)
  lp_mean = sum(lp[p] for p in pos) / len(pos)
  cov = [(A[p] - a_mean) * (lp[p] - lp_mean) for p in pos]
  k = max(1, int(len(pos) * ratio))
  order = sorted(range(len(pos)), key=lambda i: (-cov[i], i))
  chosen = {pos[i] for i in order[:k]}
  L, absk = np.zeros((B, T)), np.zeros((B, T))
  for b, t in np.ndindex(B, T):
    lr = lp[b, t] - old[b, t]
    L[b, t] = -A[b, t] * math.exp(lr) + (coef * abs(lr) if (b, t) in chosen else 0.0)
    absk[b, t] = abs(lr)
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/ppo_kl": mmean(absk, m)}, chosen


def geo_mean(old, lp, A, m, mode, cfg, w=None, **gbi):
  del mode, gbi
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  B, T = lp.shape
  pg, cfp, cfn, kl = [], np.zeros((B, T)), np.zeros((B, T)), np.zeros((B, T))
  for b in range(B):
    n = m[b].sum()
    slmin, sadv, slw = 0.0, 0.0, 0.0
    for t in range(T):
      lr = lp[b, t] - old[b, t]
      s = float(np.sign(A[b, t]))
      lcl = clamp(lr, -low, high)
      slmin += s * min(s * lr, s * lcl) * m[b, t]
      sadv += A[b, t] * m[b, t]
      if w is not None:
        slw += math.log(w[b, t] + 1e-10) * m[b, t]
      clipped = lr != lcl
      cfp[b, t] = float(clipped and A[b, t] > 0)
      cfn[b, t] = float(clipped and A[b, t] < 0)
      kl[b, t] = -lr
    val = -(sadv / (n + 1e-8)) * math.exp(slmin / (n + 1e-8))
    if w is not None:
      val *= math.exp(slw / (n + 1e-8))
    pg.append(val)
  return float(np.mean(pg)), {"actor/pg_clipfrac": mmean(cfp, m), "actor/ppo_kl": mmean(kl, m),
                              "actor/pg_clipfrac_lower": mmean(cfn, m)}


def dro(old, lp, A, m, mode, cfg, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  beta = cfg["policy_loss"]["dro_beta"]
  L = np.zeros(lp.shape)
  for b, t in np.ndindex(lp.shape):
    lr = lp[b, t] - old[b, t]
    L[b, t] = -(lp[b, t] * A[b, t] - 0.5 * beta * lr * lr)
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/ppo_kl": mmean(-(lp - old), m)}


def cispo(old, lp, A, m, mode, cfg, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  low, high = _bounds(cfg)
  B, T = lp.shape
  L, cf, kl, G = (np.zeros((B, T)) for _ in range(4))
  W = agg_weights(m, mode, **gbi)
  for b, t in np.ndindex(B, T):
    lrc = clamp(lp[b, t] - old[b, t], -BOUND, BOUND)
    r = math.exp(lrc)
    cr = clamp(r, 1 - low, 1 + high)
    L[b, t] = -cr * A[b, t] * lp[b, t]
    G[b, t] = -cr * A[b, t] * (1.0 if w is None else w[b, t]) * W[b, t]
    cf[b, t] = float(r != cr)
    kl[b, t] = -lrc
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/pg_clipfrac": mmean(cf, m), "actor/ppo_kl": mmean(kl, m),
                "actor/pg_clipfrac_lower": 0.0}, G


def reinforce(rollout_lp, lp, A, m, mode, w=None, **gbi):
  rollout_lp, lp, A, m = f64(rollout_lp), f64(lp), f64(A), f64(m)
  L = -A * lp
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/ppo_kl": mmean(-(lp - rollout_lp), m)}


def aipo(old, lp, A, m, mode, rho, w=None, **gbi):
  old, lp, A, m = f64(old), f64(lp), f64(A), f64(m)
  L, cf, kl = (np.zeros(lp.shape) for _ in range(3))
  for b, t in np.ndindex(lp.shape):
    lrc = clamp(lp[b, t] - old[b, t], -BOUND, BOUND)
    r = math.exp(lrc)
    L[b, t] = -min(r, rho) * A[b, t]
    cf[b, t] = float(r > rho)
    kl[b, t] = -lrc
  loss = agg_loss(_apply_w(L, w), m, mode, **gbi)
  return loss, {"actor/pg_clipfrac": mmean(cf, m), "actor/ppo_kl": mmean(kl, m),
                "actor/pg_clipfrac_lower": 0.0}


# ------------------------------------------------------------ §4.1 value loss --


def value_loss(vpreds, returns, values, m, cv, mode="token-mean", **gbi):
  vpreds, returns, values, m = f64(vpreds), f64(returns), f64(values), f64(m)
  L, cf = np.zeros(vpreds.shape), np.zeros(vpreds.shape)
  for idx in np.ndindex(vpreds.shape):
    vclip = max(min(vpreds[idx], values[idx] + cv), values[idx] - cv)
    l1 = (vpreds[idx] - returns[idx]) ** 2
    l2 = (vclip - returns[idx]) ** 2
    L[idx] = max(l1, l2)
    cf[idx] = float(l2 > l1)
  return 0.5 * agg_loss(L, m, mode, **gbi), mmean(cf, m)


def value_loss_grad(vpreds, returns, values, m, cv, mode="token-mean", **gbi):
  vpreds, returns, values = f64(vpreds), f64(returns), f64(values)
  W = agg_weights(m, mode, **gbi)
  G = np.zeros(vpreds.shape)
  for idx in np.ndindex(vpreds.shape):
    lo, hi = values[idx] - cv, values[idx] + cv
    vclip = max(min(vpreds[idx], hi), lo)
    l1 = (vpreds[idx] - returns[idx]) ** 2
    l2 = (vclip - returns[idx]) ** 2
    if l1 >= l2:
      G[idx] = (vpreds[idx] - returns[idx]) * W[idx]
    elif lo < vpreds[idx] < hi:
      G[idx] = (vclip - returns[idx]) * W[idx]
  return G


# -------------------------------------------------------- §5 rollout correction --


def _parse_is(spec):
  if isinstance(spec, str) and "_" in spec:
    lo, up = spec.split("_")
    return float(up), float(lo)
  return float(spec), None


def is_weights(lr, m, level="token", threshold=2.0, batch_normalize=False):
  """(weights [B, T], metrics) — spec §5.1 with verl's metric definitions."""
  lr, m = f64(lr), f64(m)
  B, T = lr.shape
  upper, lower = _parse_is(threshold)
  raw = np.zeros((B, T))
  seq_lr = np.array([row_msum(lr, m, b) for b in range(B)])
  for b, t in np.ndindex(B, T):
    if not m[b, t]:
      continue
    x = clamp(lr[b, t], -BOUND, BOUND) if level == "token" else clamp(seq_lr[b], -BOUND, BOUND)
    raw[b, t] = math.exp(x)
  w = np.zeros((B, T))
  for b, t in np.ndindex(B, T):
    if lower is None:
      w[b, t] = min(raw[b, t], upper)
    else:
      w[b, t] = raw[b, t] if lower <= raw[b, t] <= upper else 0.0
  lo_thr = 1.0 / upper if lower is None else lower
  valid = [(b, t) for b, t in np.ndindex(B, T) if m[b, t]]
  met = {"rollout_is_mean": mmean(w, m)}
  if level == "sequence":
    met["rollout_is_max"] = math.exp(min(max(seq_lr), BOUND))
    met["rollout_is_min"] = math.exp(min(seq_lr))
    met["rollout_is_ratio_fraction_high"] = float(np.mean(seq_lr > math.log(upper)))
    met["rollout_is_ratio_fraction_low"] = float(np.mean(seq_lr < math.log(lo_thr)))
  else:
    met["rollout_is_ratio_fraction_high"] = mmean(raw > upper, m)
    met["rollout_is_ratio_fraction_low"] = mmean(raw < lo_thr, m)
    met["rollout_is_max"] = max(w[p] for p in valid)
    met["rollout_is_min"] = min(w[p] for p in valid)
  wc = np.clip(w, 0.0, upper)
  if len(valid) > 1:
    mu = mmean(wc, m)
    met["rollout_is_std"] = math.sqrt(max(mmean(wc ** 2, m) - mu * mu, 0.0))
  else:
    met["rollout_is_std"] = 0.0
  mu = mmean(wc, m)
  met["rollout_is_eff_sample_size"] = 1.0 / mmean((wc / (mu + 1e-8)) ** 2, m)
  seq_w = np.array([row_mmean(w, m, b) for b in range(B)])
  met["rollout_is_seq_mean"] = float(seq_w.mean())
  met["rollout_is_seq_std"] = float(seq_w.std(ddof=1)) if B > 1 else 0.0
  met["rollout_is_seq_max"] = float(seq_w.max())
  met["rollout_is_seq_min"] = float(seq_w.min())
  met["rollout_is_seq_max_deviation"] = float(np.abs(seq_w - 1).max())
  raw_seq = np.array([row_mmean(raw, m, b) for b in range(B)])
  met["rollout_is_seq_fraction_high"] = float(np.mean(raw_seq > upper))
  met["rollout_is_seq_fraction_low"] = float(np.mean(raw_seq < lo_thr))
  if lower is not None:
    met["rollout_is_oob_ratio"] = mmean((raw < lower) | (raw > upper), m)
  if batch_normalize:
    if level == "token":
      mean = mmean(w, m)
    else:
      nonempty = [b for b in range(B) if m[b].sum() > 0]
      mean = sum(row_mmean(w, m, b) for b in nonempty) / max(len(nonempty), 1e-8)
    if mean > 1e-8:
      w = w / mean
      met["rollout_is_batch_norm_factor"] = mean
    else:
      met["rollout_is_batch_norm_factor"] = 1.0
  return w, met


def _parse_rs(options, spec):
  parts = [p.strip() for p in str(spec).split(",")]
  if len(parts) == 1:
    parts = parts * len(options)
  out = {}
  for opt, p in zip(options, parts):
    if opt.endswith("k1"):
      if "_" in p:
        lo, up = p.split("_")
        out[opt] = (float(lo), float(up))
      else:
        out[opt] = (1.0 / float(p), float(p))
    else:
      out[opt] = (None, float(p))
  return out


def rs_mask(lr, m, rollout_rs, threshold):
  """(mask', metrics) — spec §5.2 with verl's metric definitions."""
  lr, m = f64(lr), f64(m)
  B, T = lr.shape
  options = []
  for o in rollout_rs.split(","):
    if o.strip() and o.strip() not in options:
      options.append(o.strip())
  thr = _parse_rs(options, threshold)
  div = {"k1": np.zeros((B, T)), "k2": np.zeros((B, T)), "k3": np.zeros((B, T))}
  for b, t in np.ndindex(B, T):
    x = clamp(lr[b, t], -BOUND, BOUND)
    div["k1"][b, t] = -x
    div["k2"][b, t] = 0.5 * x * x
    div["k3"][b, t] = math.exp(x) - 1 - x
  combined = np.ones((B, T))
  seq_valid = [m[b].sum() > 0 for b in range(B)]
  met = {}
  for opt in options:
    lower, upper = thr[opt]
    kind = opt[-2:]
    is_k1 = kind == "k1"
    tok = div[kind]
    if opt.startswith("token"):
      stat = tok.copy()
      seq = None
    else:
      seq = np.zeros(B)
      for b in range(B):
        vals = [tok[b, t] for t in range(T) if m[b, t]]
        if opt.startswith("seq_sum"):
          seq[b] = sum(vals)
        elif opt.startswith("seq_mean"):
          seq[b] = sum(vals) / (len(vals) + 1e-8)
        else:
          seq[b] = max(vals) if vals else 0.0
      stat = np.repeat(seq[:, None], T, axis=1)
    up = math.log(upper) if is_k1 else upper
    lo = math.log(lower) if is_k1 else 0.0
    keep = np.zeros((B, T), bool)
    for b, t in np.ndindex(B, T):
      keep[b, t] = (lo <= stat[b, t] <= up) if is_k1 else stat[b, t] <= up
    combined *= keep
    p = f"rollout_rs_{opt}"
    seq_values = seq if seq is not None else np.array([row_mmean(stat, m, b) for b in range(B)])
    sv = np.array([seq_values[b] for b in range(B) if seq_valid[b]])
    valid = [(b, t) for b, t in np.ndindex(B, T) if m[b, t]]
    met[f"{p}_mean"] = mmean(stat, m)
    if seq is not None:
      met[f"{p}_max"], met[f"{p}_min"] = float(sv.max()), float(sv.min())
      met[f"{p}_fraction_high"] = float(np.mean(sv > up))
      met[f"{p}_fraction_low"] = float(np.mean(sv < lo)) if is_k1 else 0.0
    else:
      met[f"{p}_max"] = max(stat[q] for q in valid)
      met[f"{p}_min"] = min(stat[q] for q in valid)
      met[f"{p}_fraction_high"] = mmean(stat > up, m)
      met[f"{p}_fraction_low"] = mmean(stat < lo, m) if is_k1 else 0.0
    if len(valid) > 1:
      c = np.clip(stat, lo if is_k1 else 0.0, up)
      mu = mmean(c, m)
      met[f"{p}_std"] = math.sqrt(max(mmean(c * c, m) - mu * mu, 0.0))
    else:
      met[f"{p}_std"] = 0.0
    met[f"{p}_seq_mean"] = float(sv.mean())
    met[f"{p}_seq_std"] = float(sv.std(ddof=1)) if len(sv) > 1 else 0.0
    met[f"{p}_seq_max"] = float(sv.max())
    met[f"{p}_seq_min"] = float(sv.min())
    met[f"{p}_seq_max_deviation"] = float(np.abs(sv).max())
    met[f"{p}_seq_fraction_high"] = float(np.mean(sv > up))
    if is_k1:
      met[f"{p}_seq_fraction_low"] = float(np.mean(sv < lo))
    met[f"{p}_masked_fraction"] = mmean(1.0 - keep, m)
    rejected_rows = [b for b in range(B) if seq_valid[b]
                     and any(m[b, t] and not keep[b, t] for t in range(T))]
    met[f"{p}_seq_masked_fraction"] = len(rejected_rows) / max(sum(seq_valid), 1)
  met["rollout_rs_masked_fraction"] = mmean(1.0 - combined, m)
  met["rollout_rs_seq_masked_fraction"] = float(np.mean(
      [any(m[b, t] and combined[b, t] <= 0.5 for t in range(T)) for b in range(B)]))
  return m * combined, met


def offpolicy_metrics(old, roll, m):
  old, roll, m = f64(old), f64(roll), f64(m)
  B, T = old.shape
  mu_old = np.array([row_mmean(old, m, b) for b in range(B)])
  mu_roll = np.array([row_mmean(roll, m, b) for b in range(B)])
  lr = old - roll
  d = mu_roll - mu_old
  k3 = np.zeros((B, T))
  rho2 = np.zeros((B, T))
  for b, t in np.ndindex(B, T):
    if m[b, t]:
      k3[b, t] = math.exp(lr[b, t]) - lr[b, t] - 1
      rho2[b, t] = math.exp(clamp(lr[b, t], -BOUND, BOUND)) ** 2
  seq = [math.exp(2 * clamp(row_msum(lr, m, b), -BOUND, BOUND)) for b in range(B)]
  return {
      "training_ppl": float(np.mean(np.exp(-mu_old))),
      "training_log_ppl": float(np.mean(-mu_old)),
      "kl": mmean(roll - old, m),
      "k3_kl": mmean(k3, m),
      "rollout_ppl": float(np.mean(np.exp(-mu_roll))),
      "rollout_log_ppl": float(np.mean(-mu_roll)),
      "log_ppl_diff": float(np.mean(d)),
      "log_ppl_abs_diff": float(np.mean(np.abs(d))),
      "log_ppl_diff_max": float(np.max(d)),
      "log_ppl_diff_min": float(np.min(d)),
      "ppl_ratio": float(np.mean(np.exp(d))),
      "chi2_token": mmean(rho2, m) - 1.0,
      "chi2_seq": float(np.mean(seq)) - 1.0,
  }


def rollout_correction(old, roll, m, rollout_is=None, rollout_is_threshold=2.0,
                       rollout_is_batch_normalize=False, rollout_rs=None,
                       rollout_rs_threshold=None):
  lr = f64(old) - f64(roll)
  met, w, mask = {}, None, f64(m)
  if rollout_is is not None and rollout_is_threshold is not None:
    w, im = is_weights(lr, m, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
    met.update(im)
  if rollout_rs is not None:
    mask, rm = rs_mask(lr, m, rollout_rs, rollout_rs_threshold)
    met.update(rm)
  met.update(offpolicy_metrics(old, roll, m))
  return w, mask, {f"rollout_corr/{k}": v for k, v in met.items()}


# -------------------------------------------------------------- §0 entropy --


def entropy(logits):
  logits = f64(logits)
  out = np.zeros(logits.shape[:-1])
  for idx in np.ndindex(out.shape):
    row = logits[idx]
    mx = row.max()
    lse = mx + math.log(np.exp(row - mx).sum())
    p = np.exp(row - lse)
    out[idx] = lse - float((p * row).sum())
  return out
