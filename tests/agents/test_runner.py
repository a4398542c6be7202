"""ToolSession / InteractionSession: timeouts, exceptions, async methods, parallel calls, lifecycle."""

import asyncio
import concurrent.futures
import threading
import time

import pytest

from rljax.agents import (BaseInteraction, BaseTool, InteractionSession, ToolCall, ToolResponse,
                          ToolSession, tool_messages, truncate_tool_response)


def schema(name):
  return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


class Recorder(BaseTool):
  """Records every lifecycle call; execute echoes its parameters and kwargs."""

  def __init__(self, name, reward=1.0):
    super().__init__({}, schema(name))
    self.calls, self.reward, self.lock = [], reward, threading.Lock()

  def _log(self, *entry):
    with self.lock:
      self.calls.append(entry)

  def create(self, instance_id=None, **kwargs):
    self._log("create", instance_id, kwargs)
    return instance_id, ToolResponse()

  def execute(self, instance_id, parameters, **kwargs):
    self._log("execute", instance_id, parameters, kwargs)
    return ToolResponse(text=f"{self.name}({parameters}){kwargs}"), 0.5, {"n": 1}

  def calc_reward(self, instance_id, **kwargs):
    self._log("calc_reward", instance_id, kwargs)
    return self.reward

  def release(self, instance_id, **kwargs):
    self._log("release", instance_id, kwargs)


class Raises(Recorder):
  def execute(self, instance_id, parameters, **kwargs):
    raise ValueError("boom")

  def calc_reward(self, instance_id, **kwargs):
    raise RuntimeError("no reward")


class Hangs(Recorder):
  def execute(self, instance_id, parameters, **kwargs):
    time.sleep(parameters.get("s", 30))
    return "late", 0.0, {}


class Async(Recorder):
  async def create(self, instance_id=None, **kwargs):
    await asyncio.sleep(0)
    return instance_id

  async def execute(self, instance_id, parameters, **kwargs):
    await asyncio.sleep(parameters.get("s", 0.01))
    return f"async {parameters}", 0.25, {}

  async def calc_reward(self, instance_id, **kwargs):
    return 2.0

  async def release(self, instance_id, **kwargs):
    self._log("release", instance_id, kwargs)


@pytest.fixture
def executor():
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    yield pool


def session(executor, *tools, timeout_s=2.0, parallel=4, length=256, side="middle", kwargs=None):
  s = ToolSession({t.name: t for t in tools}, kwargs or {}, executor, timeout_s, parallel, length, side)
  s.start()
  return s


def test_truncate_sides():
  text = "abcdefghij"
  assert truncate_tool_response(text, 10, "left") == text
  assert truncate_tool_response(text, 4, "left") == "abcd...(truncated)"
  assert truncate_tool_response(text, 4, "right") == "(truncated)...ghij"
  assert truncate_tool_response(text, 4, "middle") == "ab\n...(truncated)...\nij"
  assert truncate_tool_response(text, 5, "middle") == "ab\n...(truncated)...\nij"
  with pytest.raises(ValueError, match=r"tool_response_truncate_side='up'.*left, right, middle"):
    truncate_tool_response(text, 4, "up")


def test_lifecycle_kwargs_and_messages(executor):
  tool = Recorder("calc")
  kwargs = {"calc": {"create_kwargs": {"ground_truth": "5"}, "execute_kwargs": {"e": 1},
                     "calc_reward_kwargs": {"r": 2}, "release_kwargs": {"x": 3}}}
  s = session(executor, tool, kwargs=kwargs)
  outcomes = s.submit([ToolCall("calc", {"a": 1}), ToolCall("calc", {"a": 2})]).result()
  assert [(o.name, o.text, o.reward, o.metrics, o.error) for o in outcomes] == [
      ("calc", "calc({'a': 1}){'e': 1}", 0.5, {"n": 1}, None),
      ("calc", "calc({'a': 2}){'e': 1}", 0.5, {"n": 1}, None)]
  assert tool_messages(outcomes)[0] == {"role": "tool", "name": "calc", "content": "calc({'a': 1}){'e': 1}"}
  assert s.finish() == {"calc": 1.0}
  kinds = [c[0] for c in tool.calls]
  assert kinds.count("create") == kinds.count("calc_reward") == kinds.count("release") == 1
  instance = tool.calls[0][1]
  assert tool.calls[0] == ("create", instance, {"ground_truth": "5"})
  assert tool.calls[-2:] == [("calc_reward", instance, {"r": 2}), ("release", instance, {"x": 3})]
  assert s.errors == []


