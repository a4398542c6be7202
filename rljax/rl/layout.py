"""Batch-size arithmetic of an RL run: rows, mini-batches, micro-batches, shared-prompt groups.

Everything here is a pure function of the config and the number of
data-parallel devices (`data` x `fsdp` x `expert`), so the trainer and
`rljax.compile` derive the same shapes.

Rows need not divide the data-parallel devices: a pass over `rows` rows runs
over `slots_of(rows, D)` row slots (every device the same number), the slots
no row fills empty (no token, no mask), and every aggregation counts the real
rows (verl's global batch size is the real mini-batch). Megatron's pipeline
stages, which rljax lays out as data-parallel devices, are where that meets
verl's lines.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from ml_collections import ConfigDict

from rljax.sharding.mesh import device_tokens

FORWARD_PASSES = ("old_log_prob", "ref", "values", "reward_model")


@dataclasses.dataclass(frozen=True)
class Layout:
  """Batch geometry derived from the config.

  Attributes:
    n: responses per prompt.
    rows: rows per step (train_batch_size * n).
    mini_rows: rows per mini-batch.
    micro_batches: micro-batches per mini-batch.
    total_steps: training steps of the run.
    prompt_length: P, tokens of a left-padded prompt.
    response_length: R, tokens of a right-padded response.
    forward_micros: micro-batches of each forward pass over a step's rows (FORWARD_PASSES).
    group: rows per shared prompt in the trainer's passes (1: no sharing).
    token_budgets: real tokens per data-parallel shard of one micro-batch of each pass under verl's
      use_dynamic_bsz (`TOKEN_BUDGET_PASSES`; None: its micro-batches count rows), which a packed pass
      forms its micro-batches by (`rl.packing.budget_arrangement`).
    data_parallel: D, the devices that split a batch's rows.
  """

  n: int
  rows: int
  mini_rows: int
  micro_batches: int
  total_steps: int
  prompt_length: int
  response_length: int
  forward_micros: dict[str, int]
  group: int
  token_budgets: dict[str, int | None] = dataclasses.field(default_factory=dict)
  data_parallel: int = 1

  @property
  def minis(self) -> int:
    return self.rows // self.mini_rows

  @property
  def mini_slots(self) -> int:
    """Row slots of an update's mini-batch: mini_rows rounded up to a multiple of D."""
    return slots_of(self.mini_rows, self.data_parallel)

  @property
  def row_slots(self) -> int:
    """Row slots of a forward pass over the step's rows: rows rounded up to a multiple of D."""
    return slots_of(self.rows, self.data_parallel)

  @property
  def row_tokens(self) -> int:
    return self.prompt_length + self.response_length

  def budget_of(self, step_name: str) -> int | None:
    """The token budget of the Step named `step_name` (its pass's; ref_log_prob is the "ref" pass)."""
    return self.token_budgets.get({"ref_log_prob": "ref"}.get(step_name, step_name))

  def forward_group(self, phase: str) -> int:
    """Rows per shared prompt in the forward pass `phase` (1 where it has empty slots)."""
    return pass_group_size(self.group, self.rows, self.forward_micros[phase], self.row_slots)

  def update_group(self, shuffled: bool) -> int:
    """Rows per shared prompt in an update: 1 when mini-batches are shuffled (groups split) or have empty
    slots."""
    return 1 if shuffled else pass_group_size(self.group, self.mini_rows, self.micro_batches, self.mini_slots)


