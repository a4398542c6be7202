"""Qwen3-MoE: routing, the grouped-matmul dispatch, the load-balancing loss and expert parallelism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import rljax.models as M
from rljax import config as config_lib
from rljax import sharding
from rljax.models import lora, moe, weight_quant
from rljax.models.layers import PerLayer
from tests.models import helpers
from tests.rollout.test_rollout import hf_greedy, left_padded, sampler_for


@pytest.fixture(scope="module")
def all_sparse(tmp_path_factory):
  return helpers.saved_family(tmp_path_factory, "qwen3_moe_all")


def rows4():
  ids, mask = helpers.batch()
  return np.concatenate([ids, ids[1:2, ::-1]]), np.concatenate([mask, mask[:1]])


loss_and_grad = helpers.loss_and_grad


def test_route_picks_top_k_and_renormalises():
  logits = jnp.log(jnp.array([[0.1, 0.5, 0.15, 0.25]]))
  w, ids, probs = moe.route(logits, 2, normalize=False)
  np.testing.assert_array_equal(ids, [[1, 3]])
  np.testing.assert_allclose(w, [[0.5, 0.25]], rtol=1e-6)
  w, _, _ = moe.route(logits, 2, normalize=True)
  np.testing.assert_allclose(w, [[2 / 3, 1 / 3]], rtol=1e-6)
  np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)


def test_dispatch_equals_every_expert_weighted_by_the_router():
  rng = np.random.default_rng(0)
  e, d, f, n, k = 5, 8, 6, 7, 2
  x = jnp.asarray(rng.normal(size=(1, n, d)), jnp.float32)
  gate, up = (jnp.asarray(rng.normal(size=(e, d, f)), jnp.float32) for _ in range(2))
  down = jnp.asarray(rng.normal(size=(e, f, d)), jnp.float32)
  w, ids, _ = moe.route(jnp.asarray(rng.normal(size=(n, e)), jnp.float32), k, normalize=False)
  got = moe.dispatch(x, ids[None], w[None], gate, up, down)[0]
  every = jnp.einsum("nef,efd->ned", jax.nn.silu(jnp.einsum("nd,edf->nef", x[0], gate))
                     * jnp.einsum("nd,edf->nef", x[0], up), down)
  dense_w = jnp.zeros((n, e)).at[jnp.arange(n)[:, None], ids].set(w)
  np.testing.assert_allclose(got, jnp.einsum("ned,ne->nd", every, dense_w), rtol=1e-5, atol=1e-5)


def test_load_balancing_loss_equals_transformers(all_sparse):
  hf, path = all_sparse
  ids, mask = helpers.batch()
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
             output_router_logits=True)
  model = M.from_pretrained(path)
  _, routing = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask), with_routing=True)
  stats = routing.stats
  assert stats.shape == (2, 2, 4) and routing.experts.shape == (3, 10, 2, 3)
  np.testing.assert_allclose(stats[:, 0].sum(-1), 3 * mask.sum(), rtol=1e-6)
  ours = moe.load_balancing_loss(stats, jnp.sum(mask))
  np.testing.assert_allclose(ours, out.aux_loss.item(), rtol=1e-5)
  # HF trains with the loss only where config.json asks for router logits (Qwen3-MoE's releases do not)
  assert model.cfg.router_aux_loss_coef == 0.0
  assert M.from_pretrained(path, override_config={"output_router_logits": True}).cfg.router_aux_loss_coef == 0.02


@pytest.mark.slow
def test_scan_matches_unrolled(all_sparse):
  _, path = all_sparse
  ids, mask = helpers.batch()
  l1, o1, g1 = loss_and_grad(M.from_pretrained(path), ids, mask)
  l2, o2, g2 = loss_and_grad(M.from_pretrained(path, scan_layers=True, remat=True), ids, mask)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  np.testing.assert_allclose(g1["layers"][1]["mlp"]["gate"][...], g2["layers"]["mlp"]["gate"][...][1],
                             rtol=1e-3, atol=1e-5)


def test_replayed_routing_is_the_recorded_one_and_moves_the_experts(all_sparse):
  _, path = all_sparse
  ids, mask = helpers.batch()
  for scan in (False, True):
    model = M.from_pretrained(path, scan_layers=scan)
    h, routing = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask), with_routing=True)
    again, same = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask), with_routing=True, experts=routing.experts)
    np.testing.assert_allclose(again, h, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(same.experts, routing.experts)
    other = (routing.experts + 1) % 4  # every token to other experts: a different output
    moved, replayed = model.hidden_states(jnp.asarray(ids), jnp.asarray(mask), with_routing=True, experts=other)
    np.testing.assert_array_equal(replayed.experts, other)
    assert np.abs(np.asarray(moved - h)).max() > 1e-2


def test_scan_refuses_mixed_layers(tmp_path):
  hf = helpers.hf_model("qwen3_moe")
  hf.save_pretrained(str(tmp_path))
  with pytest.raises(ValueError, match="mlp_only_layers=\\[1\\]"):
    M.from_pretrained(str(tmp_path), scan_layers=True)


def ep_mesh():
  return sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 2, "sequence": 1, "expert": 2})


def carved_experts(sequence: int = 1):
  """Megatron's expert groups out of tensor x context x data (`expert_model_parallel_size=4` with tensor 4, or with
  tensor 2 and context 2, as the config maps it where the devices after those cannot hold 4): the experts split
  over the tensor (and sequence) axis, each expert whole."""
  config = config_lib.get_base_config()
  axes = ["expert", "tensor"] + (["sequence"] if sequence > 1 else [])
  config.trainer.logical_axis_rules = [["exp", axes] if logical == "exp" else [logical, axis]
                                       for logical, axis in config.trainer.logical_axis_rules]
  mesh = sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 4 // sequence, "sequence": sequence, "expert": 1})
  return mesh, sharding.rules_from_config(config)


@pytest.mark.slow
@pytest.mark.parametrize("layout,gate_shard", [("expert axis", (2, 16, 8)), ("carved from tensor", (1, 16, 16)),
                                                ("carved from tensor x sequence", (1, 16, 16))])
def test_expert_x_fsdp_x_tensor_sharding_equals_unsharded(all_sparse, layout, gate_shard):
  _, path = all_sparse
  ids, mask = rows4()
  mesh, rules = {"expert axis": lambda: (ep_mesh(), sharding.rules_from_config(config_lib.get_base_config())),
                 "carved from tensor": carved_experts,
                 "carved from tensor x sequence": lambda: carved_experts(sequence=2)}[layout]()
  model = M.from_pretrained(path, mesh=mesh, rules=rules)
  assert model.layers[0].mlp.gate[...].sharding.shard_shape((4, 32, 16)) == gate_shard
  l1, o1, g1 = loss_and_grad(M.from_pretrained(path), ids, mask)
  l2, o2, g2 = loss_and_grad(model, ids, mask, mesh, rules)
  np.testing.assert_allclose(o1, o2, rtol=1e-4, atol=1e-5)
  for name in ("gate", "down", "router"):
    np.testing.assert_allclose(g1["layers"][0]["mlp"][name][...], g2["layers"][0]["mlp"][name][...],
                               rtol=1e-3, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["unsharded", "expert axis", "carved from tensor"])
def test_greedy_equals_transformers_generate(all_sparse, layout):
  hf, path = all_sparse
  mesh, rules = {"unsharded": lambda: (None, None), "carved from tensor": carved_experts,
                 "expert axis": lambda: (ep_mesh(), sharding.rules_from_config(config_lib.get_base_config()))}[layout]()
  model = M.from_pretrained(path, mesh=mesh, rules=rules)
  ids, mask = left_padded([3, 8, 11, 16], 128)
  sampler = sampler_for(model, slots=4, eos=(), ignore_eos=True, response=32, mesh=mesh, rules=rules)
  got = sampler.generate(nnx.state(model, nnx.Param), ids, mask, 1, jax.random.key(0))
  for row, expected in enumerate(hf_greedy(hf, ids, mask, 32, None)):
    np.testing.assert_array_equal(got.responses[row], expected, err_msg=f"row {row}")


@pytest.mark.slow
def test_rollout_records_the_routing_a_full_forward_pass_takes(all_sparse):
  # verl's R3: prompt experts from the prefill, response experts from each decode step, in the trainer's layout
  _, path = all_sparse
  model = M.from_pretrained(path)
  ids, mask = left_padded([3, 8, 11, 16], 128)
  sampler = sampler_for(model, slots=3, eos=(7,), record_routing=True)  # 8 requests through 3 slots: refills
  got = sampler.generate(nnx.state(model, nnx.Param), ids, mask, 2, jax.random.key(0))
  rows = np.concatenate([ids[got.prompt_index], got.responses], axis=1)
  real = np.concatenate([mask[got.prompt_index], got.response_mask], axis=1)
  _, routing = model.hidden_states(jnp.asarray(rows), jnp.asarray(real), with_routing=True)
  assert got.routed_experts.shape == (8, 16 + 12, 2, 3)
  np.testing.assert_array_equal(got.routed_experts[real == 1], np.asarray(routing.experts)[real == 1])
  assert not got.routed_experts[real == 0].any()


def _local_experts(n: int, k: int, seed: int) -> tuple:
  """x [n, 8], ids [n, k] (k distinct of 8 experts), weights [n, k], and float32 experts 2 and 3 (the local
  ones at first=2): gate, up [2, 8, 4], down [2, 4, 8]."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(n, 8)), jnp.float32)
  gate, up = (jnp.asarray(rng.normal(size=(2, 8, 4)), jnp.float32) for _ in range(2))
  down = jnp.asarray(rng.normal(size=(2, 4, 8)), jnp.float32)
  weights = jnp.asarray(rng.uniform(size=(n, k)), jnp.float32)
  ids = jnp.asarray(np.stack([rng.permutation(8)[:k] for _ in range(n)]), jnp.int32)
  return x, ids, weights, gate, up, down


