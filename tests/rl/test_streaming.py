"""colocate_async (`rljax.rl.streaming`): partial rollouts across policy versions, drop and wait, resuming, and
rljax.compile's memory check (tests/rl/test_trainer.py runs the trainer at threshold 1 against the synchronous one)."""

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.config import ConfigError
from rljax.data.dataset import object_array
from rljax.rl import positions, remote, staleness, streaming
from rljax.rollout import SamplingParams, make_engine
from rljax.rollout import Rollout, RolloutSampler
from tests.rl import tiny_run
from tests.rollout import chain, test_agent_loop as agent_tests

LONG, OTHER, SHORT = 100, 101, 102  # a prompt ending in LONG or OTHER is answered until the length limit
RESPONSE = 12


@pytest.fixture(scope="module")
def tok():
  return chain.tokenizer()


def policy_params(tok, version: int):
  """Version 0 picks LONG or OTHER after either with probability 1/2 each; version 1 with 0.8 and 0.2 (so a
  token's log-prob says which version sampled it); after SHORT both end the response."""
  odds = {0: (0.0, 0.0), 1: (np.log(0.8), np.log(0.2))}[version]
  table = {t: {LONG: odds[0], OTHER: odds[1]} for t in (LONG, OTHER)}
  table[SHORT] = {tok.eos_token_id: 0.0}
  return chain.model(tok, table)


@pytest.fixture(scope="module")
def scripted(tok):
  models = [policy_params(tok, v) for v in (0, 1, 1, 1, 1)]
  engine = make_engine(models[0], max_concurrent_decodes=4, prefill_buckets=(8,), max_decode_length=RESPONSE,
                       eos_ids=(tok.eos_token_id,), sampling_params=SamplingParams(temperature=1.0))
  return engine, [nnx.state(m, nnx.Param) for m in models]


def batches(*kinds):
  """One data batch per string: a prompt per letter, L long and S short; its tag names batch, letter and row."""
  out = []
  for index, kind in enumerate(kinds):
    ids = np.zeros((len(kind), 4), np.int32)
    mask = np.zeros((len(kind), 4), np.int32)
    for row, letter in enumerate(kind):
      ids[row, 2:] = (5, LONG if letter == "L" else SHORT)
      mask[row, 2:] = 1
    out.append({"input_ids": ids, "attention_mask": mask,
                "tag": np.asarray([f"{index}{letter}{r}" for r, letter in enumerate(kind)]),
                "raw_prompt_ids": object_array([np.arange(r + 1) for r in range(len(kind))])})  # rows of their own length
  return out


def rollout(engine, policy, data, consumed=(), first_batch=0):
  pending = list(data)
  return streaming.AsyncRollout(RolloutSampler(engine, 0, 4), policy, 2, 0,
                                batch_key=lambda b: jax.random.key(b), data_position=lambda: "end",
                                read_batch=lambda: (pending.pop(0), f"before{len(data) - len(pending) - 1}")
                                if pending else None, first_batch=first_batch, consumed=consumed)


def test_a_response_spanning_two_versions_records_each_tokens_version_and_log_prob(scripted):
  engine, params = scripted
  stream = rollout(engine, staleness.StalenessPolicy(groups=1, threshold=2, strategy="drop", ahead=1), batches("LS", "LS"))
  picked = stream.next_groups(params[0], 0)
  assert list(picked.columns["tag"]) == ["0S1"] and picked.spans.tolist() == [1]  # the short one ends first
  assert picked.columns["raw_prompt_ids"].dtype == object and picked.columns["raw_prompt_ids"][0].tolist() == [0, 1]
  assert picked.scores is None  # no judge: the update scores its groups
  picked = stream.next_groups(params[1], 1)
  second, metrics = picked.rollout, staleness.off_policy_metrics(picked, threshold=2)
  assert list(picked.columns["tag"]) == ["0L0"]
  # one chunk of 4 tokens under version 0, and the 5th from the logits version 0 left; then version 1's
  np.testing.assert_array_equal(second.versions, [[0] * 5 + [1] * 7] * 2)
  np.testing.assert_allclose(second.log_probs[:, :5], np.log(0.5), atol=1e-3)  # RMSNorm's eps scales the logits a little
  expected = np.where(second.responses[:, 5:] == LONG, np.log(0.8), np.log(0.2))
  np.testing.assert_allclose(second.log_probs[:, 5:], expected, atol=1e-3)
  assert metrics["off_policy/staleness/mean"] == 2 and metrics["off_policy/mixed_version_frac"] == 1
  assert (metrics["off_policy/staleness/frac_1"], metrics["off_policy/staleness/frac_2_or_more"]) == (0, 1)
  assert metrics["off_policy/token_lag/mean"] == pytest.approx(5 / 12)
  assert second.response_lengths.tolist() == [RESPONSE] * 2 and second.prompt_index.tolist() == [0, 0]