def slots_of(rows: int, data_parallel: int) -> int:
  """`rows` rounded up to a multiple of `data_parallel`: the row slots a pass over them runs."""
  return -(-rows // data_parallel) * data_parallel


def spread(rows: np.ndarray, micro_batches: int, slots: int) -> np.ndarray:
  """[M, slots] the rows `rows` ([n] row numbers, n <= M * slots) in M micro-batches of `slots` slots each:
  micro-batch m takes the next ceil or floor of n / M rows in order (the first n % M one more), then -1 in its
  empty slots. With n = M * slots it is `rows.reshape(M, slots)`."""
  rows = np.asarray(rows)
  per, extra = divmod(len(rows), micro_batches)
  out = np.full((micro_batches, slots), -1, rows.dtype)
  start = 0
  for m in range(micro_batches):
    count = per + (m < extra)
    out[m, :count] = rows[start:start + count]
    start += count
  return out


def largest_divisor(n: int, cap: int) -> int:
  """The largest divisor of n that is at most cap (at least 1)."""
  return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(1, cap))


def micro_batch_count(config: ConfigDict, mini_rows: int, data_parallel: int, row_tokens: int) -> int:
  """Micro-batches per mini-batch from the per-device micro size or token budget, each a cap: a device's
  micro-batch holds the most rows that divide its mini-batch evenly within it (verl runs a micro size above a
  device's rows as one micro-batch, and one that does not divide them as a shorter last one; the loss is
  normalized over the mini-batch either way, so only the peak memory differs). A device's rows are its share
  of the mini-batch's slots (`slots_of`).

  With use_dynamic_bsz, rows are padded to P + R tokens (static shapes), a
  device holding `row_tokens` of each (P + R over the sequence axis), so
  the per-device budget `ppo_max_token_len_per_gpu` buys
  budget // row_tokens rows per data-parallel group.
  """
  actor = config.actor_rollout_ref.actor
  per_device = slots_of(mini_rows, data_parallel) // data_parallel
  cap = actor.ppo_max_token_len_per_gpu // row_tokens if actor.use_dynamic_bsz else actor.ppo_micro_batch_size_per_gpu
  return per_device // largest_divisor(per_device, cap)


