"""Rollout weights quantized to 8 bits at weight sync (`rollout.quantization`, `rljax.models.weight_quant`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax import sharding
from rljax.models import from_pretrained, lora, weight_quant
from rljax.models.weight_quant import QuantizedWeight
from rljax.rollout import SamplingParams, make_engine
from tests.models import helpers

RULES = [("batch", ("data", "fsdp")), ("embed", "fsdp"), ("vocab", "tensor"), ("mlp", "tensor"),
         ("heads", "tensor"), ("kv_heads", "tensor"), ("exp", "tensor")]


def test_per_channel_int8_is_within_half_a_step_and_keeps_zero_channels():
  """Each output channel's scale is its largest magnitude over 127; every value comes back within half a scale,
  the largest exactly, and an all-zero channel stays zero."""
  w = jax.random.normal(jax.random.key(0), (16, 4, 8)) * jnp.arange(1, 9)  # [embed, heads, head_dim]
  w = w.at[:, 1, 3].set(0.0)
  q = weight_quant.quantize(w, (0,), jnp.int8, jnp.float32)
  assert q.values.dtype == jnp.int8 and q.scale.shape == (1, 4, 8)
  np.testing.assert_allclose(q.scale[0], jnp.max(jnp.abs(w), axis=0) / 127, rtol=1e-6)
  back = weight_quant.dequantize(q, jnp.float32)
  assert float(jnp.max(jnp.abs(back - w) / jnp.maximum(q.scale, 1e-30))) <= 0.5 + 1e-4
  assert float(jnp.max(jnp.abs(back[:, 1, 3]))) == 0.0
  np.testing.assert_allclose(jnp.max(jnp.abs(back), axis=0), jnp.max(jnp.abs(w), axis=0), rtol=1e-6)


@pytest.fixture(scope="module", params=["llama3", "qwen3_moe"])
def family(request, tmp_path_factory):
  """(model, its float32 parameters over a 2 x 2 x 2 mesh, the mesh) of a dense (tied, biased) and a
  mixture-of-experts family."""
  _, path = helpers.saved_family(tmp_path_factory, request.param)
  model = from_pretrained(path)
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  params = nnx.state(model, nnx.Param)
  return model, sharding.shard_like(params, sharding.param_shardings(params, mesh, RULES)), mesh


def _decode(model, mesh, params, quantization, rows):
  engine = make_engine(model, max_concurrent_decodes=4, prefill_buckets=(8,), max_decode_length=8,
                       sampling_params=SamplingParams(greedy=True), mesh=mesh, rules=RULES,
                       quantization=quantization)
  compute = engine.compute_params(params)
  state = engine.init_decode_state()
  for slot, ids in enumerate(rows):
    padded = np.zeros((8,), np.int32)
    padded[:len(ids)] = ids
    state = engine.insert(engine.prefill(params=compute, padded_tokens=padded, true_length=len(ids)), state, slot)
  _, out = engine.generate_steps(compute, state, 6)
  return compute, np.asarray(out.tokens), np.asarray(out.log_probs)


def _dequantized(state):
  """A parameter state with every QuantizedWeight replaced by its float32 weight."""
  return jax.tree.map(lambda v: v.replace(weight_quant.dequantize(v.get_value(), jnp.float32))
                      if isinstance(v.get_value(), QuantizedWeight) else v, state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def _quantized(state):
  """{path: the QuantizedWeight} of a parameter state's quantized leaves."""
  flat = nnx.to_flat_state(state)
  return {path: var.get_value() for path, var in flat if isinstance(var.get_value(), QuantizedWeight)}


