"""LoRA adapters: exact no-op at init, gradients, scaling, merged and PEFT exports, sharding."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx

import rljax.models as M
from rljax import config as config_lib
from rljax import sharding
from rljax.models import lora
from tests.models import helpers

peft = pytest.importorskip("peft")

CFG = M.ModelConfig(model_type="llama", vocab_size=128, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=False)


def tiny(scan=False, seed=0):
  return M.CausalLM(dataclasses.replace(CFG, scan_layers=scan), nnx.Rngs(seed))


def perturb(model, seed=1, scale=0.2):
  """Random values for every trained variable (adapters' B included), so LoRA is no longer a no-op."""
  graphdef, trained, frozen = lora.split_trainable(model)
  leaves, treedef = jax.tree.flatten(trained)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy), frozen)


def logits(model, ids, mask=None):
  return np.asarray(model(jnp.asarray(ids), None if mask is None else jnp.asarray(mask)))


IDS, MASK = helpers.batch()


@pytest.mark.parametrize("scan,init", [(False, True), (True, "gaussian")])
def test_zero_b_reproduces_base_logits_exactly(scan, init):
  model = tiny(scan)
  base = logits(model, IDS, MASK)
  lora.apply_lora(model, lora.LoRAConfig(rank=4, alpha=8, init_lora_weights=init), jax.random.key(3))
  np.testing.assert_array_equal(logits(model, IDS, MASK), base)
  assert lora.has_lora(model)


@pytest.mark.slow
def test_gradients_reach_only_adapters_and_optimizer_holds_only_them():
  model = lora.apply_lora(tiny(), lora.LoRAConfig(rank=2, alpha=4, target_modules=["q_proj", "down_proj"]))
  graphdef, trained, frozen = lora.split_trainable(model)
  paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(trained)]
  assert paths and all("/adapters/" in p for p in paths)
  assert {p.rsplit("/", 2)[-2] for p in paths} == {"q", "down"}
  assert not any(isinstance(v, (lora.LoRAParam, lora.TrainedParam)) for _, v in nnx.to_flat_state(frozen))
  assert len(nnx.state(frozen, nnx.Param)) == len(nnx.state(tiny(), nnx.Param))

  def loss(t):
    return jnp.mean(nnx.merge(graphdef, t, frozen)(IDS, MASK) ** 2)

  grads = jax.grad(loss)(trained)
  assert jax.tree.structure(grads) == jax.tree.structure(trained)
  b_grads = [g for p, g in nnx.to_flat_state(grads) if p[-1] == "b"]
  assert all(float(jnp.abs(g[...]).max()) > 0 for g in b_grads)

  tx = optax.adamw(1e-2)
  lora_opt = tx.init(trained)
  full_opt = tx.init(nnx.state(tiny(), nnx.Param))
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
  adapter_bytes = nbytes(trained)
  assert nbytes(lora_opt) == 2 * adapter_bytes + 4  # Adam's mu and nu, and the step count
  assert nbytes(full_opt) > 20 * nbytes(lora_opt)
  updates, _ = tx.update(grads, lora_opt, trained)
  stepped = nnx.merge(graphdef, optax.apply_updates(trained, updates), frozen)
  assert np.abs(logits(stepped, IDS, MASK) - logits(model, IDS, MASK)).max() > 0


