"""The JetStream engine and the RL sampler against transformers and against themselves."""

import asyncio
import logging
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from rljax import config as config_lib, sharding
from rljax.models import CausalLM, ModelConfig, from_pretrained
from rljax.rollout import factory
from rljax.rollout import sampling
from rljax.rollout import (
    HAS_JETSTREAM, DriverThreadError, RolloutSampler, SamplingParams, make_driver, make_engine, sample, top_k_filter,
    top_p_filter,
)
from tests.models import helpers

RESPONSE = 12
BUCKETS = (8, 16)


def left_padded(lengths, vocab, seed=0, width=16):
  rng = np.random.default_rng(seed)
  ids = np.zeros((len(lengths), width), np.int32)
  mask = np.zeros((len(lengths), width), np.int32)
  for i, length in enumerate(lengths):
    ids[i, width - length:] = rng.integers(3, vocab, length)
    mask[i, width - length:] = 1
  return ids, mask


def sampler_for(model, slots, greedy=True, eos=(), ignore_eos=False, response=RESPONSE, mesh=None, rules=None,
                temperature=1.0, steps_per_sync=4, cpu_dot_library="auto", record_routing=False):
  mesh_ = mesh if mesh is not None else sharding.build_mesh((1, 1, 1, 1), jax.devices()[:1])
  options = factory.decode_compiler_options(mesh_, cpu_dot_library, factory.slots_per_device(mesh_, rules, slots))
  engine = make_engine(model, max_concurrent_decodes=slots, prefill_buckets=BUCKETS,
                       max_decode_length=response, eos_ids=eos, ignore_eos=ignore_eos, mesh=mesh, rules=rules,
                       sampling_params=SamplingParams(temperature=temperature, greedy=greedy),
                       decode_compiler_options=options, record_routing=record_routing)
  return RolloutSampler(engine, pad_id=0, steps_per_sync=steps_per_sync)


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def twins(request, tmp_path_factory):
  hf = helpers.hf_model(request.param)
  path = tmp_path_factory.mktemp(request.param)
  hf.save_pretrained(path)
  return hf, from_pretrained(str(path))


def hf_greedy(hf, ids, mask, new_tokens, eos):
  out = []
  for row, m in zip(ids, mask):
    prompt = torch.tensor(row[m.astype(bool)][None], dtype=torch.long)
    with torch.no_grad():
      gen = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                        max_new_tokens=new_tokens, min_new_tokens=0, eos_token_id=eos, pad_token_id=0)
    out.append(gen[0, prompt.shape[1]:].numpy())
  return out


@pytest.mark.parametrize("library", ["eigen", "ynnpack"])
def test_greedy_equals_transformers_generate(twins, library):
  hf, model = twins
  ids, mask = left_padded([3, 8, 11, 5, 16], 128)
  eos = 7
  sampler = sampler_for(model, slots=3, eos=(eos,), cpu_dot_library=library)
  got = sampler.generate(nnx.state(model, nnx.Param), ids, mask, 1, jax.random.key(0))
  for row, expected in enumerate(hf_greedy(hf, ids, mask, RESPONSE, eos)):
    length = got.response_lengths[row]
    np.testing.assert_array_equal(got.responses[row, :length], expected[:length], err_msg=f"row {row}")
    assert length == len(expected) or expected[length - 1] == eos


@pytest.mark.slow
def test_continuous_batching_equals_one_request_at_a_time(twins):
  _, model = twins
  params = nnx.state(model, nnx.Param)
  ids, mask = left_padded([2, 9, 4, 13, 6, 1, 16], 128, seed=1)
  few = sampler_for(model, slots=2, eos=(5,)).generate(params, ids, mask, 2, jax.random.key(0))
  many = sampler_for(model, slots=16, eos=(5,)).generate(params, ids, mask, 2, jax.random.key(0))
  one = [sampler_for(model, slots=1, eos=(5,)).generate(params, ids[i:i + 1], mask[i:i + 1], 2, jax.random.key(0))
         for i in range(len(ids))]
  np.testing.assert_array_equal(few.responses, many.responses)
  np.testing.assert_array_equal(few.response_lengths, many.response_lengths)
  np.testing.assert_array_equal(few.responses, np.concatenate([o.responses for o in one]))
  np.testing.assert_array_equal(few.prompt_index, np.repeat(np.arange(len(ids)), 2))