def forward_micro_batches(rows: int, data_parallel: int, row_tokens: int, micro_per_device: int | None,
                          use_dynamic_bsz: bool, max_token_len: int | None) -> int:
  """Micro-batches a forward pass (old/ref log-probs, values, rewards) over `rows` takes.

  Each device holds at most `micro_per_device` rows at once (None: all its
  rows), or with use_dynamic_bsz `max_token_len // row_tokens` rows; the
  count is rounded so the micro-batches are equal (results do not depend on
  it, only peak memory does). A device's rows are its share of the slots.
  """
  per_device = slots_of(rows, data_parallel) // data_parallel
  cap = (max_token_len // row_tokens) if use_dynamic_bsz and max_token_len else (micro_per_device or per_device)
  return per_device // largest_divisor(per_device, cap)


def _forward_micros(config: ConfigDict, rows: int, data_parallel: int, row_tokens: int) -> dict[str, int]:
  """Micro-batch counts of the forward passes, from their verl keys."""
  arr, critic, rm = config.actor_rollout_ref, config.critic, config.reward_model

  def fwd(micro, dynamic, budget):
    return forward_micro_batches(rows, data_parallel, row_tokens, micro, dynamic, budget)

  return {
      "old_log_prob": fwd(arr.rollout.log_prob_micro_batch_size_per_gpu, arr.rollout.log_prob_use_dynamic_bsz,
                          arr.rollout.log_prob_max_token_len_per_gpu),
      "ref": fwd(arr.ref.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_use_dynamic_bsz,
                 arr.ref.log_prob_max_token_len_per_gpu),
      "values": fwd(critic.forward_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
                    critic.forward_max_token_len_per_gpu),
      "reward_model": fwd(rm.micro_batch_size_per_gpu, rm.use_dynamic_bsz, rm.forward_max_token_len_per_gpu),
  }


TOKEN_BUDGET_PASSES = ("actor_update", "critic_update") + FORWARD_PASSES


def token_budgets(config: ConfigDict) -> dict[str, int | None]:
  """Each pass's use_dynamic_bsz budget per data-parallel shard: verl's per-GPU key times the Ulysses size (the
  shard's devices split its tokens), or None without use_dynamic_bsz."""
  arr, critic, rm = config.actor_rollout_ref, config.critic, config.reward_model
  actor_sp = arr.actor.ulysses_sequence_parallel_size
  critic_sp = critic.get("ulysses_sequence_parallel_size", 1) or 1

  def budget(dynamic: bool, per_gpu: int | None, sp: int) -> int | None:
    return int(per_gpu) * sp if dynamic and per_gpu else None

  return {
      "actor_update": budget(arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu, actor_sp),
      "critic_update": budget(critic.use_dynamic_bsz, critic.ppo_max_token_len_per_gpu, critic_sp),
      "old_log_prob": budget(arr.rollout.log_prob_use_dynamic_bsz, arr.rollout.log_prob_max_token_len_per_gpu,
                             actor_sp),
      "ref": budget(arr.ref.log_prob_use_dynamic_bsz, arr.ref.log_prob_max_token_len_per_gpu, actor_sp),
      "values": budget(critic.use_dynamic_bsz, critic.forward_max_token_len_per_gpu, critic_sp),
      "reward_model": budget(rm.use_dynamic_bsz, rm.forward_max_token_len_per_gpu, 1),
  }


def prompt_group_size(config: ConfigDict, n: int, rows: int, data_parallel: int) -> int:
  """Rows per shared prompt in the trainer's forward and update passes (1: no sharing).

  Rollout rows come in verl's groups (row p * n + j answers prompt p), and
  stay grouped unless balance_batch has to split groups to give every
  data-parallel device equal rows.
  """
  if not config.actor_rollout_ref.model.share_prompt_forward or n == 1:
    return 1
  if config.trainer.balance_batch and data_parallel > 1 and (rows // n) % data_parallel:
    return 1
  return n


def pass_group_size(group: int, rows: int, micro_batches: int, slots: int) -> int:
  """`group` when every micro-batch of rows // micro_batches rows holds whole groups and no slot is empty
  (`slots` == `rows`), else 1."""
  return group if slots == rows and (rows // micro_batches) % group == 0 else 1


def make_layout(config: ConfigDict, batches_per_epoch: int, data_parallel: int) -> Layout:
  """The run's Layout; `batches_per_epoch` sets total_steps when trainer.total_training_steps is unset."""
  data, arr = config.data, config.actor_rollout_ref
  n = arr.rollout.n
  rows = data.train_batch_size * n
  mini_rows = arr.actor.ppo_mini_batch_size * n
  total = config.trainer.total_training_steps or batches_per_epoch * config.trainer.total_epochs
  prompt, response = data.max_prompt_length, arr.rollout.response_length
  row_tokens = device_tokens(prompt + response, arr.actor.ulysses_sequence_parallel_size)
  return Layout(n=n, rows=rows, mini_rows=mini_rows,
                micro_batches=micro_batch_count(config, mini_rows, data_parallel, row_tokens),
                total_steps=int(total), prompt_length=prompt, response_length=response,
                forward_micros=_forward_micros(config, rows, data_parallel, row_tokens),
                group=prompt_group_size(config, n, rows, data_parallel), token_budgets=token_budgets(config),
                data_parallel=data_parallel)


def balance_order(lengths: np.ndarray, parts: int, group: int = 1) -> np.ndarray:
  """A permutation giving each of `parts` equal row blocks similar token totals.

  Groups of `group` consecutive rows (one prompt's responses) move together:
  groups sorted by their token total are dealt snake-wise (0..k-1, k-1..0,
  ...) to the blocks, then the blocks are laid out one after another.
  """
  totals = lengths.reshape(-1, group).sum(-1)
  order = np.argsort(-totals, kind="stable")
  blocks = [[] for _ in range(parts)]
  for i, g in enumerate(order):
    lap, pos = divmod(i, parts)
    blocks[pos if lap % 2 == 0 else parts - 1 - pos].append(g)
  groups = np.concatenate([np.asarray(b, np.int64) for b in blocks])
  return (groups[:, None] * group + np.arange(group)).reshape(-1)
