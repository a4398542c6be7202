"""verl's batch metrics (critic/score/mean, response_length/mean, ...) on host arrays."""

from __future__ import annotations

from typing import Mapping

import numpy as np


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
  if values.size == 0:
    return {}
  return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
          f"{prefix}/min": float(values.min())}


def data_metrics(batch: Mapping[str, np.ndarray], response_width: int, prompt_width: int) -> dict[str, float]:
  """verl's `compute_data_metrics`.

  Args:
    batch: token_level_scores, token_level_rewards, advantages, returns,
      response_mask [N, R]; attention_mask [N, P + R] (a response's length
      counts every id, a multi-turn response's tool turns included, as
      verl counts it); prompt_mask [N, P]; optionally values [N, R].
    response_width: R (a response of R tokens was clipped).
    prompt_width: P.
  """
  mask = batch["response_mask"].astype(bool)
  response_length = batch["attention_mask"][:, -response_width:].sum(-1).astype(np.float64)
  prompt_length = batch["prompt_mask"].sum(-1).astype(np.float64)
  out = {}
  out.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
  out.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
  out.update(_stats("critic/advantages", batch["advantages"][mask]))
  out.update(_stats("critic/returns", batch["returns"][mask]))
  if "values" in batch:
    values, returns = batch["values"][mask], batch["returns"][mask]
    out.update(_stats("critic/values", values))
    variance = np.var(returns)
    out["critic/vf_explained_var"] = float(1.0 - np.var(returns - values) / (variance + 1e-5))
  out.update(_stats("response_length", response_length))
  out["response_length/clip_ratio"] = float(np.mean(response_length >= response_width))
  out.update(_stats("prompt_length", prompt_length))
  out["prompt_length/clip_ratio"] = float(np.mean(prompt_length >= prompt_width))
  return out


def throughput_metrics(timing: Mapping[str, float], total_tokens: int, devices: int) -> dict[str, float]:
  """perf/total_num_tokens, perf/time_per_step, perf/throughput (tokens/s per device)."""
  step = timing.get("timing_s/step", 0.0)
  return {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step,
          "perf/throughput": float(total_tokens / step / devices) if step > 0 else 0.0}


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
