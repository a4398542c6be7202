"""Serving an rljax engine with JetStream's own orchestrator (the `jetstream` extra)."""

from __future__ import annotations

from typing import Any

from rljax.rollout import jetstream_compat
from rljax.rollout.engine import Engine


def make_driver(engine: Engine, params: Any, **kwargs) -> Any:
  """A `jetstream.core.orchestrator.Driver` that prefills and generates with `engine`.

  Args:
    engine: the rljax engine (built with a tokenizer for text requests).
    params: the parameters to serve (e.g. a loaded checkpoint's).
    **kwargs: passed to Driver (e.g. interleaved_mode=True).

  Raises:
    ImportError: google-jetstream is not installed.
  """
  orchestrator = jetstream_compat.import_quietly("jetstream.core.orchestrator")
  if orchestrator is None:
    raise ImportError("serving needs google-jetstream: pip install 'rljax[jetstream]'")
  jetstream_compat.install_tree_map_alias()
  return orchestrator.Driver(prefill_engines=[engine], generate_engines=[engine],
                             prefill_params=[params], generate_params=[params], **kwargs)
