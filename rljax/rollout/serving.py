"""Serving an rljax engine with JetStream's own orchestrator (the `jetstream` extra)."""

from __future__ import annotations

from typing import Any

from rljax.rollout import jetstream_compat
from rljax.rollout.engine import Engine, ResultTokens


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
  # The engine module leaves JetStream (and the TensorFlow it imports) out of every
  # run that does not serve; JetStream's orchestrator takes the engine's results for
  # tokens by `isinstance(..., engine_api.ResultTokens)`.
  engine_api = orchestrator.engine_api
  missing = sorted(name for name in engine_api.Engine.__abstractmethods__ if not hasattr(Engine, name))
  if missing:  # what subclassing JetStream's Engine would have refused
    raise TypeError(f"rljax's Engine lacks JetStream's Engine methods {missing}")
  engine_api.Engine.register(Engine)
  engine_api.ResultTokens.register(ResultTokens)
  return orchestrator.Driver(prefill_engines=[engine], generate_engines=[engine],
                             prefill_params=[params], generate_params=[params], **kwargs)
