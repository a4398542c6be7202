"""Rollout: a JetStream engine over rljax models and the RL sampler on top of it.

`factory` builds both from a config's rollout node (trainer, generation, compile).
"""

from rljax.rollout.engine import (
    HAS_JETSTREAM, DecodeState, Engine, JetStreamTokenizer, Prefix, ResultTokens, bucket_for,
    make_engine, pad_to_bucket,
)
from rljax.rollout.sampler import Rollout, RolloutSampler
from rljax.rollout.serving import DriverThreadError, make_driver
from rljax.rollout.sampling import SamplingParams, sample, top_k_filter, top_p_filter

__all__ = [
    "HAS_JETSTREAM", "DecodeState", "DriverThreadError", "Engine", "JetStreamTokenizer", "Prefix", "ResultTokens",
    "Rollout", "RolloutSampler", "SamplingParams", "bucket_for", "make_driver", "make_engine", "pad_to_bucket",
    "sample", "top_k_filter", "top_p_filter",
]
