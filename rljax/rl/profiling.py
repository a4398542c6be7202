"""verl's profiler keys as jax.profiler traces.

verl records Nsight/torch profiles of the roles whose `profiler.enable` is
true at the steps `global_profiler.steps` lists. rljax's roles (rollout,
log-probs, updates) run in one JAX program, so a listed step is traced whole
when any role enables profiling: `jax.profiler.trace` writes one trace per
step to `global_profiler.save_path/step_N` (TensorBoard's profile plugin
reads it; the `.trace.json.gz` beside it opens in Perfetto).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import ContextManager, Iterator

import jax
from ml_collections import ConfigDict

from rljax import config as config_lib


def traced_steps(config: ConfigDict) -> frozenset[int]:
  """The steps (1-based) to trace: global_profiler.steps when some role's profiler.enable is true."""
  enabled = any(config_lib.get_node(config, f"{section}.profiler.enable") for section in config_lib.PROFILED_SECTIONS)
  return frozenset(config.global_profiler.steps or ()) if enabled else frozenset()


def trace_directory(config: ConfigDict, step: int) -> str:
  """Where step `step`'s trace goes."""
  return os.path.join(os.path.expanduser(config.global_profiler.save_path), f"step_{step}")


def step_trace(config: ConfigDict, step: int) -> ContextManager[None]:
  """A jax.profiler trace of step `step` when it is one to trace, else nothing."""
  if step not in traced_steps(config):
    return contextlib.nullcontext()
  return jax.profiler.trace(trace_directory(config, step), create_perfetto_trace=True)


@contextlib.contextmanager
def timed(timing: dict[str, float], name: str) -> Iterator[None]:
  """Adds the block's seconds to timing["timing_s/<name>"]."""
  start = time.perf_counter()
  yield
  timing[f"timing_s/{name}"] = timing.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start
