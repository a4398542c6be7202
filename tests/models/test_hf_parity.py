"""Logits parity with transformers' PyTorch models, both checkpoint directions."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import rljax.models as M
from tests.models import helpers

FAMILIES = sorted(helpers.FAMILIES)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """family -> (HF model, directory it was saved to by transformers)."""
  out = {}
  for family in FAMILIES:
    model = helpers.hf_model(family)
    path = str(tmp_path_factory.mktemp(family))
    model.save_pretrained(path)
    out[family] = (model, path)
  return out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_from_transformers_checkpoint_same_logits(saved, family):
  hf, path = saved[family]
  ids, mask = helpers.batch()
  model = M.from_pretrained(path)
  assert model.cfg.model_type == hf.config.model_type
  ours = model(jnp.asarray(ids), jnp.asarray(mask))
  ref = helpers.hf_logits(hf, ids, mask)
  assert helpers.max_diff_on_mask(ours, ref, mask) <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_opens_in_transformers(saved, family, tmp_path):
  _, path = saved[family]
  ids, mask = helpers.batch(seed=1)
  model = M.from_pretrained(path)
  M.save_pretrained(model, str(tmp_path))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32, attn_implementation="eager")
  ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
  assert helpers.max_diff_on_mask(ours, helpers.hf_logits(reloaded, ids, mask), mask) <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True])  # True: each layer's input kept in host memory
def test_scan_and_remat_match_unrolled(saved, offload):
  _, path = saved["qwen3"]
  ids, mask = helpers.batch()
  plain = M.from_pretrained(path)
  scanned = M.from_pretrained(path, scan_layers=True, remat=True, offload_activations=offload)
  assert scanned.layers.attn.q.shape[0] == plain.cfg.num_layers

  (l1, _, g1), (l2, _, g2) = (helpers.loss_and_grad(m, ids, mask) for m in (plain, scanned))
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  np.testing.assert_allclose(g1["layers"][1]["attn"]["q"][...],
                             g2["layers"]["attn"]["q"][...][1], rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(g1["embed"][...], g2["embed"][...], rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_kv_cache_prefill_then_decode_matches_full_forward(saved, scan):
  _, path = saved["mistral"]  # sliding window 4 exercises the windowed cache mask.
  model = M.from_pretrained(path, scan_layers=scan)
  ids, mask = helpers.batch()
  full_ids = np.concatenate([ids, [[5, 6], [7, 8], [9, 10]]], axis=1)
  full_mask = np.concatenate([mask, np.ones((3, 2), np.int32)], axis=1)
  full = np.asarray(model(jnp.asarray(full_ids), jnp.asarray(full_mask)))
  cache = M.init_cache(model.cfg, 3, 16)
  logits, cache = model.step(jnp.asarray(ids), cache, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(logits)[mask == 1], full[:, :10][mask == 1], atol=1e-5)
  last, _ = model.step(jnp.asarray(ids), M.init_cache(model.cfg, 3, 16), jnp.asarray(mask),
                       last_only=True)
  np.testing.assert_allclose(np.asarray(last)[:, 0], full[:, 9], atol=1e-5)
  for t in (10, 11):
    logits, cache = model.step(jnp.asarray(full_ids[:, t:t + 1]), cache)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.index), [12, 12, 12])


@pytest.mark.slow
def test_segment_ids_isolate_packed_sequences(saved):
  _, path = saved["llama3"]
  model = M.from_pretrained(path)
  a, b = np.arange(3, 9), np.arange(20, 24)
  packed = np.concatenate([a, b])[None]
  segments = np.array([[1] * 6 + [2] * 4])
  positions = np.array([list(range(6)) + list(range(4))])
  out = np.asarray(model(jnp.asarray(packed), positions=jnp.asarray(positions),
                         segment_ids=jnp.asarray(segments)))
  np.testing.assert_allclose(out[0, :6], np.asarray(model(jnp.asarray(a[None])))[0], atol=1e-5)
  np.testing.assert_allclose(out[0, 6:], np.asarray(model(jnp.asarray(b[None])))[0], atol=1e-5)


@pytest.mark.slow
def test_override_config_replaces_fields(saved):
  _, path = saved["llama_linear"]
  model = M.from_pretrained(path, override_config={"rope_theta": 1234.0,
                                                   "rms_norm_eps": 1e-3})
  assert model.cfg.rope_theta == 1234.0 and model.cfg.rms_norm_eps == 1e-3
