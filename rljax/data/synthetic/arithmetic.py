"""The synthetic arithmetic task, in verl's parquet schema.

`generate` writes `train.parquet` and `test.parquet` with verl's columns
(data_source, prompt, ability, reward_model, extra_info). Every ground truth
is a whole number written as a string; `rljax.rewards` scores a response by
its last number (data_source "rljax/arithmetic").

`extra_info` holds split, index, difficulty, expression, question, answer
and `solution`: the worked answer an SFT run trains on, the expression, each
intermediate value of a two-operation problem, then the answer, joined by
" = " ("3 + 4 = 7", "12 * 3 + 5 = 36 + 5 = 41", "(2 + 3) * 4 = 5 * 4 = 20").

Difficulty levels (one level, or several sampled uniformly):

1. a + b, one-digit operands.
2. a + b or a - b, one-digit operands, result >= 0.
3. a + b or a - b, two-digit operands, result >= 0.
4. a * b (one digit), or a + b - c (two digits), result >= 0.
5. a * b + c or (a + b) * c, up to two digits.

Style "arithmetic" asks "What is 3 + 4?"; "word" tells the same sum as a
short GSM8K-like story; "mixed" picks either per problem. The same arguments
and seed always give the same files.

Two default directories are written on first use (`maybe_generate_default`):
`~/data/rljax/arithmetic` (level 1, arithmetic style: the RL presets' task)
and `~/data/rljax/arithmetic_word` (levels 1-2 told as word problems: the
SFT preset's task).
"""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "rljax/arithmetic"
DEFAULT_LOCAL_DIR = "~/data/rljax/arithmetic"
WORD_LOCAL_DIR = "~/data/rljax/arithmetic_word"
# default directory -> the `generate` arguments its files are written with on first use.
DEFAULT_TASKS: dict[str, dict[str, str]] = {
    DEFAULT_LOCAL_DIR: {},
    WORD_LOCAL_DIR: {"difficulty": "1,2", "style": "word"},
}
# extra_info fields that files written by older versions of this module lack.
LATER_FIELDS = ("solution",)
LEVELS = (1, 2, 3, 4, 5)
STYLES = ("arithmetic", "word", "mixed")
INSTRUCTION = "Reply with just the final number."

_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan",
          "Jade", "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books",
          "coins", "shells", "cards", "balloons")


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem: the expression, its value, its worked solution and its two phrasings."""
  expression: str
  answer: int
  story: str
  difficulty: int
  solution: str


def _solution(expression: str, *steps: int | str) -> str:
  """"EXPRESSION = STEP = ... = ANSWER": the expression, then each form it reduces to."""
  return " = ".join([expression, *(str(s) for s in steps)])


def _story_add(rng: random.Random, a: int, b: int) -> str:
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  return (f"{name} has {a} {item}. {name} gets {b} more {item}. "
          f"How many {item} does {name} have now?")


def _story_sub(rng: random.Random, a: int, b: int) -> str:
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  return (f"{name} has {a} {item} and gives {b} of them away. "
          f"How many {item} does {name} have left?")


def _add_or_sub(rng: random.Random, lo: int, hi: int, level: int,
                allow_sub: bool) -> Problem:
  a, b = rng.randint(lo, hi), rng.randint(lo, hi)
  if allow_sub and rng.random() < 0.5:
    a, b = max(a, b), min(a, b)
    return Problem(f"{a} - {b}", a - b, _story_sub(rng, a, b), level,
                   _solution(f"{a} - {b}", a - b))
  return Problem(f"{a} + {b}", a + b, _story_add(rng, a, b), level,
                 _solution(f"{a} + {b}", a + b))


def _level1(rng: random.Random) -> Problem:
  return _add_or_sub(rng, 1, 9, 1, allow_sub=False)


def _level2(rng: random.Random) -> Problem:
  return _add_or_sub(rng, 1, 9, 2, allow_sub=True)


def _level3(rng: random.Random) -> Problem:
  return _add_or_sub(rng, 10, 99, 3, allow_sub=True)


def _level4(rng: random.Random) -> Problem:
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  if rng.random() < 0.5:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    story = (f"{name} buys {a} bags with {b} {item} in each bag. "
             f"How many {item} does {name} buy?")
    return Problem(f"{a} * {b}", a * b, story, 4, _solution(f"{a} * {b}", a * b))
  a, b = rng.randint(10, 60), rng.randint(10, 39)
  c = rng.randint(1, a + b)
  story = (f"{name} has {a} {item}, buys {b} more and then gives {c} away. "
           f"How many {item} does {name} have now?")
  return Problem(f"{a} + {b} - {c}", a + b - c, story, 4,
                 _solution(f"{a} + {b} - {c}", f"{a + b} - {c}", a + b - c))


def _level5(rng: random.Random) -> Problem:
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(2, 30)
  if rng.random() < 0.5:
    story = (f"{name} has {c} {item} and buys {a} boxes with {b} {item} in "
             f"each box. How many {item} does {name} have now?")
    return Problem(f"{a} * {b} + {c}", a * b + c, story, 5,
                   _solution(f"{a} * {b} + {c}", f"{a * b} + {c}", a * b + c))
  c = rng.randint(2, 9)
  story = (f"There are {a} red boxes and {b} blue boxes. Each box holds {c} "
           f"{item}. How many {item} are there in all?")
  return Problem(f"({a} + {b}) * {c}", (a + b) * c, story, 5,
                 _solution(f"({a} + {b}) * {c}", f"{a + b} * {c}", (a + b) * c))


_GENERATORS: dict[int, Callable[[random.Random], Problem]] = {
    1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5}


def parse_levels(difficulty: int | str | Sequence[int], allowed: Sequence[int] = LEVELS) -> tuple[int, ...]:
  """1, "2", "1,2,3" or [1, 2] -> a tuple of levels, each one of `allowed` (this task's by default)."""
  allowed = tuple(allowed)
  if isinstance(difficulty, str):
    items = [d for d in difficulty.replace(" ", "").split(",") if d]
  elif isinstance(difficulty, int):
    items = [difficulty]
  else:
    items = list(difficulty)
  try:
    levels = tuple(int(d) for d in items)
  except ValueError as e:
    raise ValueError(f"difficulty {difficulty!r}: expected levels in {allowed}") from e
  if not levels or any(d not in allowed for d in levels):
    raise ValueError(f"difficulty {difficulty!r}: expected levels in {allowed}")
  return levels


def make_rows(split: str, size: int, levels: Sequence[int],
              style: str = "arithmetic", seed: int = 0) -> list[dict]:
  """`size` rows in verl's schema; the same arguments give the same rows."""
  if style not in STYLES:
    raise ValueError(f"style {style!r}: expected one of {STYLES}")
  rng = random.Random(f"rljax-arithmetic:{split}:{seed}")
  rows = []
  for i in range(size):
    level = rng.choice(list(levels))
    problem = _GENERATORS[level](rng)
    use_story = style == "word" or (style == "mixed" and rng.random() < 0.5)
    question = problem.story if use_story else f"What is {problem.expression}?"
    answer = str(problem.answer)
    rows.append({
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": i, "difficulty": level,
                       "expression": problem.expression, "question": question,
                       "answer": answer, "solution": problem.solution},
    })
  return rows


