"""The synthetic calculator task: multi-turn tool use, in verl's parquet schema.

The model is asked the value of a sum or product of numbers too large for a
small model to compute in its head, and is given one tool, `calculator`
(`rljax.data.synthetic.calculator_tool.CalculatorTool`, declared for verl's
tool loop in `configs/tools/calculator.yaml`). Tool calls use the `hermes`
format: the assistant writes

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123456 + 654321"}}
    </tool_call>

and ends its turn; the tool's answer comes back as a `{"role": "tool"}`
message; then the assistant answers with the number at the end. Since
SmolLM2's chat template has no tool support, the system message describes
the tool and the exact call format (`SYSTEM_PROMPT`).

`generate` writes into one directory:

* `train.parquet`, `test.parquet`: the RL rows, verl's columns data_source
  ("rljax/calculator"), prompt (system + user messages), ability,
  reward_model {"style": "rule", "ground_truth": the answer as a string},
  extra_info {split, index, difficulty, expression, question, answer,
  need_tools_kwargs, tools_kwargs: {"calculator": {"create_kwargs":
  {"ground_truth": answer}}}, interaction_kwargs: {query, ground_truth}}
  (verl's gsm8k_multiturn_w_tool layout; parquet cannot store an empty
  struct, so interaction_kwargs carries verl's two fields, which nothing
  reads unless an interaction is configured), and agent_name ("tool_agent",
  verl's agent loop for tool calls).
* `sft_train.parquet`, `sft_test.parquet`: worked conversations for an SFT
  warm-start (`data.multiturn.enable=true`, `messages_key=messages`): the
  same system and user messages, the assistant's tool call, the tool's
  result, and the assistant's answer "EXPRESSION = ANSWER".
  `configs/sft.py:smollm2_calculator` trains on them.

Difficulty levels (one level, or several sampled uniformly):

1. a + b, four-digit operands.
2. a + b, five- or six-digit operands.
3. a * b, three-digit operands.
4. a * b, a four- to six-digit number times a two- to four-digit one.

Rewards: `rljax.rewards.calculator` (data_source "rljax/calculator").
The same arguments and seed always give the same files. The default
directory `~/data/rljax/calculator` (levels 1-4) is written on first use
(`maybe_generate_default`).

    python -m rljax.data.synthetic calculator --local_dir DIR [--difficulty 1,2,3,4]
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any, Callable, Sequence

from rljax.data.synthetic import arithmetic
from rljax.data.synthetic.arithmetic import write_parquet

DATA_SOURCE = "rljax/calculator"
DEFAULT_LOCAL_DIR = "~/data/rljax/calculator"
AGENT_NAME = "tool_agent"
TOOL_NAME = "calculator"
LEVELS = (1, 2, 3, 4)
DEFAULT_DIFFICULTY = "1,2,3,4"
FILES = ("train.parquet", "test.parquet", "sft_train.parquet", "sft_test.parquet")

SYSTEM_PROMPT = (
    "You are a helpful assistant with a calculator tool. It computes an arithmetic expression "
    "made of numbers, + - * / and parentheses. To use it, write exactly:\n"
    "<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n'
    "</tool_call>\n"
    "and stop. The result comes back in a tool message. Then give the final answer, "
    "ending with the number.")
INSTRUCTION = "Use the calculator tool, then give the final answer as a number."


@dataclasses.dataclass(frozen=True)
class Problem:
  expression: str
  answer: int
  difficulty: int


def _number(rng: random.Random, min_digits: int, max_digits: int) -> int:
  digits = rng.randint(min_digits, max_digits)
  return rng.randint(10 ** (digits - 1), 10 ** digits - 1)


def _level1(rng: random.Random) -> Problem:
  a, b = _number(rng, 4, 4), _number(rng, 4, 4)
  return Problem(f"{a} + {b}", a + b, 1)


def _level2(rng: random.Random) -> Problem:
  a, b = _number(rng, 5, 6), _number(rng, 5, 6)
  return Problem(f"{a} + {b}", a + b, 2)


def _level3(rng: random.Random) -> Problem:
  a, b = _number(rng, 3, 3), _number(rng, 3, 3)
  return Problem(f"{a} * {b}", a * b, 3)


def _level4(rng: random.Random) -> Problem:
  a, b = _number(rng, 4, 6), _number(rng, 2, 4)
  if rng.random() < 0.5:
    a, b = b, a
  return Problem(f"{a} * {b}", a * b, 4)


_GENERATORS: dict[int, Callable[[random.Random], Problem]] = {1: _level1, 2: _level2, 3: _level3, 4: _level4}


def parse_levels(difficulty: int | str | Sequence[int]) -> tuple[int, ...]:
  """1, "2", "1,2,3" or [1, 2] -> a tuple of this task's levels."""
  return arithmetic.parse_levels(difficulty, LEVELS)


