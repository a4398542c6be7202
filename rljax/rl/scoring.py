"""Scoring a rollout: the reward model or the reward manager, the reward's numeric components, generation dumps.

`Scorer` holds what scores (a reward manager, and the reward model when reward_model.enable) and is the one
place rows get their scores: `scored_rows` turns a rollout into an `Experience` of scored rows. It is shared by
the trainer's thread and, under separate_async, the rollout thread's judge (dynamic sampling), so a lock
serializes its calls.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from rljax.rewards import managers
from rljax.rl.experience import Experience
from rljax.rl.profiling import timed
from rljax.rl.reward_model import ModelReward
from rljax.rl.sequences import make_sequences, with_images
from rljax.sharding import hosts

REWARD_COLUMNS = ("data_source", "reward_model", "extra_info")


def numeric_components(extra_info: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
  """The numeric per-row entries of a reward manager's extra info, as float32 [rows] arrays (this host's)."""
  out = {}
  for key, values in extra_info.items():
    array = np.asarray(values)
    if array.shape == (rows,) and array.dtype.kind in "biuf":
      out[key] = array.astype(np.float32)
  return out


def reward_components(extra_info: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
  """`numeric_components`; on several hosts, every name any host has (NaN on the rows of a host without it, as
  one process fills a row without it)."""
  out = numeric_components(extra_info, rows)
  names = hosts.process_union(out) if hosts.count() > 1 else sorted(out)
  return {k: out[k] if k in out else np.full(rows, np.nan, np.float32) for k in names}


def dump_generations(directory: str, step: int, records: list[dict[str, Any]], append: bool = False) -> str:
  """verl's trainer.rollout_data_dir / validation_data_dir dump, one record per row.

  Every process writes the rows it holds: DIR/<step>.jsonl in a one-process
  job, DIR/<step>.process<k>.jsonl in a multi-host one; `append` adds to
  the file (a step's later generation rounds under dynamic sampling).
  """
  directory = os.path.expanduser(directory)
  os.makedirs(directory, exist_ok=True)
  suffix = f".process{hosts.index()}" if hosts.count() > 1 else ""
  path = os.path.join(directory, f"{step}{suffix}.jsonl")
  with open(path, "a" if append else "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps({**record, "step": step}, ensure_ascii=False) + "\n")
  return path


def rollout_rows(batch: dict[str, Any], rollout: Any, model_config: Any = None) -> Experience:
  """The unscored rows [N, P + R] of `rollout`'s responses to `batch`'s prompts (row i answers prompt
  rollout.prompt_index[i]); a vision-language model's (`model_config`) with their prompts' images."""
  idx = rollout.prompt_index
  rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                        rollout.response_mask, rollout.attention_mask).replace(
      prompt_mask=batch["attention_mask"][idx].astype(np.int32), rollout_log_probs=rollout.log_probs,
      routed_experts=rollout.routed_experts, group=idx.astype(np.int32))
  if model_config is None or model_config.vision is None:
    return rows
  inputs = batch.get("multi_modal_inputs")
  return with_images(rows, [None] * len(idx) if inputs is None else [inputs[i] for i in idx], model_config)


class Scorer:
  """Scores rollouts (the reward model's when enabled, else the reward manager's) and writes their dumps."""

  def __init__(self, config: ConfigDict, tokenizer: Any, reward_model: Any = None, model_config: Any = None):
    """`reward_model`: the run's (`assembly.RLRun.reward_model`: params and step), or None; `model_config`: the
    actor's (a vision-language one's rows carry their images)."""
    self.config = config
    self.model_config = model_config
    self.tokenizer = tokenizer
    self.reward_manager = managers.make_reward_manager(config, tokenizer)
    self.model_reward = (ModelReward(config, tokenizer, reward_model.params, reward_model.step)
                         if reward_model is not None else None)
    self._lock = threading.Lock()  # separate_async's rollout thread judges groups (dynamic sampling) meanwhile

  def __call__(self, batch: dict[str, Any], rollout: Any, use_model: bool = True) -> managers.RewardResult:
    """Token-level scores [N, R] of a rollout: the reward model's (when enabled and use_model), else the
    reward manager's."""
    with self._lock:
      return self._scored_by(batch, rollout, use_model)

  def _scored_by(self, batch: dict[str, Any], rollout: Any, use_model: bool) -> managers.RewardResult:
    idx = rollout.prompt_index
    if self.model_reward is not None and use_model:
      rows = make_sequences(batch["input_ids"][idx], batch["attention_mask"][idx], rollout.responses,
                            rollout.attention_mask)
      raw = np.asarray(batch["raw_prompt"])[idx] if "raw_prompt" in batch else None
      return managers.RewardResult(self.model_reward(rows, raw), {}, {})
    columns = {k: np.asarray(batch[k])[idx] for k in REWARD_COLUMNS if k in batch}
    infos = rollout.extra_info(columns.get("extra_info"))
    if infos is not None:
      columns["extra_info"] = np.array(list(infos), dtype=object)
    return self.reward_manager({"responses": rollout.responses, "response_mask": rollout.attention_mask, **columns})

  def scored_rows(self, batch: dict[str, Any], rollout: Any, timing: dict[str, float],
                  scores: managers.RewardResult | None = None) -> Experience:
    """`rollout_rows` with their token-level scores and reward components (`scores`: already scored); the
    reward's counts summed over hosts into `timing`, its time under timing_s/reward."""
    rows = rollout_rows(batch, rollout, self.model_config)
    with timed(timing, "reward"):
      result = self(batch, rollout) if scores is None else scores
    timing.update({k: hosts.process_total(float(v)) for k, v in result.metrics.items()})  # counts
    return rows.replace(token_level_scores=np.asarray(result.reward_tensor, np.float32),
                        reward_components=reward_components(result.reward_extra_info, len(rollout.prompt_index)))

  def records(self, batch: dict[str, Any], idx: np.ndarray, responses: np.ndarray, response_mask: np.ndarray,
              scores: np.ndarray) -> list[dict[str, Any]]:
    """Decoded input, output, ground truth and score of each row (for the generation dumps)."""
    truths = np.asarray(batch["reward_model"])[idx] if "reward_model" in batch else [None] * len(idx)
    decode = self.tokenizer.decode
    return [{"input": decode(batch["input_ids"][p][batch["attention_mask"][p] > 0], skip_special_tokens=True),
             "output": decode(r[m > 0], skip_special_tokens=True),
             "gts": (t or {}).get("ground_truth") if isinstance(t, dict) else None, "score": float(sc)}
            for p, r, m, t, sc in zip(idx, responses, response_mask, truths, scores)]

  def dump_rollout(self, step: int, batch: dict[str, Any], rollout: Any, scores: np.ndarray,
                   append: bool = False) -> None:
    """trainer.rollout_data_dir's dump of a rollout's rows at `step` (when set)."""
    if self.config.trainer.rollout_data_dir:
      dump_generations(self.config.trainer.rollout_data_dir, step, self.records(
          batch, rollout.prompt_index, rollout.responses, rollout.attention_mask, scores), append=append)

  def close(self) -> None:
    self.reward_manager.close()

