"""Rollout: a JetStream engine over rljax models and the RL sampler on top of it.

`factory` builds both from a config's rollout node (trainer, generation, compile). The engine's parts by job:
`decode_state` (the slots' state and cache layout), `weights` (the trainer's weights as the engine reads them),
`jetstream_adapter` (JetStream's types and hooks), `serving` (JetStream's orchestrator).
"""

from rljax.rollout.decode_state import DecodeState, Prefix, bucket_for, pad_to_bucket
from rljax.rollout.engine import Engine, make_engine
from rljax.rollout.jetstream_adapter import HAS_JETSTREAM, JetStreamTokenizer, ResultTokens
from rljax.rollout.sampler import Rollout, RolloutSampler
from rljax.rollout.serving import DriverThreadError, make_driver
from rljax.rollout.sampling import SamplingParams, sample, top_k_filter, top_p_filter

__all__ = [
    "HAS_JETSTREAM", "DecodeState", "DriverThreadError", "Engine", "JetStreamTokenizer", "Prefix", "ResultTokens",
    "Rollout", "RolloutSampler", "SamplingParams", "bucket_for", "make_driver", "make_engine", "pad_to_bucket",
    "sample", "top_k_filter", "top_p_filter",
]
