"""Continuous batching over an engine's decode slots, for requests that come and go at any time.

A `DecodeStream` holds a decode state across calls: `submit` queues requests,
each `step` refills the free slots from the queue, the lowest slot first (a
prompt is prefilled once for all its requests that enter slots together) and
runs one chunk of decode steps, returning the requests that ended in it.
Parameters can change between steps (`set_params`): a request in flight
continues under the new ones on what its cache holds, and each token records
the policy version whose forward pass gave the logits it was sampled from (a
chunk's first token after a change comes from the logits the old version
left). `RolloutSampler.generate` is one batch through a stream; the
asynchronous trainer (`rljax.rl.streaming`) keeps one open across its updates.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import vision
from rljax.rollout import decode_state, engine as engine_lib
from rljax.rollout import sampling


@dataclasses.dataclass(eq=False)
class Request:
  """One response being generated.

  Attributes:
    id: its sampling stream (`fold_in(key, id)`), whatever slot or step decodes it.
    group: the prompt it answers (requests of one group share the prompt's prefill).
    prompt: [p] the prompt's token ids.
    key: the rollout key its stream derives from.
    tokens, log_probs, versions: [R] each response token, its log-probability under the sampling
      distribution and the policy version that sampled it (-1 past the end, and on ids a conversation appended).
    length: response tokens so far (a conversation's appended ids included).
    experts: with the engine's record_routing, [width + R, L_sparse, k] the experts of its prompt (left-padded
      to `width`) and response tokens; else None.
    images: the prompt's images (a vision-language model's), `PromptImages`; None: text only.
  """

  id: int
  group: int
  prompt: np.ndarray
  key: jax.Array
  tokens: np.ndarray
  log_probs: np.ndarray
  versions: np.ndarray
  length: int = 0
  experts: np.ndarray | None = None
  images: "PromptImages | None" = None


class PromptImages(NamedTuple):
  """One prompt's images as the image processor gives them.

  Attributes:
    pixels: [N, F] float32 patches (``pixel_values``).
    grids: [I, 3] int patch grids (``image_grid_thw``).
  """

  pixels: np.ndarray
  grids: np.ndarray


def new_request(engine: engine_lib.Engine, pad_id: int, request_id: int, group: int, prompt: np.ndarray,
                key: jax.Array, width: int, images: PromptImages | None = None) -> Request:
  """An empty request for `engine` (its buffers sized to the response length; `width` is the prompt width the
  trainer's routing layout uses; `images`: the prompt's, if any)."""
  length = engine.max_decode_length
  routing = engine.cfg.routing_shape if engine.record_routing else None
  return Request(id=request_id, group=group, prompt=prompt, key=key,
                 tokens=np.full((length,), pad_id, np.int32), log_probs=np.zeros((length,), np.float32),
                 versions=np.full((length,), -1, np.int32),
                 experts=None if routing is None else np.zeros((width + length, *routing), np.int32), images=images)


def _power_of_two_at_least(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def prefill(engine: engine_lib.Engine, params: Any, prompts: Sequence[np.ndarray], pad_id: int,
            images: Sequence[PromptImages | None] | None = None) -> decode_state.Prefix:
  """The prefix of `prompts` (with `images`: each one's, or None), padded to a power of two rows, a length
  bucket and, with images, a power of two patches per row (few compilations)."""
  rows = _power_of_two_at_least(len(prompts))
  bucket = decode_state.bucket_for(max(len(p) for p in prompts), engine.buckets)
  tokens = np.full((rows, bucket), pad_id, np.int32)
  lengths = np.ones((rows,), np.int32)
  for i, ids in enumerate(prompts):
    tokens[i, :len(ids)] = ids
    lengths[i] = len(ids)
  if not images or all(i is None for i in images):
    return engine.prefill(params=params, padded_tokens=tokens, true_length=lengths)
  padded = list(images) + [None] * (rows - len(images))
  batch = vision.row_images([None if i is None else i.pixels for i in padded],
                            [None if i is None else i.grids for i in padded], engine.cfg.vision)
  return engine.prefill(params=params, padded_tokens=tokens, true_length=lengths, images=batch,
                        grids=[None if i is None else i.grids for i in padded])


class DecodeStream:
  """Requests through an engine's slots across calls (see the module docstring)."""

  def __init__(self, engine: engine_lib.Engine, pad_id: int, steps_per_sync: int,
               state: decode_state.DecodeState | None = None,
               sampling_params: sampling.SamplingParams | None = None):
    """Args:
      engine: the JetStream engine.
      pad_id: pads prefill rows.
      steps_per_sync: decode steps per chunk (a finished slot waits at most this many before it is refilled).
      state: a decode state to continue in (default: the engine's empty one).
      sampling_params: override of the engine's sampling settings.
    """
    self.engine = engine
    self.pad_id = pad_id
    self.steps_per_sync = steps_per_sync
    self.state = state if state is not None else engine.init_decode_state()
    self.sampling_params = sampling_params
    self.pending: list[Request] = []
    self.slots: dict[int, Request] = {}
    self.free = list(range(engine.max_concurrent_decodes))
    self.params: Any = None
    self.version = 0
    self.logits_version = np.zeros((engine.max_concurrent_decodes,), np.int32)
    self.decode_steps = 0
    self.busy_slot_steps = 0

  @property
  def idle(self) -> bool:
    """Nothing queued and nothing decoding."""
    return not self.pending and not self.slots

  def set_params(self, params: Any, version: int) -> None:
    """Decode from now on with `params` (the trainer's arrays, cast once if the engine computes in another
    dtype), recording `version` on the tokens they sample."""
    self.params = self.engine.compute_params(params)
    self.version = int(version)

  def submit(self, requests: Sequence[Request]) -> None:
    """Queues `requests` (they enter slots in this order)."""
    self.pending.extend(requests)

  def cancel(self, doomed: Callable[[Request], bool]) -> list[Request]:
    """Removes the queued and decoding requests for which `doomed` holds (their slots are refilled next step)."""
    gone = [r for r in self.pending if doomed(r)]
    self.pending = [r for r in self.pending if not doomed(r)]
    for slot, request in list(self.slots.items()):
      if doomed(request):
        gone.append(self.slots.pop(slot))
        self.free.append(slot)
    return gone

  def _refill(self) -> None:
    """Moves queued requests into the free slots: one prefill for their prompts, one insert per rollout key (the
    insert donates the state, so each takes its own copy of the key)."""
    take, self.pending = self.pending[:len(self.free)], self.pending[len(self.free):]
    groups = sorted({r.group for r in take})
    prompts = {r.group: r for r in take}
    prefix = prefill(self.engine, self.params, [prompts[g].prompt for g in groups], self.pad_id,
                     [prompts[g].images for g in groups])
    if self.engine.record_routing:
      _place_prompt_experts(jax.device_get(prefix.experts), take, groups)
    self.free.sort()  # which slot a request takes depends on the queue alone, not on which slots ended when
    slots, self.free = self.free[:len(take)], self.free[len(take):]
    for key in _distinct(r.key for r in take):
      mine = [(s, r) for s, r in zip(slots, take) if r.key is key]
      self.state = self.engine.insert_many(prefix, self.state._replace(key=jnp.copy(key)), [s for s, _ in mine],
                                           [groups.index(r.group) for _, r in mine], [r.id for _, r in mine])
    self.slots.update(zip(slots, take))
    self.logits_version[slots] = self.version

  def step(self) -> list[Request]:
    """Refills the free slots, runs one chunk of decode steps; returns the requests that ended in it."""
    ended = self._between_chunks()
    decoding = self._decoding()
    if not decoding:
      return ended
    self.state, out = self.engine.generate_steps(self.params, self.state, self.steps_per_sync, self.sampling_params)
    out, done = jax.device_get((out, self.state.done))
    self.decode_steps += self.steps_per_sync
    self.busy_slot_steps += int(out.valid[list(decoding)].sum())
    for slot, request in decoding.items():
      self._record(slot, request, out)
      if done[slot] and self._ends(slot, request):
        ended.append(self._release(slot))
    return ended

  def _between_chunks(self) -> list[Request]:
    """What happens before a decode chunk: the free slots take queued requests. Returns requests that ended
    outside a chunk (none here)."""
    if self.free and self.pending:
      self._refill()
    return []

  def _decoding(self) -> dict[int, Request]:
    """slot -> the request it decodes in the next chunk."""
    return dict(self.slots)

  def _record(self, slot: int, request: Request, out: Any) -> None:
    """Writes the tokens a chunk's output `out` (host arrays) holds for `slot` into `request`."""
    valid = out.valid[slot]
    count, start = int(valid.sum()), request.length
    request.tokens[start:start + count] = out.tokens[slot][valid]
    request.log_probs[start:start + count] = out.log_probs[slot][valid]
    request.versions[start:start + count] = self.version
    request.versions[start:start + min(count, 1)] = self.logits_version[slot]
    if request.experts is not None:
      width = request.experts.shape[0] - len(request.tokens)
      request.experts[width + start:width + start + count] = out.experts[slot][valid]
    request.length += count
    self.logits_version[slot] = self.version

  def _ends(self, slot: int, request: Request) -> bool:
    """Whether `request`, whose slot's decoding stopped in this chunk, has ended (a response: always)."""
    del slot, request
    return True

  def _release(self, slot: int) -> Request:
    """Frees `slot`; returns its request."""
    self.free.append(slot)
    return self.slots.pop(slot)

  def finish(self) -> None:
    """Steps until every submitted request has ended."""
    while not self.idle:
      self.step()

  def close(self) -> None:
    """Cancels every request queued or decoding."""
    self.cancel(lambda request: True)

  def occupancy(self) -> float:
    """The share of slot-steps that decoded a request's token so far (1.0 before any step)."""
    total = self.decode_steps * self.engine.max_concurrent_decodes
    return self.busy_slot_steps / total if total else 1.0


def _distinct(keys) -> list[jax.Array]:
  """The distinct key objects of `keys`, in order of first appearance."""
  seen: list[jax.Array] = []
  for key in keys:
    if not any(key is k for k in seen):
      seen.append(key)
  return seen


def _place_prompt_experts(prefix: np.ndarray, requests: Sequence[Request], groups: list[int]) -> None:
  """Writes each request's prompt routing (its group's prefix row [bucket, L, k], left-padded) into its experts'
  first `width` rows: its `len(prompt)` tokens end both the prefix row and the trainer's prompt."""
  for request in requests:
    size = len(request.prompt)
    width = request.experts.shape[0] - len(request.tokens)
    request.experts[width - size:width] = prefix[groups.index(request.group), prefix.shape[1] - size:]


__all__ = ["DecodeStream", "PromptImages", "Request", "new_request", "prefill"]
