"""Reward managers: a batch of responses -> token-level rewards.

`reward_model.reward_manager` picks one, as in verl:

- naive: scores the responses one after another in this process.
- prime: scores them in a process pool; a sample that runs past the
  per-sample timeout, or whose process dies, scores 0 and is counted.
- dapo: naive plus DAPO's overlong penalty
  (`reward_model.overlong_buffer.{enable, len, penalty_factor, log}`); a
  plain score is also reported as "acc" (verl's, for dynamic sampling).
- batch: one call of the user function on the whole batch.

Calling a manager:

    result = manager(batch)
    result.reward_tensor      # [B, T] float32, the score on the last real
                              # response token (token 0 for an empty one)
    result.reward_extra_info  # dict of lists of length B (the keys of dict
                              # scores besides "score"; dapo's overlong info)
    result.metrics            # reward/scorer_errors (samples scored 0 by a
                              # failure, timeouts included),
                              # reward/scorer_timeouts

`batch` is a mapping with, for B responses of up to T tokens:

- responses [B, T] int token ids, right-padded, and response_mask [B, T]
  (1 on real tokens). Without response_mask, attention_mask [B, P + T] is
  used (its last T columns); without either, every token is real.
- response_text (optional) list of B decoded strings; otherwise responses
  are decoded with the manager's tokenizer (special tokens skipped).
- data_source [B] (or the key named by data.reward_fn_key), reward_model [B]
  dicts with "ground_truth", extra_info [B] (optional).

A scorer that raises, returns a non-finite or malformed score, hangs (prime)
or kills its process (prime) never stops training: its sample scores 0, the
reward/scorer_errors metric counts it, and the first traceback is logged.
Scorers never execute model output.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from rljax.rewards import custom
from rljax.rewards import pool as pool_lib
from rljax.rewards.default import default_compute_score

logger = logging.getLogger(__name__)


class RewardResult(NamedTuple):
  """What a manager returns (see the module docstring)."""
  reward_tensor: np.ndarray
  reward_extra_info: dict[str, list[Any]]
  metrics: dict[str, float]


def concat_results(results: Sequence[RewardResult]) -> RewardResult:
  """One result for the rows of several, in order: an extra-info key some results lack is NaN on their rows (as
  `RewardManager.gather` fills a row's), the metrics (counts) are summed."""
  keys = sorted({k for r in results for k in r.reward_extra_info})
  extra = {k: [v for r in results for v in r.reward_extra_info.get(k, [float("nan")] * len(r.reward_tensor))]
           for k in keys}
  metrics: dict[str, float] = {}
  for result in results:
    for k, v in result.metrics.items():
      metrics[k] = metrics.get(k, 0.0) + float(v)
  return RewardResult(np.concatenate([np.asarray(r.reward_tensor) for r in results]), extra, metrics)


def response_lengths(batch: Mapping[str, Any]) -> tuple[np.ndarray, int]:
  """Real response lengths [B] and the padded width T."""
  responses = np.asarray(batch["responses"])
  width = responses.shape[1]
  if batch.get("response_mask") is not None:
    mask = np.asarray(batch["response_mask"])
  elif batch.get("attention_mask") is not None:
    mask = np.asarray(batch["attention_mask"])[:, -width:]
  else:
    mask = np.ones_like(responses)
  return mask.sum(axis=1).astype(np.int64), width


def place_scores(scores: np.ndarray, lengths: np.ndarray,
                 width: int) -> np.ndarray:
  """Token-level rewards: each score on its response's last real token.

  Args:
    scores: [B] float.
    lengths: [B] real response lengths.
    width: T.

  Returns:
    [B, T] float32, zero except at (i, max(lengths[i] - 1, 0)).
  """
  out = np.zeros((len(scores), width), dtype=np.float32)
  out[np.arange(len(scores)), np.maximum(lengths - 1, 0)] = scores
  return out


def overlong_penalty(lengths: np.ndarray, max_response_length: int,
                     buffer_len: int, penalty_factor: float) -> np.ndarray:
  """DAPO's soft overlong punishment.

  With L_max = max_response_length, L_buf = buffer_len and length |y|:
  penalty = min(0, -(|y| - (L_max - L_buf)) / L_buf * penalty_factor), i.e. 0
  up to L_max - L_buf tokens, then falling linearly to -penalty_factor at
  L_max.

  Args:
    lengths: [B] response lengths.
    max_response_length: L_max (data.max_response_length).
    buffer_len: L_buf (reward_model.overlong_buffer.len), > 0.
    penalty_factor: reward_model.overlong_buffer.penalty_factor.

  Returns:
    [B] float penalties, each <= 0.
  """
  exceed = np.asarray(lengths, np.float64) - (max_response_length - buffer_len)
  return np.minimum(-exceed / buffer_len * penalty_factor, 0.0)


class RewardManager:
  """The shared part of every manager: decoding, placement, error handling."""

  def __init__(self, compute_score: Callable[..., Any] | None = None,
               tokenizer: Any = None, reward_fn_key: str = "data_source",
               num_examine: int = 0):
    self.compute_score = compute_score or default_compute_score
    self.tokenizer = tokenizer
    self.reward_fn_key = reward_fn_key
    self.num_examine = num_examine
    self._logged_error = False

  def __call__(self, batch: Mapping[str, Any]) -> RewardResult:
    lengths, width = response_lengths(batch)
    samples = self.samples(batch, lengths)
    outcomes = self.score(samples)
    scores, extra, metrics = self.gather(outcomes)
    self.examine(samples, scores)
    return RewardResult(place_scores(scores, lengths, width), extra, metrics)

  def samples(self, batch: Mapping[str, Any],
              lengths: np.ndarray) -> list[dict[str, Any]]:
    """The keyword arguments of each scorer call."""
    texts = batch.get("response_text")
    if texts is None:
      if self.tokenizer is None:
        raise ValueError("batch has no response_text and the reward manager "
                         "has no tokenizer to decode responses")
      responses = np.asarray(batch["responses"])
      texts = [_decode(self.tokenizer, r[:n])
               for r, n in zip(responses, lengths)]
    sources = batch[self.reward_fn_key]
    reward_model = batch["reward_model"]
    extra_info = batch.get("extra_info")
    return [{"data_source": sources[i], "solution_str": texts[i],
             "ground_truth": _ground_truth(reward_model[i], i),
             "extra_info": None if extra_info is None else extra_info[i]}
            for i in range(len(texts))]

  def score(self, samples: list[dict[str, Any]]) -> list[pool_lib.Outcome]:
    """Runs the scorer on every sample, in this process."""
    outcomes = []
    for sample in samples:
      try:
        outcomes.append(pool_lib.Outcome(value=self.compute_score(**sample)))
      except Exception:  # pylint: disable=broad-except
        outcomes.append(pool_lib.Outcome(error=traceback.format_exc()))
    return outcomes

  def gather(self, outcomes: Sequence[pool_lib.Outcome]
             ) -> tuple[np.ndarray, dict[str, list[Any]], dict[str, float]]:
    """Scores [B], extra info lists and error metrics from the outcomes."""
    scores = np.zeros(len(outcomes), dtype=np.float64)
    rows: list[dict[str, Any]] = []
    errors = timeouts = 0
    for i, outcome in enumerate(outcomes):
      if outcome.error is None:
        try:
          scores[i], info = _split_result(outcome.value)
          rows.append(info)
          continue
        except (TypeError, ValueError, KeyError) as e:
          outcome = pool_lib.Outcome(error=f"bad scorer result: {e}")
      errors += 1
      timeouts += int(outcome.timed_out)
      rows.append({})
      self._log_error(outcome.error)
    keys = sorted({k for row in rows for k in row})
    extra = {k: [row.get(k, float("nan")) for row in rows] for k in keys}
    metrics = {"reward/scorer_errors": float(errors),
               "reward/scorer_timeouts": float(timeouts)}
    return scores, extra, metrics

  def examine(self, samples: Sequence[dict[str, Any]],
              scores: np.ndarray) -> None:
    """Logs the first `num_examine` responses of each data source."""
    if self.num_examine <= 0:
      return
    shown: dict[str, int] = {}
    for sample, score in zip(samples, scores):
      source = str(sample["data_source"])
      if shown.get(source, 0) < self.num_examine:
        shown[source] = shown.get(source, 0) + 1
        logger.info("[%s] response=%r ground_truth=%r score=%s", source,
                    sample["solution_str"], sample["ground_truth"], score)

  def _log_error(self, error: str | None) -> None:
    if not self._logged_error:
      self._logged_error = True
      logger.error("reward scorer failed; the sample scores 0 (later failures "
                   "are only counted in reward/scorer_errors):\n%s", error)

  def close(self) -> None:
    """Releases worker processes, if any."""


def _decode(tokenizer: Any, ids: np.ndarray) -> str:
  ids = [int(i) for i in ids]
  try:
    return tokenizer.decode(ids, skip_special_tokens=True)
  except TypeError:
    return tokenizer.decode(ids)


def _ground_truth(reward_model: Any, row: int) -> Any:
  if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
    return reward_model["ground_truth"]
  raise ValueError(f"row {row}: reward_model must be a dict with a "
                   f"'ground_truth' key; got {reward_model!r:.200}")


def _split_result(value: Any) -> tuple[float, dict[str, Any]]:
  """A scorer's float, or dict with "score" -> (score, other keys)."""
  if isinstance(value, Mapping):
    if "score" not in value:
      raise KeyError(f"dict result without a 'score' key: {sorted(value)}")
    return _split_result(value["score"])[0], dict(value)
  if isinstance(value, (bool, int, float, np.number)):
    score = float(value)
    if not np.isfinite(score):
      raise ValueError(f"score {score} is not finite")
    return score, {}
  raise TypeError(f"expected a float or a dict, got {type(value).__name__}")


class NaiveRewardManager(RewardManager):
  """verl's naive manager: sequential scoring in this process."""


class PrimeRewardManager(RewardManager):
  """Scores in a process pool with a per-sample timeout."""

  def __init__(self, compute_score: Callable[..., Any] | None = None,
               tokenizer: Any = None, reward_fn_key: str = "data_source",
               num_examine: int = 0, num_workers: int | None = None,
               timeout_s: float = 300.0):
    super().__init__(compute_score, tokenizer, reward_fn_key, num_examine)
    self.pool = pool_lib.ScorerPool(
        self.compute_score, num_workers or os.cpu_count() or 1, timeout_s)

  def score(self, samples: list[dict[str, Any]]) -> list[pool_lib.Outcome]:
    return self.pool.run(samples)

  def close(self) -> None:
    self.pool.close()


class DAPORewardManager(RewardManager):
  """Naive scoring plus DAPO's overlong penalty on the response length.

  With the buffer enabled the reward is score + overlong_penalty(length) (see
  `overlong_penalty`); with `log`, reward_extra_info gains "overlong_reward"
  (the penalty) and "overlong" (penalty < 0).
  """

  def __init__(self, compute_score: Callable[..., Any] | None = None,
               tokenizer: Any = None, reward_fn_key: str = "data_source",
               num_examine: int = 0, max_response_length: int = 512,
               overlong_enable: bool = False, overlong_len: int = 0,
               overlong_penalty_factor: float = 1.0,
               overlong_log: bool = False):
    super().__init__(compute_score, tokenizer, reward_fn_key, num_examine)
    if overlong_enable and not 0 < overlong_len <= max_response_length:
      raise ValueError(
          f"reward_model.overlong_buffer.len={overlong_len} must be in (0, "
          f"data.max_response_length={max_response_length}]")
    self.max_response_length = max_response_length
    self.overlong_enable = overlong_enable
    self.overlong_len = overlong_len
    self.overlong_penalty_factor = overlong_penalty_factor
    self.overlong_log = overlong_log

  def gather(self, outcomes: Sequence[pool_lib.Outcome]
             ) -> tuple[np.ndarray, dict[str, list[Any]], dict[str, float]]:
    """verl's dapo manager: a plain (float) score is also the row's "acc"; a dict score brings its own keys."""
    scores, extra, metrics = super().gather(outcomes)
    plain = [not isinstance(o.value, Mapping) for o in outcomes]
    if any(plain):
      given = extra.get("acc", [float("nan")] * len(outcomes))
      extra["acc"] = [float(s) if p else a for s, p, a in zip(scores, plain, given)]
    return scores, extra, metrics

  def __call__(self, batch: Mapping[str, Any]) -> RewardResult:
    result = super().__call__(batch)
    if not self.overlong_enable:
      return result
    lengths, width = response_lengths(batch)
    penalty = overlong_penalty(lengths, self.max_response_length,
                               self.overlong_len, self.overlong_penalty_factor)
    rewards = result.reward_tensor + place_scores(penalty, lengths, width)
    extra = dict(result.reward_extra_info)
    if self.overlong_log:
      extra["overlong_reward"] = penalty.tolist()
      extra["overlong"] = (penalty < 0).tolist()
    return RewardResult(rewards, extra, result.metrics)


class BatchRewardManager(RewardManager):
  """One call of a user function over the whole batch.

  The function is called as `compute_score(data_sources=..., solution_strs=...,
  ground_truths=..., extra_infos=...)` and returns B floats or dicts. If it
  raises, or returns the wrong number of results, every sample scores 0 and
  counts as an error.
  """

  def score(self, samples: list[dict[str, Any]]) -> list[pool_lib.Outcome]:
    try:
      values = list(self.compute_score(
          data_sources=[s["data_source"] for s in samples],
          solution_strs=[s["solution_str"] for s in samples],
          ground_truths=[s["ground_truth"] for s in samples],
          extra_infos=[s["extra_info"] for s in samples]))
      if len(values) != len(samples):
        raise ValueError(f"batch reward function returned {len(values)} "
                         f"results for {len(samples)} samples")
    except Exception:  # pylint: disable=broad-except
      error = traceback.format_exc()
      return [pool_lib.Outcome(error=error) for _ in samples]
    return [pool_lib.Outcome(value=v) for v in values]


MANAGERS = {
    "naive": NaiveRewardManager,
    "prime": PrimeRewardManager,
    "dapo": DAPORewardManager,
    "batch": BatchRewardManager,
}


def _get(node: Any, key: str, default: Any = None) -> Any:
  if node is None:
    return default
  try:
    value = node[key]
  except (KeyError, TypeError, AttributeError):
    return default
  return default if value is None else value


def load_compute_score(config: Any) -> Callable[..., Any] | None:
  """The user's function (custom_reward_function.*), or None if no path."""
  node = _get(config, "custom_reward_function")
  path = _get(node, "path")
  if not path:
    return None
  kwargs = _get(node, "reward_kwargs", {})
  return custom.FileFunction(path, _get(node, "name", "compute_score"),
                             dict(kwargs))


def make_reward_manager(config: Any, tokenizer: Any = None,
                        num_examine: int = 0) -> RewardManager:
  """The manager named by reward_model.reward_manager, built from `config`.

  Reads reward_model.reward_manager, custom_reward_function.{path, name,
  reward_kwargs}, data.reward_fn_key, and for prime
  reward_model.prime.{num_workers, timeout_s}, for dapo
  data.max_response_length and reward_model.overlong_buffer.{enable, len,
  penalty_factor, log}.
  """
  reward_model = _get(config, "reward_model")
  name = _get(reward_model, "reward_manager", "naive")
  if name not in MANAGERS:
    raise ValueError(f"reward_model.reward_manager={name!r}; expected one of "
                     f"{sorted(MANAGERS)}")
  compute_score = load_compute_score(config)
  common = dict(compute_score=compute_score, tokenizer=tokenizer,
                num_examine=num_examine,
                reward_fn_key=_get(_get(config, "data"), "reward_fn_key",
                                   "data_source"))
  if name == "prime":
    prime = _get(reward_model, "prime")
    return PrimeRewardManager(
        **common, num_workers=_get(prime, "num_workers"),
        timeout_s=float(_get(prime, "timeout_s", 300.0)))
  if name == "dapo":
    buffer = _get(reward_model, "overlong_buffer")
    return DAPORewardManager(
        **common,
        max_response_length=int(_get(_get(config, "data"),
                                     "max_response_length", 512)),
        overlong_enable=bool(_get(buffer, "enable", False)),
        overlong_len=int(_get(buffer, "len", 0)),
        overlong_penalty_factor=float(_get(buffer, "penalty_factor", 1.0)),
        overlong_log=bool(_get(buffer, "log", False)))
  if name == "batch" and compute_score is None:
    raise ValueError("reward_model.reward_manager=batch needs "
                     "custom_reward_function.path: a function over whole "
                     "batches")
  return MANAGERS[name](**common)
