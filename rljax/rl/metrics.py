"""verl's batch metrics (critic/score/mean, response_length/mean, ...) from each host's rows, reduced over hosts
as sums, counts and extrema (never as means of means)."""

from __future__ import annotations

import numpy as np

from rljax.rl.experience import Experience
from rljax.sharding import hosts


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
  """{prefix}/mean, /max, /min over every host's `values` (hosts exchange a sum, a count and the extrema)."""
  total, count = hosts.process_sum([values.sum(dtype=np.float64), values.size])
  if count == 0:
    return {}
  local = [values.max(), values.min()] if values.size else [-np.inf, np.inf]
  high, _ = hosts.process_extrema([local[0], -local[1]])
  return {f"{prefix}/mean": float(total / count), f"{prefix}/max": float(high[0]), f"{prefix}/min": float(-high[1])}


def _mean(values: np.ndarray) -> float:
  """The mean over every host's `values`."""
  total, count = hosts.process_sum([values.sum(dtype=np.float64), values.size])
  return float(total / count)


def _variance(values: np.ndarray) -> float:
  """The (population) variance over every host's `values`, from their sums of x and x²."""
  x = values.astype(np.float64)
  total, squares, count = hosts.process_sum([x.sum(), (x * x).sum(), x.size])
  mean = total / count
  return float(max(squares / count - mean * mean, 0.0))


def data_metrics(batch: Experience, response_width: int, prompt_width: int) -> dict[str, float]:
  """verl's `compute_data_metrics` over the step's rows of every host.

  Args:
    batch: this host's rows with token_level_scores, token_level_rewards,
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
    out["critic/vf_explained_var"] = float(1.0 - _variance(returns - values) / (_variance(returns) + 1e-5))
  out.update(_stats("response_length", response_length))
  out["response_length/clip_ratio"] = _mean(response_length >= response_width)
  out.update(_stats("prompt_length", prompt_length))
  out["prompt_length/clip_ratio"] = _mean(prompt_length >= prompt_width)
  return out


def validation_metrics(data_sources: np.ndarray, scores: np.ndarray, n: int) -> dict[str, float]:
  """val-core/<data_source>/reward/mean@n (and std@n, best@n over each prompt's n samples).

  Rows are grouped n per prompt in order (row p * n + j). Each host passes its own rows; the hosts exchange
  each source's prompt count and its sums of the prompts' mean, std and best score.
  """
  out = {}
  per_prompt = scores.reshape(-1, n).astype(np.float64)
  sources = np.asarray(data_sources).reshape(-1, n)[:, 0]
  names = hosts.process_union(sources.tolist())
  sums = hosts.process_sum([stat for source in names for stat in _prompt_sums(per_prompt[sources == source])])
  for source, (prompts, mean, std, best) in zip(names, sums.reshape(-1, 4)):
    out[f"val-core/{source}/reward/mean@{n}"] = float(mean / prompts)
    if n > 1:
      out[f"val-aux/{source}/reward/std@{n}"] = float(std / prompts)
      out[f"val-aux/{source}/reward/best@{n}/mean"] = float(best / prompts)
  return out


def _prompt_sums(per_prompt: np.ndarray) -> list[float]:
  """[prompts, n] scores -> (prompt count, sums over prompts of the mean, std and best of its n scores)."""
  return [len(per_prompt), per_prompt.mean(1).sum(), per_prompt.std(1).sum(), per_prompt.max(1).sum()]