def trained_until_the_end(stream, params, first_version):
  """The tags each update trains from `first_version` on until the data ends."""
  out = []
  for version in range(first_version, first_version + 10):
    try:
      out.append(list(stream.next_groups(params[min(version, len(params) - 1)], version).columns["tag"]))
    except StopIteration:
      return out
  raise AssertionError("the stream did not end")


def test_a_request_takes_the_lowest_free_slot_whatever_ended_first(scripted):
  # which slot a request decodes in changes its logits' last bits (its place in the decode batch): the lowest
  # free first makes a resumed stream, which starts with every slot free, decode as the uninterrupted one did
  engine, params = scripted
  sampler = RolloutSampler(engine, 0, 4)
  stream = sampler.open_stream()
  stream.set_params(params[0], 0)
  key = jax.random.key(0)

  def request(i, last):
    return sampler.new_request(i, i, np.asarray([5, last], np.int32), key, 4)

  stream.submit([request(0, LONG), request(1, LONG), request(2, SHORT), request(3, LONG)])
  ended = [r.id for r in stream.step()]  # slot 2's short response ends in the first chunk
  while len(ended) < 4:
    ended += [r.id for r in stream.step()]
  assert ended[0] == 2 and stream.idle
  stream.submit([request(4, LONG)])
  stream.step()
  assert {slot: r.id for slot, r in stream.slots.items()} == {0: 4}


def test_the_staleness_histogram_has_a_share_per_span_up_to_the_threshold():
  span = np.asarray([1, 1, 2, 3, 8, 12], np.float32)
  name = "off_policy/staleness/frac_{}".format
  assert staleness.staleness_histogram(span[:4], 3) == {name(1): 0.5, name(2): 0.25, name("3_or_more"): 0.25}
  assert staleness.staleness_histogram(span[:2], 1) == {name("1_or_more"): 1.0}
  for threshold in (8, 16):  # 8 shares at most: the names do not change past 8
    wide = staleness.staleness_histogram(span, threshold)
    assert list(wide) == [name(s) for s in range(1, 8)] + [name("8_or_more")]
    assert wide[name("8_or_more")] == pytest.approx(2 / 6) and sum(wide.values()) == pytest.approx(1)


def test_drop_evicts_groups_past_the_threshold_and_wait_trains_them(scripted):
  engine, params = scripted
  dropped = rollout(engine, staleness.StalenessPolicy(groups=1, threshold=1, strategy="drop", ahead=1),
                    batches("LS", "SS", "SS"))
  trained, evicted = [], 0
  for version in range(3):
    picked = dropped.next_groups(params[version], version)
    trained += list(picked.columns["tag"])
    evicted += picked.evicted
    out = picked.rollout
    assert picked.spans.tolist() == [1] and (out.versions[out.response_mask > 0] == version).all()
  # at version 1, 0L0 (first sampled at 0) would span 2; at version 2, 1S1 (finished at 1, untrained)
  assert trained == ["0S1", "1S0", "2S0"] and evicted == 2

  waited = rollout(engine, staleness.StalenessPolicy(groups=1, threshold=2, strategy="wait", ahead=3), batches("LS", "SS"))
  assert waited.policy.capacity == 2  # at most threshold batches untrained
  # version 1 waits for 0L0 (it would span 3 versions at version 2) although 1S0 finished first
  assert trained_until_the_end(waited, params, 0) == [["0S1"], ["0L0"], ["1S0"], ["1S1"]]


