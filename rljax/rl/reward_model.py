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

With `reward_model.model.use_remove_padding` the pass is packed (`rl.packing`):
each row's real tokens in buffers of L tokens, its score read at its last
token, the same scores for the real tokens' cost.
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
from rljax.rl import experience as experience_lib, packing
from rljax.rl.experience import Experience
from rljax.rl.layout import Layout, token_budgets
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


def packs(config: ConfigDict) -> bool:
  """Whether the reward-model pass is packed: reward_model.model.use_remove_padding."""
  return bool(config.reward_model.model.use_remove_padding)


def packed_scores(model: Any, packed: packing.PackedRows) -> jax.Array:
  """[D * r] the score of each row slot of a packed micro-batch ([D, B, L] tokens, `row_index` [D, r, L]) at its
  last real token (the last of its places in the buffers: a row's tokens lie in order)."""
  hidden = packing.packed_hidden(model.backbone, packed).astype(jnp.float32)
  last = jnp.maximum(jnp.max(packed.row_index, axis=-1), 0)
  h_last = jnp.take_along_axis(hidden, last[..., None], axis=1)
  return (h_last @ model.score[...].astype(jnp.float32)).reshape(-1)


def scoring_step(config: ConfigDict, graphdef: nnx.GraphDef, params: Any, layout: Layout, mesh: jax.sharding.Mesh,
                 rules: Any) -> Step:
  """The jitted reward-model pass: [M, rows, L] input_ids, attention_mask, positions -> [M, rows] scores, or
  packed (`packs`) a PackedRows of [M, D, B, L] tokens -> [M, rows] scores.

  M is the pass's micro-batch count (`layout.forward_micros["reward_model"]`), rows a step's row slots
  (`layout.row_slots`), L `input_length`.
  """
  micro = layout.forward_micros["reward_model"]
  if packs(config):
    batch = packing.spec(micro, layout.row_slots, input_length(config), 0, mesh, rules, recorded=True)
    score = lambda params, packed: packed_scores(nnx.merge(graphdef, params), packed)  # noqa: E731
    return make_forward("reward_model", score, mesh, rules, params, batch)
  shape = (micro, layout.row_slots // micro, input_length(config))
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
    self.budget = token_budgets(config)["reward_model"]
    self.rules = rules_lib.rules_from_config(config)
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
    piece = self.step_rows() // hosts.count()
    total = len(inputs["input_ids"])
    score = self._score if isinstance(spec, dict) else self._score_packed
    scores = np.concatenate([score(_padded_piece(inputs, start, piece), spec)[:total - start]
                             for start in range(0, total, piece)])
    return token_level_scores(scores, rows.response_mask)

  def step_rows(self) -> int:
    """The rows of one call of the pass (every host's)."""
    spec = self.step.args[1]
    if isinstance(spec, dict):
      return spec["input_ids"].shape[0] * spec["input_ids"].shape[1]
    return spec.input_ids.shape[0] * spec.input_ids.shape[1] * spec.input_ids.shape[2]

  def _score(self, inputs: dict[str, np.ndarray], spec: dict[str, jax.ShapeDtypeStruct]) -> np.ndarray:
    """[piece] scores of one piece of this host's rows."""
    batches = as_micro_batches(inputs, spec["input_ids"].shape[0])
    placed = {k: jax.make_array_from_process_local_data(s.sharding, batches[k], s.shape) for k, s in spec.items()}
    return merge_micro_batches(hosts.process_rows(self.step(self.params, placed), axis=1))

  def _score_packed(self, inputs: dict[str, np.ndarray], spec: packing.PackedRows) -> np.ndarray:
    """[piece] scores of one piece of this host's rows, packed (every host's rows' spans exchanged, [N, 2])."""
    local, width = inputs["input_ids"].shape
    rows, shards = local * hosts.count(), spec.input_ids.shape[1]
    spans = hosts.process_concat(np.stack(packing.row_spans(inputs["attention_mask"]), axis=1))
    tokens = experience_lib.spec(packing.TOKEN_FIELDS, 1, rows, width, 0, spec.input_ids.sharding.mesh, self.rules)
    placed = experience_lib.place(Experience(input_ids=inputs["input_ids"], positions=inputs["positions"]), tokens)
    arrangement = packing.pass_arrangement(spans[:, 1] - spans[:, 0], local, spec, self.budget)
    plan = packing.make_plan(spans[:, 0], spans[:, 1], arrangement, shards, width, 0, packing.local_shards(spec),
                             self.budget)
    return packing.process_rows(self.step(self.params, packing.pack(placed.input_ids, placed.positions, plan, spec)),
                                arrangement, local)


def _padded_piece(inputs: dict[str, np.ndarray], start: int, size: int) -> dict[str, np.ndarray]:
  """Rows [start, start + size) of each [N, L] array, padded with copies of the last row to `size` rows."""
  def piece(x):
    x = x[start:start + size]
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])
  return {k: piece(np.asarray(x)) for k, x in inputs.items()}
