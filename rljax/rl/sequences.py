"""Prompt + response rows as the actor, reference and critic read them.

Prompts arrive left-padded to P = data.max_prompt_length, responses
right-padded to R = rollout.response_length, so every row is [P + R] and one
compilation serves every step. The hidden state at position P - 1 + t
predicts response token t.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rljax.data.dataset import image_inputs
from rljax.models import positions_from_mask, token_log_probs, vision
from rljax.rl import packing
from rljax.rl.experience import Experience, images_of


def make_sequences(prompt_ids: np.ndarray, prompt_mask: np.ndarray, responses: np.ndarray,
                   response_mask: np.ndarray, response_attention: np.ndarray | None = None) -> Experience:
  """Rows for the model.

  Args:
    prompt_ids, prompt_mask: [N, P] left-padded prompts (already repeated n times).
    responses, response_mask: [N, R] right-padded responses; response_mask
      is 1 on the tokens the losses count (a multi-turn response's generated
      ones).
    response_attention: [N, R] 1 on every response token the model reads
      (tool turns included); default response_mask.

  Returns:
    An `Experience` of input_ids, attention_mask, positions [N, P + R] and responses, response_mask [N, R].
  """
  if response_attention is None:
    response_attention = response_mask
  input_ids = np.concatenate([prompt_ids, responses], axis=1).astype(np.int32)
  attention_mask = np.concatenate([prompt_mask, response_attention], axis=1).astype(np.int32)
  return Experience(input_ids=input_ids, attention_mask=attention_mask,
                    positions=np.asarray(positions_from_mask(attention_mask)),
                    responses=responses.astype(np.int32), response_mask=response_mask.astype(np.int32))


def with_images(rows: Experience, inputs: Sequence[Any], cfg: Any) -> Experience:
  """A vision-language run's rows with their images and M-RoPE positions.

  Args:
    rows: [N, P + R] rows (`make_sequences`).
    inputs: per row, its prompt's `multi_modal_inputs` ({"pixel_values": [N_r, F], "image_grid_thw": [I_r, 3]})
      or None (no image).
    cfg: the model's ModelConfig (its vision tower, image token, merge size).

  Returns:
    `rows` with the image fields (`rljax.rl.experience.IMAGE_FIELDS`, `rljax.models.vision.row_images`) and
    positions [N, P + R, 3]: the prompt's M-RoPE positions (`rljax.models.vision.rope_index`), and the
    response's one position per token on all three axes, offset as its prompt's decoded tokens were (an
    image-pad token the response generated is text, as the engine decoded it).
  """
  found = [image_inputs(i) for i in inputs]
  pixels, grids = [None if f is None else f[0] for f in found], [None if f is None else f[1] for f in found]
  images = vision.row_images(pixels, grids, cfg.vision)
  width = rows.input_ids.shape[1] - rows.responses.shape[1]
  mask = np.asarray(rows.attention_mask)
  prompt, deltas = vision.rope_index(np.asarray(rows.input_ids)[:, :width], mask[:, :width],
                                     vision.joined_grids(grids),
                                     cfg.image_token_id, cfg.vision.spatial_merge_size, cfg.hf_top.get("video_token_id"))
  # a response's tokens (image-pad ones it generated too) are text: real tokens before them plus the offset
  response = np.asarray(positions_from_mask(mask))[:, width:] + deltas[:, None]
  positions = np.concatenate([np.moveaxis(prompt, 0, -1), np.repeat(response[..., None], 3, axis=-1)], axis=1)
  layout = images.layout
  slots = (np.asarray(rows.input_ids) == cfg.image_token_id) & (np.arange(rows.input_ids.shape[1]) < width)
  return rows.replace(positions=positions.astype(np.int32), image_slots=slots.astype(np.int32), pixels=images.pixels,
                      patch_order=layout.order, patch_rotary=layout.rotary, patch_windows=layout.windows,
                      patch_frames=layout.frames, merge_restore=layout.restore)


class PassRouting(NamedTuple):
  """What a mixture-of-experts model's layers did in one pass over rows of P + R tokens.

  Attributes:
    stats: [L_sparse, 2, E] router stats over the token positions computed.
    tokens: how many real token positions that is.
    experts: [N, P + R, L_sparse, k] int32, each token's experts (what router
      replay feeds back as the batch's `routed_experts`); from a packed pass, only where it holds a
      `row_index` (else None).
  """

  stats: jax.Array
  tokens: jax.Array
  experts: jax.Array


def _predicting(batch: Experience) -> slice:
  """The positions P - 1 .. P + R - 2 of a row, whose states predict its R response tokens."""
  return slice(batch.input_ids.shape[1] - batch.responses.shape[1] - 1, -1)


def _whole_rows(model: Any, batch: Experience) -> tuple[jax.Array, PassRouting | None]:
  """(final hidden states of every position [N, P + R, D], the pass's PassRouting or None) of a pass over whole
  rows."""
  mask = batch.attention_mask
  trunk, routing = model.hidden_states(batch.input_ids, mask, model_positions(batch.positions), with_routing=True,
                                       experts=batch.routed_experts, images=images_of(batch))
  return trunk, None if routing is None else PassRouting(routing.stats, jnp.sum(mask), routing.experts)


def response_hidden(model: Any, batch: Experience, group_size: int = 1,
                    with_routing: bool = False) -> jax.Array | tuple[jax.Array, PassRouting | None]:
  """[N, R, D] hidden states at the positions that predict each response token.

  With group_size n > 1, rows come in groups of n consecutive rows sharing
  one prompt (verl's layout, checked by `prompts_shared`), and each group's
  prompt runs once (`CausalLM.shared_prompt_hidden`): the same states from
  (P + R) / (P / n + R) times fewer token positions.

  A batch holding `routed_experts` [N, P + R, L_sparse, k] replays that
  routing. With `with_routing`, also the pass's PassRouting (None for a dense
  model).
  """
  prompt_len = batch.input_ids.shape[1] - batch.responses.shape[1]
  mask, replay, images = batch.attention_mask, batch.routed_experts, images_of(batch)
  if group_size == 1:
    trunk, routing = _whole_rows(model, batch)
    hidden = trunk[:, _predicting(batch)]
  else:
    group_first = lambda x: x.reshape(-1, group_size, *x.shape[1:])[:, 0]  # noqa: E731
    first = lambda x: group_first(x)[:, :prompt_len]  # noqa: E731
    last, hidden, routing = model.shared_prompt_hidden(
        first(batch.input_ids), first(mask), model_positions(first(batch.positions)),
        batch.input_ids[:, prompt_len:], mask[:, prompt_len:], model_positions(batch.positions[:, prompt_len:]),
        with_routing=True, prompt_experts=None if replay is None else first(replay),
        response_experts=None if replay is None else replay[:, prompt_len:],
        prompt_images=None if images is None else jax.tree.map(group_first, images))
    hidden = jnp.concatenate([jnp.repeat(last, group_size, axis=0)[:, None], hidden[:, :-1]], axis=1)
    if routing is not None:
      prompts, responses = routing
      experts = jnp.concatenate([jnp.repeat(prompts.experts, group_size, axis=0), responses.experts], axis=1)
      # each prompt stands for its n rows: the stats of running every row's prompt (share_prompt_forward
      # changes no number)
      routing = PassRouting(group_size * prompts.stats + responses.stats,
                            group_size * jnp.sum(first(mask)) + jnp.sum(mask[:, prompt_len:]), experts)
  return (hidden, routing) if with_routing else hidden


def model_positions(positions: jax.Array) -> jax.Array:
  """A batch's positions as the model reads them: [N, T], or M-RoPE's [N, T, 3] as [3, N, T]."""
  return positions if positions.ndim == 2 else jnp.moveaxis(positions, -1, 0)


def prompts_shared(batch: Experience, group_size: int) -> bool:
  """True when every group of `group_size` consecutive rows has one prompt (ids, mask and positions, and a
  vision-language run's images)."""
  prompt_len = batch.input_ids.shape[1] - batch.responses.shape[1]
  if group_size == 1:
    return True
  if batch.input_ids.shape[0] % group_size:
    return False
  prompts = [np.asarray(part)[:, :prompt_len] for part in (batch.input_ids, batch.attention_mask, batch.positions)]
  images = [np.asarray(part) for part in (batch.pixels, batch.merge_restore) if part is not None]
  for part in prompts + images:
    part = part.reshape(-1, group_size, *part.shape[1:])
    if not np.array_equal(part, np.broadcast_to(part[:, :1], part.shape)):
      return False
  return True


def response_log_probs(model: Any, batch: Experience, temperature: float,
                       with_entropy: bool = True, chunk_size: int = 1024,
                       group_size: int = 1, with_routing: bool = False,
                       sum_pi_squared: bool = False, with_trunk: bool = False) -> tuple[Any, ...]:
  """(log-probs [N, R], entropy [N, R][, PassRouting or None][, trunk]) of the response tokens, logits / temperature.

  Never materialises the [N, R, V] logits at once (chunked over tokens).
  group_size, with_routing: see `response_hidden`. A batch holding `packed` tokens runs them
  (`rl.packing`: each row's real tokens only, the same numbers; group_size is then unused).
  sum_pi_squared: Σ_v π_v² in the entropy's place (`token_log_probs`).
  with_trunk: last, the pass's final hidden states of every position (what the multi-token prediction layers
  read, `rljax.rl.mtp`): [N, P + R, D] from padded rows (group_size 1), [D, B * L, D] from packed ones.
  """
  if batch.packed is not None:
    log_probs, entropy, routing, *trunk = packing.packed_log_probs(model, batch.packed, temperature, with_entropy,
                                                                   chunk_size, sum_pi_squared, with_trunk=with_trunk)
    if routing is not None:
      experts = None if batch.packed.row_index is None else packing.routing_to_rows(routing.experts,
                                                                                  batch.packed.row_index)
      routing = PassRouting(routing.stats, jnp.sum(batch.packed.segment_ids > 0), experts)
  else:
    if with_trunk:  # every position's state: a pass over whole rows
      whole, routing = _whole_rows(model, batch)
      hidden, trunk = whole[:, _predicting(batch)], [whole]
    else:
      (hidden, routing), trunk = response_hidden(model, batch, group_size, with_routing=True), []
    log_probs, entropy = token_log_probs(hidden, model.lm_head_weight(), batch.responses, chunk_size=chunk_size,
                                         temperature=temperature, with_entropy=with_entropy,
                                         softcap=model.cfg.final_logit_softcapping, sum_pi_squared=sum_pi_squared)
  return (log_probs, entropy) + ((routing,) if with_routing else ()) + tuple(trunk)


def as_micro_batches(batch: Any, micro_batches: int) -> Any:
  """[M, ...] -> [micro_batches, M / micro_batches, ...] for each array of a pytree (an `Experience`, a dict)."""
  def split(x):
    x = np.asarray(x)
    return x.reshape(micro_batches, x.shape[0] // micro_batches, *x.shape[1:])
  return jax.tree.map(split, batch)


def merge_micro_batches(x: Any) -> np.ndarray:
  """[M, rows, ...] -> [M * rows, ...] on the host."""
  x = np.asarray(x)
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])