def full_sequence_log_probs(model, ids, mask, rollout, temperature):
  """log_softmax(logits / T) of each response token from one forward pass over prompt + response."""
  prompt_index = rollout.prompt_index
  seq = np.concatenate([ids[prompt_index], rollout.responses], axis=1)
  seq_mask = np.concatenate([mask[prompt_index], rollout.response_mask], axis=1)
  logits = np.asarray(model(jnp.asarray(seq), jnp.asarray(seq_mask)), np.float64) / temperature
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
  width = ids.shape[1]
  pred = logp[:, width - 1:-1]
  return np.take_along_axis(pred, rollout.responses[..., None], -1)[..., 0]


@pytest.mark.slow
def test_a_sampled_response_depends_on_its_request_not_its_slot_or_batch(twins):
  # request r samples from fold_in(key, r): any slot count, and prompts split over calls (as over hosts) with
  # their first request id, give the same responses
  _, model = twins
  params = nnx.state(model, nnx.Param)
  ids, mask = left_padded([2, 9, 4, 13, 6, 1], 128, seed=2)
  whole = sampler_for(model, slots=3, greedy=False, eos=(5,)).generate(params, ids, mask, 2, jax.random.key(3))
  many = sampler_for(model, slots=16, greedy=False, eos=(5,)).generate(params, ids, mask, 2, jax.random.key(3))
  sampler = sampler_for(model, slots=4, greedy=False, eos=(5,))
  halves = [sampler.generate(params, ids[i:i + 3], mask[i:i + 3], 2, jax.random.key(3), first_request=2 * i)
            for i in (0, 3)]
  np.testing.assert_array_equal(whole.responses, many.responses)
  np.testing.assert_array_equal(whole.responses, np.concatenate([h.responses for h in halves]))
  np.testing.assert_array_equal(whole.response_lengths, np.concatenate([h.response_lengths for h in halves]))
  assert len({tuple(r) for r in whole.responses}) > len(ids)  # sampled: a prompt's two responses differ


@pytest.mark.slow
def test_log_probs_are_the_sampling_distributions(twins):
  _, model = twins
  ids, mask = left_padded([4, 10, 16], 128, seed=2)
  temperature = 0.7
  rollout = sampler_for(model, slots=4, greedy=False, temperature=temperature, eos=(9,)).generate(
      nnx.state(model, nnx.Param), ids, mask, 3, jax.random.key(3))
  expected = full_sequence_log_probs(model, ids, mask, rollout, temperature)
  on = rollout.response_mask.astype(bool)
  np.testing.assert_allclose(rollout.log_probs[on], expected[on], atol=2e-4)
  assert np.all(rollout.log_probs[~on] == 0)
  # samples differ within a group: the key is used, and n rows are not copies
  assert len({tuple(r) for r in rollout.responses[:3]}) > 1


def filtered_probs(logits, temperature, k, p):
  """Independent reference: sort, keep top-k, keep the nucleus, renormalise."""
  z = np.asarray(logits, np.float64) / temperature
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  order = np.argsort(-probs, kind="stable")
  keep = np.zeros_like(probs, bool)
  total = 0.0
  for rank, token in enumerate(order):
    if (k > 0 and rank >= k) or total >= p:
      break
    keep[token] = True
    total += probs[token]
  out = np.where(keep, probs, 0.0)
  return out / out.sum()