def test_capped_grouped_matmuls_equal_all_copies_and_fall_back_past_their_rows():
  args = (*_local_experts(n=12, k=3, seed=0), 2, lambda v: v, {})
  ids = args[1]
  exact = moe._experts_local(*args)
  routed = int(np.sum((np.asarray(ids) >= 2) & (np.asarray(ids) < 4)))
  assert 0 < routed <= 16 and bool(jnp.any(exact != 0))
  np.testing.assert_allclose(moe._experts_capped(*args, 16), exact, rtol=1e-5, atol=1e-6)
  for rows in (16, 8 if routed > 8 else routed - 1):  # within the rows, and past them (all copies)
    np.testing.assert_allclose(moe._experts_bounded(*args, rows), exact, rtol=1e-5, atol=1e-6)
  assert not np.allclose(moe._experts_capped(*args, routed - 1), exact)  # too few rows drop a copy
  assert moe.capacity(2048, 8) == 512 and moe.capacity(12, 2) == 12 and moe.capacity(48, 4) == 24


@pytest.mark.slow
def test_an_update_takes_its_copies_a_capacity_at_a_time_with_exact_gradients(monkeypatch):
  # 9 of 36 copies are local: 16 rows take them in one chunk, 8 in two, 3 in three; forward and gradients exact
  x, ids, weights, gate, up, down = _local_experts(n=12, k=3, seed=0)
  assert int(np.sum((np.asarray(ids) >= 2) & (np.asarray(ids) < 4))) == 9

  def grads(experts):
    loss = lambda *a: jnp.sum(jnp.tanh(experts(a[0], ids, *a[1:], 2, lambda v: v, {})))  # noqa: E731
    return jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3, 4)))(x, weights, gate, up, down)

  exact = grads(moe._experts_local)
  for rows in (16, 8, 3):
    for got, want in zip(jax.tree.leaves(grads(lambda *a: moe._experts_chunked(*a, rows))), jax.tree.leaves(exact)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{rows} rows")
  # a quantized rollout's prefill gathers its weights too: 8-bit experts through the chunks
  quantized = [weight_quant.quantize(w, (1,), jnp.int8, jnp.float32) for w in (gate, up, down)]
  args = (x, ids, weights, *quantized, 2, lambda v: v, {})
  np.testing.assert_allclose(moe._experts_chunked(*args, 3), moe._experts_local(*args), rtol=1e-5, atol=1e-5)
  # over 4 expert shards (fsdp 2): 16 copies per device in chunks of 8; one fsdp half sends all 16 of its copies
  # to the first shard (two chunks), the other 4 to each shard (one)
  x, ids, weights, gate, up, down = helpers.uneven_dispatch(16, 32, 16, seed=3)
  loss = lambda x, gate, up, down: jnp.sum(jnp.tanh(moe.dispatch(x, ids, weights, gate, up, down)))  # noqa: E731
  rows, swiglu = [], moe._swiglu_rows
  monkeypatch.setattr(moe, "_swiglu_rows", lambda r, *a, **kw: rows.append(r.shape[0]) or swiglu(r, *a, **kw))
  got = jax.jit(jax.grad(helpers.expert_split_update(loss), (0, 1, 2, 3)))(x, gate, up, down)
  assert set(rows) == {8}
  for a, b in zip(got, jax.grad(loss, (0, 1, 2, 3))(x, gate, up, down)):  # gradients up to 30: float32 sums
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_a_decode_step_whose_devices_take_different_branches_equals_the_unsharded_dispatch():
  # 8 experts over 4 expert shards (2 each), weights split over fsdp too; 16 tokens x 2 copies give each shard
  # 16 rows: experts 0 and 1 take 20 copies (all 32 rows there), the others 4 each (their 16 rows)
  n = 16
  x, ids, weights, gate, up, down = helpers.uneven_dispatch(n, 32, 16, seed=2)
  assert moe.capacity(2 * n, 4) == 16 and int(np.sum(np.asarray(ids) < 2)) == 20
  want = moe.dispatch(x, ids, weights, gate, up, down)
  step = helpers.expert_split_decode(moe.dispatch)
  got = jax.jit(step)(x, ids, weights, gate, up, down)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert "conditional" in jax.jit(step).lower(x, ids, weights, gate, up, down).compile().as_text()


def test_int8_experts_multiply_as_stored_and_scale_the_product():
  rng = np.random.default_rng(1)
  rows = jnp.asarray(rng.normal(size=(10, 8)), jnp.float32)
  sizes = jnp.asarray([3, 0, 4], jnp.int32)  # 7 rows in groups, 3 past them
  w = weight_quant.quantize(jnp.asarray(rng.normal(size=(3, 8, 5)), jnp.float32), (1,), jnp.int8, jnp.float32)
  want = jax.lax.ragged_dot(rows, weight_quant.dequantize(w, jnp.float32), sizes)
  got = moe._grouped(rows, w, sizes)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert not np.asarray(got[7:]).any()
  np.testing.assert_array_equal(moe._row_scales(w.scale, sizes, 10)[:7],
                                np.asarray(w.scale)[[0, 0, 0, 2, 2, 2, 2], 0])


@pytest.mark.slow
@pytest.mark.parametrize("factor", [moe.CAPACITY_FACTOR, 0.5])
def test_scanned_decode_over_four_expert_shards_equals_transformers_generate(all_sparse, monkeypatch, factor):
  # each device holds one expert; its grouped matmuls are sized for `factor` times its share of the 16 slots'
  # copies (24 of 48), or at 0.5 for 8, which the devices routed more copies than that exceed (all copies then)
  hf, path = all_sparse
  monkeypatch.setattr(moe, "CAPACITY_FACTOR", factor)
  mesh = sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 1, "sequence": 1, "expert": 4})
  rules = sharding.rules_from_config(config_lib.get_base_config())
  model = M.from_pretrained(path, mesh=mesh, rules=rules, scan_layers=True)
  ids, mask = left_padded([3, 8, 11, 16, 5, 9, 14, 2, 7, 12, 16, 4, 6, 10, 13, 15], 128)
  sampler = sampler_for(model, slots=16, eos=(), ignore_eos=True, response=16, mesh=mesh, rules=rules)
  params = nnx.state(model, nnx.Param)
  held = sampler.engine.compute_params(params)["layers"]["mlp"]["gate"].get_value()
  assert isinstance(held, PerLayer) and held.layers[0].shape == (4, 32, 16)  # the engine's experts per layer
  got = sampler.generate(params, ids, mask, 1, jax.random.key(0))
  for row, expected in enumerate(hf_greedy(hf, ids, mask, 16, None)):
    np.testing.assert_array_equal(got.responses[row], expected, err_msg=f"row {row}")


