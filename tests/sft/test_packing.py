"""Packing: several examples per row give the same per-token losses, loss and gradient as one per row."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.models import CausalLM, ModelConfig
from rljax.sft import packing
from rljax.sft import step as step_lib

_CFG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, rope_theta=10000.0)
L = 16


def _examples(seed=0, lengths=(3, 11, 5, 8, 2, 13, 6)):
  rng = np.random.default_rng(seed)
  out = []
  for n in lengths:
    ids = rng.integers(1, _CFG.vocab_size, n).astype(np.int32)
    mask = (np.arange(n) >= n // 2).astype(np.int32)
    out.append((ids, mask))
  return out


@jax.jit
def _value_and_grad(graphdef, params, rows, n):
  return jax.value_and_grad(lambda p: step_lib.nll_sum(nnx.merge(graphdef, p), rows) / n)(params)


def _loss_and_grad(graphdef, params, rows):
  return _value_and_grad(graphdef, params, rows, jnp.float32(packing.trained_tokens(rows)))


@nnx.jit
def _log_probs(model, rows):
  logits = model(rows["input_ids"], rows["segment_ids"] > 0, rows["positions"], rows["segment_ids"])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, rows["targets"][..., None], axis=-1)[..., 0]


def _token_log_probs(model, rows):
  return np.asarray(_log_probs(model, rows))


def test_first_fit_decreasing_fills_rows_and_keeps_every_example():
  lengths = [3, 11, 5, 8, 2, 13, 6]
  groups = packing.first_fit_decreasing(lengths, L)
  assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
  assert all(sum(lengths[i] for i in g) <= L for g in groups)
  assert groups == [[5, 0], [1, 2], [3, 6, 4]]


def test_packed_loss_and_gradient_equal_unpacked():
  model = CausalLM(_CFG, nnx.Rngs(3))
  graphdef, params = nnx.split(model, nnx.Param)
  examples = _examples()
  lengths = [len(e[0]) for e in examples]
  unpacked = packing.build_rows(examples, packing.one_per_row(lengths), L, 8, pad_id=0)
  groups = packing.first_fit_decreasing(lengths, L)
  packed = packing.build_rows(examples, groups, L, 8, pad_id=0)  # same shape: one compilation
  assert packing.trained_tokens(packed) == packing.trained_tokens(unpacked) == sum(n - n // 2 for n in lengths)
  # positions restart at every example of a packed row
  assert packed["positions"][0, :16].tolist() == list(range(13)) + [0, 1, 2]
  assert packed["segment_ids"][0, :16].tolist() == [1] * 13 + [2] * 3

  loss_u, grad_u = _loss_and_grad(graphdef, params, unpacked)
  loss_p, grad_p = _loss_and_grad(graphdef, params, packed)
  np.testing.assert_allclose(float(loss_p), float(loss_u), rtol=1e-6)
  for gu, gp in zip(jax.tree.leaves(grad_u), jax.tree.leaves(grad_p)):
    np.testing.assert_allclose(np.asarray(gp), np.asarray(gu), rtol=1e-4, atol=1e-7)

  # each example's per-token log-probs are its own, wherever it sits
  logp_u, logp_p = _token_log_probs(model, unpacked), _token_log_probs(model, packed)
  where = {k: (r, sum(lengths[j] for j in g[:g.index(k)])) for r, g in enumerate(groups) for k in g}
  for k, n in enumerate(lengths):
    r, start = where[k]
    np.testing.assert_allclose(logp_p[r, start:start + n - 1], logp_u[k, :n - 1], rtol=1e-5, atol=1e-6)


def test_no_cross_contamination_between_packed_examples():
  model = CausalLM(_CFG, nnx.Rngs(4))
  examples = _examples(seed=1, lengths=(7, 9))
  rows = packing.build_rows(examples, [[0, 1]], L, 8, pad_id=0)
  changed = [(examples[0][0][::-1].copy(), examples[0][1]), examples[1]]
  other = packing.build_rows(changed, [[0, 1]], L, 8, pad_id=0)
  np.testing.assert_array_equal(_token_log_probs(model, rows)[0, 7:15], _token_log_probs(model, other)[0, 7:15])