def test_scaling_and_patterns_against_hand_values():
  assert lora.lora_scale(8, 16, False) == 2.0
  assert lora.lora_scale(8, 16, True) == pytest.approx(16 / math.sqrt(8))
  patterns = {r"layers\.1\.self_attn\.q_proj": 2, "q_proj": 4, "self_attn": 7}
  assert lora.pattern_value(patterns, "model.layers.1.self_attn.q_proj", 8) == 2
  assert lora.pattern_value(patterns, "model.layers.0.self_attn.q_proj", 8) == 4
  assert lora.pattern_value(patterns, "model.layers.0.self_attn.k_proj", 8) == 8
  assert lora.pattern_value({"proj": 3}, "model.layers.0.mlp.up_proj", 8) == 8  # whole dotted parts only

  config = lora.LoRAConfig(rank=8, alpha=16, r_pattern={r"layers\.1\.self_attn\.q_proj": 2, "q_proj": 4},
                           alpha_pattern={"down_proj": 32})
  model = lora.apply_lora(tiny(), config)
  q0, q1 = model.layers[0].attn.adapters["q"], model.layers[1].attn.adapters["q"]
  assert q0.a.shape == (32, 4) and q0.b.shape == (4, 4, 8) and float(q0.scale[...]) == 16 / 4
  assert q1.a.shape == (32, 2) and float(q1.scale[...]) == 16 / 2
  assert model.layers[0].attn.adapters["o"].a.shape == (4, 8, 8)
  assert float(model.layers[0].mlp.adapters["down"].scale[...]) == 32 / 8
  assert float(model.layers[0].mlp.adapters["up"].scale[...]) == 16 / 8
  rs = lora.apply_lora(tiny(), dataclasses.replace(config, use_rslora=True))
  assert float(rs.layers[1].attn.adapters["q"].scale[...]) == pytest.approx(16 / math.sqrt(2))

  adapter = perturb(model).layers[1].attn.adapters["o"]
  x = np.random.default_rng(0).normal(size=(2, 3, 4, 8)).astype(np.float32)
  a, b = np.asarray(adapter.a[...]).reshape(32, 8), np.asarray(adapter.b[...])
  hand = 2.0 * (x.reshape(2, 3, 32) @ a) @ b
  np.testing.assert_allclose(np.asarray(adapter(jnp.asarray(x))), hand, rtol=1e-5, atol=1e-6)


def test_stacked_layers_take_per_layer_alpha_but_one_rank():
  config = lora.LoRAConfig(rank=4, alpha=8, alpha_pattern={r"layers\.1\..*": 2})
  model = lora.apply_lora(tiny(scan=True), config)
  np.testing.assert_allclose(model.layers.attn.adapters["q"].scale[...], [2.0, 0.5])
  with pytest.raises(config_lib.ConfigError, match=r"actor_rollout_ref\.model\.r_pattern.*scan_layers"):
    lora.apply_lora(tiny(scan=True), lora.LoRAConfig(rank=4, r_pattern={r"layers\.0\..*": 2}))


def test_init_lora_weights():
  wide = dataclasses.replace(CFG, hidden_size=256, intermediate_size=64, num_layers=1, head_dim=64)
  model = lora.apply_lora(M.CausalLM(wide, nnx.Rngs(0)), lora.LoRAConfig(rank=16, target_modules="q_proj"))
  a = np.asarray(model.layers[0].attn.adapters["q"].a[...])
  bound = 1 / math.sqrt(256)
  assert np.abs(a).max() <= bound and np.abs(a).max() > 0.95 * bound
  assert a.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)
  assert not np.asarray(model.layers[0].attn.adapters["q"].b[...]).any()
  gauss = lora.apply_lora(M.CausalLM(wide, nnx.Rngs(0)),
                          lora.LoRAConfig(rank=16, target_modules="q_proj", init_lora_weights="gaussian"))
  assert np.asarray(gauss.layers[0].attn.adapters["q"].a[...]).std() == pytest.approx(1 / 16, rel=0.05)


def test_dropout_only_in_training_and_deterministic_given_a_key():
  model = perturb(lora.apply_lora(tiny(), lora.LoRAConfig(rank=4, dropout=0.5)))
  plain = perturb(lora.apply_lora(tiny(), lora.LoRAConfig(rank=4)))
  np.testing.assert_array_equal(logits(model, IDS), logits(plain, IDS))
  graphdef, trained, frozen = lora.split_trainable(model)

  def train_logits(key):
    m = nnx.merge(graphdef, trained, lora.seed_dropout(frozen, key))
    m.train()
    return logits(m, IDS)

  first, again = train_logits(jax.random.key(1)), train_logits(jax.random.key(1))
  other = train_logits(jax.random.key(2))
  np.testing.assert_array_equal(first, again)
  assert np.abs(first - other).max() > 1e-3 and np.abs(first - logits(model, IDS)).max() > 1e-3
  no_dropout = nnx.state(plain)
  assert lora.seed_dropout(no_dropout, jax.random.key(1)) is no_dropout