@pytest.mark.parametrize("temperature,k,p", [(1.0, -1, 1.0), (0.5, -1, 1.0), (1.0, 3, 1.0), (1.3, -1, 0.6), (0.8, 4, 0.7)])
def test_sampled_distribution_matches_filtered_softmax(temperature, k, p):
  logits = jnp.asarray([2.0, 1.5, 1.4, 0.3, 0.0, -0.5, -1.0, 0.9])
  draws = 40000
  tokens, _ = jax.jit(lambda keys: sample(keys, jnp.tile(logits, (draws, 1)), SamplingParams(temperature, k, p)))(
      jax.random.split(jax.random.key(0), draws))
  freq = np.bincount(np.asarray(tokens), minlength=8) / draws
  ref = filtered_probs(logits, temperature, k, p)
  assert np.all(freq[ref == 0] == 0), (freq, ref)
  assert 0.5 * np.abs(freq - ref).sum() < 0.012, (freq, ref)


@pytest.mark.parametrize("vocab,block", [(1000, 128), (300, 128), (64, 16)])
def test_inverse_cdf_index_equals_a_full_cdf_search(vocab, block):
  rng = np.random.default_rng(vocab)
  probs = rng.random((6, vocab)) ** 4
  probs[1, : vocab // 2] = 0.0                        # mass only in later blocks
  probs[2, vocab // 3:] = 0.0                         # a filtered tail (top-k / top-p)
  probs[3, rng.random(vocab) < 0.9] = 0.0             # sparse
  probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)
  for u in [0.0, 1e-7, 0.25, 0.5, 0.999, 1 - 2.0 ** -24, 1.0, *rng.random(20)]:
    got = np.asarray(sampling.inverse_cdf_index(jnp.asarray(probs), jnp.full((6,), u, jnp.float32), block))
    cdf = np.cumsum(probs.astype(np.float64), -1)
    for row in range(6):
      token = got[row]
      assert probs[row, token] > 0, f"u={u}: drew token {token} of zero probability in row {row}"
      target = u * cdf[row, -1]
      low = cdf[row, token] - probs[row, token]
      assert low - 1e-5 <= target <= cdf[row, token] + 1e-5, (u, row, token, low, target, cdf[row, token])


def test_filters_keep_the_right_sets():
  logits = jnp.asarray([[3.0, 1.0, 2.0, 0.0]])
  assert np.isfinite(np.asarray(top_k_filter(logits, 2)) > -1e29).tolist() == [[True, True, True, True]]
  assert (np.asarray(top_k_filter(logits, 2)) > -1e29).tolist() == [[True, False, True, False]]
  probs = np.exp([3.0, 1.0, 2.0, 0.0]) / np.exp([3.0, 1.0, 2.0, 0.0]).sum()
  assert (np.asarray(top_p_filter(logits, probs[0] - 1e-3)) > -1e29).tolist() == [[True, False, False, False]]
  assert (np.asarray(top_p_filter(logits, probs[0] + 1e-3)) > -1e29).tolist() == [[True, False, True, False]]


@pytest.mark.slow
def test_eos_ignore_eos_and_length_cutoff():
  cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  model = CausalLM(cfg, nnx.Rngs(1))
  params = nnx.state(model, nnx.Param)
  ids, mask = left_padded([5, 7], 64, seed=4)
  free = sampler_for(model, slots=2).generate(params, ids, mask, 1, jax.random.key(0))
  assert list(free.response_lengths) == [RESPONSE, RESPONSE] and free.truncated.all()
  eos = int(free.responses[0, 3])
  first = int(np.argmax(free.responses[0] == eos))
  stopped = sampler_for(model, slots=2, eos=(eos,)).generate(params, ids, mask, 1, jax.random.key(0))
  assert stopped.response_lengths[0] == first + 1 and not stopped.truncated[0]
  assert stopped.responses[0, first] == eos and np.all(stopped.responses[0, first + 1:] == 0)
  assert stopped.response_mask[0].sum() == first + 1
  ignoring = sampler_for(model, slots=2, eos=(eos,), ignore_eos=True).generate(params, ids, mask, 1, jax.random.key(0))
  np.testing.assert_array_equal(ignoring.responses, free.responses)
  short = sampler_for(model, slots=2, response=3).generate(params, ids, mask, 1, jax.random.key(0))
  np.testing.assert_array_equal(short.responses, free.responses[:, :3])
  assert short.truncated.all()


@pytest.mark.slow
def test_no_recompilation_within_a_bucket():
  cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
  model = CausalLM(cfg, nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  sampler = sampler_for(model, slots=4, response=4)
  for seed, lengths in enumerate([[3], [5, 7, 2], [8, 1], [6, 6, 6, 6]]):
    ids, mask = left_padded(lengths, 64, seed=seed, width=8)
    sampler.generate(params, ids, mask, 1, jax.random.key(seed))
  engine = sampler.engine
  # prefill and insert: one compilation per prefix shape (bucket 8 x power-of-two rows 1, 4, 2);
  # prompt lengths 1..8 and slot choices never add one; decode compiles once
  # (rows, bucket, image patches per row: none for a text model)
  assert sorted(engine._prefills) == [(1, 8, 0), (2, 8, 0), (4, 8, 0)]  # pylint: disable=protected-access
  assert all(fn._cache_size() == 1 for fn in engine._prefills.values())  # pylint: disable=protected-access
  assert engine.insert_program._cache_size() == 3
  assert engine.generate_program._cache_size() == 1


def test_parameters_are_read_in_place_and_updates_are_seen():
  cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  model = CausalLM(cfg, nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  pointers = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(params)]
  sampler = sampler_for(model, slots=2)
  ids, mask = left_padded([4, 6], 64, seed=5)
  first = sampler.generate(params, ids, mask, 1, jax.random.key(0))
  live_before = len(jax.live_arrays())
  again = sampler.generate(params, ids, mask, 1, jax.random.key(0))
  assert len(jax.live_arrays()) == live_before  # nothing new stays alive: no copy of the weights
  assert [x.unsafe_buffer_pointer() for x in jax.tree.leaves(params)] == pointers
  np.testing.assert_array_equal(first.responses, again.responses)
  updated = jax.tree.map(lambda x: x * 1.5, params)
  changed = sampler.generate(updated, ids, mask, 1, jax.random.key(0))
  nnx.update(model, updated)
  reference = sampler_for(model, slots=2).generate(nnx.state(model, nnx.Param), ids, mask, 1, jax.random.key(0))
  np.testing.assert_array_equal(changed.responses, reference.responses)
  assert not np.array_equal(changed.responses, first.responses)


def test_cpu_dot_library_rule():
  eigen = {"xla_cpu_experimental_ynn_fusion_type": ""}
  low, high = factory.EIGEN_ROWS
  assert factory.cpu_dot_options("auto", 1, avx512=False) == {}
  assert factory.cpu_dot_options("auto", low - 1, avx512=False) == {}
  assert factory.cpu_dot_options("auto", low, avx512=False) == eigen
  assert factory.cpu_dot_options("auto", high, avx512=False) == eigen
  assert factory.cpu_dot_options("auto", high + 1, avx512=False) == {}
  # an AVX-512 host runs every decode row count faster in YNNPACK (BENCHMARKS.md)
  assert all(factory.cpu_dot_options("auto", rows, avx512=True) == {} for rows in (1, low, 16, high, 64))
  assert factory.cpu_dot_options("auto", 16) == factory.cpu_dot_options("auto", 16, factory.host_has_avx512())
  assert factory.cpu_dot_options("eigen", 512, avx512=True) == eigen
  assert factory.cpu_dot_options("ynnpack", 1) == {}
  with pytest.raises(ValueError, match="cpu_dot_library='blas': must be one of auto, ynnpack, eigen"):
    factory.cpu_dot_options("blas", 8)


def decode_hlo(engine, params):
  """The compiled text of the engine's decode loop (one step)."""
  return engine.generate_program.lower(params, engine.init_decode_state(), 1, engine.sampling_params).compile().as_text()  # pylint: disable=protected-access


AVX2_EIGEN = not factory.host_has_avx512()  # `auto`'s Eigen rows: on a host without AVX-512 only


@pytest.mark.parametrize("slots,data,library,ynn", [
    (4, 1, "auto", True),       # 4 rows per device: YNNPACK (Eigen is slower below 8)
    (16, 1, "auto", not AVX2_EIGEN),  # 16 rows: Eigen on an AVX2 host
    (32, 1, "auto", True),      # 32 rows: YNNPACK, XLA's default
    (64, 8, "auto", not AVX2_EIGEN),  # 64 slots over 8 devices: 8 rows each
    (4, 1, "ynnpack", True),
    (64, 1, "eigen", False),
])
def test_decode_dots_run_in_the_chosen_library(slots, data, library, ynn):
  cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  model = CausalLM(cfg, nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  mesh = sharding.build_mesh({"data": data, "fsdp": 1, "tensor": 1, "sequence": 1}) if data > 1 else None
  rules = [("batch", "data")] if data > 1 else None
  engine = sampler_for(model, slots=slots, mesh=mesh, rules=rules, cpu_dot_library=library).engine
  if data > 1:
    params = sharding.shard_like(params, sharding.param_shardings(params, mesh, rules))
  assert ("ynn_fusion" in decode_hlo(engine, params)) == ynn
  assert "ynn_fusion" in engine.prefill_fn(4, BUCKETS[0]).lower(
      params, jnp.zeros((4, BUCKETS[0]), jnp.int32), jnp.ones((4,), jnp.int32)).compile().as_text()


TENSOR_RULES = [("batch", ("data", "fsdp")), ("embed", "fsdp"), ("vocab", "tensor"), ("mlp", "tensor"),
                ("heads", "tensor"), ("kv_heads", "tensor")]


def one_device_generation(model):
  """(ids, mask, params, the unsharded sampler's greedy result) for 8 prompts of several lengths."""
  ids, mask = left_padded([3, 9, 16, 6, 2, 12, 7, 5], 128, seed=6)
  params = nnx.state(model, nnx.Param)
  expected = sampler_for(model, slots=8, eos=(7,)).generate(params, ids, mask, 1, jax.random.key(0))
  return ids, mask, params, expected


@pytest.mark.slow
def test_sharded_engine_equals_one_device(twins):
  ids, mask, params, expected = one_device_generation(twins[1])
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  rules = TENSOR_RULES
  placed = sharding.shard_like(params, sharding.param_shardings(params, mesh, rules))
  sampler = sampler_for(twins[1], slots=8, eos=(7,), mesh=mesh, rules=rules)
  state = sampler.engine.init_decode_state()
  assert state.cache.k[0].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), "tensor", None, None)
  got = sampler.generate(placed, ids, mask, 1, jax.random.key(0))
  np.testing.assert_array_equal(got.responses, expected.responses)


@pytest.mark.slow
def test_jetstream_orchestrator_serves_the_engine(twins):
  assert HAS_JETSTREAM, "the dev install includes google-jetstream; this test needs it"
  from jetstream.core.proto import jetstream_pb2

  hf, model = twins
  params = nnx.state(model, nnx.Param)
  engine = make_engine(model, max_concurrent_decodes=2, prefill_buckets=(8, 16, 32), max_decode_length=RESPONSE,
                       eos_ids=(7,), sampling_params=SamplingParams(greedy=True), params=params,
                       tokenizer=_BosOnly(bos=1))
  root_level = logging.getLogger().level
  driver = make_driver(engine, params)
  assert logging.getLogger().level == root_level  # JetStream's import-time DEBUG is undone
  prompts = [[5, 9, 33, 17], [44, 12, 90, 3, 3, 61, 2]]

  async def serve_all():
    client = sys.modules["jetstream.core.orchestrator"].LLMOrchestrator(driver=driver)

    async def decode(tokens):
      request = jetstream_pb2.DecodeRequest(
          token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=tokens), max_tokens=RESPONSE)
      out = []
      async for response in client.Decode(request):
        out.extend(response.stream_content.samples[0].token_ids)
      return out

    try:
      return await asyncio.wait_for(asyncio.gather(*(decode(p) for p in prompts)), 120)
    finally:
      # inside the loop: a request's end is two callbacks from the detokenize thread, and the loop must still be
      # open for the second after the first has ended the request (closed, it raised in that thread, which under
      # JetStream's own thread class killed pytest: the suite's SIGKILLs in this module)
      driver.stop()

  served = asyncio.run(serve_all())
  for tokens, got in zip(prompts, served):
    ids = np.asarray([[1, *tokens]], np.int32)
    expected = hf_greedy(hf, ids, np.ones_like(ids), RESPONSE, 7)[0]
    expected = list(expected[:list(expected).index(7)] if 7 in expected else expected)
    assert got == expected


