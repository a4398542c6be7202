"""Model-based reward: a decoder backbone with a scalar score head.

A Hugging Face reward model (`LlamaForSequenceClassification`,
`Qwen2ForSequenceClassification`, ... with `num_labels = 1`) stores the
backbone under the causal LM's names and a head `score.weight [1, D]`. Its
reward for a sequence is the head applied to the hidden state of the last
real token:

    r = h[last] . w_score          h: [T, D] final-norm hidden states

`load_reward_model` reads such a directory; the LM head, if present, is not
needed and not loaded.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rljax.models import checkpoint
from rljax.models import config as config_lib
from rljax.models.api import resolve_path
from rljax.models.transformer import CausalLM

SCORE_TENSOR = "score.weight"


class RewardModel(nnx.Module):
  """A CausalLM backbone and a score vector [D]."""

  def __init__(self, backbone: CausalLM, score: jax.Array):
    self.backbone = backbone
    self.score = nnx.Param(score, out_sharding=("embed",), eager_sharding=False)

  def sequence_scores(self, input_ids: jax.Array, attention_mask: jax.Array,
                      positions: jax.Array) -> jax.Array:
    """[N] score of each row at its last real token.

    Args:
      input_ids: [N, T] token ids (left-padded prompt then right-padded
        response, as the trainer lays rows out).
      attention_mask: [N, T] 1 for real tokens.
      positions: [N, T] position ids.
    """
    hidden = self.backbone.hidden_states(input_ids, attention_mask, positions).astype(jnp.float32)
    last = last_token_index(attention_mask)
    h_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    return h_last @ self.score[...].astype(jnp.float32)


def last_token_index(attention_mask: jax.Array) -> jax.Array:
  """[N] index of the last 1 in each row of a [N, T] mask (0 for an empty row)."""
  t = attention_mask.shape[1]
  slots = jnp.arange(t, dtype=jnp.int32)
  return jnp.max(jnp.where(attention_mask > 0, slots, 0), axis=1)


def _score_vector(src: checkpoint.TensorSource, hidden_size: int) -> np.ndarray:
  """The [D] score head from `score.weight` [1, D]; a clear error otherwise."""
  if SCORE_TENSOR not in src.names():
    raise ValueError(
        f"{src.origin}: no {SCORE_TENSOR!r} tensor, so this is not a sequence-classification reward model "
        "(reward_model.model.path must be an HF *ForSequenceClassification directory with num_labels=1).")
  weight = np.asarray(src.tensor(SCORE_TENSOR), np.float32)
  if weight.shape != (1, hidden_size):
    raise ValueError(
        f"{src.origin}: {SCORE_TENSOR!r} has shape {weight.shape}; a reward model needs (1, {hidden_size}) "
        "(num_labels=1).")
  return weight[0]


def load_reward_model(path: str, dtype: Any = jnp.float32, mesh: Mesh | None = None,
                      rules: checkpoint.Rules | None = None) -> RewardModel:
  """Loads an HF sequence-classification reward model directory.

  Args:
    path: directory with config.json and safetensors holding the backbone
      and `score.weight` [1, D].
    dtype: compute and parameter dtype.
    mesh, rules: place the backbone on this mesh like the actor.
  """
  path = resolve_path(path)
  hf_config = dict(checkpoint.hf_config_from_dir(path))
  src = checkpoint.safetensors_source(path)
  backbone_names = {n: src.tensor(n) for n in src.names() if n not in (SCORE_TENSOR, "lm_head.weight")}
  hf_config["tie_word_embeddings"] = True
  backbone = checkpoint.make_model(hf_config, checkpoint.TensorSource(backbone_names, src.origin),
                                   dtype=dtype, mesh=mesh, rules=rules)
  score = _score_vector(src, backbone.cfg.hidden_size)
  return RewardModel(backbone, jnp.asarray(score, dtype))


def reward_model_from_hf(hf_config: Any, dtype: Any = jnp.float32) -> RewardModel:
  """A freshly initialised reward model of an HF config.json dict (its shapes; `nnx.eval_shape` it for abstract
  parameters)."""
  cfg = config_lib.from_hf_dict({**hf_config, "tie_word_embeddings": True}, dtype=dtype, param_dtype=dtype)
  return RewardModel(CausalLM(cfg, nnx.Rngs(0)), jnp.zeros((cfg.hidden_size,), dtype))


def token_level_scores(scores: np.ndarray, response_mask: np.ndarray) -> np.ndarray:
  """[N, R] reward tensor with each score on its row's last response token.

  Args:
    scores: [N] sequence scores.
    response_mask: [N, R] 1 for real response tokens.
  """
  mask = np.asarray(response_mask)
  out = np.zeros(mask.shape, np.float32)
  lengths = mask.sum(axis=1).astype(np.int64)
  rows = np.nonzero(lengths > 0)[0]
  out[rows, lengths[rows] - 1] = np.asarray(scores, np.float32)[rows]
  return out