@pytest.mark.parametrize("scan", [False, True])
def test_merged_model_equals_adapter_forward(scan):
  config = lora.LoRAConfig(rank=4, alpha=8, alpha_pattern={r"layers\.0\.mlp\..*": 3}, modules_to_save=("norm",))
  model = perturb(lora.apply_lora(tiny(scan), config))
  merged = lora.merge_lora(model)
  assert not lora.has_lora(merged) and lora.has_lora(model)
  np.testing.assert_allclose(logits(merged, IDS, MASK), logits(model, IDS, MASK), atol=1e-5)
  paths = lambda m: {p for p, _ in nnx.to_flat_state(nnx.state(m))}  # noqa: E731
  assert paths(merged) == paths(tiny(scan))


def test_reference_is_the_base_over_the_same_arrays():
  model = tiny()
  base = logits(model, IDS, MASK)
  lora.apply_lora(model, lora.LoRAConfig(rank=4, modules_to_save=("lm_head",)))
  ref_graphdef, ref_state = lora.reference_split(model)
  _, trained, frozen = lora.split_trainable(model)
  frozen_arrays = {p: v[...] for p, v in nnx.to_flat_state(frozen)}
  for path, var in nnx.to_flat_state(ref_state):
    if path == ("lm_head",):
      assert var[...] is not trained["lm_head"][...]
    else:
      assert var[...] is frozen_arrays[path], path
  trained_more = perturb(model)
  assert np.abs(logits(trained_more, IDS, MASK) - base).max() > 1e-3
  np.testing.assert_array_equal(logits(nnx.merge(ref_graphdef, ref_state), IDS, MASK), base)


def test_adapters_shard_like_their_base_weights():
  mesh = sharding.build_mesh({"data": 1, "fsdp": 4, "tensor": 2, "sequence": 1}, jax.devices()[:8])
  rules = sharding.rules_from_config(config_lib.get_base_config())
  model = M.CausalLM(CFG, nnx.Rngs(0))
  lora.apply_lora(model, lora.LoRAConfig(rank=4), mesh=mesh, rules=rules)
  attn, mlp = model.layers[0].attn, model.layers[0].mlp
  spec = lambda v: v[...].sharding.spec  # noqa: E731
  assert spec(attn.adapters["q"].a) == jax.sharding.PartitionSpec("fsdp", None)
  assert spec(attn.adapters["q"].b) == jax.sharding.PartitionSpec(None, "tensor", None)
  assert spec(attn.adapters["o"].a) == jax.sharding.PartitionSpec("tensor", None, None)
  assert spec(mlp.adapters["down"].a) == jax.sharding.PartitionSpec("tensor", None)
  assert spec(mlp.adapters["down"].b) == jax.sharding.PartitionSpec(None, "fsdp")
  assert attn.adapters["q"].a.get_metadata()["out_sharding"] == ("embed", "lora_rank")


def test_modules_to_save_train_in_full():
  model = lora.apply_lora(tiny(), lora.LoRAConfig(rank=2, modules_to_save=("lm_head", "layers.1.input_layernorm")))
  _, trained, _ = lora.split_trainable(model)
  full = {p for p, v in nnx.to_flat_state(trained) if isinstance(v, lora.TrainedParam)}
  assert full == {("lm_head",), ("layers", 1, "input_norm", "scale")}
  key = "actor_rollout_ref.model.modules_to_save"
  tied = M.CausalLM(dataclasses.replace(CFG, tie_word_embeddings=True), nnx.Rngs(0))
  with pytest.raises(config_lib.ConfigError, match=rf"{key}.*tie_word_embeddings"):
    lora.apply_lora(tied, lora.LoRAConfig(rank=2, modules_to_save=("lm_head",)))
  with pytest.raises(config_lib.ConfigError, match=rf"{key}.*scan_layers"):
    lora.apply_lora(tiny(scan=True), lora.LoRAConfig(rank=2, modules_to_save=("layers.0.input_layernorm",)))
  with pytest.raises(config_lib.ConfigError, match=rf"{key}.*also a LoRA target"):
    lora.apply_lora(tiny(), lora.LoRAConfig(rank=2, modules_to_save=("q_proj",)))


