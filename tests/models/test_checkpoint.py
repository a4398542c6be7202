"""Checkpoint I/O: sharded files, clear errors on bad input, sharded placement."""

import json
import os
import shutil
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

import rljax.models as M
from rljax.models import safetensors_io
from rljax.sharding import rules as sharding_rules
from tests.models import helpers


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """A transformers-saved tiny Qwen2 (biases, untied) directory."""
  path = str(tmp_path_factory.mktemp("qwen2"))
  helpers.hf_model("qwen2").save_pretrained(path)
  return path


def _copy(src, tmp_path):
  dst = str(tmp_path / "ckpt")
  shutil.copytree(src, dst)
  return dst


def _rewrite(path, edit):
  """Loads model.safetensors, applies edit(dict) in place, writes it back."""
  file = os.path.join(path, "model.safetensors")
  reader = safetensors_io.SafetensorsReader(file)
  tensors = {n: np.array(reader.tensor(n)) for n in reader.names()}
  del reader
  edit(tensors)
  safetensors_io.write_file(file, tensors)


def test_sharded_save_writes_index_and_reloads(model_dir, tmp_path):
  model = M.from_pretrained(model_dir)
  out = str(tmp_path / "out")
  M.save_pretrained(model, out, max_shard_bytes=20_000)
  with open(os.path.join(out, safetensors_io.INDEX_FILE)) as f:
    index = json.load(f)
  files = set(index["weight_map"].values())
  assert len(files) > 1 and all(os.path.exists(os.path.join(out, f)) for f in files)
  assert not os.path.exists(os.path.join(out, "model.safetensors"))
  ids, mask = helpers.batch()
  np.testing.assert_array_equal(np.asarray(M.from_pretrained(out)(ids, mask)),
                                np.asarray(model(ids, mask)))


def test_plan_shards_respects_limit():
  sizes = [("a", 3), ("b", 3), ("c", 5), ("d", 1)]
  assert safetensors_io.plan_shards(sizes, 6) == [["a", "b"], ["c", "d"]]
  assert safetensors_io.shard_file_names(2) == ["model-00001-of-00002.safetensors",
                                                "model-00002-of-00002.safetensors"]


def test_bfloat16_round_trip(model_dir, tmp_path):
  model = M.from_pretrained(model_dir, dtype=jnp.bfloat16)
  assert model.layers[0].attn.q[...].dtype == jnp.bfloat16
  M.save_pretrained(model, str(tmp_path))
  reader = safetensors_io.SafetensorsReader(str(tmp_path))
  assert reader.tensor("model.embed_tokens.weight").dtype == jnp.bfloat16
  again = M.from_pretrained(str(tmp_path), dtype=jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(again.embed[...]), np.asarray(model.embed[...]))


def test_missing_tensor_is_named(model_dir, tmp_path):
  path = _copy(model_dir, tmp_path)
  _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
  with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.self_attn\.k_proj\.bias"):
    M.from_pretrained(path)


def test_unexpected_tensor_is_named(model_dir, tmp_path):
  path = _copy(model_dir, tmp_path)
  _rewrite(path, lambda t: t.update({"model.layers.0.extra.weight": np.zeros(3, np.float32)}))
  with pytest.raises(ValueError, match=r"unexpected.*model\.layers\.0\.extra\.weight"):
    M.from_pretrained(path)


def test_wrong_shape_is_named(model_dir, tmp_path):
  path = _copy(model_dir, tmp_path)
  _rewrite(path, lambda t: t.update(
      {"model.layers.0.mlp.up_proj.weight": np.zeros((47, 32), np.float32)}))
  with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\(47, 32\).*"
                                       r"\(48, 32\)"):
    M.from_pretrained(path)


def test_unknown_model_type_is_named(model_dir, tmp_path):
  path = _copy(model_dir, tmp_path)
  with open(os.path.join(path, "config.json")) as f:
    cfg = json.load(f)
  cfg["model_type"] = "gpt_neox"
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f)
  with pytest.raises(ValueError, match=r"model_type='gpt_neox'.*supported"):
    M.from_pretrained(path)


@pytest.mark.parametrize("corruption", ["length", "json", "offsets", "short"])
def test_corrupt_safetensors_header(model_dir, tmp_path, corruption):
  path = _copy(model_dir, tmp_path)
  file = os.path.join(path, "model.safetensors")
  with open(file, "rb") as f:
    raw = bytearray(f.read())
  n = struct.unpack("<Q", raw[:8])[0]
  if corruption == "length":
    raw[:8] = struct.pack("<Q", len(raw) * 2)
  elif corruption == "json":
    raw[8:12] = b"\xff\xfe{{"
  elif corruption == "offsets":
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 4
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    raw[8:8 + n] = text.ljust(n)
  else:
    raw = raw[:5]
  with open(file, "wb") as f:
    f.write(raw)
  detail = {"length": "exceeds file size", "json": "invalid JSON", "offsets": "has offsets",
            "short": "shorter than 8 bytes"}[corruption]
  with pytest.raises(ValueError,
                     match=rf"model\.safetensors: corrupt safetensors header.*{detail}"):
    M.from_pretrained(path)


def test_logical_to_spec_rules():
  mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
  rules = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("kv_heads", "tensor"),
           ("vocab", ("fsdp", "tensor"))]
  spec = sharding_rules.logical_to_spec
  assert spec(("embed", "mlp"), (32, 48), mesh, rules) == PartitionSpec("fsdp", "tensor")
  # kv_heads=2 is not divisible by tensor=4: replicated.
  assert spec(("embed", "kv_heads", "head_dim"), (32, 2, 8), mesh, rules) == PartitionSpec(
      "fsdp", None, None)
  # fsdp used by vocab already: embed stays replicated.
  assert spec(("vocab", "embed"), (128, 32), mesh, rules) == PartitionSpec(
      ("fsdp", "tensor"), None)
  assert spec(("layers", "embed"), (2, 32), mesh, None) == PartitionSpec(None, None)


@pytest.mark.parametrize("scan", [False, True])
def test_sharded_load_places_right_slices(model_dir, scan):
  assert jax.device_count() == 8
  mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
  rules = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"),
           ("layers", None)]
  full = M.from_pretrained(model_dir, scan_layers=scan)
  sharded = M.from_pretrained(model_dir, mesh=mesh, rules=rules, scan_layers=scan)
  want = dict(nnx.to_flat_state(nnx.state(full, nnx.Param)))
  shardings = dict(nnx.to_flat_state(sharding_rules.param_shardings(sharded, mesh, rules)))
  checked = 0
  for path, var in nnx.to_flat_state(nnx.state(sharded, nnx.Param)):
    arr, ref = var[...], np.asarray(want[path][...])
    expected = sharding_rules.logical_to_spec(var.get_metadata()["out_sharding"], arr.shape, mesh,
                                          rules)
    assert arr.sharding.spec == expected == shardings[path].get_value().spec, path
    for shard in arr.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), ref[shard.index])
    checked += len(arr.addressable_shards) > 1 and len(set(
        str(s.index) for s in arr.addressable_shards)) > 1
  assert checked >= 5
  q = sharded.layers.attn.q[...] if scan else sharded.layers[0].attn.q[...]
  assert q.sharding.spec == PartitionSpec(*((None,) if scan else ()), "fsdp", "tensor", None)
  ids, mask = helpers.batch()
  np.testing.assert_allclose(np.asarray(sharded(ids, mask)), np.asarray(full(ids, mask)),
                             atol=1e-5)
