"""Running one conversation's tools and interaction off the decode loop.

The rollout decodes many conversations at once; when one stops at a tool call
it calls `ToolSession.submit(calls)`, keeps decoding the others, and appends
the tool turns when the returned future is done.

Threads: user code never runs on the caller's executor. A sync method runs on
a fresh daemon thread and an `async def` method on one shared event loop (a
daemon thread; async tools that hold loop-bound clients keep working across
calls, and must not block that loop). The executor only hosts `submit`'s
short coordinating task, which waits on those; so a tool that hangs past its
timeout is abandoned (its daemon thread never blocks the run or the
interpreter's exit, an async one is cancelled), and waiting on the executor
from inside it cannot starve it. `start()` and `finish()` block the calling
thread (each method call up to timeout_s) and use no executor.

Every failure becomes an outcome the model sees, never an exception:
timeouts, exceptions (type and message as the turn text), malformed calls,
unknown tools, a tool that failed to start, and calls beyond
max_parallel_calls (each answered "too many calls: only N run per turn"
instead of being dropped as verl's agent loop drops them, so every call the
model made gets a tool turn).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import logging
import threading
import time
import uuid
from typing import Any, Callable, NamedTuple

from rljax.agents.parsing import ToolCall

TRUNCATE_SIDES = ("left", "right", "middle")
TRUNCATE_KEY = "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side"

log = logging.getLogger(__name__)


def truncate_tool_response(text: str, max_length: int, side: str) -> str:
  """`text` cut to `max_length` characters as verl cuts tool responses.

  "left" keeps the start (+ "...(truncated)"), "right" the end ("(truncated)..." +),
  "middle" both halves around "\\n...(truncated)...\\n". Text no longer than
  max_length is returned unchanged.

  Raises:
    ValueError: an unknown side, naming TRUNCATE_KEY and the choices.
  """
  check_truncate_side(side)
  if len(text) <= max_length:
    return text
  if side == "left":
    return text[:max_length] + "...(truncated)"
  if side == "right":
    return "(truncated)..." + text[-max_length:]
  half = max_length // 2
  return text[:half] + "\n...(truncated)...\n" + (text[-half:] if half else "")


def check_truncate_side(side: str) -> None:
  """Raises ValueError naming TRUNCATE_KEY and the choices unless `side` is one of TRUNCATE_SIDES."""
  if side not in TRUNCATE_SIDES:
    raise ValueError(f"{TRUNCATE_KEY}={side!r} is not a truncation side. "
                     f"Fix: use one of {', '.join(TRUNCATE_SIDES)}")


@dataclasses.dataclass
class ToolOutcome:
  """The result of one call.

  Attributes:
    name: the called tool ("" for a call without a name).
    text: the tool turn's content (truncated).
    reward: the step reward execute returned (0.0 on error).
    metrics: execute's metrics dict ({} on error).
    error: None, or "timeout", "exception: Type: message", "malformed: ...",
      "unknown tool ...", "bad result: ...", "not started: ...", "too many calls: ...".
    seconds: wall time of the call (0.0 when nothing ran).
  """
  name: str
  text: str
  reward: float = 0.0
  metrics: dict = dataclasses.field(default_factory=dict)
  error: str | None = None
  seconds: float = 0.0


def tool_messages(outcomes: list[ToolOutcome]) -> list[dict]:
  """The chat messages of a turn's outcomes: [{"role": "tool", "name": ..., "content": text}]."""
  return [{"role": "tool", "name": o.name, "content": o.text} for o in outcomes]


class _Timeout(Exception):
  """A user method ran past its timeout."""


_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _event_loop() -> asyncio.AbstractEventLoop:
  """The shared event loop for async user methods, started on first use on a daemon thread."""
  global _loop
  with _loop_lock:
    if _loop is None:
      loop = asyncio.new_event_loop()
      threading.Thread(target=loop.run_forever, name="rljax-agents-loop", daemon=True).start()
      _loop = loop
    return _loop


