"""The offline calculator tool-use task: data, SFT conversations, the tool, its YAML and the reward."""

import importlib
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from rljax import rewards
from rljax.data import synthetic
from rljax.data.synthetic import calculator
from rljax.data.synthetic import calculator_tool
from rljax.rewards import calculator as calculator_reward
from rljax.sft import data as sft_data
from tests.data.conftest import make_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = ["data_source", "agent_name", "prompt", "ability", "reward_model", "extra_info"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_cli_writes_verl_schema_with_tools_kwargs(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "rljax.data.synthetic", "calculator", "--local_dir", str(tmp_path),
       "--train_size", "20", "--test_size", "6", "--seed", "2"],
      check=True, capture_output=True, text=True, cwd=ROOT)
  assert out.stdout.split() == [str(tmp_path / f) for f in calculator.FILES]
  train = pq.read_table(tmp_path / "train.parquet")
  assert train.num_rows == 20 and pq.read_table(tmp_path / "test.parquet").num_rows == 6
  assert train.column_names == SCHEMA
  for row in train.to_pylist():
    assert row["data_source"] == "rljax/calculator" and row["agent_name"] == "tool_agent"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "<tool_call>" in row["prompt"][0]["content"] and '"name": "calculator"' in row["prompt"][0]["content"]
    truth = row["reward_model"]["ground_truth"]
    assert row["reward_model"]["style"] == "rule"
    extra = row["extra_info"]
    assert extra["split"] == "train" and extra["answer"] == truth
    assert extra["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": truth}}}
    assert extra["need_tools_kwargs"] is True and isinstance(extra["interaction_kwargs"], dict)
    assert calculator_tool.calculate(extra["expression"]) == truth
    a, b = (int(x) for x in extra["expression"].replace("*", "+").split(" + "))
    assert max(a, b) >= 100 and int(truth) >= 2000  # too large for mental arithmetic


def test_deterministic_and_levels(tmp_path):
  a = calculator.make_rows("train", 40, (1, 2, 3, 4), seed=1)
  assert a == calculator.make_rows("train", 40, (1, 2, 3, 4), seed=1)
  assert a != calculator.make_rows("train", 40, (1, 2, 3, 4), seed=2)
  assert {r["extra_info"]["difficulty"] for r in a} == {1, 2, 3, 4}
  for level, op in ((1, "+"), (2, "+"), (3, "*"), (4, "*")):
    row = calculator.make_rows("test", 1, (level,))[0]
    assert f" {op} " in row["extra_info"]["expression"]
  with pytest.raises(ValueError):
    calculator.parse_levels("5")
  paths = calculator.generate(str(tmp_path / "a"), 8, 4)
  again = calculator.generate(str(tmp_path / "b"), 8, 4)
  for p, q in zip(paths, again):
    assert pq.read_table(p).equals(pq.read_table(q))


def test_default_directory_written_on_first_use(tmp_path, monkeypatch):
  monkeypatch.setattr(calculator, "DEFAULT_LOCAL_DIR", str(tmp_path / "calc"))
  monkeypatch.setattr(calculator, "ensure_data", lambda d: calculator.generate(d, 5, 3))
  synthetic.maybe_generate_default(str(tmp_path / "calc" / "sft_train.parquet"))
  assert sorted(os.listdir(tmp_path / "calc")) == sorted(calculator.FILES)
  synthetic.maybe_generate_default(str(tmp_path / "elsewhere" / "test.parquet"))
  assert not (tmp_path / "elsewhere").exists()