def test_resuming_from_the_position_loses_and_repeats_no_prompt(scripted):
  engine, params = scripted
  policy = staleness.StalenessPolicy(groups=1, threshold=4, strategy="drop", ahead=1)
  data = ("LS", "SS", "SL")
  whole = rollout(engine, policy, batches(*data))
  first = [list(whole.next_groups(params[v], v).columns["tag"]) for v in range(2)]
  assert first == [["0S1"], ["1S0"]]
  position = whole.position()  # 0L0 is still generating
  assert position == {"data_state": "before0", "batch": 0, "consumed": [[0, 1], [1, 0]]}
  rest = trained_until_the_end(whole, params, 2)
  again = trained_until_the_end(rollout(engine, policy, batches(*data), position["consumed"], position["batch"]),
                                params, 2)
  every = sorted(f"{b}{letter}{r}" for b, kind in enumerate(data) for r, letter in enumerate(kind))
  assert sorted(sum(first + rest, [])) == every and sorted(sum(first + again, [])) == every
  positions.check_resumable(position, True, "ckpt")
  positions.check_resumable({"data_state": "before1", "batch": 1, "consumed": []}, False, "ckpt")
  with pytest.raises(ConfigError, match=r"trainer.v1.trainer_mode='sync': the checkpoint ckpt was written under "
                                        r"colocate_async, which had trained 2 prompt\(s\) past its data position"):
    positions.check_resumable(position, False, "ckpt")


@pytest.mark.slow
def test_compile_counts_the_kv_cache_beside_the_update_under_colocate_async(model_dir, data_dir, tmp_path):
  """The decode state lives across updates under colocate_async: rljax.compile's memory check counts it beside
  every step that does not take it, and beside the engine's own steps where another rollout decodes then."""
  from rljax.compile import plan  # pylint: disable=import-outside-toplevel
  from rljax.compile.report import shard_bytes  # pylint: disable=import-outside-toplevel

  def planned(*extra):
    config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), *extra)
    return {p.step.name: p for p in plan.rl_steps(config, tiny_run.one_device())}

  sync, streamed = planned(), planned("trainer.v1.trainer_mode=colocate_async")
  decode = {mode: next(p for name, p in plans.items() if name.startswith("decode_step"))
            for mode, plans in (("sync", sync), ("streamed", streamed))}
  # a slot for each response of the two batches in flight (num_warmup_batches=1), against one batch's in sync
  assert decode["streamed"].step.name == decode["sync"].step.name.replace("[8 slots]", "[16 slots]")
  cache = shard_bytes([x for x in jax.tree.leaves(decode["streamed"].step.args[1])
                       if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)])
  assert streamed["actor_update"].resident - sync["actor_update"].resident == cache > 0
  # the decode step takes the state (its int32 request count matches an optimizer's step count in sync: 4 bytes)
  assert abs(decode["streamed"].resident - decode["sync"].resident) <= 4
  # validation (or remax's baselines) decodes in a cache of its own while the stream's lives: counted beside
  for extra in ("trainer.test_freq=1", "algorithm.adv_estimator=remax"):
    both = planned("trainer.v1.trainer_mode=colocate_async", extra)
    second = next(p for name, p in both.items() if name.startswith("decode_step"))
    assert abs(second.resident - decode["streamed"].resident - cache) <= 4, extra
    assert both["actor_update"].resident == streamed["actor_update"].resident


def test_dynamic_sampling_judges_each_group_as_it_ends_and_its_slots_go_to_the_next_prompts(scripted):
  """A group the judge drops (here every short prompt's: both responses end at once, all alike) leaves as its last
  response ends; the update trains the next kept ones, counts the dropped per update, and a resumed stream neither
  trains nor judges them again. Past `most_judged` prompts for one update, verl's error."""
  engine, params = scripted
  judged = []

  def keep(group):
    judged.append(group.columns["tag"].item())
    group.scores = f"scores of {judged[-1]}"  # what the trainer's judge leaves for the update
    return "L" in judged[-1]

  policy = staleness.StalenessPolicy(groups=1, threshold=8, strategy="drop", ahead=1)
  data = ("SL", "SSL")
  stream = rollout(engine, policy, batches(*data))
  stream.keep = keep
  first = stream.next_groups(params[0], 0)
  # while 0L1 decodes, the short prompts of batch 1 take the freed slots, end and are dropped
  assert list(first.columns["tag"]) == ["0L1"] and first.filtered == 3 and first.scores == ["scores of 0L1"]
  assert judged == ["0S0", "1S0", "0L1", "1S1"]
  position = stream.position()  # 1L2 is still generating
  assert position == {"data_state": "before1", "batch": 1, "consumed": [[1, 0], [1, 1]]}
  second = stream.next_groups(params[1], 1)
  assert list(second.columns["tag"]) == ["1L2"] and second.filtered == 0 and judged[-1] == "1L2"
  with pytest.raises(StopIteration):
    stream.next_groups(params[1], 2)
  resumed = rollout(engine, policy, batches(*data)[1:], position["consumed"], position["batch"])  # from before1
  resumed.keep, judged[:] = keep, []
  assert list(resumed.next_groups(params[1], 1).columns["tag"]) == ["1L2"] and judged == ["1L2"]

  bounded = rollout(engine, policy, batches("SSSL"))
  bounded.keep, bounded.most_judged = keep, 2
  with pytest.raises(ValueError, match="dynamic sampling judged 3 prompts for one update, more than "
                                       "max_num_gen_batches x data.gen_batch_size = 2 on this host"):
    bounded.next_groups(params[0], 0)


