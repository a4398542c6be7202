"""verl's batch metrics (critic/score/mean, response_length/mean, ...) on host arrays."""

from __future__ import annotations

import numpy as np

from rljax.rl.experience import Experience


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
  if values.size == 0:
    return {}
  return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
          f"{prefix}/min": float(values.min())}


def data_metrics(batch: Experience, response_width: int, prompt_width: int) -> dict[str, float]:
  """verl's `compute_data_metrics`.

  Args:
    batch: a step's rows with token_level_scores, token_level_rewards,
      advantages, returns, response_mask [N, R]; attention_mask [N, P + R]
      (a response's length counts every id, a multi-turn response's tool
      turns included, as verl counts it); prompt_mask [N, P]; values [N, R]
      with a critic.
    response_width: R (a response of R tokens was clipped).
    prompt_width: P.
  """
  mask = batch.response_mask.astype(bool)
  response_length = batch.attention_mask[:, -response_width:].sum(-1).astype(np.float64)
  prompt_length = batch.prompt_mask.sum(-1).astype(np.float64)
  out = {}
  out.update(_stats("critic/score", batch.token_level_scores.sum(-1)))
  out.update(_stats("critic/rewards", batch.token_level_rewards.sum(-1)))
  out.update(_stats("critic/advantages", batch.advantages[mask]))
  out.update(_stats("critic/returns", batch.returns[mask]))
  if batch.values is not None:
    values, returns = batch.values[mask], batch.returns[mask]
    out.update(_stats("critic/values", values))
    variance = np.var(returns)
    out["critic/vf_explained_var"] = float(1.0 - np.var(returns - values) / (variance + 1e-5))
  out.update(_stats("response_length", response_length))
  out["response_length/clip_ratio"] = float(np.mean(response_length >= response_width))
  out.update(_stats("prompt_length", prompt_length))
  out["prompt_length/clip_ratio"] = float(np.mean(prompt_length >= prompt_width))
  return out


def validation_metrics(data_sources: np.ndarray, scores: np.ndarray, n: int) -> dict[str, float]:
  """val-core/<data_source>/reward/mean@n (and std@n, best@n over each prompt's n samples).

  Rows are grouped n per prompt in order (row p * n + j).
  """
  out = {}
  per_prompt = scores.reshape(-1, n)
  sources = np.asarray(data_sources).reshape(-1, n)[:, 0]
  for source in sorted(set(sources.tolist())):
    rows = per_prompt[sources == source]
    out[f"val-core/{source}/reward/mean@{n}"] = float(rows.mean())
    if n > 1:
      out[f"val-aux/{source}/reward/std@{n}"] = float(rows.std(axis=1).mean())
      out[f"val-aux/{source}/reward/best@{n}/mean"] = float(rows.max(axis=1).mean())
  return out