@pytest.mark.parametrize("field,value,key", [
    ("rank", -1, "lora_rank"), ("rank", 0, "lora_rank"), ("alpha", 0, "lora_alpha"),
    ("dropout", 1.0, "lora_dropout"), ("target_modules", ["q_proj", "qkv"], "target_modules"),
    ("init_lora_weights", "pissa", "init_lora_weights"), ("r_pattern", {"q_proj": 0}, "r_pattern"),
    ("alpha_pattern", {"(": 1.0}, "alpha_pattern"), ("modules_to_save", ("bogus",), "modules_to_save"),
])
def test_bad_values_name_the_key(field, value, key):
  with pytest.raises(config_lib.ConfigError, match=rf"actor_rollout_ref\.model\.{key}="):
    lora.LoRAConfig(**{"rank": 4, field: value})
  if field == "rank" and value == 0:
    return
  config = config_lib.get_base_config()
  config_lib.finalize(config, device_count=1)
  config_lib.set_value(config, f"actor_rollout_ref.model.{key}", value)
  with pytest.raises(config_lib.ConfigError, match=rf"actor_rollout_ref\.model\.{key}="):
    config_lib.validate(config)


def test_config_tree_builds_the_lora_config():
  config = config_lib.get_base_config()
  config_lib.apply_overrides(config, [
      "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=q_proj,v_proj",
      r"actor_rollout_ref.model.r_pattern={'layers\.0\.self_attn\.q_proj': 2}",
      "actor_rollout_ref.model.modules_to_save=[lm_head]", "actor_rollout_ref.model.use_rslora=true"])
  config = config_lib.from_yaml(config_lib.to_yaml(config))
  got = lora.LoRAConfig.from_model_config(config.actor_rollout_ref.model)
  assert got.targets == ("q_proj", "v_proj") and got.rank == 8 and got.use_rslora
  assert got.r_pattern == {r"layers\.0\.self_attn\.q_proj": 2} and got.modules_to_save == ("lm_head",)
  assert lora.LoRAConfig(rank=1).targets == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def hf_bases(tmp_path_factory):
  """family -> (transformers model, the directory it saved itself to)."""
  out = {}
  for family in PEFT_CASES:
    model = helpers.hf_model(family)
    path = str(tmp_path_factory.mktemp(family))
    model.save_pretrained(path)
    out[family] = (model, path)
  return out


PEFT_CASES = {
    # untied, head_dim != hidden / heads, per-layer rank and alpha, lm_head and a layer norm trained in full.
    "llama_linear": (False, lora.LoRAConfig(
        rank=4, alpha=8, r_pattern={r"layers\.1\.self_attn\.q_proj": 2}, alpha_pattern={"down_proj": 3},
        modules_to_save=("lm_head", "input_layernorm"))),
    # tied, q/k norm, scanned layers, rank-stabilised scale, the final norm trained in full.
    "qwen3": (True, lora.LoRAConfig(rank=4, alpha=6, use_rslora=True, target_modules=["q_proj", "v_proj", "up_proj"],
                                    alpha_pattern={r"layers\.1\..*": 2}, modules_to_save=("norm",))),
    # Gemma 3: every projection, scanned sliding and full layers, a sandwich norm trained in full.
    "gemma3": (True, lora.LoRAConfig(rank=4, alpha=8, modules_to_save=("post_feedforward_layernorm",))),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(PEFT_CASES))
def test_peft_loads_the_adapter_export_with_the_same_logits(hf_bases, family, tmp_path):
  hf, path = hf_bases[family]
  scan, config = PEFT_CASES[family]
  model = perturb(lora.apply_lora(M.from_pretrained(path, scan_layers=scan), config, jax.random.key(5)), scale=0.1)
  ours = logits(model, IDS, MASK)
  lora.save_peft(model, config, str(tmp_path / "adapter"), path)
  tensors = lora.peft_tensors(model)
  assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 32)
  peft_model = peft.PeftModel.from_pretrained(helpers.hf_model(family), str(tmp_path / "adapter")).eval()
  assert helpers.max_diff_on_mask(ours, helpers.hf_logits(peft_model, IDS, MASK), MASK) <= 1e-4
  assert helpers.max_diff_on_mask(ours, helpers.hf_logits(hf, IDS, MASK), MASK) > 1e-2

  M.save_pretrained(lora.merge_lora(model), str(tmp_path / "merged"))
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32,
                                                             attn_implementation="eager")
  assert helpers.max_diff_on_mask(ours, helpers.hf_logits(merged, IDS, MASK), MASK) <= 1e-4