def test_exception_timeout_malformed_unknown(executor):
  raises, hangs, ok = Raises("bad"), Hangs("slow"), Recorder("ok")
  s = session(executor, raises, hangs, ok, timeout_s=0.2, parallel=5)
  start = time.monotonic()
  outcomes = s.submit([ToolCall("bad", {}), ToolCall("slow", {}), ToolCall("", None, "invalid JSON: x"),
                       ToolCall("nope", {}), ToolCall("ok", {})]).result()
  assert time.monotonic() - start < 1.0
  assert outcomes[0].error == "exception: ValueError: boom" and outcomes[0].text == "ValueError: boom"
  assert outcomes[1].error == "timeout" and "timed out after 0.2 s" in outcomes[1].text
  assert outcomes[2].error == "malformed: invalid JSON: x" and outcomes[2].text == "Error: malformed: invalid JSON: x"
  assert outcomes[3].error.startswith("unknown tool 'nope'; the tools are: bad, slow, ok")
  assert outcomes[4].error is None
  assert all(o.reward == 0.0 for o in outcomes[:4])
  rewards = s.finish()
  assert rewards == {"bad": 0.0, "slow": 1.0, "ok": 1.0}
  assert any("calc_reward raised RuntimeError: no reward" in e for e in s.errors)
  assert [c[0] for c in ok.calls] == ["create", "execute", "calc_reward", "release"]


def test_async_tool(executor):
  tool = Async("a")
  s = session(executor, tool)
  (outcome,) = s.submit([ToolCall("a", {"x": 1})]).result()
  assert (outcome.text, outcome.reward, outcome.error) == ("async {'x': 1}", 0.25, None)
  assert s.finish() == {"a": 2.0}
  assert [c[0] for c in tool.calls] == ["release"]


def test_hanging_async_tool_is_cancelled(executor):
  s = session(executor, Async("a"), timeout_s=0.2)
  start = time.monotonic()
  (outcome,) = s.submit([ToolCall("a", {"s": 30})]).result()
  assert outcome.error == "timeout" and time.monotonic() - start < 1.0


def test_parallel_calls_overlap_and_extra_calls_are_answered(executor):
  s = session(executor, Hangs("slow"), parallel=2)
  start = time.monotonic()
  outcomes = s.submit([ToolCall("slow", {"s": 0.3})] * 3).result()
  assert time.monotonic() - start < 0.5
  assert [o.error for o in outcomes] == [None, None, "too many calls: only 2 run per turn"]
  assert outcomes[2].text == "Error: too many calls: only 2 run per turn"


def test_responses_are_truncated_and_bad_results_reported(executor):
  class Long(Recorder):
    def execute(self, instance_id, parameters, **kwargs):
      return ("x" * 100 + "END") if parameters.get("bad") is None else "x", 0.0, {}

  class Bad(Recorder):
    def execute(self, instance_id, parameters, **kwargs):
      return "only text"

  s = session(executor, Long("long"), Bad("bad"), length=10, side="right")
  outcomes = s.submit([ToolCall("long", {}), ToolCall("bad", {})]).result()
  assert outcomes[0].text == "(truncated)...xxxxxxxEND"
  assert outcomes[1].error.startswith("bad result: execute must return (response, reward, metrics)")


def test_failed_create_answers_calls_and_skips_finish(executor):
  class NoStart(Recorder):
    def create(self, instance_id=None, **kwargs):
      raise OSError("sandbox down")

  tool = NoStart("sb")
  s = session(executor, tool)
  (outcome,) = s.submit([ToolCall("sb", {})]).result()
  assert outcome.error == "not started: create raised OSError: sandbox down"
  assert s.finish() == {} and tool.calls == []


def test_bad_settings():
  with pytest.raises(ValueError, match="max_parallel_calls=0"):
    ToolSession({}, {}, None, 1.0, 0, 10, "left")
  with pytest.raises(ValueError, match="tool_response_truncate_side"):
    ToolSession({}, {}, None, 1.0, 1, 10, "top")


class Guess(BaseInteraction):
  def __init__(self, config):
    super().__init__(config)
    self.state = {}

  async def start_interaction(self, instance_id=None, answer="5", **kwargs):
    self.state[instance_id] = {"answer": answer, "score": 0.0}
    return instance_id

  def generate_response(self, instance_id, messages, **kwargs):
    if messages[-1]["content"] == "boom":
      raise KeyError("bad turn")
    right = messages[-1]["content"] == self.state[instance_id]["answer"]
    self.state[instance_id]["score"] = float(right)
    return right, "Correct." if right else "Try again.", float(right), {"turn": len(messages)}

  def calculate_score(self, instance_id, **kwargs):
    return self.state[instance_id]["score"]

  def finalize_interaction(self, instance_id, **kwargs):
    del self.state[instance_id]


def test_interaction_session(executor):
  interaction = Guess({"name": "guess"})
  s = InteractionSession(interaction, {"answer": "7", "name": "guess"}, executor, timeout_s=1.0)
  s.start()
  turn = s.submit([{"role": "assistant", "content": "5"}]).result()
  assert turn == (False, "Try again.", 0.0, {"turn": 1})
  turn = s.submit([{"role": "assistant", "content": "7"}]).result()
  assert turn.terminate and turn.text == "Correct." and turn.score == 1.0
  assert s.finish() == 1.0 and interaction.state == {}
  s = InteractionSession(interaction, {}, executor, timeout_s=1.0)
  s.start()
  turn = s.submit([{"role": "assistant", "content": "boom"}]).result()
  assert turn.terminate and "generate_response raised KeyError" in turn.extra["error"]
  assert s.errors == [turn.extra["error"]]