def tool_call_text(expression: str) -> str:
  """The hermes-format call of the calculator on `expression` (an assistant turn's content)."""
  call = json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}})
  return f"<tool_call>\n{call}\n</tool_call>"


def prompt_messages(question: str) -> list[dict[str, str]]:
  """The RL prompt: the system message describing the tool, and the question."""
  return [{"role": "system", "content": SYSTEM_PROMPT},
          {"role": "user", "content": f"{question} {INSTRUCTION}"}]


def conversation(question: str, expression: str, answer: str) -> list[dict[str, str]]:
  """A worked tool-use conversation: prompt, call, tool result, final answer."""
  return prompt_messages(question) + [
      {"role": "assistant", "content": tool_call_text(expression)},
      {"role": "tool", "content": answer},
      {"role": "assistant", "content": f"{expression} = {answer}"},
  ]


def make_problems(split: str, size: int, levels: Sequence[int], seed: int = 0) -> list[Problem]:
  rng = random.Random(f"rljax-calculator:{split}:{seed}")
  return [_GENERATORS[rng.choice(list(levels))](rng) for _ in range(size)]


def make_rows(split: str, size: int, levels: Sequence[int], seed: int = 0) -> list[dict[str, Any]]:
  """`size` RL rows in verl's schema (with agent_name and tools_kwargs); deterministic."""
  rows = []
  for i, problem in enumerate(make_problems(split, size, levels, seed)):
    question = f"What is {problem.expression}?"
    answer = str(problem.answer)
    rows.append({
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": prompt_messages(question),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split, "index": i, "difficulty": problem.difficulty,
            "expression": problem.expression, "question": question, "answer": answer,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": answer}}},
            "interaction_kwargs": {"query": question, "ground_truth": answer},
        },
    })
  return rows


def make_sft_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The worked conversation of each RL row (a `messages` column, plus the row's extra_info)."""
  return [{"messages": conversation(r["extra_info"]["question"], r["extra_info"]["expression"],
                                    r["reward_model"]["ground_truth"]),
           "data_source": r["data_source"],
           "extra_info": {k: r["extra_info"][k] for k in ("split", "index", "difficulty", "expression", "answer")}}
          for r in rows]


def generate(local_dir: str, train_size: int = 10000, test_size: int = 500,
             difficulty: int | str | Sequence[int] = DEFAULT_DIFFICULTY, seed: int = 0) -> tuple[str, ...]:
  """Writes `local_dir`/{train,test,sft_train,sft_test}.parquet; returns the four paths."""
  if train_size <= 0 or test_size <= 0:
    raise ValueError("train_size and test_size must be positive")
  levels = parse_levels(difficulty)
  local_dir = os.path.expanduser(local_dir)
  paths = tuple(os.path.join(local_dir, f) for f in FILES)
  for split, size in (("train", train_size), ("test", test_size)):
    rows = make_rows(split, size, levels, seed)
    write_parquet(make_sft_rows(rows), os.path.join(local_dir, f"sft_{split}.parquet"))
    write_parquet(rows, os.path.join(local_dir, f"{split}.parquet"))
  return paths


def ensure_data(local_dir: str = DEFAULT_LOCAL_DIR, **kwargs: Any) -> tuple[str, ...]:
  """`generate(local_dir, **kwargs)` unless all four files already exist."""
  local_dir = os.path.expanduser(local_dir)
  paths = tuple(os.path.join(local_dir, f) for f in FILES)
  if all(os.path.isfile(p) for p in paths):
    return paths
  return generate(local_dir, **kwargs)


def maybe_generate_default(path: str) -> None:
  """Generates `DEFAULT_LOCAL_DIR` if `path` is one of its absent files."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) or os.path.basename(path) not in FILES:
    return
  if os.path.dirname(path) == os.path.abspath(os.path.expanduser(DEFAULT_LOCAL_DIR)):
    ensure_data(DEFAULT_LOCAL_DIR)
