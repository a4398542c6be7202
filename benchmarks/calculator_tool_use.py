"""Does a model call the calculator? First-turn and two-turn rates on the calculator task.

Works on the parquet files `python -m rljax.generate` writes (a `responses`
column, one list of samples per row), so any model rljax generates with
can be measured:

    # 1. first turns (one assistant turn each, ending at <|im_end|>)
    python -m rljax.generate --config=configs/generate.py data.path=TEST.parquet data.n_samples=1 \\
        rollout.do_sample=false rollout.temperature=0 rollout.prompt_length=160 rollout.response_length=96 \\
        data.output_path=FIRST.parquet
    python benchmarks/calculator_tool_use.py rates FIRST.parquet
    # 2. second turns: each well-formed call is run by the tool and its result appended as a tool message
    python benchmarks/calculator_tool_use.py continue FIRST.parquet SECOND_PROMPTS.parquet
    python -m rljax.generate ... data.path=SECOND_PROMPTS.parquet rollout.prompt_length=256 \\
        rollout.response_length=48 data.output_path=SECOND.parquet
    python benchmarks/calculator_tool_use.py final SECOND.parquet

`rates` prints, over all samples: `tool_call` (the first turn holds a
well-formed hermes call of the calculator: `<tool_call>` + JSON naming it
with a string expression), `call_right` (and the expression's value is the
ground truth), `tool_tag` (any `<tool_call>` text at all), `direct_acc`
(no tool call and the turn's last number is the ground truth: answering
directly) and `first_turn_score` (`rljax.rewards.calculator` on the first
turn alone). `final` prints the task reward of the whole two-turn response
(first turn, the rendered tool turn, second turn) as a rollout would be
scored: samples without a call keep their first-turn score.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rljax.data.synthetic import calculator_tool
from rljax.rewards import calculator as reward


def _samples(path: str):
  """(row, sample index, response text) for every sample of a generated file."""
  for row in pq.read_table(path).to_pylist():
    responses = row["responses"]
    for k, text in enumerate([responses] if isinstance(responses, str) else responses):
      yield row, k, text


def first_call(text: str) -> dict | None:
  return next((args for args in reward.tool_calls(text) if args is not None), None)


def rates(path: str) -> dict:
  stats = {"tool_call": [], "call_right": [], "tool_tag": [], "direct_acc": [], "first_turn_score": []}
  for row, _, text in _samples(path):
    truth = row["reward_model"]["ground_truth"]
    args = first_call(text)
    right = False
    if args is not None:
      try:
        right = calculator_tool.same_number(calculator_tool.calculate(args["expression"]), truth)
      except calculator_tool.CalculatorError:
        pass
    score = reward.compute_score(text, truth)
    stats["tool_call"].append(args is not None)
    stats["call_right"].append(right)
    stats["tool_tag"].append("<tool_call>" in text)
    stats["direct_acc"].append(args is None and score["acc"])
    stats["first_turn_score"].append(score["score"])
  return {"file": path, "samples": len(stats["tool_call"]),
          **{k: round(float(np.mean(v)), 4) for k, v in stats.items()}}


def continue_(path: str, out: str) -> dict:
  """Writes the second-turn prompts: prompt + the first turn + the tool's result, for turns with a call."""
  rows = []
  for row, k, text in _samples(path):
    args = first_call(text)
    if args is None:
      continue
    tool = calculator_tool.CalculatorTool()
    iid = tool.create(ground_truth=row["reward_model"]["ground_truth"])
    result, _, _ = tool.execute(iid, args)
    first = text.split("</tool_call>")[0] + "</tool_call>"  # the turn ends at the call, as the agent loop cuts it
    rows.append({**{key: v for key, v in row.items() if key != "responses"},
                 "prompt": list(row["prompt"]) + [{"role": "assistant", "content": first},
                                                  {"role": "tool", "content": result}],
                 "first_turn": first, "tool_result": result, "sample": k})
  pq.write_table(pa.Table.from_pylist(rows), out)
  return {"file": out, "rows": len(rows)}


def final(path: str, first_path: str | None = None) -> dict:
  """The two-turn reward; with `first_path`, samples without a call count with their first-turn score."""
  scores, accs = [], []
  for row, _, text in _samples(path):
    full = f"{row['first_turn']}\ntool\n{row['tool_result']}\nassistant\n{text}"
    s = reward.compute_score(full, row["reward_model"]["ground_truth"])
    scores.append(s["score"])
    accs.append(s["acc"])
  called = len(scores)
  if first_path:
    for row, _, text in _samples(first_path):
      if first_call(text) is None:
        s = reward.compute_score(text, row["reward_model"]["ground_truth"])
        scores.append(s["score"])
        accs.append(s["acc"])
  return {"file": path, "samples": len(scores), "with_call": called,
          "two_turn_score": round(float(np.mean(scores)), 4) if scores else 0.0,
          "two_turn_acc": round(float(np.mean(accs)), 4) if accs else 0.0}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("rates").add_argument("responses")
  c = sub.add_parser("continue")
  c.add_argument("responses")
  c.add_argument("out")
  f = sub.add_parser("final")
  f.add_argument("responses")
  f.add_argument("--first", default=None, help="the first-turn file, to count samples without a call")
  args = parser.parse_args(argv)
  if args.command == "rates":
    result = rates(args.responses)
  elif args.command == "continue":
    result = continue_(args.responses, args.out)
  else:
    result = final(args.responses, args.first)
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
