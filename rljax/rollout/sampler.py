"""The RL sampler: n responses per prompt by continuous batching over the engine.

`RolloutSampler.generate(params, prompt_ids, prompt_mask, n, key)` is the one
call the trainer makes. Requests (prompt p, sample j) fill the engine's
decode slots; a slot whose request ends (an eos id, or `response_length`
tokens) is refilled from the pending requests at the next synchronisation.
A prompt is prefilled once for all of its samples that enter slots
together: its prefix is inserted into each of their slots. Prefill batches
are padded to a power of two rows and a length bucket, so prompt lengths and
counts do not trigger new compilations.

Outputs follow verl's layout: row `p * n + j` is sample j of prompt p.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from rljax.data import dataset
from rljax.rollout import decode_state, engine as engine_lib
from rljax.rollout import sampling
from rljax.rollout import stream as stream_lib


@dataclasses.dataclass
class Rollout:
  """n responses for each of B prompts ([B * n, R] arrays, R = response_length).

  Attributes:
    responses: token ids, right-padded with pad_id.
    response_mask: 1 for generated tokens (eos included), 0 after the end.
    response_lengths: [B * n] generated token counts.
    log_probs: log-probability of each generated token under the sampling
      distribution (log_softmax(logits / temperature)); 0 after the end.
    prompt_index: [B * n] the prompt each row answers.
    truncated: [B * n] True where the response hit response_length without eos.
    routed_experts: with the engine's record_routing, [B * n, P + R, L_sparse, k]
      the experts each prompt and response token went to, in the trainer's
      layout (prompt left-padded to P, response from P on; 0 at padding);
      else None.
    versions: [B * n, R] int32 the policy version that sampled each token (-1 after the end and on a multi-turn
      rollout's appended ids); None where the sampler does not record it.
    stats: the sampler's measurements (the share of decode slot-steps that decoded a token).
  """

  responses: np.ndarray
  response_mask: np.ndarray
  response_lengths: np.ndarray
  log_probs: np.ndarray
  prompt_index: np.ndarray
  truncated: np.ndarray
  routed_experts: np.ndarray | None = None
  versions: np.ndarray | None = None
  stats: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def attention_mask(self) -> np.ndarray:
    """[B * n, R] int32: 1 on every response id (a multi-turn rollout's tool turns included), 0 after the end."""
    return (np.arange(self.responses.shape[1])[None, :] < self.response_lengths[:, None]).astype(np.int32)

  @property
  def metrics(self) -> dict[str, float]:
    """Rollout metrics beyond the trainer's own (the sampler's `stats`; a multi-turn rollout adds its own)."""
    return dict(self.stats)

  def extra_info(self, rows: Sequence[Any] | None) -> Sequence[Any] | None:
    """Each row's extra_info as the reward function gets it: the data's (`rows`, one per response row, or None);
    a multi-turn rollout adds verl's num_turns and rollout_reward_scores."""
    return rows


class RolloutSampler:
  """Drives an Engine over a batch of prompts with continuous batching."""

  def __init__(self, engine: engine_lib.Engine, pad_id: int, steps_per_sync: int = 8,
               free_cache: bool = True):
    """Args:
      engine: the JetStream engine (slots, buckets, response length, eos).
      pad_id: fills responses after their end.
      steps_per_sync: decode steps per host round trip; a finished slot waits
        at most this many steps before it is refilled.
      free_cache: drop the KV cache after each call (rollout.free_cache_engine).
    """
    self.engine = engine
    self.pad_id = int(pad_id)
    self.steps_per_sync = max(1, min(int(steps_per_sync), engine.max_decode_length))
    self.free_cache = free_cache
    self._state: decode_state.DecodeState | None = None

  def _decode_state(self, key: jax.Array) -> decode_state.DecodeState:
    state = self._state if self._state is not None else self.engine.init_decode_state()
    self._state = None
    return state._replace(key=key)

  def close(self) -> None:
    """Nothing to release (the multi-turn sampler stops its tool threads)."""

  def open_stream(self, state: decode_state.DecodeState | None = None,
                  sampling_params: sampling.SamplingParams | None = None) -> stream_lib.DecodeStream:
    """A decode stream over the engine's slots (in `state`, default the engine's empty one)."""
    return stream_lib.DecodeStream(self.engine, self.pad_id, self.steps_per_sync, state, sampling_params)

  def new_request(self, request_id: int, group: int, prompt: np.ndarray, key: jax.Array, width: int,
                  columns: Mapping[str, Any] | None = None) -> stream_lib.Request:
    """An empty request answering `prompt` ([p] ids; `width`: the prompt width of the trainer's layout);
    `columns` are its prompt's data columns (its images, `multi_modal_inputs`, are read here; the rest by
    multi-turn samplers)."""
    return stream_lib.new_request(self.engine, self.pad_id, request_id, group, prompt, key, width,
                                  prompt_images(columns))

  def assemble(self, requests: Sequence[stream_lib.Request], metrics: dict[str, float] | None = None) -> Rollout:
    """The Rollout of finished `requests` (row i from requests[i]), with the sampler's `metrics`."""
    return assemble(requests, self.engine, metrics)

  def generate(self, params: Any, prompt_ids: np.ndarray, prompt_mask: np.ndarray, n: int,
               key: jax.Array, sampling_params: sampling.SamplingParams | None = None,
               rows: Mapping[str, Sequence[Any]] | None = None, first_request: int = 0) -> Rollout:
    """n responses per prompt, through one decode stream.

    Args:
      params: the model parameters (the trainer's arrays, used in place when
        they are in the engine's compute dtype, else cast once for this call).
      prompt_ids: [B, P] left-padded prompt token ids.
      prompt_mask: [B, P] 1 for prompt tokens.
      n: responses per prompt.
      key: PRNG key (the run is reproducible for a given key).
      sampling_params: override of the engine's sampling settings.
      rows: the batch's per-prompt columns ([B] each; read by multi-turn samplers only).
      first_request: the id of row 0's first response; response j of prompt b is request
        first_request + b * n + j, whose sampling stream is `fold_in(key, id)`, whatever slot or call
        decodes it (a host passes its rows' offset in the global batch).

    Returns:
      A Rollout of B * n rows.
    """
    prompt_ids, prompt_mask = np.asarray(prompt_ids), np.asarray(prompt_mask).astype(bool)
    prompts = [row[m] for row, m in zip(prompt_ids, prompt_mask)]
    if any(len(p) == 0 for p in prompts):
      raise ValueError(f"prompt rows {[i for i, p in enumerate(prompts) if not len(p)]} are empty")
    params = self.engine.compute_params(params)  # the copy, if any, before a decode state is allocated
    stream = self.open_stream(self._decode_state(key), sampling_params)
    stream.set_params(params, 0)
    columns = [{k: v[p] for k, v in (rows or {}).items()} for p in range(len(prompts))]
    requests = [self.new_request(first_request + r, r // n, prompts[r // n], key, prompt_ids.shape[1],
                                 columns[r // n]) for r in range(len(prompts) * n)]
    stream.submit(requests)
    stream.finish()
    if not self.free_cache:
      self._state = stream.state
    return self.assemble(requests, {"perf/slot_occupancy": stream.occupancy()})


def prompt_images(columns: Mapping[str, Any] | None) -> stream_lib.PromptImages | None:
  """A prompt's images from its data columns: `multi_modal_inputs` ({"pixel_values": [N, F], "image_grid_thw":
  [I, 3]}, as `rljax.data.dataset.RLHFDataset` gives them); None without images."""
  found = dataset.image_inputs((columns or {}).get("multi_modal_inputs"))
  return None if found is None else stream_lib.PromptImages(*found)


def assemble(requests: Sequence[stream_lib.Request], engine: engine_lib.Engine,
             metrics: dict[str, float] | None = None) -> Rollout:
  """The Rollout of finished `requests`, row i from requests[i] (prompt_index: each one's group)."""
  tokens = np.stack([r.tokens for r in requests])
  lengths = np.asarray([r.length for r in requests], np.int32)
  length = tokens.shape[1]
  last = tokens[np.arange(len(requests)), np.maximum(lengths - 1, 0)]
  ended_on_eos = np.isin(last, engine.eos_ids) & ~engine.ignore_eos
  return Rollout(responses=tokens, response_mask=(np.arange(length)[None, :] < lengths[:, None]).astype(np.int32),
                 response_lengths=lengths, log_probs=np.stack([r.log_probs for r in requests]),
                 prompt_index=np.asarray([r.group for r in requests], np.int64),
                 truncated=(lengths >= length) & ~ended_on_eos,
                 routed_experts=None if requests[0].experts is None else np.stack([r.experts for r in requests]),
                 versions=np.stack([r.versions for r in requests]), stats=metrics or {})