def test_expert_axis_must_divide_the_experts():
  mesh = sharding.build_mesh({"data": 1, "fsdp": 1, "tensor": 1, "sequence": 1, "expert": 8})
  with pytest.raises(config_lib.ConfigError, match="expert_model_parallel_size.*num_experts \\(4\\)"):
    sharding.check_model_fits(mesh, 4, 2, num_experts=4)
  with pytest.raises(config_lib.ConfigError, match="a dense model has no experts"):
    sharding.check_model_fits(mesh, 4, 2, num_experts=0)
  # experts carved out of the tensor axis (expert 1 x tensor 4) split 4 ways too
  carved, _ = carved_experts()
  sharding.check_model_fits(carved, 4, 4, num_experts=8, expert_axes=("expert", "tensor"))
  with pytest.raises(config_lib.ConfigError, match="expert_model_parallel_size=4.*num_experts \\(6\\)"):
    sharding.check_model_fits(carved, 4, 4, num_experts=6, expert_axes=("expert", "tensor"))


def with_random_adapters(model, targets="all-linear"):
  """`model` with LoRA on `targets` and every B random (B starts at 0, which would hide a wrong adapter path)."""
  lora.apply_lora(model, lora.LoRAConfig(rank=4, alpha=8.0, target_modules=targets))
  for i, (_, var) in enumerate(nnx.to_flat_state(nnx.state(model, lora.LoRAParam))):
    var.set_value(0.3 * jax.random.normal(jax.random.key(i), var.shape, var.dtype))
  return model


