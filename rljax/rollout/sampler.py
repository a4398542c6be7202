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
from typing import Any, Sequence

import jax
import numpy as np

from rljax.rollout import engine as engine_lib
from rljax.rollout import sampling


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
  """

  responses: np.ndarray
  response_mask: np.ndarray
  response_lengths: np.ndarray
  log_probs: np.ndarray
  prompt_index: np.ndarray
  truncated: np.ndarray
  routed_experts: np.ndarray | None = None

  @property
  def attention_mask(self) -> np.ndarray:
    """[B * n, R] int32: 1 on every response id (a multi-turn rollout's tool turns included), 0 after the end."""
    return (np.arange(self.responses.shape[1])[None, :] < self.response_lengths[:, None]).astype(np.int32)

  @property
  def metrics(self) -> dict[str, float]:
    """Rollout metrics beyond the trainer's own (a multi-turn rollout's; none here)."""
    return {}

  def extra_info(self, rows: Sequence[Any] | None) -> Sequence[Any] | None:
    """Each row's extra_info as the reward function gets it: the data's (`rows`, one per response row, or None);
    a multi-turn rollout adds verl's num_turns and rollout_reward_scores."""
    return rows


def _power_of_two_at_least(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _place_prompt_experts(experts: np.ndarray, prefix: np.ndarray, requests: Sequence[int], unique: list[int],
                          prompts: Sequence[np.ndarray], n: int, width: int) -> None:
  """Writes each request's prompt routing (its prefix row [bucket, L, k], left-padded) into experts[request, :width].

  Request r answers prompt r // n, whose prefix is row `unique.index(r // n)`;
  its `len` tokens end both the prefix row and the trainer's width-`width` prompt.
  """
  for request in requests:
    prompt = request // n
    size = len(prompts[prompt])
    experts[request, width - size:width] = prefix[unique.index(prompt), prefix.shape[1] - size:]


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
    self._state: engine_lib.DecodeState | None = None

  def _decode_state(self, key: jax.Array) -> engine_lib.DecodeState:
    state = self._state if self._state is not None else self.engine.init_decode_state()
    self._state = None
    return state._replace(key=key)

  def _prefill(self, params, prompts: Sequence[np.ndarray]) -> engine_lib.Prefix:
    rows = _power_of_two_at_least(len(prompts))
    bucket = engine_lib.bucket_for(max(len(p) for p in prompts), self.engine.buckets)
    tokens = np.full((rows, bucket), self.pad_id, np.int32)
    lengths = np.ones((rows,), np.int32)
    for i, ids in enumerate(prompts):
      tokens[i, :len(ids)] = ids
      lengths[i] = len(ids)
    return self.engine.prefill(params=params, padded_tokens=tokens, true_length=lengths)

  def close(self) -> None:
    """Nothing to release (the multi-turn sampler stops its tool threads)."""

  def generate(self, params: Any, prompt_ids: np.ndarray, prompt_mask: np.ndarray, n: int,
               key: jax.Array, sampling_params: sampling.SamplingParams | None = None,
               rows: Any = None, first_request: int = 0) -> Rollout:
    """n responses per prompt (`rows`, the batch's per-prompt columns, are read by multi-turn samplers only).

    Args:
      params: the model parameters (the trainer's arrays, used in place when
        they are in the engine's compute dtype, else cast once for this call).
      prompt_ids: [B, P] left-padded prompt token ids.
      prompt_mask: [B, P] 1 for prompt tokens.
      n: responses per prompt.
      key: PRNG key (the run is reproducible for a given key).
      sampling_params: override of the engine's sampling settings.
      first_request: the id of row 0's first response; response j of prompt b is request
        first_request + b * n + j, whose sampling stream is `fold_in(key, id)`, whatever slot or call
        decodes it (a host passes its rows' offset in the global batch).

    Returns:
      A Rollout of B * n rows.
    """
    del rows
    params = self.engine.compute_params(params)
    prompt_ids, prompt_mask = np.asarray(prompt_ids), np.asarray(prompt_mask).astype(bool)
    prompts = [row[m] for row, m in zip(prompt_ids, prompt_mask)]
    if any(len(p) == 0 for p in prompts):
      raise ValueError(f"prompt rows {[i for i, p in enumerate(prompts) if not len(p)]} are empty")
    total, length = len(prompts) * n, self.engine.max_decode_length
    tokens = np.full((total, length), self.pad_id, np.int32)
    log_probs = np.zeros((total, length), np.float32)
    lengths = np.zeros((total,), np.int32)
    width = prompt_ids.shape[1]
    routing = self.engine.cfg.routing_shape if self.engine.record_routing else None
    experts = None if routing is None else np.zeros((total, width + length, *routing), np.int32)
    state = self._decode_state(key)
    free = list(range(self.engine.max_concurrent_decodes))
    slot_request: dict[int, int] = {}
    next_request = finished = 0
    while finished < total:
      if free and next_request < total:
        take = list(range(next_request, min(total, next_request + len(free))))
        next_request += len(take)
        unique = sorted({r // n for r in take})
        prefix = self._prefill(params, [prompts[p] for p in unique])
        if experts is not None:
          _place_prompt_experts(experts, jax.device_get(prefix.experts), take, unique, prompts, n, width)
        slots = [free.pop(0) for _ in take]
        state = self.engine.insert_many(prefix, state, slots, [unique.index(r // n) for r in take],
                                        [first_request + r for r in take])
        slot_request.update(zip(slots, take))
      state, out = self.engine.generate_steps(params, state, self.steps_per_sync, sampling_params)
      out, done = jax.device_get((out, state.done))
      for slot, request in list(slot_request.items()):
        valid = out.valid[slot]
        count = int(valid.sum())
        start = lengths[request]
        tokens[request, start:start + count] = out.tokens[slot][valid]
        log_probs[request, start:start + count] = out.log_probs[slot][valid]
        if experts is not None:
          experts[request, width + start:width + start + count] = out.experts[slot][valid]
        lengths[request] += count
        if done[slot]:
          del slot_request[slot]
          free.append(slot)
          finished += 1
    if not self.free_cache:
      self._state = state
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    last = tokens[np.arange(total), np.maximum(lengths - 1, 0)]
    ended_on_eos = np.isin(last, self.engine.eos_ids) & ~self.engine.ignore_eos
    return Rollout(responses=tokens, response_mask=mask, response_lengths=lengths, log_probs=log_probs,
                   prompt_index=np.repeat(np.arange(len(prompts)), n),
                   truncated=(lengths >= length) & ~ended_on_eos, routed_experts=experts)