def test_a_failing_driver_thread_raises_at_stop_and_leaves_the_process_alive(twins):
  # JetStream's own driver threads SIGKILL their process when they raise (the traceback on stdout, which pytest
  # captures): here the error is kept, logged, and raised by stop()
  _, model = twins
  params = nnx.state(model, nnx.Param)
  engine = make_engine(model, max_concurrent_decodes=2, prefill_buckets=(8,), max_decode_length=RESPONSE,
                       params=params, tokenizer=_BosOnly(bos=1))

  def broken():
    raise ValueError("no decode state today")

  engine.init_decode_state = broken  # the generate thread's first call
  driver = make_driver(engine, params)
  deadline = time.monotonic() + 30
  while not driver.thread_errors and time.monotonic() < deadline:
    time.sleep(0.05)
  assert [name for name, _ in driver.thread_errors] == ["generate-0"]
  with pytest.raises(DriverThreadError, match="generate-0 failed: ValueError.'no decode state today'"):
    driver.stop()


class _BosOnly:
  """Minimal tokenizer for serving token ids: JetStream prepends bos to token prompts."""

  def __init__(self, bos):
    self.bos_token_id, self.pad_token_id = bos, 0

  def encode(self, text):
    return [ord(c) % 100 for c in text]

  def decode(self, ids):
    return " ".join(map(str, ids))


@pytest.mark.slow
def test_rollout_mesh_reshards_the_weights_once_and_decodes_the_same(twins):
  ids, mask, params, expected = one_device_generation(twins[1])
  model = twins[1]
  train_mesh = sharding.build_mesh({"data": 1, "fsdp": 8, "tensor": 1, "sequence": 1})
  rules = TENSOR_RULES
  placed = sharding.shard_like(params, sharding.param_shardings(params, train_mesh, rules))
  mesh = factory.rollout_mesh(train_mesh, 2)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2, "sequence": 1, "expert": 1}
  sampler = sampler_for(model, slots=8, eos=(7,), mesh=mesh, rules=rules)
  copy = sampler.engine.compute_params(placed)
  q = copy["layers"][0]["attn"]["q"].get_value()
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert sampler.engine.compute_params(copy) is copy  # already the rollout's: read in place
  got = sampler.generate(placed, ids, mask, 1, jax.random.key(0))
  np.testing.assert_array_equal(got.responses, expected.responses)
  assert factory.rollout_mesh(train_mesh, 1) is train_mesh
  with pytest.raises(config_lib.ConfigError, match="rollout.tensor_model_parallel_size=3: does not divide the 8"):
    factory.rollout_mesh(train_mesh, 3)
