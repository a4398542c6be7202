"""`default_compute_score`: a row's rule reward, chosen by its data_source.

The data sources and scorers are verl's (`verl.utils.reward_score.
default_compute_score`), plus rljax's synthetic task:

- openai/gsm8k: `gsm8k`;
- lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500:
  `math_answer` (verl's math_reward);
- math_dapo, math, math_dapo_reasoning and every name starting with "aime":
  `math_dapo` (a dict score);
- numina_aops_forum, numina_synthetic_math, numina_amc_aime,
  numina_synthetic_amc, numina_cn_k12, numina_olympiads: `prime_math`;
- hiyouga/geometry3k: `geo3k`;
- searchR1_nq, searchR1_triviaqa, searchR1_popqa, searchR1_hotpotqa,
  searchR1_2wikimultihopqa, searchR1_musique, searchR1_bamboogle:
  `search_r1`;
- rljax/arithmetic: `arithmetic`;
- rljax/shapes: `shapes` (the colour and shape an image shows);
- rljax/calculator: `calculator` (multi-turn tool use; a dict score with
  partial credit for a well-formed tool call).

verl's code sources (codecontests, apps, codeforces, taco) are scored by
running the response as code in a sandbox; rljax never runs model output
in the trainer's process, so those sources need custom_reward_function.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import pyarrow.parquet as pq

from rljax.rewards import arithmetic
from rljax.rewards import calculator
from rljax.rewards import shapes
from rljax.rewards import geo3k
from rljax.rewards import gsm8k
from rljax.rewards import math_answer
from rljax.rewards import math_dapo
from rljax.rewards import prime_math
from rljax.rewards import search_r1

SYNTHETIC_ARITHMETIC = "rljax/arithmetic"
SYNTHETIC_CALCULATOR = "rljax/calculator"
SYNTHETIC_SHAPES = "rljax/shapes"
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
                "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
DAPO_PREFIX = "aime"
NUMINA_SOURCES = ("numina_aops_forum", "numina_synthetic_math",
                  "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
                  "numina_olympiads")
SEARCH_R1_SOURCES = ("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa",
                     "searchR1_hotpotqa", "searchR1_2wikimultihopqa",
                     "searchR1_musique", "searchR1_bamboogle")
CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")

Scorer = Callable[..., Any]

_SCORERS: dict[str, Scorer] = {
    "openai/gsm8k": gsm8k.compute_score,
    **{s: math_answer.compute_score for s in MATH_SOURCES},
    **{s: math_dapo.compute_score for s in DAPO_SOURCES},
    **{s: prime_math.compute_score for s in NUMINA_SOURCES},
    "hiyouga/geometry3k": geo3k.compute_score,
    **{s: search_r1.compute_score for s in SEARCH_R1_SOURCES},
    SYNTHETIC_ARITHMETIC: arithmetic.compute_score,
    SYNTHETIC_CALCULATOR: calculator.compute_score,
    SYNTHETIC_SHAPES: shapes.compute_score,
}
_PREFIX_SCORERS: dict[str, Scorer] = {DAPO_PREFIX: math_dapo.compute_score}


def scorer_for(data_source: Any) -> Scorer | None:
  """The built-in scorer of `data_source`, or None."""
  scorer = _SCORERS.get(data_source)
  if scorer is None and isinstance(data_source, str):
    scorer = next((s for prefix, s in _PREFIX_SCORERS.items()
                   if data_source.startswith(prefix)), None)
  return scorer


def has_builtin_scorer(data_source: Any) -> bool:
  """Whether `default_compute_score` can score `data_source`."""
  return scorer_for(data_source) is not None


def known_data_sources() -> list[str]:
  """The data_source values `default_compute_score` can score; "aime*"
  stands for every name starting with "aime"."""
  return sorted(_SCORERS) + [f"{prefix}*" for prefix in _PREFIX_SCORERS]


def code_source_message(data_source: Any) -> str:
  """Why a code data_source has no built-in score, and what to do."""
  return (f"data_source {data_source!r} is a code task: verl scores it by "
          "running the response as code in a sandbox "
          "(reward_model.sandbox_fusion.url), which rljax does not call; "
          "rljax never runs model output in the trainer's process. Set "
          "custom_reward_function.path (and .name) to a function that scores "
          "it, e.g. by sending the code to your own sandbox.")


def first_unknown_source(sources: Iterable[Any]) -> tuple[int, Any] | None:
  """(row, data_source) of the first row no built-in scorer handles, or None."""
  for row, source in enumerate(sources):
    if not has_builtin_scorer(source):
      return row, source
  return None


def check_data_sources(files: Iterable[str]) -> None:
  """Fails up front when a parquet row's data_source has no built-in scorer.

  Without `custom_reward_function.path` every row is scored by
  `default_compute_score`; an unknown data_source would score 0 on every
  step instead of training, and a code source cannot be scored at all.
  Files without a data_source column are left to the data loader's own
  checks.

  Raises:
    ValueError: naming the file, row and data_source, and the fix.
  """
  for file in files:
    schema = pq.read_schema(file)
    if "data_source" not in schema.names:
      continue
    column = pq.read_table(file, columns=["data_source"]).column("data_source").to_pylist()
    unknown = first_unknown_source(column)
    if unknown is None:
      continue
    row, source = unknown
    if source in CODE_SOURCES:
      raise ValueError(f"{file}: row {row}: {code_source_message(source)}")
    raise ValueError(
        f"{file}: row {row} has data_source {source!r}, which no built-in reward scores "
        f"(built-in: {known_data_sources()}). Set custom_reward_function.path (and .name) to a "
        "function that scores it, or enable reward_model.")


def default_compute_score(data_source: str, solution_str: str,
                          ground_truth: Any, extra_info: Any = None,
                          **kwargs: Any) -> float | dict[str, Any]:
  """The rule score of one response, like verl's default_compute_score.

  Args:
    data_source: the row's data_source; selects the scorer (module
      docstring).
    solution_str: the decoded response.
    ground_truth: reward_model["ground_truth"]: text (converted with str),
      or for searchR1_* the mapping {"target": answers}.
    extra_info: the row's extra_info (unused by the built-in scorers).
    **kwargs: accepted and ignored, as verl 0.9.1's function ignores them (its
      gsm8k scores strictly even when a caller passes method="flexible":
      call `rljax.rewards.gsm8k.compute_score` for that).

  Returns:
    The score as a float, or for the math_dapo sources verl's dict
    {"score", "acc", "pred"} (rljax/calculator adds "tool_call").

  Raises:
    NotImplementedError: for a data_source with no built-in scorer (a code
      source's message names the sandbox setting and the custom function).
  """
  del extra_info, kwargs
  if data_source in CODE_SOURCES:
    raise NotImplementedError(code_source_message(data_source))
  scorer = scorer_for(data_source)
  if scorer is None:
    raise NotImplementedError(
        f"no built-in reward for data_source {data_source!r}; built-in: "
        f"{known_data_sources()}. Set custom_reward_function.path to score it.")
  truth = ground_truth if isinstance(ground_truth, Mapping) else str(ground_truth)
  result = scorer(solution_str, truth)
  return result if isinstance(result, dict) else float(result)
