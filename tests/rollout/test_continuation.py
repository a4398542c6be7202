"""Continuing a conversation in the engine (`append`, `prefill(existing_prefix=...)`) equals prefilling it whole."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax import sharding
from rljax.models import from_pretrained
from rljax.rollout import SamplingParams, make_engine
from tests.models import helpers

TENSOR_RULES = [("batch", ("data", "fsdp")), ("embed", "fsdp"), ("vocab", "tensor"), ("mlp", "tensor"),
                ("heads", "tensor"), ("kv_heads", "tensor")]
SLOTS = 4


@pytest.fixture(scope="module")
def family(tmp_path_factory):
  """(model, its parameters over a 2 x 2 x 2 mesh, the mesh)."""
  _, path = helpers.saved_family(tmp_path_factory, "llama3")
  model = from_pretrained(path)
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  params = nnx.state(model, nnx.Param)
  return model, sharding.shard_like(params, sharding.param_shardings(params, mesh, TENSOR_RULES)), mesh


def greedy_engine(model, mesh, slots, kv_cache_dtype=None):
  return make_engine(model, max_concurrent_decodes=slots, prefill_buckets=(8, 16), max_decode_length=16,
                     sampling_params=SamplingParams(greedy=True), mesh=mesh, rules=TENSOR_RULES,
                     append_buckets=(4, 8), kv_cache_dtype=kv_cache_dtype)


@pytest.fixture(scope="module")
def setup(family):
  model, params, mesh = family
  return greedy_engine(model, mesh, SLOTS), params


def prompts(seed=3, lengths=(5, 8, 3, 7)):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, 128, n).astype(np.int32) for n in lengths]


def fill(engine, params, rows):
  """A decode state whose slot i holds rows[i] (one prefill per row, bucketed)."""
  state = engine.init_decode_state()
  for slot, ids in enumerate(rows):
    bucket = 8 if len(ids) <= 8 else 16
    padded = np.zeros((bucket,), np.int32)
    padded[:len(ids)] = ids
    state = engine.insert(engine.prefill(params=params, padded_tokens=padded, true_length=len(ids)), state, slot)
  return state


@pytest.mark.slow
def test_append_continues_a_slot_as_a_whole_prefill_would(setup):
  """Slots 0 and 2 take a tool's tokens after 3 generated ones; 4 more tokens then equal those after one prefill of
  the whole conversation, and slots 1 and 3, left alone, go on as if nothing was appended."""
  engine, params = setup
  rows = prompts()
  state, first = engine.generate_steps(params, fill(engine, params, rows), 3)
  tool = {0: np.array([9, 10, 11, 12, 13], np.int32), 2: np.array([40, 41], np.int32)}
  index = np.asarray(state.cache.index)
  state = engine.append(params, state, tool)
  np.testing.assert_array_equal(np.asarray(state.generated), [8, 3, 5, 3])
  np.testing.assert_array_equal(np.asarray(state.cache.index), index + [5, 0, 2, 0])  # the chunk's padding is reused
  state, second = engine.generate_steps(params, state, 4)
  whole = [np.concatenate([rows[s], np.asarray(first.tokens[s]), tool.get(s, np.zeros(0, np.int32))])
           for s in range(SLOTS)]
  _, straight = engine.generate_steps(params, fill(engine, params, [whole[0], rows[1], whole[2], rows[3]]), 7)
  for slot in (0, 2):
    np.testing.assert_array_equal(second.tokens[slot], straight.tokens[slot, :4])
    np.testing.assert_allclose(second.log_probs[slot], straight.log_probs[slot, :4], atol=2e-5)
  for slot in (1, 3):
    np.testing.assert_array_equal(np.concatenate([first.tokens[slot], second.tokens[slot]]), straight.tokens[slot])
    np.testing.assert_allclose(second.log_probs[slot], straight.log_probs[slot, 3:], atol=2e-5)


@pytest.mark.slow
def test_a_few_appending_slots_are_continued_over_their_own_rows(family):
  """16 slots in 4 shards of 4: three slots of different shards append, each shard runs one row (copied out of its
  cache and back), and they go on as a whole prefill would while the 13 others go on as if nothing was appended.
  Two appending slots of one shard (over a quarter of it) run over all slots."""
  model, params, mesh = family
  engine = greedy_engine(model, mesh, 16)
  assert engine.slot_shards == 4 and engine.append_rows_per_shard([1, 6, 14]) == 1
  assert engine.append_rows_per_shard([1, 2]) is None
  rows = prompts(seed=6, lengths=[3 + s % 6 for s in range(16)])
  state, first = engine.generate_steps(params, fill(engine, params, rows), 3)
  tool = {1: np.array([9, 10, 11, 12, 13], np.int32), 6: np.array([40, 41], np.int32), 14: np.array([7, 8, 9], np.int32)}
  index = np.asarray(state.cache.index)
  state = engine.append(params, state, tool)
  assert engine.append_rows_program._cache_size() == 1 and engine.append_program._cache_size() == 0  # pylint: disable=protected-access
  np.testing.assert_array_equal(np.asarray(state.cache.index), index + [len(tool.get(s, ())) for s in range(16)])
  state, second = engine.generate_steps(params, state, 4)
  whole = [np.concatenate([rows[s], np.asarray(first.tokens[s]), tool[s]]) if s in tool else rows[s]
           for s in range(16)]
  _, straight = engine.generate_steps(params, fill(engine, params, whole), 7)
  for slot in range(16):
    if slot in tool:
      np.testing.assert_array_equal(second.tokens[slot], straight.tokens[slot, :4])
      np.testing.assert_allclose(second.log_probs[slot], straight.log_probs[slot, :4], atol=2e-5)
    else:
      np.testing.assert_array_equal(np.concatenate([first.tokens[slot], second.tokens[slot]]), straight.tokens[slot])
      np.testing.assert_allclose(second.log_probs[slot], straight.log_probs[slot, 3:], atol=2e-5)


@pytest.mark.slow
def test_an_int8_cache_decodes_appends_and_continues_as_the_full_precision_one(family):
  """16 slots over 4 shards with an int8 cache (half the bytes): greedy decoding, an append of 3 slots (their own
  rows), one of 12 (all slots) and a prefix continued by a second prefill give the tokens of the full-precision
  cache, log-probs within 0.03."""
  model, params, mesh = family
  runs, rows = {}, prompts(seed=7, lengths=[3 + s % 6 for s in range(16)])
  for dtype in (None, jnp.int8):
    engine = greedy_engine(model, mesh, 16, dtype)
    state, first = engine.generate_steps(params, fill(engine, params, rows), 3)
    state = engine.append(params, state, {1: [9, 10, 11], 6: [40, 41], 14: [7]})
    state, second = engine.generate_steps(params, state, 3)
    state = engine.append(params, state, {s: [20 + s, 5] for s in range(12)})
    state, third = engine.generate_steps(params, state, 3)
    assert engine.append_rows_program._cache_size() == engine.append_program._cache_size() == 1  # pylint: disable=protected-access
    prefix = engine.prefill(params=params, padded_tokens=np.arange(3, 19, dtype=np.int32).reshape(2, 8),
                            true_length=np.array([5, 8], np.int32))
    prefix = engine.prefill(params=params, existing_prefix=prefix, padded_tokens=np.full((2, 8), 30, np.int32),
                            true_length=np.array([2, 6], np.int32))
    _, fourth = engine.generate_steps(params, engine.insert_many(prefix, engine.init_decode_state(), [0, 9], [0, 1]),
                                      4)
    runs[dtype] = (np.concatenate([first.tokens, second.tokens, third.tokens], 1),
                   np.concatenate([first.log_probs, second.log_probs, third.log_probs], 1),
                   np.asarray(fourth.tokens)[[0, 9]], np.asarray(fourth.log_probs)[[0, 9]], state.cache)
  full, int8 = runs[None], runs[jnp.int8]
  assert int8[4].k[0].values.dtype == jnp.int8 and int8[4].k[0].scale.shape == full[4].k[0].shape[:3]
  assert int8[4].k[0].values.nbytes + int8[4].k[0].scale.nbytes < 0.6 * full[4].k[0].nbytes
  for got, want in ((int8[0], full[0]), (int8[2], full[2])):
    np.testing.assert_array_equal(got, want)
  for got, want in ((int8[1], full[1]), (int8[3], full[3])):
    np.testing.assert_allclose(got, want, atol=0.03)


@pytest.mark.slow
def test_an_idle_slot_keeps_its_cache_room_while_others_decode(setup):
  """A finished slot's write index stays put through later decode steps, so an append after them continues it
  exactly (the generation budget counts the appended ids)."""
  engine, params = setup
  rows = prompts(seed=4)
  state, first = engine.generate_steps(params, fill(engine, params, rows), 2)
  index = np.asarray(state.cache.index)
  state = state._replace(done=state.done.at[1].set(True))
  state, _ = engine.generate_steps(params, state, 5)
  assert int(state.cache.index[1]) == index[1]
  state = engine.append(params, state, {1: np.array([7, 8, 9], np.int32)})
  assert not bool(state.done[1])
  state, after = engine.generate_steps(params, state, 3)
  whole = np.concatenate([rows[1], np.asarray(first.tokens[1]), [7, 8, 9]]).astype(np.int32)
  _, straight = engine.generate_steps(params, fill(engine, params, [rows[0], whole, rows[2], rows[3]]), 3)
  np.testing.assert_array_equal(after.tokens[1], straight.tokens[1])


@pytest.mark.slow
def test_existing_prefix_continues_a_prefill(setup):
  """JetStream's `prefill(existing_prefix=...)`: a prompt prefilled in two parts decodes as the whole prompt does,
  token for token and log-prob for log-prob."""
  engine, params = setup
  rows = prompts(seed=5)
  head = np.zeros((4, 8), np.int32)
  tail = np.zeros((4, 8), np.int32)
  split = [3, 5, 2, 4]
  for i, (ids, k) in enumerate(zip(rows, split)):
    head[i, :k], tail[i, :len(ids) - k] = ids[:k], ids[k:]
  prefix = engine.prefill(params=params, padded_tokens=head, true_length=np.array(split, np.int32))
  prefix = engine.prefill(params=params, existing_prefix=prefix, padded_tokens=tail,
                          true_length=np.array([len(r) - k for r, k in zip(rows, split)], np.int32))
  assert prefix.cache.mask.shape == (4, 16)
  state = engine.insert_many(prefix, engine.init_decode_state(), range(SLOTS), range(SLOTS))
  _, parts = engine.generate_steps(params, state, 6)
  _, whole = engine.generate_steps(params, fill(engine, params, rows), 6)
  np.testing.assert_array_equal(parts.tokens, whole.tokens)
  np.testing.assert_allclose(parts.log_probs, whole.log_probs, atol=2e-5)


def test_append_beyond_the_largest_bucket_is_an_error(setup):
  engine, params = setup
  with pytest.raises(ValueError, match="largest append bucket 8"):
    engine.append(params, engine.init_decode_state(), {0: np.arange(9, dtype=np.int32)})


def test_a_continuation_that_leaves_no_decode_room_is_an_error(setup):
  engine, params = setup
  prefix = engine.prefill(params=params, padded_tokens=np.ones((1, 16), np.int32), true_length=np.array([16]))
  with pytest.raises(ValueError, match="continuing a 16-slot prefix by 16 tokens leaves no room for 16 decode steps"):
    engine.prefill(params=params, existing_prefix=prefix, padded_tokens=np.ones((1, 16), np.int32),
                   true_length=np.array([4]))