@pytest.mark.slow
def test_a_conversation_continues_across_an_update_and_its_tool_turn_is_masked(tok, tmp_path):
  """A tool_agent conversation whose turn ended under version 0 gets its tool's answer appended under version 1 and
  decodes its next turn there; a single-turn row of the same batch trains first. The tool ids carry mask 0 and no
  version; the first token after them records version 1 (its logits come from the append's forward)."""
  root = agent_tests.write_files(tmp_path)
  start, call, answer, eos = chain.start_id(tok), chain.phrase_id(tok, "lookup"), chain.phrase_id(tok, "answer"), \
      tok.eos_token_id
  tables = [{start: {call: 0.0}, call: {eos: 0.0}},
            {start: {call: np.log(0.8), answer: np.log(0.2)}, call: {eos: 0.0}, answer: {eos: 0.0}}]
  agent, model = agent_tests.sampler(tok, tables[0], agent_tests.settings(root, max_assistant_turns=2), greedy=False)
  params = [nnx.state(chain.model(tok, t), nnx.Param) for t in tables]
  ids, mask, columns = agent_tests.prompts(tok, 2, agents=["single_turn_agent", "tool_agent"])
  batch = {"input_ids": ids, "attention_mask": mask, **{k: np.asarray(v, object) for k, v in columns.items()}}
  pending = [batch]
  stream = streaming.AsyncRollout(agent, staleness.StalenessPolicy(groups=1, threshold=2, strategy="drop", ahead=1), 1, 0,
                                  batch_key=jax.random.key, data_position=lambda: "end",
                                  read_batch=lambda: (pending.pop(), "before0") if pending else None)
  try:
    first = stream.next_groups(params[0], 0)
    assert list(first.columns["agent_name"]) == ["single_turn_agent"]
    np.testing.assert_array_equal(first.rollout.versions[0, :3], [0, 0, -1])
    second = stream.next_groups(params[1], 1)
  finally:
    agent.close()
  out, turn = second.rollout, agent_tests.tool_turn(tok, "7")
  size, tail = int(out.response_lengths[0]), 2 + len(turn)
  assert out.responses[0, :tail].tolist() == [call, eos] + turn and out.responses[0, size - 1] == eos
  assert out.response_mask[0, :size].tolist() == [1, 1] + [0] * len(turn) + [1, 1] and size == tail + 2
  np.testing.assert_array_equal(out.versions[0, :size], [0, 0] + [-1] * len(turn) + [1, 1])
  np.testing.assert_allclose(out.log_probs[0, tail], np.log(0.8 if out.responses[0, tail] == call else 0.2), atol=1e-3)
  assert second.spans.tolist() == [2] and out.episodes[0].user_turns == 1 and out.episodes[0].assistant_turns == 2
  assert out.metrics["num_turns/mean"] == 4
  assert staleness.off_policy_metrics(second, 2)["off_policy/mixed_version_frac"] == 1



def one_host_picked(groups, first, n=2, scores=True, epoch=0):
  """A Picked of `groups` groups of n rows each, tagged from `first` on (a rollout process's share)."""
  rows = groups * n
  tags = object_array([[f"t{first + g}"] * (g + 1) for g in range(groups)])  # a list per prompt, of its own length
  rollout = Rollout(
      responses=np.full((rows, 3), first), response_mask=np.ones((rows, 3), np.int32),
      response_lengths=np.full(rows, 3, np.int32), log_probs=np.zeros((rows, 3), np.float32),
      prompt_index=np.repeat(np.arange(groups), n), truncated=np.zeros(rows, bool),
      versions=np.zeros((rows, 3), np.int32), stats={"perf/slot_occupancy": 0.5 + first / 10})
  return streaming.Picked({"tag": tags, "id": np.arange(first, first + groups)}, rollout,
                          np.full(groups, first, np.float32), 4, evicted=first, filtered=1,
                          scores=[first + g for g in range(groups)] if scores else None, epoch=epoch)


