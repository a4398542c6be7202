"""Metrics both trainers log: verl's throughput figures."""

from __future__ import annotations

from typing import Mapping


def throughput_metrics(timing: Mapping[str, float], total_tokens: int, devices: int) -> dict[str, float]:
  """perf/total_num_tokens, perf/time_per_step, perf/throughput (tokens/s per device)."""
  step = timing.get("timing_s/step", 0.0)
  return {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step,
          "perf/throughput": float(total_tokens / step / devices) if step > 0 else 0.0}
