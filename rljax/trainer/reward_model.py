"""`reward_model.enable`: rewards from a sequence-classification model.

As in verl, a model reward replaces the rule reward of the training batch:
each response's score sits on its last response token. Validation keeps the
rule reward manager (verl validates rule-scored data only).

When the reward model reads the actor's token ids (`reward_model.model.
input_tokenizer` unset or equal to the actor's model path), rows are scored
as they are. Otherwise the chat is re-rendered with the reward model's own
tokenizer and chat template: the prompt's messages (`data.return_raw_chat`)
plus the decoded response as the assistant turn, right-padded to
`reward_model.max_length` (default: prompt + response length). A rendered
chat longer than that is an error, never truncated.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from rljax import models
from rljax.models.reward import load_reward_model, token_level_scores
from rljax.trainer.sequences import as_micro_batches, map_micro_batches, merge_micro_batches


def uses_actor_tokens(config: ConfigDict) -> bool:
  """True when the reward model reads the actor's token ids unchanged."""
  tok = config.reward_model.model.input_tokenizer
  return tok is None or tok == config.actor_rollout_ref.model.path


def render_chats(tokenizer: models.Tokenizer, raw_prompts: Sequence[Any], responses: Sequence[str],
                 max_length: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded (ids [N, max_length], mask [N, max_length]) of prompt + response chats.

  Raises ValueError naming the row and `reward_model.max_length` when a chat
  does not fit.
  """
  ids = np.full((len(responses), max_length), tokenizer.pad_token_id or 0, np.int32)
  mask = np.zeros((len(responses), max_length), np.int32)
  for row, (messages, text) in enumerate(zip(raw_prompts, responses)):
    chat = list(messages) + [{"role": "assistant", "content": text}]
    toks = tokenizer.apply_chat_template(chat, tokenize=True)
    if len(toks) > max_length:
      raise ValueError(f"reward model input of row {row} has {len(toks)} tokens > reward_model.max_length="
                       f"{max_length}; raise reward_model.max_length.")
    ids[row, :len(toks)] = toks
    mask[row, :len(toks)] = 1
  return ids, mask


class ModelReward:
  """Scores trainer rows with the reward model; see the module docstring."""

  def __init__(self, config: ConfigDict, actor_tokenizer: models.Tokenizer, mesh: jax.sharding.Mesh,
               rules: Any, dtype: Any, place_rows, micro_batches: int = 1):
    """Loads reward_model.model.path.

    Args:
      config: the full config.
      actor_tokenizer: decodes responses when the reward model re-renders chats.
      mesh, rules: where the reward model's parameters live.
      dtype: its parameter and compute dtype.
      place_rows: (dict of [M, rows, ...] host arrays, micro=True) -> device arrays.
      micro_batches: M, forward passes per scoring call.
    """
    rm = config.reward_model
    model = load_reward_model(rm.model.path, dtype=dtype, mesh=mesh, rules=rules)
    self.graphdef, self.params = nnx.split(model)
    self.actor_tokenizer = actor_tokenizer
    self.same_tokens = uses_actor_tokens(config)
    self.tokenizer = None if self.same_tokens else models.load_tokenizer(rm.model.input_tokenizer)
    self.max_length = rm.max_length or (config.data.max_prompt_length
                                        + config.actor_rollout_ref.rollout.response_length)
    self.place_rows = place_rows
    self.micro_batches = micro_batches
    self._scores = map_micro_batches(lambda params, b: nnx.merge(self.graphdef, params).sequence_scores(
        b["ids"], b["mask"], b["pos"]))

  def _inputs(self, rows: dict[str, np.ndarray], raw_prompts: Sequence[Any] | None) -> tuple[np.ndarray, ...]:
    if self.same_tokens:
      return rows["input_ids"], rows["attention_mask"], rows["positions"]
    texts = [self.actor_tokenizer.decode(r[m > 0], skip_special_tokens=True)
             for r, m in zip(rows["responses"], rows["response_mask"])]
    ids, mask = render_chats(self.tokenizer, raw_prompts, texts, self.max_length)
    return ids, mask, np.asarray(models.positions_from_mask(mask))

  def __call__(self, rows: dict[str, np.ndarray], raw_prompts: Sequence[Any] | None = None) -> np.ndarray:
    """[N, R] token-level scores for the rows (raw prompts needed only to re-render)."""
    ids, mask, pos = self._inputs(rows, raw_prompts)
    placed = self.place_rows(as_micro_batches({"ids": ids, "mask": mask, "pos": pos}, self.micro_batches), micro=True)
    scores = merge_micro_batches(self._scores(self.params, placed))
    return token_level_scores(scores, rows["response_mask"])