def peft_adapter(tmp_path, config):
  """The PEFT model of `config` over the llama_linear base (saved to tmp_path/base), its B matrices trained away
  from zero, saved by PEFT to tmp_path/adapter."""
  hf = helpers.hf_model("llama_linear")
  hf.save_pretrained(str(tmp_path / "base"))
  peft_model = peft.get_peft_model(hf, config)
  with torch.no_grad():
    for name, param in peft_model.named_parameters():
      if "lora_B" in name:
        param.copy_(0.2 * torch.randn_like(param))
  peft_model.save_pretrained(str(tmp_path / "adapter"))
  return peft_model


@pytest.mark.parametrize("scan", [False, True])
def test_an_adapter_peft_saved_loads_with_peft_s_logits(tmp_path, scan):
  # verl's actor_rollout_ref.model.lora_adapter_path: PEFT's own adapter (per-module rank and alpha, rank-stabilised
  # scale, B trained away from zero) gives rljax's model the logits PeftModel gives
  peft_model = peft_adapter(tmp_path, peft.LoraConfig(
      r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], use_rslora=True,
      rank_pattern={r"layers\.1\.self_attn\.q_proj": 2}, alpha_pattern={"down_proj": 3}))
  keys = lora.read_peft_config(str(tmp_path / "adapter"))
  assert (keys["lora_rank"], keys["lora_alpha"], keys["use_rslora"]) == (4, 8, True)
  config = lora.LoRAConfig(rank=keys["lora_rank"], alpha=keys["lora_alpha"], target_modules=keys["target_modules"],
                           use_rslora=keys["use_rslora"], r_pattern=keys["r_pattern"],
                           alpha_pattern=keys["alpha_pattern"])
  if scan:  # one stacked adapter per projection: one rank in every layer
    config = dataclasses.replace(config, r_pattern={})
    with pytest.raises(config_lib.ConfigError, match="lora_A.weight is \\[2, 32\\], the model's is \\[4, 32\\]"):
      lora.load_peft_weights(lora.apply_lora(M.from_pretrained(str(tmp_path / "base"), scan_layers=True), config),
                             str(tmp_path / "adapter"))
    return
  model = lora.apply_lora(M.from_pretrained(str(tmp_path / "base")), config)
  lora.load_peft_weights(model, str(tmp_path / "adapter"))
  expected = helpers.hf_logits(peft_model.eval(), IDS, MASK)
  assert helpers.max_diff_on_mask(logits(model, IDS, MASK), expected, MASK) <= 1e-4
  base = logits(M.from_pretrained(str(tmp_path / "base")), IDS, MASK)
  assert helpers.max_diff_on_mask(logits(model, IDS, MASK), base, MASK) > 1e-2  # the adapter's B counts


def test_an_adapter_rljax_cannot_hold_is_named(tmp_path):
  hf = helpers.hf_model("llama_linear")
  peft.get_peft_model(hf, peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)).save_pretrained(
      str(tmp_path / "dora"))
  with pytest.raises(config_lib.ConfigError, match="adapter_config.json sets use_dora=True, which rljax's LoRA "
                                                   "adapters do not implement"):
    lora.read_peft_config(str(tmp_path / "dora"))
  with pytest.raises(config_lib.ConfigError, match="lora_adapter_path='.*missing': holds no adapter_config.json"):
    lora.read_peft_config(str(tmp_path / "missing"))


@pytest.mark.parametrize("scan,exclude", [
    (False, r"model\.layers\.1\.self_attn\.q_proj"),  # a regex: one layer's q_proj
    (True, r"model\.layers\.0\..*"),  # every module of layer 0: its slices of the stacked adapters add nothing
    (True, ["o_proj", "model.layers.1.mlp.down_proj"]),  # every o_proj (no adapter at all), one down_proj
])
def test_exclude_modules_keeps_the_modules_peft_keeps_out(tmp_path, scan, exclude):
  peft_model = peft_adapter(tmp_path, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj",
                                                                                      "down_proj"],
                                                       exclude_modules=exclude))
  keys = lora.read_peft_config(str(tmp_path / "adapter"))
  config = lora.LoRAConfig(rank=4, alpha=8, target_modules=keys["target_modules"],
                           exclude_modules=keys["exclude_modules"])
  model = lora.apply_lora(M.from_pretrained(str(tmp_path / "base"), scan_layers=scan), config)
  lora.load_peft_weights(model, str(tmp_path / "adapter"))  # every tensor PEFT wrote, and no other, is read
  expected = helpers.hf_logits(peft_model.eval(), IDS, MASK)
  assert helpers.max_diff_on_mask(logits(model, IDS, MASK), expected, MASK) <= 1e-4
  lora.save_peft(perturb(model, scale=0.1), config, str(tmp_path / "ours"), str(tmp_path / "base"))
  ours = peft.PeftModel.from_pretrained(helpers.hf_model("llama_linear"), str(tmp_path / "ours")).eval()
  assert sorted(ours.state_dict()) == sorted(peft_model.state_dict())  # the same modules adapted
  assert helpers.max_diff_on_mask(logits(perturb(model, scale=0.1), IDS, MASK), helpers.hf_logits(ours, IDS, MASK),
                                  MASK) <= 1e-4