def _start(method: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
  """Starts method(*args, **kwargs) off the calling thread; a future of its (awaited) result."""
  future: concurrent.futures.Future = concurrent.futures.Future()
  if inspect.iscoroutinefunction(method):
    try:
      coroutine = method(*args, **kwargs)
    except Exception as e:  # e.g. a TypeError for arguments the signature does not take
      future.set_exception(e)
      return future
    return asyncio.run_coroutine_threadsafe(coroutine, _event_loop())

  def run() -> None:
    try:
      result = method(*args, **kwargs)
      if inspect.isawaitable(result):
        result = asyncio.run_coroutine_threadsafe(_awaited(result), _event_loop()).result()
    except Exception as e:
      _settle(future.set_exception, e)
    except BaseException as e:  # SystemExit from user code: an error of the call, not of the process
      _settle(future.set_exception, RuntimeError(f"the call raised {_describe(e)}"))
    else:
      _settle(future.set_result, result)

  threading.Thread(target=run, name=f"rljax-agents-{getattr(method, '__name__', 'call')}",
                   daemon=True).start()
  return future


async def _awaited(awaitable: Any) -> Any:
  return await awaitable


def _settle(setter: Callable[[Any], None], value: Any) -> None:
  """future.set_result / set_exception(value), unless the waiter gave up on (cancelled) the future."""
  try:
    setter(value)
  except concurrent.futures.InvalidStateError:
    pass


def _wait(future: concurrent.futures.Future, deadline: float) -> Any:
  """The future's result by `deadline` (time.monotonic()); raises _Timeout and cancels it after."""
  try:
    return future.result(timeout=max(0.0, deadline - time.monotonic()))
  except concurrent.futures.TimeoutError:
    future.cancel()
    raise _Timeout() from None


def _call(method: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> Any:
  """method(*args, **kwargs) (sync or async), raising _Timeout after timeout_s seconds."""
  return _wait(_start(method, *args, **kwargs), time.monotonic() + timeout_s)


def _describe(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


class ToolSession:
  """One conversation's tool instances (verl's create -> execute* -> calc_reward -> release).

  Args:
    tools: {name: tool object} offered in this conversation.
    tools_kwargs: the row's tools_kwargs, {name: {"create_kwargs": {...},
      "execute_kwargs": {...}, "calc_reward_kwargs": {...}, "release_kwargs": {...}}};
      a tool it does not name gets no extra kwargs.
    executor: runs submit's coordinating tasks (any concurrent.futures.Executor).
    timeout_s: the limit of each method call, in seconds.
    max_parallel_calls: calls run concurrently per turn; later ones are answered with an error.
    max_response_length: tool turn texts are truncated to this many characters.
    truncate_side: "left", "right" or "middle" (see truncate_tool_response).

  Attributes:
    errors: every failure so far, as "tool name: error" strings (for logging / metrics).
  """

  def __init__(self, tools: dict[str, Any], tools_kwargs: dict | None,
               executor: concurrent.futures.Executor, timeout_s: float, max_parallel_calls: int,
               max_response_length: int, truncate_side: str):
    check_truncate_side(truncate_side)
    if max_parallel_calls < 1:
      raise ValueError("actor_rollout_ref.rollout.multi_turn.max_parallel_calls="
                       f"{max_parallel_calls!r}: must be at least 1")
    self.tools = dict(tools)
    self.tools_kwargs = dict(tools_kwargs or {})
    self.executor = executor
    self.timeout_s = float(timeout_s)
    self.max_parallel_calls = int(max_parallel_calls)
    self.max_response_length = int(max_response_length)
    self.truncate_side = truncate_side
    self.errors: list[str] = []
    self._instances: dict[str, str] = {}
    self._failed: dict[str, str] = {}
    self._lock = threading.Lock()

  def _kwargs(self, name: str, which: str) -> dict:
    """tools_kwargs[name][which] ({} when absent)."""
    return dict((self.tools_kwargs.get(name) or {}).get(which) or {})

  def _record(self, name: str, error: str, level: int = logging.WARNING) -> None:
    """Logs a failure and adds it to `errors`."""
    with self._lock:
      self.errors.append(f"{name}: {error}")
    log.log(level, "tool %s: %s", name, error)

  def start(self) -> None:
    """Creates an instance of every tool (concurrently), blocking until done or timed out.

    A tool whose create raises or times out is not started: its calls are
    answered with a "not started" error and finish() skips it.
    """
    deadline = time.monotonic() + self.timeout_s
    pending = {}
    for name, tool in self.tools.items():
      instance_id = uuid.uuid4().hex
      pending[name] = (instance_id, _start(tool.create, instance_id,
                                           **self._kwargs(name, "create_kwargs")))
    for name, (instance_id, future) in pending.items():
      try:
        result = _wait(future, deadline)
      except _Timeout:
        self._fail_start(name, f"create timed out after {self.timeout_s:g} s")
        continue
      except Exception as e:
        self._fail_start(name, f"create raised {_describe(e)}")
        continue
      created = result[0] if isinstance(result, tuple) and result else result
      self._instances[name] = created if isinstance(created, str) else instance_id

  def _fail_start(self, name: str, error: str) -> None:
    self._failed[name] = error
    self._record(name, error)

  def submit(self, calls: list[ToolCall]) -> concurrent.futures.Future:
    """Runs a turn's calls; a future of their outcomes, list[ToolOutcome] in call order."""
    return self.executor.submit(self.run_calls, list(calls))

  def run_calls(self, calls: list[ToolCall]) -> list[ToolOutcome]:
    """submit's work, in the calling thread: the first max_parallel_calls calls run concurrently."""
    deadline = time.monotonic() + self.timeout_s
    started = [self._begin(call) if i < self.max_parallel_calls else None
               for i, call in enumerate(calls)]
    outcomes = []
    for i, (call, begun) in enumerate(zip(calls, started)):
      if i >= self.max_parallel_calls:
        outcome = self._refuse(call, f"too many calls: only {self.max_parallel_calls} run per turn")
      elif isinstance(begun, ToolOutcome):
        outcome = begun
      else:
        outcome = self._finish_call(call, *begun, deadline)
      outcome.text = truncate_tool_response(outcome.text, self.max_response_length, self.truncate_side)
      outcomes.append(outcome)
    return outcomes

  def _begin(self, call: ToolCall) -> ToolOutcome | tuple[concurrent.futures.Future, float]:
    """Starts a call: (future, start time), or the outcome of a call that cannot run."""
    if call.error is not None:
      prefix = "" if call.error.startswith("unknown tool") else "malformed: "
      return self._refuse(call, prefix + call.error)
    if call.name not in self.tools:
      return self._refuse(call, f"unknown tool {call.name!r}; the tools are: "
                          f"{', '.join(self.tools) or 'none'}")
    if call.name in self._failed:
      return self._refuse(call, f"not started: {self._failed[call.name]}")
    if call.name not in self._instances:
      return self._refuse(call, "not started: ToolSession.start() was not called")
    tool = self.tools[call.name]
    return (_start(tool.execute, self._instances[call.name], dict(call.arguments or {}),
                   **self._kwargs(call.name, "execute_kwargs")), time.monotonic())

  def _finish_call(self, call: ToolCall, future: concurrent.futures.Future, began: float,
                   deadline: float) -> ToolOutcome:
    """Waits for a started call; its outcome."""
    try:
      result = _wait(future, deadline)
    except _Timeout:
      return self._refuse(call, "timeout", f"Error: tool {call.name} timed out after "
                          f"{self.timeout_s:g} s", seconds=time.monotonic() - began)
    except Exception as e:
      return self._refuse(call, f"exception: {_describe(e)}", _describe(e),
                          seconds=time.monotonic() - began)
    seconds = time.monotonic() - began
    try:
      text, reward, metrics = _execute_result(result)
    except (TypeError, ValueError) as e:
      return self._refuse(call, f"bad result: {e}", seconds=seconds)
    return ToolOutcome(call.name, text, reward, metrics, None, seconds)

  def _refuse(self, call: ToolCall, error: str, text: str | None = None,
              seconds: float = 0.0) -> ToolOutcome:
    """An error outcome (recorded; the model's own mistakes, counted in the rollout's metrics, are logged at debug
    level only); the model sees `text` (default "Error: <error>")."""
    model_error = error.startswith(("malformed", "unknown tool", "too many calls"))
    self._record(call.name or "<no name>", error, logging.DEBUG if model_error else logging.WARNING)
    return ToolOutcome(call.name, f"Error: {error}" if text is None else text, 0.0, {}, error, seconds)

  def finish(self) -> dict[str, float]:
    """calc_reward then release for every started instance; {tool name: reward}.

    All calc_reward calls run concurrently, then all release calls (each phase
    blocks up to timeout_s). A failing or timed-out calc_reward scores 0.0;
    failures are logged and added to `errors`, never raised. Tools that never
    started are left out.
    """
    rewards = self._each_instance("calc_reward", "calc_reward_kwargs")
    self._each_instance("release", "release_kwargs")
    self._instances.clear()
    return {name: self._as_reward(name, r) for name, r in rewards.items()}

  def _as_reward(self, name: str, value: Any) -> float:
    """calc_reward's result as a float; 0.0 for None (a recorded failure) or a non-number (recorded)."""
    try:
      return 0.0 if value is None else float(value)
    except (TypeError, ValueError):
      self._record(name, f"calc_reward returned {value!r:.100}, not a number")
      return 0.0

  def _each_instance(self, method: str, kwargs_key: str) -> dict[str, Any]:
    """{tool name: result of tool.<method>(instance_id, **kwargs)} over the started instances,
    run concurrently; a failure is recorded and gives None."""
    deadline = time.monotonic() + self.timeout_s
    started = {name: _start(getattr(self.tools[name], method), instance_id,
                            **self._kwargs(name, kwargs_key))
               for name, instance_id in self._instances.items()}
    results = {}
    for name, future in started.items():
      try:
        results[name] = _wait(future, deadline)
      except _Timeout:
        results[name] = self._record(name, f"{method} timed out after {self.timeout_s:g} s")
      except Exception as e:
        results[name] = self._record(name, f"{method} raised {_describe(e)}")
    return results


def _execute_result(result: Any) -> tuple[str, float, dict]:
  """(text, reward, metrics) of execute's return value (ToolResponse | str, float, dict).

  Raises:
    TypeError / ValueError: a result of another shape, or a response with images / video.
  """
  if not isinstance(result, tuple) or len(result) != 3:
    raise TypeError(f"execute must return (response, reward, metrics), got {result!r:.200}")
  response, reward, metrics = result
  if response is None or isinstance(response, str):
    text = response or ""
  elif hasattr(response, "text"):
    if getattr(response, "image", None) or getattr(response, "video", None):
      raise ValueError("the response holds images or video, which rljax's text rollout cannot show")
    text = response.text or ""
  else:
    raise TypeError(f"the response must be a ToolResponse or str, got {type(response).__name__}")
  if not isinstance(metrics, dict) and metrics is not None:
    raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
  return str(text), float(reward or 0.0), dict(metrics or {})


class InteractionTurn(NamedTuple):
  """An interaction's reply to the model's turn (verl's generate_response tuple).

  `extra["error"]` holds the failure when the interaction raised or timed out
  (then terminate is True, text "" and score 0.0).
  """
  terminate: bool
  text: str
  score: float
  extra: dict


class InteractionSession:
  """One conversation with a simulated user (verl's BaseInteraction lifecycle).

  Args:
    interaction: the interaction object (see rljax.agents.interactions).
    interaction_kwargs: the row's interaction_kwargs, passed to
      start_interaction and generate_response.
    executor: runs submit's coordinating tasks.
    timeout_s: the limit of each method call, in seconds.

  Attributes:
    errors: every failure so far, as strings.
  """

  def __init__(self, interaction: Any, interaction_kwargs: dict | None,
               executor: concurrent.futures.Executor, timeout_s: float):
    self.interaction = interaction
    self.interaction_kwargs = dict(interaction_kwargs or {})
    self.executor = executor
    self.timeout_s = float(timeout_s)
    self.errors: list[str] = []
    self.instance_id: str | None = None
    self._failed = False

  def _record(self, error: str) -> None:
    self.errors.append(error)
    log.warning("interaction %s: %s", getattr(self.interaction, "name", "?"), error)

  def start(self) -> None:
    """start_interaction(instance_id, **interaction_kwargs), blocking; a failure is recorded and
    every later submit then terminates the conversation."""
    instance_id = uuid.uuid4().hex
    try:
      created = _call(self.interaction.start_interaction, self.timeout_s, instance_id,
                      **self.interaction_kwargs)
    except _Timeout:
      return self._fail_start(f"start_interaction timed out after {self.timeout_s:g} s")
    except Exception as e:
      return self._fail_start(f"start_interaction raised {_describe(e)}")
    self.instance_id = created if isinstance(created, str) else instance_id

  def _fail_start(self, error: str) -> None:
    self._failed = True
    self._record(error)

  def submit(self, messages: list[dict]) -> concurrent.futures.Future:
    """A future of the InteractionTurn for the conversation so far (messages in chat format)."""
    return self.executor.submit(self.respond, list(messages))

  def respond(self, messages: list[dict]) -> InteractionTurn:
    """submit's work, in the calling thread."""
    if self._failed or self.instance_id is None:
      why = self.errors[0] if self.errors else "InteractionSession.start() was not called"
      return InteractionTurn(True, "", 0.0, {"error": f"not started: {why}"})
    try:
      result = _call(self.interaction.generate_response, self.timeout_s, self.instance_id,
                     messages, **self.interaction_kwargs)
    except _Timeout:
      return self._fail_turn(f"generate_response timed out after {self.timeout_s:g} s")
    except Exception as e:
      return self._fail_turn(f"generate_response raised {_describe(e)}")
    try:
      terminate, text, score, extra = result
      return InteractionTurn(bool(terminate), str(text or ""), float(score or 0.0), dict(extra or {}))
    except (TypeError, ValueError):
      return self._fail_turn("bad result: generate_response must return (should_terminate, "
                             f"response text, score, extra dict), got {result!r:.200}")

  def _fail_turn(self, error: str) -> InteractionTurn:
    """The turn that ends the conversation after a failure (recorded)."""
    self._record(error)
    return InteractionTurn(True, "", 0.0, {"error": error})

  def finish(self) -> float:
    """calculate_score then finalize_interaction; the score (0.0 if it failed or never started)."""
    if self.instance_id is None:
      return 0.0
    score = 0.0
    try:
      score = float(_call(self.interaction.calculate_score, self.timeout_s, self.instance_id))
    except _Timeout:
      self._record(f"calculate_score timed out after {self.timeout_s:g} s")
    except Exception as e:
      self._record(f"calculate_score raised {_describe(e)}")
    try:
      _call(self.interaction.finalize_interaction, self.timeout_s, self.instance_id)
    except _Timeout:
      self._record(f"finalize_interaction timed out after {self.timeout_s:g} s")
    except Exception as e:
      self._record(f"finalize_interaction raised {_describe(e)}")
    self.instance_id = None
    return score