def test_merged_picks_are_one_hosts_groups_in_order():
  a, b = one_host_picked(2, 0), one_host_picked(3, 2, epoch=1)
  picked = remote.merged([a, b])
  assert list(picked.columns["id"]) == [0, 1, 2, 3, 4] and picked.columns["tag"].dtype == object
  assert [list(t) for t in picked.columns["tag"]] == [["t0"], ["t1"] * 2, ["t2"], ["t3"] * 2, ["t4"] * 3]
  assert list(picked.rollout.prompt_index) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
  assert list(picked.rollout.responses[:, 0]) == [0] * 4 + [2] * 6 and picked.rollout.routed_experts is None
  assert list(picked.spans) == [0, 0, 2, 2, 2] and picked.version == 4 and picked.epoch == 1
  assert (picked.evicted, picked.filtered, picked.scores) == (2, 2, [0, 1, 2, 3, 4])
  assert picked.rollout.stats == {"perf/slot_occupancy": pytest.approx(0.6)}
  assert remote.merged([a, one_host_picked(1, 2, scores=False)]).scores is None
  assert remote.merged([a]) is a


def test_split_picks_are_equal_runs_of_one_hosts_groups_that_merge_back():
  picked = remote.merged([one_host_picked(2, 0), one_host_picked(2, 2, epoch=1)])
  first, second = remote.split(picked, 2)
  assert [list(t) for t in second.columns["tag"]] == [["t2"], ["t3"] * 2] and second.columns["tag"].dtype == object
  assert list(second.rollout.prompt_index) == [0, 0, 1, 1] and list(second.rollout.responses[:, 0]) == [2] * 4
  assert list(second.spans) == [2, 2] and (second.version, second.epoch, second.scores) == (4, 1, [2, 3])
  assert (first.evicted, first.filtered, second.evicted, second.filtered) == (2, 2, 0, 0)  # summed over the hosts
  assert second.rollout.stats == picked.rollout.stats and second.rollout.routed_experts is None
  again = remote.merged([first, second])
  assert [list(t) for t in again.columns["tag"]] == [list(t) for t in picked.columns["tag"]]
  for field in ("responses", "prompt_index", "log_probs", "response_mask"):
    np.testing.assert_array_equal(getattr(again.rollout, field), getattr(picked.rollout, field))
  assert (list(again.spans), again.scores, again.evicted) == (list(picked.spans), picked.scores, picked.evicted)
  assert remote.split(picked, 1)[0].scores == picked.scores
  with pytest.raises(ValueError, match="4 groups do not split into 3 equal parts"):
    remote.split(picked, 3)


def test_a_checkpoint_keeps_each_hosts_stream_position_where_the_hosts_trained_different_prompts():
  alike = [{"data_state": {"i": 3}, "batch": 3, "consumed": []}] * 2
  assert positions.stored_position(alike) == ({"i": 3}, {"batch": 3, "consumed": []})
  assert positions.host_position({"batch": 3, "consumed": []}, {"i": 3}, 1, 2) == alike[1]
  apart = [{"data_state": {"i": 2}, "batch": 2, "consumed": [[2, 1]]}, {"data_state": {"i": 2}, "batch": 2,
                                                                        "consumed": [[2, 0]]}]
  data, stream = positions.stored_position(apart)
  assert data == {"i": 2} and [positions.host_position(stream, data, i, 2) for i in range(2)] == apart
  with pytest.raises(ValueError, match="rollout was 2 hosts.*this run's is 4: resume it on 2"):
    positions.host_position(stream, data, 0, 4)
  assert positions.host_position(None, {"i": 1}, 0, 2) == {"data_state": {"i": 1}}
  assert positions.host_position(None, None, 0, 2) is None
  with pytest.raises(ConfigError, match="had trained 2 prompt"):  # a sync run would train both hosts' again
    positions.check_resumable(stream, False, "ckpt")
  # one host's prompts trained past its position are rows of its share: they hold on one host only
  data, alone = positions.stored_position(apart[:1])
  assert positions.host_position(alone, data, 0, 1) == apart[0]
  with pytest.raises(ValueError, match="rollout was 1 hosts"):
    positions.host_position(alone, data, 0, 2)
  # hosts apart with nothing trained past their positions: a sync run would put both at the first's
  behind = [{"data_state": {"i": 2}, "batch": 2, "consumed": []}, {"data_state": {"i": 3}, "batch": 3, "consumed": []}]
  with pytest.raises(ConfigError, match="had trained 0 prompt.*each at a position of its own"):
    positions.check_resumable(positions.stored_position(behind)[1], False, "ckpt")
