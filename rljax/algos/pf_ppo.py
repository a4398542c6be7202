"""PF-PPO (Policy Filtration for PPO; verl's `algorithm.use_pf_ppo`): after the advantages, the step's update
trains on N rows drawn again from its N rows, with replacement, each row weighted by its sequence score (the sum
of its token-level scores):

    pow          |score| ** weight_pow
    max_min      1 for the rows whose score is the batch's highest or lowest, else 0
    max_random   0.4 for the rows whose score is the batch's highest, else 0.1

plus 1e-8 (every row may be drawn), as verl 0.9.1's `compute_pf_ppo_reweight_data` draws them for
adv_estimator=gae. rljax draws the update's row order, not the rows: the mini-batches gather the drawn rows on
device (`rljax.rl.stages.update`), the critic's and the actor's alike.
"""

from __future__ import annotations

import jax
import numpy as np

METHODS = ("pow", "max_min", "max_random")  # algorithm.pf_ppo.reweight_method
ESTIMATOR = "gae"  # the one advantage estimator verl reweights under; with another the keys change nothing


def applies(use_pf_ppo: bool, adv_estimator: str) -> bool:
  """Whether a run's update trains on the rows drawn again (algorithm.use_pf_ppo under `ESTIMATOR`)."""
  return bool(use_pf_ppo) and adv_estimator == ESTIMATOR


def weights(scores: np.ndarray, method: str, weight_pow: float) -> np.ndarray:
  """[N] float32 drawing weights of rows with sequence `scores` [N]."""
  scores = np.asarray(scores, np.float32)
  if method == "pow":
    drawn = np.power(np.abs(scores), np.float32(weight_pow))
  elif method == "max_min":
    drawn = ((scores == scores.max()) | (scores == scores.min())).astype(np.float32)
  elif method == "max_random":
    drawn = np.where(scores == scores.max(), np.float32(0.4), np.float32(0.1))
  else:
    raise ValueError(f"reweight_method={method!r}: expected one of {METHODS}")
  return np.maximum(drawn + np.float32(1e-8), np.float32(1e-8)).astype(np.float32)


def resampled_order(key: jax.Array, order: np.ndarray, scores: np.ndarray, method: str,
                    weight_pow: float) -> np.ndarray:
  """[N] the update's rows drawn again: `order` [N] holds the global row numbers in update order, `scores` [N] each
  row's sequence score by row number; each of the N draws picks a position of `order` with probability
  proportional to its row's weight (`weights`)."""
  drawn = weights(np.asarray(scores)[order], method, weight_pow).astype(np.float64)
  picks = jax.random.choice(key, len(order), (len(order),), replace=True, p=drawn / drawn.sum())
  return np.asarray(order)[np.asarray(picks)]


__all__ = ["ESTIMATOR", "METHODS", "applies", "resampled_order", "weights"]