def write_parquet(rows: list[dict], path: str) -> None:
  """Writes rows atomically (a temporary file renamed into place)."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, suffix=".parquet.tmp")
  os.close(fd)
  try:
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def generate(local_dir: str, task: str = "arithmetic", train_size: int = 10000,
             test_size: int = 500, difficulty: int | str | Sequence[int] = 1,
             style: str = "arithmetic", seed: int = 0) -> tuple[str, str]:
  """Writes `local_dir`/{train,test}.parquet; returns the two paths."""
  if task != "arithmetic":
    raise ValueError(f"unknown synthetic task {task!r}; available: arithmetic")
  if train_size <= 0 or test_size <= 0:
    raise ValueError("train_size and test_size must be positive")
  levels = parse_levels(difficulty)
  local_dir = os.path.expanduser(local_dir)
  paths = (os.path.join(local_dir, "train.parquet"),
           os.path.join(local_dir, "test.parquet"))
  for split, size, path in zip(("train", "test"), (train_size, test_size),
                               paths):
    write_parquet(make_rows(split, size, levels, style, seed), path)
  return paths


def ensure_synthetic_data(local_dir: str = DEFAULT_LOCAL_DIR,
                          task: str = "arithmetic",
                          **kwargs) -> tuple[str, str]:
  """`generate(local_dir, task, **kwargs)` unless both files already exist."""
  local_dir = os.path.expanduser(local_dir)
  paths = (os.path.join(local_dir, "train.parquet"),
           os.path.join(local_dir, "test.parquet"))
  if all(os.path.isfile(p) for p in paths):
    return paths
  return generate(local_dir, task, **kwargs)


def maybe_generate_default(path: str) -> None:
  """Generates a `DEFAULT_TASKS` directory if `path` is its absent train or test file."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) or os.path.basename(path) not in ("train.parquet", "test.parquet"):
    return
  for directory, kwargs in DEFAULT_TASKS.items():
    if os.path.dirname(path) == os.path.abspath(os.path.expanduser(directory)):
      ensure_synthetic_data(directory, **kwargs)


def regenerate_hint(field: str) -> str:
  """How to rewrite files that lack `field`, a `LATER_FIELDS` entry ("" for any other name)."""
  if field not in LATER_FIELDS:
    return ""
  defaults = ", ".join(DEFAULT_TASKS)
  return (f"files written by rljax.data.synthetic before it added extra_info.{field} lack it: write them "
          "again with `python -m rljax.data.synthetic arithmetic --local_dir DIR` and the --difficulty and "
          f"--style they were made with, or, for a default directory ({defaults}), delete its train.parquet "
          "and test.parquet and they are written again on first use")
