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
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from ml_collections import ConfigDict

from rljax import models
from rljax.models.reward import token_level_scores
from rljax.rl.experience import Experience
from rljax.rl.layout import Layout
from rljax.rl.sequences import as_micro_batches, merge_micro_batches
from rljax.rl.steps import make_forward
from rljax.sharding import hosts, rules as rules_lib
from rljax.sharding.placement import Step

SCORED_FIELDS = ("input_ids", "attention_mask", "positions")


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


def input_length(config: ConfigDict) -> int:
  """Tokens of a reward-model row: the trainer's rows (P + R) when it reads the actor's ids, else
  reward_model.max_length (default P + R)."""
  rows = config.data.max_prompt_length + config.actor_rollout_ref.rollout.response_length
  return rows if uses_actor_tokens(config) else (config.reward_model.max_length or rows)


def scoring_step(config: ConfigDict, graphdef: nnx.GraphDef, params: Any, layout: Layout, mesh: jax.sharding.Mesh,
                 rules: Any) -> Step:
  """The jitted reward-model pass: [M, rows, L] input_ids, attention_mask, positions -> [M, rows] scores.

  M is the pass's micro-batch count (`layout.forward_micros["reward_model"]`), rows a step's rows, L
  `input_length`.
  """
  micro = layout.forward_micros["reward_model"]
  shape = (micro, layout.rows // micro, input_length(config))
  spec = rules_lib.logical_to_spec((None, "batch", None), shape, mesh, rules)
  batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=NamedSharding(mesh, spec)) for k in SCORED_FIELDS}
  score = lambda params, rows: nnx.merge(graphdef, params).sequence_scores(*(rows[k] for k in SCORED_FIELDS))  # noqa: E731
  return make_forward("reward_model", score, mesh, rules, params, batch)


class ModelReward:
  """Scores trainer rows with the reward model; see the module docstring."""

  def __init__(self, config: ConfigDict, actor_tokenizer: models.Tokenizer, params: Any, step: Step):
    """Args:
      config: the full config.
      actor_tokenizer: decodes responses when the reward model re-renders chats.
      params: the reward model's parameters; step: its `scoring_step`.
    """
    rm = config.reward_model
    self.params, self.step = params, step
    self.actor_tokenizer = actor_tokenizer
    self.same_tokens = uses_actor_tokens(config)
    self.tokenizer = None if self.same_tokens else models.load_tokenizer(rm.model.input_tokenizer)
    self.max_length = input_length(config)

  def _inputs(self, rows: Experience, raw_prompts: Sequence[Any] | None) -> tuple[np.ndarray, ...]:
    if self.same_tokens:
      return rows.input_ids, rows.attention_mask, rows.positions
    texts = [self.actor_tokenizer.decode(r[m > 0], skip_special_tokens=True)
             for r, m in zip(rows.responses, rows.response_mask)]
    ids, mask = render_chats(self.tokenizer, raw_prompts, texts, self.max_length)
    return ids, mask, np.asarray(models.positions_from_mask(mask))

  def __call__(self, rows: Experience, raw_prompts: Sequence[Any] | None = None) -> np.ndarray:
    """[N, R] token-level scores for any number N of rows (raw prompts needed only to re-render).

    The rows go through the compiled pass in pieces of its shape (a step's rows, this host's share), the
    last one padded with copies of its final row: remax's greedy baselines and dynamic sampling's
    generation batches score other row counts than a step has.
    """
    spec = self.step.args[1]
    inputs = dict(zip(SCORED_FIELDS, self._inputs(rows, raw_prompts)))
    piece = spec["input_ids"].shape[0] * spec["input_ids"].shape[1] // hosts.count()
    total = len(inputs["input_ids"])
    scores = np.concatenate([self._score(_padded_piece(inputs, start, piece), spec)[:total - start]
                             for start in range(0, total, piece)])
    return token_level_scores(scores, rows.response_mask)

  def _score(self, inputs: dict[str, np.ndarray], spec: dict[str, jax.ShapeDtypeStruct]) -> np.ndarray:
    """[piece] scores of one piece of this host's rows."""
    batches = as_micro_batches(inputs, spec["input_ids"].shape[0])
    placed = {k: jax.make_array_from_process_local_data(s.sharding, batches[k], s.shape) for k, s in spec.items()}
    return merge_micro_batches(hosts.process_rows(self.step(self.params, placed), axis=1))


def _padded_piece(inputs: dict[str, np.ndarray], start: int, size: int) -> dict[str, np.ndarray]:
  """Rows [start, start + size) of each [N, L] array, padded with copies of the last row to `size` rows."""
  def piece(x):
    x = x[start:start + size]
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])
  return {k: piece(np.asarray(x)) for k, x in inputs.items()}