@pytest.mark.slow
@pytest.mark.parametrize("quantization", [jnp.int8, jnp.float8_e4m3fn])
def test_an_8bit_engine_decodes_as_its_dequantized_weights_would(family, quantization):
  """The engine quantizes every projection, expert and embedding on its mesh (norms, biases and the router keep
  the compute dtype), holds under 0.35x the float32 bytes, and decodes (prefill gathering the 8-bit weights, decode
  over the shards) exactly as a full-precision engine given the dequantized weights."""
  model, params, mesh = family
  rng = np.random.default_rng(3)
  rows = [rng.integers(3, 128, n).astype(np.int32) for n in (5, 8, 3, 7)]
  compute, tokens, log_probs = _decode(model, mesh, params, quantization, rows)
  quantized = _quantized(compute)
  names = {path[-1] for path in quantized}
  assert {"q", "k", "v", "o", "embed"} <= names and ("lm_head" in names) != model.cfg.tie_word_embeddings
  assert {"gate", "up", "down"} <= names and "router" not in names and "scale" not in names
  assert all(w.values.dtype == quantization for w in quantized.values())
  held = sum(x.nbytes for x in jax.tree.leaves(compute))  # a quarter of float32, plus scales, norms and biases
  assert held < 0.35 * sum(x.nbytes for x in jax.tree.leaves(params))
  # each scale is laid out as its weight's output axes are (its contracted axes, of size 1, are whole)
  for w in quantized.values():
    pad = lambda spec: tuple(spec) + (None,) * (w.values.ndim - len(spec))  # noqa: E731
    assert pad(w.scale.sharding.spec) == tuple(a if n > 1 else None for a, n in
                                               zip(pad(w.values.sharding.spec), w.scale.shape))
  dequantized = _dequantized(compute)
  _, want_tokens, want_log_probs = _decode(model, mesh, dequantized, None, rows)
  np.testing.assert_array_equal(tokens, want_tokens)
  np.testing.assert_allclose(log_probs, want_log_probs, atol=1e-4)
  # and the first token's distribution stays near full precision's (later tokens may differ once one flips)
  _, _, full_log_probs = _decode(model, mesh, params, None, rows)
  assert np.max(np.abs(log_probs[:, 0] - full_log_probs[:, 0])) < (0.1 if quantization == jnp.int8 else 0.3)


def test_compute_params_reads_its_own_output_in_place(family):
  """What an int8 engine's `compute_params` returned goes back through it untouched (the sampler passes it again:
  no second weight sync), while the trainer's weights take one copy; an unquantized engine of their dtype reads
  them in place."""
  model, params, mesh = family
  engine = make_engine(model, max_concurrent_decodes=4, prefill_buckets=(8,), max_decode_length=8, mesh=mesh,
                       rules=RULES, quantization=jnp.int8)
  compute = engine.compute_params(params)
  assert compute is not params and engine.compute_params(compute) is compute
  assert engine.weights.sync_steps(compute) == [] and len(engine.weights.sync_steps(params)) == 1
  plain = make_engine(model, max_concurrent_decodes=4, prefill_buckets=(8,), max_decode_length=8, mesh=mesh,
                      rules=RULES)
  assert plain.compute_params(params) is params


@pytest.mark.slow
def test_lora_adapters_stay_in_the_compute_dtype_beside_8bit_base_weights(tmp_path_factory):
  """A LoRA model's engine quantizes the base projections and leaves the adapters (and their scales) as they
  are; it decodes as the dequantized base weights with the same adapters do."""
  _, path = helpers.saved_family(tmp_path_factory, "llama3")
  model = lora.apply_lora(from_pretrained(path), lora.LoRAConfig(rank=4, init_lora_weights="gaussian"))
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  params = nnx.state(model)
  compute, tokens, log_probs = _decode(model, mesh, params, jnp.int8, [np.arange(3, 9, dtype=np.int32)] * 4)
  flat = nnx.to_flat_state(compute)
  assert all(not isinstance(v.get_value(), QuantizedWeight) for p, v in flat if "adapters" in p)
  assert {p[-1] for p in _quantized(compute)} == {"q", "k", "v", "o", "gate", "up", "down", "embed"}
  dequantized = _dequantized(compute)
  _, want_tokens, want_log_probs = _decode(model, mesh, dequantized, None, [np.arange(3, 9, dtype=np.int32)] * 4)
  np.testing.assert_array_equal(tokens, want_tokens)
  np.testing.assert_allclose(log_probs, want_log_probs, atol=1e-4)
