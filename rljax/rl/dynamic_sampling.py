"""DAPO's dynamic sampling (`algorithm.filter_groups`), as verl's DAPO recipe does it.

Each generation round samples `rollout.n` responses for `data.gen_batch_size`
prompts and scores them. A prompt's group is kept when its filter metric
varies across its responses (or it has a single response); groups that are
all right or all wrong carry no GRPO signal and are dropped. Rounds repeat
until `data.train_batch_size` groups are kept, and the kept rows are cut to
exactly that many groups (the first ones, in generation order). A step that
would need more than `filter_groups.max_num_gen_batches` rounds (when > 0)
stops with verl's error. Under colocate_async the stream judges each group as
it finishes instead (`rljax.rl.streaming`).

The functions here are pure NumPy over a round's rows (an `Experience` of
N = prompts x n rows, `group` [N] the prompt of each row), except
`join_rounds`, which every host of a multi-process job calls with its own
rounds: the hosts agree on the kept groups in the order one process would
generate them (round by round, each round's prompts host by host), and each
ends with its share of the first data.train_batch_size of them, moved
between hosts on device.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from rljax.rl.experience import Experience, concatenate
from rljax.sharding import hosts

SEQUENCE_METRICS = ("seq_reward", "seq_final_reward", "reward")  # reward: verl 0.9's name of seq_reward


def metric_values(rows: Experience, metric: str) -> np.ndarray:
  """[N] the filter metric of each row.

  seq_reward, seq_final_reward and reward (verl 0.9's canonical pre-KL reward) are the row's summed token scores (the
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


def kept_order(keeps: np.ndarray) -> np.ndarray:
  """[K] the row numbers of the kept rows in generation order.

  Args:
    keeps: [P, G, M] bool, whether host p's round g's row i is kept; row numbers count each host's rounds one
      after another (p * G * M + g * M + i).

  Returns:
    The kept rows round by round and, within a round, host by host (the order of one process's rows).
  """
  hosts_, rounds, size = keeps.shape
  numbers = np.arange(hosts_ * rounds * size).reshape(hosts_, rounds, size)
  return numbers.transpose(1, 0, 2)[keeps.transpose(1, 0, 2)]


def _rows_at(rows: Experience, index: Any) -> tuple[Experience, tuple]:
  """(rows `index` of every field, nothing else): a `hosts.global_rows` function."""
  return jax.tree.map(lambda x: x[index], rows), ()


def join_rounds(rounds: Sequence[Experience], keeps: Sequence[np.ndarray], groups_wanted: int,
                group_size: int) -> Experience:
  """This host's share of the first `groups_wanted` kept groups of every host's rounds.

  Args:
    rounds: this host's rows of each round (whole groups, the same count on every host).
    keeps: [M] bool per round, which of its rows are kept.
    groups_wanted: data.train_batch_size.
    group_size: rollout.n.

  Returns:
    groups_wanted / hosts groups (block p of the kept groups in generation order on host p), `group`
    renumbered 0, 1, ... in order; the fields every round has (a reward-function component that some round
    did not return is left out; the hosts agree on each round's, `rl.scoring.reward_components`).
  """
  rows = concatenate(list(rounds))
  keeps = hosts.process_concat(np.concatenate(keeps)).reshape(hosts.count(), len(rounds), -1)
  joined, _ = hosts.global_rows(_rows_at, rows, kept_order(keeps)[:groups_wanted * group_size])
  return joined.replace(group=np.repeat(np.arange(len(joined.group) // group_size, dtype=np.int32), group_size))


def too_many_rounds(rounds: int, limit: int) -> str:
  """verl's error when a step used `rounds` generation rounds and the limit is reached."""
  return (f"num_gen_batches={rounds} >= max_num_gen_batches={limit}. Generated too many. Please check if your "
          "data are too difficult. You could also try set algorithm.filter_groups.max_num_gen_batches=0 to "
          "enable endless trials.")


def too_many_prompts(judged: int, limit: int) -> str:
  """colocate_async's form of `too_many_rounds`: one update judged `judged` prompts of this host, past `limit`
  (max_num_gen_batches rounds of this host's data.gen_batch_size prompts)."""
  return (f"dynamic sampling judged {judged} prompts for one update, more than max_num_gen_batches x "
          f"data.gen_batch_size = {limit} on this host. Generated too many. Please check if your data are too "
          "difficult. You could also try set algorithm.filter_groups.max_num_gen_batches=0 to enable endless "
          "trials.")
