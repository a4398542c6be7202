"""The tool agent loop on the engine: scripted conversations (a table-driven model, real tools on threads)."""

import textwrap
import time

import jax
import numpy as np
import pytest

from rljax import sharding
from rljax.agents import runner
from rljax.algos import policy_loss
from rljax.rollout import SamplingParams, agent_loop, make_engine
from tests.rollout import chain

TOOLS_PY = textwrap.dedent('''
    import time

    class Lookup:
        def __init__(self, config, tool_schema):
            self.schema, self.created, self.released = tool_schema, [], []
        def get_openai_tool_schema(self):
            return self.schema
        def create(self, instance_id=None, **kwargs):
            self.created.append(kwargs)
            return instance_id
        def execute(self, instance_id, parameters, **kwargs):
            return "7", 0.5, {}
        def calc_reward(self, instance_id, **kwargs):
            return 1.0
        def release(self, instance_id, **kwargs):
            self.released.append(instance_id)

    class Boom(Lookup):
        def execute(self, instance_id, parameters, **kwargs):
            raise RuntimeError("the boom tool failed")

    class Sleepy(Lookup):
        def execute(self, instance_id, parameters, **kwargs):
            time.sleep(120)
            return "late", 0.0, {}

    class Chatty(Lookup):
        def execute(self, instance_id, parameters, **kwargs):
            return "".join(chr(97 + i % 26) for i in range(60)), 0.0, {}

    class TryAgain:
        def __init__(self, config):
            self.config, self.answers = config, {}
        def start_interaction(self, instance_id=None, **kwargs):
            self.answers[instance_id] = 0
            return instance_id
        def generate_response(self, instance_id, messages, **kwargs):
            self.answers[instance_id] += 1
            done = self.answers[instance_id] >= 2
            return done, "Correct." if done else "Wrong, try again.", float(done), {}
        def calculate_score(self, instance_id, **kwargs):
            return 2.0
        def finalize_interaction(self, instance_id, **kwargs):
            pass
''')