MEGATRON_FUSED = dict(shared_a=(("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")), a_init="xavier",
                      megatron=True)


@pytest.mark.parametrize("scan", [False, True])
def test_megatron_fused_adapters_share_one_a_per_fused_module(scan):
  # verl's model.lora.type=lora adapts Megatron's fused linear_qkv and linear_fc1: x @ A feeds q, k and v (gate and
  # up) through one A, so the state holds it once and its gradient is the sum of the projections'
  model = perturb(lora.apply_lora(tiny(scan), lora.LoRAConfig(rank=4, alpha=8, **MEGATRON_FUSED), jax.random.key(3)))
  block = model.layers if scan else model.layers[0]
  attn, mlp = block.attn, block.mlp
  assert attn.adapters["k"].a is attn.adapters["q"].a is attn.adapters["v"].a
  assert mlp.adapters["up"].a is mlp.adapters["gate"].a
  graphdef, trained, frozen = lora.split_trainable(model)
  a_held = [p for p, _ in nnx.to_flat_state(trained) if p[-1] == "a" and (scan or p[1] == 0)]
  assert len(a_held) == 4 and len([p for p, _ in nnx.to_flat_state(trained) if p[-1] == "b"]) == 7 * (1 if scan else 2)
  # its gradient is the sum of what three separate adapters holding copies of it would get
  untied = lora.apply_lora(tiny(scan), lora.LoRAConfig(rank=4, alpha=8), jax.random.key(3))
  copies = dict(nnx.to_flat_state(trained))
  groups = {"q": "qkv", "k": "qkv", "v": "qkv", "gate": ("gate", "up"), "up": ("gate", "up")}
  for path, var in nnx.to_flat_state(nnx.state(untied, lora.LoRAParam)):
    held = [(*path[:-2], name, path[-1]) for name in groups.get(path[-2], (path[-2],))]
    var.set_value(copies[next(p for p in ([path] + held) if p in copies)][...])
  loss = lambda g, t, f: jnp.sum(nnx.merge(g, t, f)(jnp.asarray(IDS), jnp.asarray(MASK)) ** 2)  # noqa: E731
  grads = dict(nnx.to_flat_state(jax.grad(loss, argnums=1)(graphdef, trained, frozen)))
  u_graphdef, u_trained, u_frozen = lora.split_trainable(untied)
  u_grads = dict(nnx.to_flat_state(jax.grad(loss, argnums=1)(u_graphdef, u_trained, u_frozen)))
  shared = [(path, grad) for path, grad in grads.items() if path[-1] == "a" and path[-2] in groups]
  assert len(shared) == 2 * (1 if scan else 2)
  for path, grad in shared:
    summed = sum(u_grads[(*path[:-2], name, "a")][...] for name in groups[path[-2]])
    np.testing.assert_allclose(grad[...], summed, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(logits(lora.merge_lora(model), IDS, MASK), logits(model, IDS, MASK), rtol=2e-4,
                             atol=2e-4)


def test_megatron_a_inits_are_megatron_bridges():
  key, shape = jax.random.key(0), (4096, 8)
  xavier = lora.init_a(key, shape, 4096, 8, "xavier")
  np.testing.assert_allclose(float(jnp.std(xavier)), math.sqrt(2 / (4096 + 8)), rtol=0.02)
  np.testing.assert_allclose(float(jnp.std(lora.init_a(key, shape, 4096, 8, "normal"))), 0.2, rtol=0.02)
  kaiming = lora.init_a(key, shape, 4096, 8, "kaiming")
  assert float(jnp.abs(kaiming).max()) <= 1 / math.sqrt(4096) and float(jnp.abs(kaiming).max()) > 0.9 / math.sqrt(
      4096)