def test_sft_conversations_render_with_chatml(tmp_path):
  calculator.generate(str(tmp_path), 4, 2)
  rows = pq.read_table(tmp_path / "sft_train.parquet").to_pylist()
  tok = make_tokenizer()
  tok.chat_template = CHATML
  for row in rows:
    messages = row["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    expression, answer = row["extra_info"]["expression"], row["extra_info"]["answer"]
    assert calculator_reward.tool_calls(messages[2]["content"]) == [{"expression": expression}]
    assert messages[3]["content"] == answer and messages[4]["content"].endswith(answer)
    text = tok.apply_chat_template(messages, tokenize=False)
    assert f"<|im_start|>tool\n{answer}<|im_end|>\n<|im_start|>assistant\n" in text
    # What follows the prompt is what a rollout's response decodes to; the reward scores it right.
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    response = text[len(prompt):]
    assert text.startswith(prompt)
    assert calculator_reward.compute_score(response, answer)["score"] == 1.0
    ids, mask = sft_data.multi_turn_example(tok, messages, "row")
    assert len(ids) == len(mask) and 0 < mask.sum() < len(mask)


def test_tool_evaluates_rejects_and_rewards():
  tool = calculator_tool.CalculatorTool({"type": "native"}, {"type": "function", "function": {"name": "calculator"}})
  iid = tool.create(ground_truth="777777")
  assert tool.execute(iid, {"expression": "123456 + 654321"}) == ("777777", 0.0, {"valid": 1.0})
  assert tool.calc_reward(iid) == 1.0
  other = tool.create("fixed-id", ground_truth="12")
  assert other == "fixed-id" and tool.calc_reward(other) == 0.0
  assert tool.execute(other, {"expression": "(2 + 4) * 3 - 7 / 2"})[0] == "14.5"
  assert tool.execute(other, {"expression": "1.5 * 4"})[0] == "6"
  assert tool.execute(other, {"expression": "-3 - 4"})[0] == "-7"
  assert tool.execute(other, json.dumps({"expression": "10 / 4"}))[0] == "2.5"
  for bad in ({"expression": "__import__('os')"}, {"expression": "2 ** 100000"}, {"expression": "1 / 0"},
              {"expression": "7 // 2"}, {"expression": "(1 + "}, {"expression": ""}, {"expression": 5},
              {"expr": "1 + 1"}, "not json", {"expression": "9" * 50 + " * " + "9" * 50}):
    text, step_reward, metrics = tool.execute(other, bad)
    assert text.startswith("Error: ") and step_reward == 0.0 and metrics == {"valid": 0.0}
  assert tool.calc_reward(other) == 0.0
  assert tool.execute(other, {"expression": "3 * 4"})[0] == "12" and tool.calc_reward(other) == 1.0
  tool.release(other)
  assert tool.calc_reward(other) == 0.0 and tool.calc_reward(iid) == 1.0
  assert tool.calc_reward(tool.create()) == 0.0  # no ground truth


def test_yaml_names_an_importable_tool():
  with open(os.path.join(ROOT, "configs", "tools", "calculator.yaml"), encoding="utf-8") as f:
    tools = yaml.safe_load(f)["tools"]
  assert len(tools) == 1
  spec = tools[0]
  assert spec["config"] == {"type": "native"}
  schema = spec["tool_schema"]
  assert schema["type"] == "function" and schema["function"]["name"] == "calculator"
  params = schema["function"]["parameters"]
  assert params["type"] == "object" and params["required"] == ["expression"]
  assert params["properties"]["expression"]["type"] == "string"
  module, _, name = spec["class_name"].rpartition(".")
  cls = getattr(importlib.import_module(module), name)
  tool = cls(spec["config"], schema)
  assert tool.name == "calculator" and tool.get_openai_tool_schema() == schema
  iid = tool.create(ground_truth="5")
  assert tool.execute(iid, {"expression": "2 + 3"})[0] == "5" and tool.calc_reward(iid) == 1.0


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234 + 5678"}}\n</tool_call>'
# The tool turn as the reward managers decode it (special tokens skipped) and with them kept.
TOOL_TURN_SKIPPED = "\ntool\n6912\nassistant\n"
TOOL_TURN_KEPT = "<|im_end|>\n<|im_start|>tool\n6912<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("response, score, acc, called", [
    # tool call, tool result, correct final answer: 1.0
    (CALL + TOOL_TURN_SKIPPED + "1234 + 5678 = 6912", 1.0, True, 1.0),
    (CALL + TOOL_TURN_KEPT + "The answer is 6,912.<|im_end|>", 1.0, True, 1.0),
    (CALL + "\nuser\n<tool_response>\n6912\n</tool_response>\nassistant\n6912", 1.0, True, 1.0),  # Qwen2.5
    # correct direct answer, no call: 1.0
    ("1234 + 5678 = 6912", 1.0, True, 0.0),
    # well-formed call, wrong final answer: 0.2
    (CALL + TOOL_TURN_SKIPPED + "The answer is 6913.", 0.2, False, 1.0),
    # well-formed call never answered (the tool turn is missing): no final answer, 0.2
    (CALL, 0.2, False, 1.0),
    # the right number inside the tool's result only does not count as the final answer
    (CALL + TOOL_TURN_SKIPPED + "I do not know.", 0.2, False, 1.0),
    # malformed calls: bad JSON, another tool, missing expression: 0.0
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": 1234 + 5678}\n</tool_call>', 0.0, False, 0.0),
    ('<tool_call>\n{"name": "python", "arguments": {"expression": "1234 + 5678"}}\n</tool_call>', 0.0, False, 0.0),
    ('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', 0.0, False, 0.0),
    # a wrong direct answer, or nothing: 0.0
    ("1234 + 5678 = 6900", 0.0, False, 0.0),
    ("", 0.0, False, 0.0),
])
def test_reward_partial_credit(response, score, acc, called):
  result = rewards.default_compute_score("rljax/calculator", response, "6912",
                                         {"rollout_reward_scores": {"calculator": 1.0}, "num_turns": 4})
  assert result["score"] == score and result["acc"] is acc and result["tool_call"] == called
  assert rewards.has_builtin_scorer("rljax/calculator")


def test_reward_arguments_as_json_string_and_second_call():
  call = '<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"2 * 3\\"}"}\n</tool_call>'
  assert calculator_reward.tool_calls(call) == [{"expression": "2 * 3"}]
  two = (CALL + TOOL_TURN_SKIPPED + CALL.replace("+", "*") + "\ntool\n7006652\nassistant\n" + "7006652")
  assert calculator_reward.final_answer(two) == "7006652"
  assert calculator_reward.compute_score(two, "7006652")["score"] == 1.0