def schema(name):
  return (f"    tool_schema:\n      type: function\n      function:\n        name: {name}\n        description: {name}\n"
          f"        parameters: {{type: object, properties: {{key: {{type: string}}}}, required: []}}\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  return write_files(tmp_path_factory.mktemp("agent"))


def write_files(root):
  """(tool YAML, interaction YAML) in verl's formats under `root`, classes in a .py file next to them."""
  (root / "agent_tools.py").write_text(TOOLS_PY)
  tools = "tools:\n" + "".join(f"  - class_name: {root}/agent_tools.py:{cls}\n    config: {{type: native}}\n" + schema(name)
                               for name, cls in [("lookup", "Lookup"), ("boom", "Boom"), ("sleepy", "Sleepy"),
                                                 ("chatty", "Chatty")])
  (root / "tools.yaml").write_text(tools)
  (root / "interaction.yaml").write_text(f"interaction:\n  - name: try_again\n    class_name: {root}/agent_tools.py:TryAgain\n"
                                         "    config: {}\n")
  return str(root / "tools.yaml"), str(root / "interaction.yaml")


@pytest.fixture(scope="module")
def tok():
  return chain.tokenizer()


def settings(files, **kw):
  from rljax.agents import interactions, tools
  loaded = tools.tools_by_name(tools.load_tool_config(files[0]))
  return agent_loop.AgentSettings(tools=loaded, tool_schemas=None,
                                  interactions=interactions.load_interaction_config(files[1]),
                                  default_agent="tool_agent", **kw)


def sampler(tok, table, agent, response=48, greedy=True, slots=4, mesh=None, rules=None):
  model = chain.model(tok, table)
  engine = make_engine(model, max_concurrent_decodes=slots, prefill_buckets=(32,), max_decode_length=response,
                       eos_ids=(tok.eos_token_id,), sampling_params=SamplingParams(greedy=greedy), mesh=mesh,
                       rules=rules, append_buckets=agent_loop.append_buckets(response))
  return agent_loop.AgentSampler(engine, tok.pad_token_id, tok, agent, steps_per_sync=2), model


def prompts(tok, count, extra=None, agents=None):
  """count left-padded prompts (width 32) and their rows."""
  messages = [[{"role": "user", "content": f"q{i}"}] for i in range(count)]
  ids = np.full((count, 32), tok.pad_token_id, np.int32)
  mask = np.zeros((count, 32), np.int32)
  for i, m in enumerate(messages):
    row = tok.apply_chat_template(m, add_generation_prompt=True)
    ids[i, 32 - len(row):], mask[i, 32 - len(row):] = row, 1
  return ids, mask, {"raw_prompt": messages, "extra_info": extra or [{}] * count,
                     "agent_name": agents or ["tool_agent"] * count}


def generate(smp, model, tok, count, n=1, key=0, **rows):
  from flax import nnx
  ids, mask, columns = prompts(tok, count, **rows)
  return smp.generate(nnx.state(model, nnx.Param), ids, mask, n, jax.random.key(key), rows=columns)


def tool_turn(tok, text):
  """The ids the chat template puts between an assistant turn's end and the next assistant turn."""
  return tok.encode(f"\n<|im_start|>tool\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)


@pytest.mark.slow
def test_three_turns_mask_exactly_the_tool_tokens(files, tok):
  """call, tool, call, tool, call (max_assistant_turns=3): mask 1 on the 6 generated ids only; the policy loss's
  gradient is zero on every tool id."""
  start, call, eos = chain.start_id(tok), chain.phrase_id(tok, "lookup"), tok.eos_token_id
  smp, model = sampler(tok, {start: {call: 0.0}, call: {eos: 0.0}}, settings(files, max_assistant_turns=3))
  out = generate(smp, model, tok, 3)
  turn = tool_turn(tok, "7")
  expected = [call, eos] + turn + [call, eos] + turn + [call, eos]
  for row in range(3):
    size = int(out.response_lengths[row])
    assert out.responses[row, :size].tolist() == expected
    assert out.response_mask[row, :size].tolist() == [1, 1] + [0] * len(turn) + [1, 1] + [0] * len(turn) + [1, 1]
    assert out.response_mask[row, size:].sum() == 0 and out.attention_mask[row, :size].all()
    episode = out.episodes[row]
    assert episode.ended == "assistant_turns" and episode.tool_calls == 2 and episode.tokenization_mismatch is None
    assert episode.reward_scores == {"lookup": 1.0, "boom": 1.0, "sleepy": 1.0, "chatty": 1.0, "tool_steps": 1.0}
    assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
  assert out.metrics["num_turns/mean"] == 6.0 and out.metrics["multi_turn/ended/assistant_turns"] == 1.0
  mask = jax.numpy.asarray(out.response_mask, jax.numpy.float32)
  advantages = jax.numpy.ones_like(mask)
  log_probs = jax.numpy.asarray(out.log_probs)
  grad = jax.grad(lambda lp: policy_loss.compute_policy_loss_vanilla(log_probs, lp, advantages, mask)[0])(log_probs)
  assert np.all(np.asarray(grad)[np.asarray(out.response_mask) == 0] == 0)
  assert np.all(np.asarray(grad)[np.asarray(out.response_mask) == 1] != 0)


@pytest.mark.slow
def test_failing_tools_become_error_turns_and_the_rollout_goes_on(files, tok):
  """A tool that raises, one that hangs past its timeout and a malformed call each get an error tool turn; the
  conversation continues and the errors are counted."""
  start, eos = chain.start_id(tok), tok.eos_token_id
  kinds = {k: chain.phrase_id(tok, k) for k in ("boom", "sleepy", "malformed")}
  table = {start: {i: 0.0 for i in kinds.values()}, **{i: {eos: 0.0} for i in kinds.values()}}
  smp, model = sampler(tok, table, settings(files, max_assistant_turns=2, timeout_s=0.3), greedy=False, slots=8,
                       response=128)
  began = time.perf_counter()
  out = generate(smp, model, tok, 16, key=3)
  assert time.perf_counter() - began < 60  # the hanging (120 s) tool did not hold the rollout
  seen = set()
  for episode in out.episodes:
    first = episode.messages[1]["content"]
    kind = next(k for k in kinds if chain.PHRASES[k] == first)
    seen.add(kind)
    answer = episode.messages[2]
    assert answer["role"] == "tool" and episode.assistant_turns == 2 and episode.ended == "assistant_turns"
    assert {"boom": "the boom tool failed", "sleepy": "timed out", "malformed": "malformed"}[kind] in answer["content"]
  assert seen == set(kinds)
  assert out.metrics["multi_turn/tool_errors"] == 16.0


def test_a_cancelled_conversation_releases_its_tools_after_its_running_call(files, tok):
  """colocate_async evicts a conversation while its tool call runs: the stream frees the slot at once, and the
  tools score and release once the call has ended (here at its 0.3 s timeout), which close() waits for."""
  from flax import nnx
  start, sleepy, eos = chain.start_id(tok), chain.phrase_id(tok, "sleepy"), tok.eos_token_id
  smp, model = sampler(tok, {start: {sleepy: 0.0}, sleepy: {eos: 0.0}}, settings(files, timeout_s=0.3))
  ids, mask, columns = prompts(tok, 1)
  stream = smp.open_stream()
  stream.set_params(nnx.state(model, nnx.Param), 0)
  conversation = smp.new_request(0, 0, ids[0][mask[0] > 0], jax.random.key(0), 32, {k: v[0] for k, v in columns.items()})
  stream.submit([conversation])
  assert stream.step() == [] and stream.waiting  # its turn called the tool, which runs
  episode = conversation.episode
  assert stream.cancel(lambda c: True) == [conversation] and stream.idle and not stream.waiting
  stream.close()
  assert episode.ended == "length" and episode.pending.done() and episode.closing.done()
  assert len(smp.settings.tools["sleepy"].released) == 1
  smp.close()


def test_tool_answers_are_truncated_and_the_response_length_holds(files, tok):
  """max_tool_response_length cuts the chatty tool's 60 characters (left and right); an answer that would not fit
  in response_length ends the conversation there, dropped (verl's rule)."""
  start, call, eos = chain.start_id(tok), chain.phrase_id(tok, "chatty"), tok.eos_token_id
  table = {start: {call: 0.0}, call: {eos: 0.0}}
  text = "".join(chr(97 + i % 26) for i in range(60))
  for side in ("left", "right"):
    kept = len(tool_turn(tok, runner.truncate_tool_response(text, 20, side)))
    response = 2 + kept + 4  # room for the first answer and the next call, not for a second answer
    smp, model = sampler(tok, table, settings(files, max_tool_response_length=20, truncate_side=side),
                         response=response)
    out = generate(smp, model, tok, 2)
    episode = out.episodes[0]
    assert episode.messages[2]["content"] == runner.truncate_tool_response(text, 20, side)
    assert episode.ended == "length" and len(episode.messages) == 4
    assert int(out.response_lengths[0]) == 2 + kept + 2  # the second answer did not fit and was not appended


def test_single_turn_rows_and_interactions(files, tok):
  """A single_turn_agent row ends after its call unexecuted; an interaction says "try again" once, then ends the
  episode with its score reaching the rollout's reward scores."""
  start, call, answer, eos = (chain.start_id(tok), chain.phrase_id(tok, "lookup"), chain.phrase_id(tok, "answer"),
                              tok.eos_token_id)
  smp, model = sampler(tok, {start: {answer: 0.0}, answer: {eos: 0.0}, call: {eos: 0.0}}, settings(files),
                       response=96)
  out = generate(smp, model, tok, 2, agents=["single_turn_agent", "tool_agent"],
                 extra=[{}, {"interaction_kwargs": {"name": "try_again"}}])
  single, talk = out.episodes
  assert single.ended == "answer" and single.assistant_turns == 1 and out.response_mask[0].sum() == 2
  assert talk.ended == "interaction" and talk.assistant_turns == 2 and talk.user_turns == 2
  assert talk.messages[2] == {"role": "user", "content": "Wrong, try again."}
  assert talk.messages[4] == {"role": "user", "content": "Correct."}  # kept, as verl keeps it, then the end
  assert out.response_mask[1, int(out.response_lengths[1]) - 1] == 0
  assert talk.reward_scores["interaction"] == 2.0 and talk.reward_scores["user_turn_rewards"] == [0.0, 1.0]
  assert out.extra_info([{"k": 1}, None])[1]["num_turns"] == 5
  with pytest.raises(ValueError, match="agent_name is 'react_agent'.*fix the data's agent_name column"):
    generate(smp, model, tok, 1, agents=["react_agent"])


@pytest.mark.slow
def test_sharded_agent_loop_equals_one_device(files, tok):
  """The same sampled conversations on data 2 x fsdp 2 x tensor 2 as on one device."""
  start, call, answer, eos = (chain.start_id(tok), chain.phrase_id(tok, "lookup"), chain.phrase_id(tok, "answer"),
                              tok.eos_token_id)
  table = {start: {call: 0.0, answer: 0.0}, call: {eos: 0.0}, answer: {eos: 0.0}}
  agent = settings(files, max_assistant_turns=4)
  one = generate(*sampler(tok, table, agent, greedy=False), tok, 4, n=2, key=5)
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  rules = [("batch", ("data", "fsdp")), ("embed", "fsdp"), ("vocab", "tensor"), ("mlp", "tensor"),
           ("heads", "tensor"), ("kv_heads", "tensor")]
  smp, model = sampler(tok, table, agent, greedy=False, mesh=mesh, rules=rules)
  eight = generate(smp, model, tok, 4, n=2, key=5)
  np.testing.assert_array_equal(eight.responses, one.responses)
  np.testing.assert_array_equal(eight.response_mask, one.response_mask)
  assert len({e.assistant_turns for e in one.episodes}) > 1  # the conversations differ in length


def test_the_sanity_check_reports_ids_the_template_would_not_produce(files, tok):
  """The model writes 'h' 'e' (the tokenizer's canonical ids are one token 'he'): trained as generated, and the strict
  check reports the difference in the rollout's metrics, the disabled one does not."""
  start, eos = chain.start_id(tok), tok.eos_token_id
  h, e = (tok.encode(c, add_special_tokens=False)[0] for c in "he")
  assert tok.encode("he", add_special_tokens=False) != [h, e]
  table = {start: {h: 0.0}, h: {e: 0.0}, e: {eos: 0.0}}
  for mode, count in (("strict", 2.0), ("disable", 0.0)):
    smp, model = sampler(tok, table, settings(files, sanity_check_mode=mode))
    out = generate(smp, model, tok, 2)
    assert out.responses[0, :3].tolist() == [h, e, eos]
    assert out.metrics["multi_turn/tokenization_mismatches"] == count
    assert (out.episodes[0].tokenization_mismatch is None) == (mode == "disable")


FUNCTION_TOOLS_PY = textwrap.dedent('''
    from verl.tools.function_tool import function_tool


    @function_tool
    def lookup(key: str) -> str:
        """Looks a value up.

        Args:
            key: What to look up.
        """
        return "seven:" + key, 0.25
''')


@pytest.mark.slow
def test_a_function_tool_file_written_for_verl_answers_the_model_s_calls(tok, tmp_path):
  """verl 0.9's function_tool_path: the file's @function_tool function is the agent's `lookup` tool (its schema in
  the settings), called with the model's arguments; its (text, reward) tuple is the tool turn and a step reward."""
  from rljax import config as config_lib
  (tmp_path / "function_tools.py").write_text(FUNCTION_TOOLS_PY)
  config = config_lib.get_base_config()
  config.actor_rollout_ref.rollout.multi_turn.function_tool_path = str(tmp_path / "function_tools.py")
  config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns = 2
  config.actor_rollout_ref.rollout.agent.default_agent_loop = "tool_agent"
  agent = agent_loop.AgentSettings.from_config(config.actor_rollout_ref.rollout)
  assert [s["function"]["name"] for s in agent.tool_schemas] == ["lookup"]
  assert agent.tool_schemas[0]["function"]["parameters"]["properties"]["key"]["description"] == "What to look up."
  start, call, eos = chain.start_id(tok), chain.phrase_id(tok, "lookup"), tok.eos_token_id
  smp, model = sampler(tok, {start: {call: 0.0}, call: {eos: 0.0}}, agent)
  out = generate(smp, model, tok, 2)
  turn = tool_turn(tok, "seven:x")
  for row in range(2):
    size = int(out.response_lengths[row])
    assert out.responses[row, :size].tolist() == [call, eos] + turn + [call, eos]
    episode = out.episodes[row]
    assert episode.tool_calls == 1 and episode.reward_scores == {"lookup": 0.0, "tool_steps": 0.25}
