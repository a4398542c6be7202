"""Gemma 3 (gemma3_text): config spellings and errors, scanned, cached, sharded and pallas passes, greedy generation.

Logits parity and both checkpoint directions run with the other families in
test_hf_parity (helpers.FAMILIES["gemma3"]).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType

import rljax.models as M
from rljax.models.attention import AttentionMask, attend
from tests.models import helpers
from tests.rollout.test_rollout import hf_greedy, left_padded, sampler_for


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """(the HF model, the directory transformers saved it to)."""
  return helpers.saved_family(tmp_path_factory, "gemma3")


def hf_config(path):
  with open(os.path.join(path, "config.json")) as f:
    return json.load(f)


def test_transformers_4_spelling_reads_as_5(saved):
  _, path = saved
  v5 = hf_config(path)
  assert "full_attention" in v5["rope_parameters"]
  v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "layer_types")}
  v4.update(rope_theta=5000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_local_base_freq=100.0,
            sliding_window_pattern=2)
  a, b = M.from_hf_dict(v5), M.from_hf_dict(v4)
  assert a == b.replace(hf_extra=a.hf_extra)
  assert a.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
  assert (a.rope_theta, a.rope_local_theta, a.sliding_window) == (5000.0, 100.0, 4)
  assert a.rope_scaling == {"rope_type": "linear", "factor": 2.0}
  assert a.attn_logit_softcapping is None and a.hf_extra["attn_logit_softcapping"] == 3.0
  default = M.from_hf_dict({**v4, "num_hidden_layers": 7, "sliding_window_pattern": None})
  assert [t[0] for t in default.layer_types] == list("sssssfs")
  assert M.to_hf_dict(a)["attn_logit_softcapping"] == 3.0


@pytest.mark.parametrize("edit,field", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "relu"}, "hidden_activation"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}},
     "sliding_attention"),
])
def test_unsupported_fields_are_named(saved, edit, field):
  with pytest.raises(ValueError, match=field):
    M.from_hf_dict({**hf_config(saved[1]), **edit})


@pytest.mark.slow
def test_scan_and_remat_match_unrolled(saved):
  _, path = saved
  ids, mask = helpers.batch()
  plain = M.from_pretrained(path)
  scanned = M.from_pretrained(path, scan_layers=True, remat=True)

  (l1, _, g1), (l2, _, g2) = (helpers.loss_and_grad(m, ids, mask) for m in (plain, scanned))
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  for i in range(3):
    for name in (("attn", "q"), ("pre_mlp_norm", "scale"), ("post_mlp_norm", "scale")):
      want = np.asarray(g1["layers"][i][name[0]][name[1]][...])
      np.testing.assert_allclose(g2["layers"][name[0]][name[1]][...][i], want, atol=1e-5 * np.abs(want).max())


@pytest.mark.slow
def test_kv_cache_prefill_then_decode_matches_full_forward(saved):
  _, path = saved
  model = M.from_pretrained(path, scan_layers=True)
  ids, mask = helpers.batch()
  full_ids = np.concatenate([ids, [[5, 6], [7, 8], [9, 10]]], axis=1)
  full_mask = np.concatenate([mask, np.ones((3, 2), np.int32)], axis=1)
  full = np.asarray(model(jnp.asarray(full_ids), jnp.asarray(full_mask)))
  step = jax.jit(model.step)
  # per-layer caches (the engine's: layers run one by one) and a stacked one (a scan over both kinds of layer)
  for stacked in (False, True):
    cache = M.init_cache(model.cfg, 3, 16, stacked=stacked)
    logits, cache = step(jnp.asarray(ids), cache, jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(logits)[mask == 1], full[:, :10][mask == 1], atol=1e-5)
    for t in (10, 11):
      logits, cache = step(jnp.asarray(full_ids[:, t:t + 1]), cache)
      np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-5)


def test_sharded_scan_equals_unsharded(saved):
  _, path = saved
  mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
  rules = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"), ("layers", None)]
  full = M.from_pretrained(path)
  sharded = M.from_pretrained(path, mesh=mesh, rules=rules, scan_layers=True)
  assert len({str(s.index) for s in sharded.layers.post_mlp_norm.scale[...].addressable_shards}) > 1
  ids, mask = helpers.batch()
  np.testing.assert_allclose(np.asarray(sharded(ids, mask)), np.asarray(full(ids, mask)), atol=1e-5)


@pytest.mark.slow
def test_greedy_32_tokens_equal_transformers_generate(saved):
  hf, path = saved
  model = M.from_pretrained(path)
  ids, mask = left_padded([3, 8, 11, 16], 128)
  got = sampler_for(model, slots=3, ignore_eos=True, response=32).generate(
      nnx.state(model, nnx.Param), ids, mask, 1, jax.random.key(0))
  for row, expected in enumerate(hf_greedy(hf, ids, mask, 32, eos=None)):
    np.testing.assert_array_equal(got.responses[row], expected, err_msg=f"row {row}")


def test_pallas_scan_over_both_kinds_of_layer_matches_xla(saved):
  _, path = saved
  ids, mask = helpers.batch()
  want = np.asarray(M.from_pretrained(path)(ids, mask))
  scanned = M.from_pretrained(path, scan_layers=True, attention_kernel="pallas")
  assert helpers.max_diff_on_mask(jax.jit(lambda i, m: scanned(i, m))(ids, mask), want, mask) <= 1e-5
  q, k = jnp.ones((1, 2, 1, 1, 4)), jnp.ones((1, 1, 2, 4))
  with pytest.raises(ValueError, match="attn_logit_softcapping"):
    attend(q, k, k, AttentionMask(dense=jnp.ones((1, 2, 2), bool)), "pallas", softcap=3.0)


def test_attention_softcap_caps_scores():
  rng = np.random.default_rng(0)
  q = rng.normal(size=(1, 3, 1, 2, 4)).astype(np.float32) * 3
  k, v = rng.normal(size=(2, 1, 1, 3, 4)).astype(np.float32)
  mask = np.tril(np.ones((3, 3), bool))[None]
  scores = np.einsum("btkgh,bksh->bkgts", q, k)
  scores = np.where(mask[:, None, None], 2.0 * np.tanh(scores / 2.0), -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  want = np.einsum("bkgts,bksh->btkgh", weights / weights.sum(-1, keepdims=True), v)
  got = attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), AttentionMask(dense=jnp.asarray(mask)), "xla",
               softcap=2.0)
  np.testing.assert_allclose(got, want, atol=1e-5)
