"""DAPO's dynamic sampling (`algorithm.filter_groups`), as verl's DAPO recipe does it.

Each generation round samples `rollout.n` responses for `data.gen_batch_size`
prompts and scores them. A prompt's group is kept when its filter metric
varies across its responses (or it has a single response); groups that are
all right or all wrong carry no GRPO signal and are dropped. Rounds repeat
until `data.train_batch_size` groups are kept, and the kept rows are cut to
exactly that many groups (the first ones, in generation order). A step that
would need more than `filter_groups.max_num_gen_batches` rounds (when > 0)
stops with verl's error.

The functions here are pure NumPy over a round's rows (an `Experience` of
N = prompts x n rows, `group` [N] the prompt of each row).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rljax.rl.experience import Experience, concatenate

SEQUENCE_METRICS = ("seq_reward", "seq_final_reward")


def metric_values(rows: Experience, metric: str) -> np.ndarray:
  """[N] the filter metric of each row.

  seq_reward and seq_final_reward are the row's summed token scores (the
  final reward equals the score here: KL in the reward is applied after
  filtering, and validation rejects it with seq_final_reward); any other
  name is a numeric entry of the reward function's extra info (`acc`,
  `score`, ...).

  Raises:
    ValueError: `metric` is neither, naming what the reward function gave.
  """
  if metric in SEQUENCE_METRICS:
    return np.asarray(rows.token_level_scores, np.float64).sum(-1)
  components = rows.reward_components or {}
  if metric not in components:
    given = sorted(components)
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r}: the reward function returned no per-response {metric!r} "
        f"(its numeric extra info: {given or 'none'}). Fix: set algorithm.filter_groups.metric to one of "
        f"{list(SEQUENCE_METRICS) + given}, or return {{'score': ..., {metric!r}: ...}} from the reward function "
        "(reward_model.reward_manager=dapo adds 'acc' for a plain score).")
  return np.asarray(components[metric], np.float64)


def kept_rows(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
  """[N] bool: rows of groups whose `values` have a non-zero standard deviation, or that hold one row.

  Args:
    values: [N] the filter metric per row.
    groups: [N] int, the prompt (group) of each row.
  """
  ids, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
  sums = np.bincount(inverse, values, len(ids))
  means = sums / counts
  spread = np.bincount(inverse, (values - means[inverse]) ** 2, len(ids))
  keep = (spread > 0) | (counts == 1)
  return keep[inverse]


def join_rounds(rounds: Sequence[Experience], groups_wanted: int, group_size: int) -> Experience:
  """The kept rows of several rounds as one batch of `groups_wanted` groups of `group_size` rows.

  Args:
    rounds: each round's kept rows (whole groups, in generation order).
    groups_wanted: data.train_batch_size.
    group_size: rollout.n.

  Returns:
    The rows of the first `groups_wanted` groups, `group` renumbered 0..groups_wanted - 1 in order; the
    fields every round has (a reward-function component that only some rounds returned is left out).
  """
  rows = concatenate(list(rounds)).take(slice(0, groups_wanted * group_size))
  return rows.replace(group=np.repeat(np.arange(groups_wanted, dtype=np.int32), group_size))


def too_many_rounds(rounds: int, limit: int) -> str:
  """verl's error when a step used `rounds` generation rounds and the limit is reached."""
  return (f"num_gen_batches={rounds} >= max_num_gen_batches={limit}. Generated too many. Please check if your "
          "data are too difficult. You could also try set algorithm.filter_groups.max_num_gen_batches=0 to "
          "enable endless trials.")
