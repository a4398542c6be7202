"""Multi-turn rollouts with tools: verl's tool agent loop over the engine's decode slots.

Each request (prompt p, sample j) is a conversation. Its slot decodes an
assistant turn until the model's end-of-turn id; the host then parses the
turn for tool calls (`rljax.agents.parsing`, in multi_turn.format) and runs
them on threads (`rljax.agents.runner`), or asks the row's interaction (a
simulated user) for its answer. The answer's turns are rendered by the
chat template (`rljax.agents.render.appended_ids`) and appended to the
slot's cache in place (`Engine.append`): nothing already cached is
recomputed. The other slots decode meanwhile: a turn that ends in decode
call k has its answer taken (waited for, if the tools are still running)
before call k + 2, so the tools run beside call k + 1, and the schedule,
hence every sampled token, does not depend on how fast the tools are (a
rollout is reproducible for a given key). A slot is refilled only when its
conversation has ended (continuous batching).

A conversation ends when a turn has no tool call (and no interaction
continues it), when the interaction ends it (its last message kept, as
verl keeps it), at max_assistant_turns / max_user_turns, when an answer
would not fit in response_length (verl drops it and ends there), or when
the response reaches response_length.

The response of a row is all its turns after the prompt, as ids: exactly
the ids the engine generated and appended (never re-tokenised).
`response_mask` is 1 on generated ids and 0 on appended ones (verl's
convention), so losses, KL and advantages count only the policy's tokens;
`response_lengths` covers every id, so the trainer attends to the tool
turns.

The loop is a decode stream (`ConversationStream`, requests that are
`Conversation`s): `AgentSampler.generate` runs one batch through it, and
the asynchronous trainer (`rljax.rl.streaming`) keeps one open across its
updates, so a conversation may continue under new weights.

Rows pick their agent with `agent_name` (verl's column), else
`rollout.agent.default_agent_loop`: `tool_agent` runs this loop,
`single_turn_agent` ends after the first turn.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from rljax.agents import interactions as interactions_lib
from rljax.agents import function_tools, parsing, render, runner, tools as tools_lib
from rljax.config.choices import AGENT_LOOPS
from rljax.rollout import decode_state, engine as engine_lib
from rljax.rollout import sampling
from rljax.rollout import stream as stream_lib
from rljax.rollout.sampler import Rollout, RolloutSampler
from rljax.sharding import hosts

_LOG = logging.getLogger("rljax.rollout")
ENDINGS = ("answer", "length", "assistant_turns", "user_turns", "interaction")
APPEND_BUCKETS = (16, 64)


def append_buckets(response_length: int) -> tuple[int, ...]:
  """The chunk lengths a multi-turn engine appends in (longer answers go in several chunks)."""
  return tuple(sorted({min(b, response_length) for b in APPEND_BUCKETS}))


@dataclasses.dataclass(frozen=True)
class AgentSettings:
  """What the tool agent loop reads from `actor_rollout_ref.rollout.multi_turn` and `.agent`.

  Attributes:
    tools: name -> tool object (verl's BaseTool interface).
    tool_schemas: their OpenAI function schemas (the chat template's `tools`).
    interactions: name -> interaction object (verl's BaseInteraction).
    format: tool-call format.
    max_assistant_turns, max_user_turns: limits, None for none.
    max_parallel_calls: calls run per turn.
    max_tool_response_length: characters kept of a tool's answer.
    truncate_side: left, middle or right.
    timeout_s: seconds a call or an interaction answer may take.
    sanity_check_mode: strict, ignore_strippable or disable.
    default_agent: agent of rows without agent_name.
  """

  tools: Mapping[str, Any]
  tool_schemas: Sequence[dict] | None
  interactions: Mapping[str, Any]
  format: str = "hermes"
  max_assistant_turns: int | None = None
  max_user_turns: int | None = None
  max_parallel_calls: int = 1
  max_tool_response_length: int = 256
  truncate_side: str = "middle"
  timeout_s: float = 30.0
  sanity_check_mode: str = "strict"
  default_agent: str = "single_turn_agent"

  @classmethod
  def from_config(cls, rollout: Any) -> "AgentSettings":
    """From a config's `actor_rollout_ref.rollout` node (tool and interaction files loaded and checked)."""
    node = rollout.multi_turn
    tools = tools_lib.tools_by_name(function_tools.load_all_tools(node.tool_config_path, node.function_tool_path))
    interactions = (interactions_lib.load_interaction_config(node.interaction_config_path)
                    if node.interaction_config_path else {})
    return cls(tools=tools, tool_schemas=[tools_lib.tool_schema_of(t) for t in tools.values()] or None,
               interactions=interactions, format=node.format, max_assistant_turns=node.max_assistant_turns,
               max_user_turns=node.max_user_turns, max_parallel_calls=node.max_parallel_calls,
               max_tool_response_length=node.max_tool_response_length,
               truncate_side=node.tool_response_truncate_side, timeout_s=node.tool_timeout_s,
               sanity_check_mode=node.tokenization_sanity_check_mode, default_agent=rollout.agent.default_agent_loop)


@dataclasses.dataclass
class Episode:
  """One conversation's host state (its ids are its `Conversation`'s).

  Attributes:
    messages: the chat so far (the prompt's messages, then every turn).
    turn_start: where the current assistant turn began in the response.
    pending: the tools' or the interaction's answer being computed.
    ended: why the conversation ended (one of ENDINGS), or None.
    checked: whether its ids were checked against the chat template (`AgentSampler.assemble`).
  """

  agent: str
  messages: list[dict[str, Any]]
  tools: runner.ToolSession | None
  interaction: runner.InteractionSession | None
  turn_start: int = 0
  assistant_turns: int = 0
  user_turns: int = 0
  tool_calls: int = 0
  tool_errors: int = 0
  tool_step_reward: float = 0.0
  interaction_scores: list[float] = dataclasses.field(default_factory=list)
  pending: concurrent.futures.Future | None = None
  ended: str | None = None
  closing: concurrent.futures.Future | None = None
  reward_scores: dict[str, Any] = dataclasses.field(default_factory=dict)
  tokenization_mismatch: str | None = None
  checked: bool = False


@dataclasses.dataclass(eq=False)
class Conversation(stream_lib.Request):
  """A request that is a conversation: its response holds every turn after the prompt.

  Attributes:
    messages: the prompt's chat messages (what the prompt ids render).
    extra_info: its row's extra_info (tools_kwargs, interaction_kwargs), agent_name: its row's agent.
    mask: [R] 1 on ids the policy generated, 0 on appended ones (and past the end).
    episode: the conversation's host state, from when it enters a slot.
  """

  messages: Sequence[Mapping[str, Any]] = ()
  extra_info: Any = None
  agent_name: Any = None
  mask: np.ndarray | None = None
  episode: Episode | None = None

  def ids(self, start: int = 0) -> list[int]:
    """The response's ids from `start` on."""
    return self.tokens[start:self.length].tolist()


@dataclasses.dataclass
class AgentRollout(Rollout):
  """A Rollout of conversations; `response_mask` is 0 on tool and interaction ids.

  Attributes:
    episodes: [B * n] each row's conversation (messages, counts, rewards).
    metrics: verl's multi-turn metrics of the rollout (num_turns/*, tool calls, errors, endings).
  """

  episodes: list[Episode] = dataclasses.field(default_factory=list)

  @property
  def metrics(self) -> dict[str, float]:
    """Over every host's episodes (each host's per-episode counts, one number per row)."""
    counts = episode_counts(self.episodes, self.response_mask, self.response_lengths)
    every = hosts.process_concat(np.stack(list(counts.values()), axis=1))  # [B, K]: one exchange
    return {**self.stats, **rollout_metrics(dict(zip(counts, every.T)))}

  def extra_info(self, rows: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Each row's extra_info with verl's additions: num_turns and rollout_reward_scores (tools' calc_reward,
    interaction scores)."""
    rows = [None] * len(self.episodes) if rows is None else rows
    return [{**(dict(info) if isinstance(info, Mapping) else {}), "num_turns": episode_turns(e),
             "rollout_reward_scores": dict(e.reward_scores)} for info, e in zip(rows, self.episodes)]


def episode_turns(episode: Episode) -> int:
  """verl's num_turns: the prompt, each assistant turn and each user (tool or interaction) turn."""
  return 1 + episode.assistant_turns + episode.user_turns


def episode_counts(episodes: Sequence[Episode], response_mask: np.ndarray,
                   response_lengths: np.ndarray) -> dict[str, np.ndarray]:
  """[B] per-episode numbers the rollout's metrics come from: turns, tool calls and errors, assistant (mask 1) and
  user (appended) tokens of each response ([B, R] mask, [B] lengths), tokenization mismatches, and each ending (1
  where the episode ended so)."""
  assistant = np.asarray(response_mask).sum(-1)
  out = {"turns": [episode_turns(e) for e in episodes], "calls": [e.tool_calls for e in episodes],
         "errors": [e.tool_errors for e in episodes], "assistant": assistant,
         "user": np.asarray(response_lengths) - assistant,
         "mismatches": [e.tokenization_mismatch is not None for e in episodes]}
  out.update({f"ended/{ending}": [e.ended == ending for e in episodes] for ending in ENDINGS})
  return {k: np.asarray(v, np.float64) for k, v in out.items()}


def rollout_metrics(counts: dict[str, np.ndarray]) -> dict[str, float]:
  """verl's num_turns/{min,max,mean} and the tool agent's counts over a rollout's episodes (`episode_counts`,
  every host's)."""
  turns, calls = counts["turns"], counts["calls"]
  out = {"num_turns/min": float(turns.min()), "num_turns/max": float(turns.max()),
         "num_turns/mean": float(turns.mean()),
         "multi_turn/tool_calls/mean": float(calls.mean()), "multi_turn/tool_calls/max": float(calls.max()),
         "multi_turn/tool_call_rate": float(np.mean(calls > 0)),
         "multi_turn/tool_errors": float(counts["errors"].sum()),
         "multi_turn/assistant_tokens/mean": float(counts["assistant"].mean()),
         "multi_turn/user_tokens/mean": float(counts["user"].mean()),
         "multi_turn/tokenization_mismatches": float(counts["mismatches"].sum())}
  for ending in ENDINGS:
    out[f"multi_turn/ended/{ending}"] = float(counts[f"ended/{ending}"].mean())
  return out


class AgentSampler(RolloutSampler):
  """The RL sampler for multi-turn rows: `generate` runs each request as a conversation (see the module doc); its
  `rows` hold each prompt's raw_prompt (the chat messages its ids render; required), extra_info (tools_kwargs,
  interaction_kwargs) and agent_name."""

  def __init__(self, engine: engine_lib.Engine, pad_id: int, tokenizer: Any, settings: AgentSettings,
               steps_per_sync: int = 8, free_cache: bool = True):
    """Args as RolloutSampler's; tokenizer renders and parses turns; settings from `AgentSettings.from_config`.

    The engine needs `append_buckets` (`append_buckets(response_length)`).
    """
    super().__init__(engine, pad_id, steps_per_sync, free_cache)
    if not engine.append_buckets:
      raise ValueError("a multi-turn sampler needs an engine built with append_buckets")
    self.tokenizer = tokenizer
    self.settings = settings
    self._executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(4, engine.max_concurrent_decodes * settings.max_parallel_calls),
        thread_name_prefix="rljax-tools")

  # ----- one conversation -----------------------------------------------------------------

  def _start(self, conversation: Conversation) -> None:
    """Starts `conversation`'s episode (its tools created, its interaction started)."""
    info = conversation.extra_info if isinstance(conversation.extra_info, Mapping) else {}
    agent = str(conversation.agent_name) if conversation.agent_name else self.settings.default_agent
    if agent not in AGENT_LOOPS:
      raise ValueError(f"a row's agent_name is {agent!r}; rljax runs {' and '.join(AGENT_LOOPS)} (custom agent loops are "
                       "not implemented): fix the data's agent_name column")
    tools = interaction = None
    kwargs = info.get("interaction_kwargs") or {}
    chosen = (interactions_lib.select_interaction(self.settings.interactions, kwargs)  # raises before any tool exists
              if agent == "tool_agent" and kwargs and self.settings.interactions else None)  # verl's rows carry them
    if agent == "tool_agent" and self.settings.tools:
      tools = runner.ToolSession(
          dict(self.settings.tools), info.get("tools_kwargs") or {}, self._executor, self.settings.timeout_s,
          self.settings.max_parallel_calls, self.settings.max_tool_response_length, self.settings.truncate_side)
      tools.start()
    if chosen is not None:
      interaction = runner.InteractionSession(chosen, kwargs, self._executor, self.settings.timeout_s)
      interaction.start()
    conversation.episode = Episode(agent=agent, messages=[dict(m) for m in conversation.messages], tools=tools,
                                   interaction=interaction)

  def _turn_text(self, ids: Sequence[int]) -> str:
    """An assistant turn's text without its end-of-turn id."""
    if ids and ids[-1] in self.engine.eos_ids:
      ids = ids[:-1]
    return self.tokenizer.decode(list(ids), skip_special_tokens=False)

  def end_turn(self, conversation: Conversation) -> None:
    """The slot's turn is over: record it and either end the conversation or ask the tools / interaction."""
    episode, turn = conversation.episode, conversation.ids(conversation.episode.turn_start)
    episode.assistant_turns += 1
    text = self._turn_text(turn)
    episode.messages.append({"role": "assistant", "content": text})
    settings = self.settings
    ended_on_eos = bool(turn) and turn[-1] in self.engine.eos_ids
    if conversation.length >= self.engine.max_decode_length or not ended_on_eos:
      return self._finish(episode, "length")
    if episode.agent != "tool_agent":
      return self._finish(episode, "answer")
    if settings.max_assistant_turns and episode.assistant_turns >= settings.max_assistant_turns:
      return self._finish(episode, "assistant_turns")
    calls = []
    if episode.tools is not None:
      _, calls = parsing.parse_tool_calls(text, settings.format, {name: tools_lib.tool_schema_of(tool)
                                                                  for name, tool in settings.tools.items()})
    if not calls and episode.interaction is None:
      return self._finish(episode, "answer")
    if settings.max_user_turns and episode.user_turns >= settings.max_user_turns:
      return self._finish(episode, "user_turns")
    if calls:
      episode.tool_calls += len(calls)
      episode.pending = episode.tools.submit(calls)
    else:
      episode.pending = episode.interaction.submit(list(episode.messages))

  def answer(self, conversation: Conversation) -> list[int] | None:
    """The ids appended to `conversation` once its episode's pending answer is done (written into its response,
    mask 0), or None: the conversation ended instead."""
    episode = conversation.episode
    result, episode.pending = episode.pending.result(), None
    terminate = False
    if isinstance(result, runner.InteractionTurn):
      terminate, text, score, _ = result
      episode.interaction_scores.append(float(score))
      new = [{"role": "user", "content": text}]
    else:
      episode.tool_errors += sum(o.error is not None for o in result)
      episode.tool_step_reward += float(sum(o.reward for o in result))
      new = runner.tool_messages(result)
    ids = render.appended_ids(self.tokenizer, episode.messages, new, self.settings.tool_schemas)
    start = conversation.length
    if start + len(ids) >= self.engine.max_decode_length:
      self._finish(episode, "length")
      return None
    episode.user_turns += 1
    episode.messages.extend(new)
    conversation.tokens[start:start + len(ids)] = ids
    conversation.length = episode.turn_start = start + len(ids)
    if terminate:  # verl keeps the interaction's last message, then ends
      self._finish(episode, "interaction")
      return None
    return ids

  def _finish(self, episode: Episode, why: str) -> None:
    """Ends the conversation; its tools and interaction close on a thread (`_close`), joined by `assemble`."""
    episode.ended = why
    episode.closing = self._executor.submit(self._close, episode)

  def abandon(self, conversations: Sequence[Conversation]) -> list[concurrent.futures.Future]:
    """Ends the started conversations of `conversations` that have not ended (a failed or cancelled rollout);
    returns the futures of every started one's closing (its tools and interaction released)."""
    started = [c.episode for c in conversations if c.episode is not None]
    for episode in started:
      if episode.ended is None:
        self._finish(episode, "length")
    return [e.closing for e in started]

  @staticmethod
  def _close(episode: Episode) -> None:
    """Tools score (calc_reward) and release their instances, the interaction scores and finalizes: verl's
    rollout_reward_scores ({tool: reward}, "user_turn_rewards", and rljax's "interaction" and "tool_steps").
    A turn's calls still running (an abandoned conversation's) end first: each runs at most multi_turn's
    tool_timeout_s."""
    if episode.pending is not None:
      concurrent.futures.wait([episode.pending])
    if episode.tools is not None:
      episode.reward_scores.update(episode.tools.finish())
    if episode.interaction is not None:
      episode.reward_scores["interaction"] = float(episode.interaction.finish())
    if episode.interaction_scores:
      episode.reward_scores["user_turn_rewards"] = list(episode.interaction_scores)
    if episode.tool_step_reward:
      episode.reward_scores["tool_steps"] = episode.tool_step_reward

  # ----- the rollout ----------------------------------------------------------------------

  def append(self, params, state: decode_state.DecodeState, pending: dict[int, list[int]]) -> decode_state.DecodeState:
    """Appends each slot's ids, in chunks of the largest append bucket."""
    width = self.engine.append_buckets[-1]
    while pending:
      state = self.engine.append(params, state, {s: ids[:width] for s, ids in pending.items()})
      pending = {s: ids[width:] for s, ids in pending.items() if len(ids) > width}
    return state

  def start_all(self, conversations: Sequence[Conversation]) -> None:
    """Starts the episodes of conversations entering slots, on the tool threads; raises the first failure once
    every start has returned (so each started episode is attached to its conversation)."""
    starts = [self._executor.submit(self._start, c) for c in conversations]
    concurrent.futures.wait(starts)
    for start in starts:
      start.result()

  def open_stream(self, state: decode_state.DecodeState | None = None,
                  sampling_params: sampling.SamplingParams | None = None) -> "ConversationStream":
    return ConversationStream(self, state, sampling_params)

  def new_request(self, request_id: int, group: int, prompt: np.ndarray, key: jax.Array, width: int,
                  columns: Mapping[str, Any] | None = None) -> Conversation:
    """A conversation answering `prompt`; `columns` (its prompt's data columns) hold its chat messages
    (raw_prompt), extra_info and agent_name."""
    columns = columns or {}
    if "raw_prompt" not in columns:
      raise ValueError("multi-turn rollouts need each prompt's chat messages: set data.return_raw_chat=true")
    request = stream_lib.new_request(self.engine, self.pad_id, request_id, group, prompt, key, width)
    return Conversation(**{f.name: getattr(request, f.name) for f in dataclasses.fields(request)},
                        messages=list(columns["raw_prompt"]), extra_info=columns.get("extra_info"),
                        agent_name=columns.get("agent_name"), mask=np.zeros(len(request.tokens), np.int32))

  def _prompt_renders(self, conversation: Conversation) -> bool:
    """Whether a prompt's ids are its messages' chat-template rendering (they are not where data.truncation cut
    them: the sanity check then has nothing to compare)."""
    text = render.render(self.tokenizer, list(conversation.messages), True, self.settings.tool_schemas)
    return list(conversation.prompt) == list(self.tokenizer.encode(text, add_special_tokens=False))

  def assemble(self, conversations: Sequence[Conversation], metrics: dict[str, float] | None = None) -> AgentRollout:
    """The rollout of ended `conversations` (row i from conversations[i]; prompt_index: each one's group), each
    checked against the chat template (tokenization_sanity_check_mode)."""
    renders: dict[int, bool] = {}  # group -> whether its prompt ids are its messages' rendering
    unchecked = [c for c in conversations if not c.episode.checked]  # a judged group was checked when judged
    for c in unchecked:
      episode = c.episode
      episode.closing.result()  # a tool's calc_reward or release that raised
      episode.checked = True
      if (episode.ended != "length" and c.length and c.mask[c.length - 1]  # a rendering ends after the model's turn
          and renders.setdefault(c.group, self._prompt_renders(c))):
        episode.tokenization_mismatch = render.sanity_check(
            self.tokenizer, episode.messages, self.settings.tool_schemas, list(c.prompt) + c.ids(),
            self.settings.sanity_check_mode)
    mismatched = [c.episode.tokenization_mismatch for c in unchecked if c.episode.tokenization_mismatch]
    if mismatched:
      _LOG.warning("%d of %d conversations do not re-tokenise to the ids trained on "
                   "(multi_turn.tokenization_sanity_check_mode=%s); the first: %s", len(mismatched),
                   len(unchecked), self.settings.sanity_check_mode, mismatched[0])
    return AgentRollout(responses=np.stack([c.tokens for c in conversations]),
                        response_mask=np.stack([c.mask for c in conversations]),
                        response_lengths=np.asarray([c.length for c in conversations], np.int32),
                        log_probs=np.stack([c.log_probs for c in conversations]),
                        prompt_index=np.asarray([c.group for c in conversations], np.int64),
                        truncated=np.asarray([c.episode.ended == "length" for c in conversations]),
                        versions=np.stack([c.versions for c in conversations]), stats=dict(metrics or {}),
                        episodes=[c.episode for c in conversations])

  def close(self) -> None:
    """Stops the tool threads (a call still hanging past its timeout is abandoned)."""
    self._executor.shutdown(wait=False, cancel_futures=True)


class ConversationStream(stream_lib.DecodeStream):
  """A decode stream whose requests are conversations (`Conversation`).

  A slot whose turn ends waits for its tools' or interaction's answer, taken
  after one more decode chunk of the other slots (at once when no other slot
  decodes), appended to its cache in place, and decodes the next turn; the
  slot is freed when the conversation ends. Across `set_params` a
  conversation continues under the new weights: its appended ids are
  cached by the weights of the moment, and the first token after them
  records that version.
  """

  def __init__(self, agent: AgentSampler, state: decode_state.DecodeState | None = None,
               sampling_params: sampling.SamplingParams | None = None):
    super().__init__(agent.engine, agent.pad_id, agent.steps_per_sync, state, sampling_params)
    self.agent = agent
    self.waiting: dict[int, int] = {}  # slot -> decode steps run when its turn ended
    self.started: list[Conversation] = []  # entered a slot, and not yet closed

  def _between_chunks(self) -> list[stream_lib.Request]:
    """Takes the answers that are due (appending them, or ending their conversations), refills the free slots and
    starts their conversations; returns the conversations that ended on an answer."""
    ended, appends = [], {}
    others_decode = len(self.waiting) < len(self.slots)
    for slot, asked in list(self.waiting.items()):
      if others_decode and asked == self.decode_steps:
        continue
      del self.waiting[slot]
      ids = self.agent.answer(self.slots[slot])
      if ids is None:
        ended.append(self._release(slot))
      else:
        appends[slot] = ids
        self.slots[slot] = self.slots.pop(slot)  # decodes again: its chunk output is read after the others'
    entering = self.pending[:len(self.free)]
    super()._between_chunks()
    self.started = [c for c in self.started if not _closed(c)] + entering
    self.agent.start_all(entering)
    if appends:
      self.state = self.agent.append(self.params, self.state, appends)
      self.logits_version[list(appends)] = self.version
    return ended

  def _decoding(self) -> dict[int, stream_lib.Request]:
    return {slot: c for slot, c in self.slots.items() if slot not in self.waiting}

  def _record(self, slot: int, request: stream_lib.Request, out: Any) -> None:
    start = request.length
    super()._record(slot, request, out)
    request.mask[start:request.length] = 1

  def _ends(self, slot: int, request: stream_lib.Request) -> bool:
    """Ends the turn; the conversation ends with it, or its slot waits for the answer."""
    self.agent.end_turn(request)
    if request.episode.ended is not None:
      return True
    self.waiting[slot] = self.decode_steps
    return False

  def cancel(self, doomed: Callable[[stream_lib.Request], bool]) -> list[stream_lib.Request]:
    """As DecodeStream.cancel; the cancelled conversations end, their tools and interactions released on the tool
    threads (`close` waits for that)."""
    gone = super().cancel(doomed)
    self.waiting = {slot: asked for slot, asked in self.waiting.items() if slot in self.slots}
    self.agent.abandon(gone)
    return gone

  def finish(self) -> None:
    """Steps until every conversation has ended; on a failure, every conversation started is closed first."""
    try:
      super().finish()
    except BaseException:
      self.close()
      raise

  def close(self) -> None:
    """Cancels every conversation and waits until each one started has released its tools and interaction."""
    self.cancel(lambda request: True)
    concurrent.futures.wait(self.agent.abandon(self.started))
    self.started = []


def _closed(conversation: Conversation) -> bool:
  """Whether `conversation` ended and released its tools and interaction."""
  closing = conversation.episode.closing if conversation.episode is not None else None
  return closing is not None and closing.done()


__all__ = ["APPEND_BUCKETS", "AgentRollout", "AgentSampler", "AgentSettings", "Conversation", "ConversationStream", "ENDINGS", "Episode", "append_buckets",
           "episode_turns", "rollout_metrics"]
