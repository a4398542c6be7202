"""Prompt + response rows as the actor, reference and critic read them.

Prompts arrive left-padded to P = data.max_prompt_length, responses
right-padded to R = rollout.response_length, so every row is [P + R] and one
compilation serves every step. The hidden state at position P - 1 + t
predicts response token t.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models import positions_from_mask, token_log_probs


def make_sequences(prompt_ids: np.ndarray, prompt_mask: np.ndarray, responses: np.ndarray,
                   response_mask: np.ndarray) -> dict[str, np.ndarray]:
  """Rows for the model.

  Args:
    prompt_ids, prompt_mask: [N, P] left-padded prompts (already repeated n times).
    responses, response_mask: [N, R] right-padded responses.

  Returns:
    input_ids, attention_mask, positions [N, P + R]; responses, response_mask [N, R].
  """
  input_ids = np.concatenate([prompt_ids, responses], axis=1).astype(np.int32)
  attention_mask = np.concatenate([prompt_mask, response_mask], axis=1).astype(np.int32)
  return {"input_ids": input_ids, "attention_mask": attention_mask,
          "positions": np.asarray(positions_from_mask(attention_mask)),
          "responses": responses.astype(np.int32), "response_mask": response_mask.astype(np.int32)}


def response_hidden(model: Any, batch: dict[str, jax.Array], group_size: int = 1) -> jax.Array:
  """[N, R, D] hidden states at the positions that predict each response token.

  With group_size n > 1, rows come in groups of n consecutive rows sharing
  one prompt (verl's layout, checked by `prompts_shared`), and each group's
  prompt runs once (`CausalLM.shared_prompt_hidden`): the same states from
  (P + R) / (P / n + R) times fewer token positions.
  """
  prompt_len = batch["input_ids"].shape[1] - batch["responses"].shape[1]
  if group_size == 1:
    hidden = model.hidden_states(batch["input_ids"], batch["attention_mask"], batch["positions"])
    return hidden[:, prompt_len - 1:-1]
  first = lambda x: x.reshape(-1, group_size, *x.shape[1:])[:, 0, :prompt_len]
  last, hidden = model.shared_prompt_hidden(
      first(batch["input_ids"]), first(batch["attention_mask"]), first(batch["positions"]),
      batch["input_ids"][:, prompt_len:], batch["attention_mask"][:, prompt_len:],
      batch["positions"][:, prompt_len:])
  return jnp.concatenate([jnp.repeat(last, group_size, axis=0)[:, None], hidden[:, :-1]], axis=1)


def prompts_shared(batch: dict[str, np.ndarray], group_size: int) -> bool:
  """True when every group of `group_size` consecutive rows has one prompt (ids, mask and positions)."""
  prompt_len = batch["input_ids"].shape[1] - batch["responses"].shape[1]
  if group_size == 1:
    return True
  if batch["input_ids"].shape[0] % group_size:
    return False
  for key in ("input_ids", "attention_mask", "positions"):
    part = np.asarray(batch[key])[:, :prompt_len]
    part = part.reshape(-1, group_size, prompt_len)
    if not np.array_equal(part, np.broadcast_to(part[:, :1], part.shape)):
      return False
  return True


def response_log_probs(model: Any, batch: dict[str, jax.Array], temperature: float,
                       with_entropy: bool = True, chunk_size: int = 1024,
                       group_size: int = 1) -> tuple[jax.Array, jax.Array]:
  """(log-probs [N, R], entropy [N, R]) of the response tokens, logits / temperature.

  Never materialises the [N, R, V] logits at once (chunked over tokens).
  group_size: see `response_hidden`.
  """
  hidden = response_hidden(model, batch, group_size)
  return token_log_probs(hidden, model.lm_head_weight(), batch["responses"], chunk_size=chunk_size,
                         temperature=temperature, with_entropy=with_entropy,
                         softcap=model.cfg.final_logit_softcapping)


def as_micro_batches(batch: dict[str, np.ndarray], micro_batches: int) -> dict[str, np.ndarray]:
  """[M, ...] -> [micro_batches, M / micro_batches, ...] for each array."""
  def split(x):
    x = np.asarray(x)
    return x.reshape(micro_batches, x.shape[0] // micro_batches, *x.shape[1:])
  return {k: split(v) for k, v in batch.items()}


def map_micro_batches(fn: Callable) -> Callable:
  """jit: (params, batch of [M, rows, ...] arrays) -> fn(params, micro) for each of the M micro-batches.

  Outputs are stacked [M, rows, ...]; `lax.map` keeps one micro-batch's
  activations live at a time.
  """
  return jax.jit(lambda params, batch: jax.lax.map(lambda micro: fn(params, micro), batch))


def merge_micro_batches(x: Any) -> np.ndarray:
  """[M, rows, ...] -> [M * rows, ...] on the host."""
  x = np.asarray(x)
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])