@pytest.mark.parametrize("scan", [False, True])
def test_lora_on_experts_equals_its_merged_kernels(all_sparse, scan):
  _, path = all_sparse
  ids, mask = helpers.batch()
  model = with_random_adapters(M.from_pretrained(path, scan_layers=scan))
  gate_a = model.layers.mlp.adapters["gate"].a if scan else model.layers[0].mlp.adapters["gate"].a
  assert gate_a.shape == ((2,) if scan else ()) + (4, 32, 4)  # per expert: A [E, D, r]
  merged = lora.merge_lora(model)
  ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
  assert helpers.max_diff_on_mask(ours, np.asarray(merged(jnp.asarray(ids), jnp.asarray(mask))), mask) < 1e-4
  plain = np.asarray(M.from_pretrained(path)(jnp.asarray(ids), jnp.asarray(mask)))
  assert helpers.max_diff_on_mask(ours, plain, mask) > 1e-2  # the adapters move the output
  names = lora.peft_tensors(model)
  assert "base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_B.weight" in names
  assert names["base_model.model.model.layers.0.mlp.experts.2.gate_proj.lora_A.weight"].shape == (4, 32)


@pytest.mark.slow
def test_lora_on_experts_sharded_equals_unsharded(all_sparse, monkeypatch):
  # capacity for one even share: each of the 2 expert shards takes its copies half of them at a time, so the
  # adapters, and the mlp split over tensor, go through the chunks and their gradient
  monkeypatch.setattr(moe, "CAPACITY_FACTOR", 1.0)
  chunked, experts_chunked = [], moe._experts_chunked
  monkeypatch.setattr(moe, "_experts_chunked", lambda *a, **kw: chunked.append(a[-1]) or experts_chunked(*a, **kw))
  _, path = all_sparse
  ids, mask = rows4()
  mesh, rules = ep_mesh(), sharding.rules_from_config(config_lib.get_base_config())
  one = with_random_adapters(M.from_pretrained(path), ["gate_proj", "down_proj", "q_proj"])
  sharded = with_random_adapters(M.from_pretrained(path, mesh=mesh, rules=rules), ["gate_proj", "down_proj", "q_proj"])
  _, o1, g1 = loss_and_grad(one, ids, mask)
  _, o2, g2 = loss_and_grad(sharded, ids, mask, mesh, rules)
  np.testing.assert_allclose(o1, o2, rtol=1e-4, atol=1e-5)
  a1, a2 = g1["layers"][0]["mlp"]["adapters"]["down"]["b"][...], g2["layers"][0]["mlp"]["adapters"]["down"]["b"][...]
  np.testing.assert_allclose(a1, a2, rtol=1e-3, atol=1e-5)
  assert chunked
