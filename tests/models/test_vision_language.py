"""Qwen2.5-VL and Qwen3-VL: the vision tower, M-RoPE positions, logits and greedy decoding from image prompts against
transformers', checkpoints both ways (and transformers 5's nested names), a sharded load, config errors.

The models are tiny and random (every weight drawn, norms near 1), their images random patches whose grids are not
square, hold several attention windows (one cut short: Qwen2.5-VL's) and, in one, two frames. Qwen3-VL's learned
position table (4 x 4) is resampled to grids both smaller and larger than it, and its two deepstack features reach
both of the language model's layers.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType

import rljax.models as M
from rljax.models import checkpoint, rope, safetensors_io, vision
from rljax.models.config import from_hf_dict, to_hf_dict
from rljax.sharding.rules import logical_to_spec, param_names

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IMAGE, START, END = 290, 292, 293
# patch grids (frames, rows, columns): windows are 16 px / 4 px patches / 2 merged = 2 merged tokens a side
GRIDS = np.array([[1, 6, 10], [2, 4, 4], [1, 2, 12]])
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, bos_token_id=1, eos_token_id=2)
VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
FAMILIES = {
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", TEXT,
                   dict(VISION, window_size=16, fullatt_block_indexes=[1])),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                 {**{k: v for k, v in TEXT.items() if k not in ("rope_theta", "rope_scaling")}, "head_dim": 16,
                  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                      "mrope_interleaved": True}},
                 dict(VISION, hidden_act="gelu_pytorch_tanh", num_position_embeddings=16,
                      deepstack_visual_indexes=[0, 1])),
}
# Qwen3-VL's tower and text layers with experts: layer 0 routes each token to 2 of 4 experts, layer 1 is dense
FAMILIES["qwen3_vl_moe"] = ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
                            dict(FAMILIES["qwen3_vl"][2], num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=24, mlp_only_layers=[1]), FAMILIES["qwen3_vl"][3])
# the dense families: what Qwen3-VL-MoE shares with Qwen3-VL (its tower, positions, config fields, the engine's
# image prefill; the engine's experts are tests/models/test_moe.py's) is tested on them alone
dense_families = pytest.mark.parametrize("saved", ["qwen2_5_vl", "qwen3_vl"], indirect=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory):
  """(the transformers model, the directory it was saved to) of each family."""
  config_class, model_class, text, vision_config = FAMILIES[request.param]
  config = getattr(transformers, config_class)(text_config=text, vision_config=vision_config, image_token_id=IMAGE,
                                               video_token_id=291, vision_start_token_id=START,
                                               vision_end_token_id=END)
  torch.manual_seed(0)
  model = getattr(transformers, model_class)(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      norm = name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight"))
      p.copy_((1.0 if norm else 0.0) + 0.1 * torch.randn_like(p))
  path = tmp_path_factory.mktemp(request.param) / "model"
  model.save_pretrained(path)
  return model, str(path)


@pytest.fixture(scope="module")
def model(saved):
  return M.from_pretrained(saved[1])


def pixels(seed=0):
  """[N, 3 * 2 * 4 * 4] random patches for GRIDS."""
  return np.random.default_rng(seed).normal(size=(int(GRIDS.prod(-1).sum()), 96)).astype(np.float32)


def batch():
  """(ids, mask) [2, T]: row 0 holds images 0 and 1 between text, row 1 (left-padded) image 2."""
  def image(k):
    t, h, w = GRIDS[k]
    return [START, *[IMAGE] * int(t * h * w // 4), END]

  rows = [[5, 6, *image(0), 7, 8, *image(1), 9, 10, 11], [12, *image(2), 13, 14]]
  width = max(map(len, rows))
  ids, mask = np.zeros((2, width), np.int64), np.zeros((2, width), np.int64)
  for i, row in enumerate(rows):
    ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
  return ids, mask


def hf_inputs(ids, mask, pix):
  return dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), pixel_values=torch.tensor(pix),
              image_grid_thw=torch.tensor(GRIDS), mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)))


def images(model, pix):
  return vision.Images(jnp.asarray(pix), vision.image_layout(GRIDS, model.cfg.vision))


@dense_families
def test_the_tower_gives_transformers_features(saved, model):
  pix = pixels()
  with torch.no_grad():
    out = saved[0].model.visual(torch.tensor(pix), grid_thw=torch.tensor(GRIDS))
  got, deep = jax.jit(lambda m, i: m.visual(i))(model, images(model, pix))
  assert got.shape == (int(GRIDS.prod(-1).sum()) // 4, 64)
  np.testing.assert_allclose(np.asarray(got), out.pooler_output.numpy(), atol=2e-5, rtol=1e-4)
  if model.cfg.vision.qwen3:
    assert deep.shape == (2, *got.shape)
    for level, want in zip(deep, out.deepstack_features):
      np.testing.assert_allclose(np.asarray(level), want.numpy(), atol=2e-5, rtol=1e-4)
  else:
    assert deep is None


def test_interleaved_m_rope_turns_each_frequency_with_transformers_axis():
  # Qwen3-VL's layout of [24, 20, 20] over 64 frequencies: T H W T H W ... for 60, then time
  axes = rope.mrope_axes((24, 20, 20), True)
  assert axes[:6].tolist() == [0, 1, 2, 0, 1, 2] and (axes[60:] == 0).all()
  assert [int((axes == a).sum()) for a in range(3)] == [24, 20, 20]
  assert rope.mrope_axes((2, 3, 3), False).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]


@dense_families
def test_positions_are_transformers_m_rope_index(saved):
  ids, mask = batch()
  # the batch, then with a text-only row beside it
  text_only = (np.concatenate([ids, np.full((1, ids.shape[1]), 7)]), np.concatenate([mask, np.ones_like(mask[:1])]))
  for ids, mask in ((ids, mask), text_only):
    want, want_deltas = saved[0].model.get_rope_index(
        torch.tensor(ids), torch.tensor((ids == IMAGE).astype(np.int64)), image_grid_thw=torch.tensor(GRIDS),
        attention_mask=torch.tensor(mask))
    got, deltas = vision.rope_index(ids, mask, GRIDS, IMAGE, 2)
    np.testing.assert_array_equal(got * mask, want.numpy() * mask)
    np.testing.assert_array_equal(deltas, want_deltas.numpy()[:, 0])
  # the text-only row: one position on all three axes, no offset
  assert deltas[2] == 0 and (got[:, 2] == np.arange(ids.shape[1])).all()


def test_logits_and_greedy_decoding_from_image_prompts_are_transformers(saved, model):
  ids, mask = batch()
  pix = pixels(1)
  with torch.no_grad():
    want = saved[0](**hf_inputs(ids, mask, pix)).logits.numpy()
    want_tokens = saved[0].generate(**hf_inputs(ids, mask, pix), max_new_tokens=6, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[:, ids.shape[1]:].numpy()
  positions, _ = vision.rope_index(ids, mask, GRIDS, IMAGE, 2)
  got = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions), images=images(model, pix))
  np.testing.assert_allclose(np.asarray(got) * mask[..., None], want * mask[..., None], atol=2e-5, rtol=1e-4)
  # each row's images padded to a patch bucket of its own (the trainer's rows): the same logits
  per_row = vision.row_images([pix[:92], pix[92:]], [GRIDS[:2], GRIDS[2:]], model.cfg.vision)
  assert per_row.pixels.shape == (2, 128, 96) and per_row.layout.restore.shape == (2, 32)
  got = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions), images=per_row)
  np.testing.assert_allclose(np.asarray(got) * mask[..., None], want * mask[..., None], atol=2e-5, rtol=1e-4)
  tokens = M.greedy_generate(model, ids, mask, 6, images=images(model, pix), grid_thw=GRIDS)
  np.testing.assert_array_equal(tokens, want_tokens)
  # a text-only row beside them (no features, and for Qwen3-VL no deepstack features, reach it)
  mixed = np.concatenate([ids, np.full((1, ids.shape[1]), 7)]), np.concatenate([mask, np.ones_like(mask[:1])])
  with torch.no_grad():
    want = saved[0](**hf_inputs(*mixed, pix)).logits.numpy() * mixed[1][..., None]
  positions, _ = vision.rope_index(*mixed, GRIDS, IMAGE, 2)
  per_row = vision.row_images([pix[:92], pix[92:], None], [GRIDS[:2], GRIDS[2:], None], model.cfg.vision)
  got = model(*map(jnp.asarray, mixed), jnp.asarray(positions), images=per_row)
  np.testing.assert_allclose(np.asarray(got) * mixed[1][..., None], want, atol=2e-5, rtol=1e-4)


def test_a_saved_model_opens_in_transformers_with_the_same_weights(saved, model, tmp_path):
  M.save_pretrained(model, str(tmp_path / "out"))
  reopened = type(saved[0]).from_pretrained(str(tmp_path / "out")).eval()
  want = saved[0].state_dict()
  got = reopened.state_dict()
  assert sorted(got) == sorted(want)
  for name, tensor in want.items():
    assert torch.equal(got[name], tensor), name
  assert M.from_pretrained(str(tmp_path / "out")).cfg == model.cfg
  if model.cfg.num_experts:
    # each projection of the experts in one tensor, as the released Qwen3-VL-MoE checkpoints hold them ([E, D, 2F]
    # and [E, F, D]; transformers 5 writes its modules' [E, 2F, D], which the fixture's model is read from)
    written = safetensors_io.SafetensorsReader(str(tmp_path / "out"))
    assert written.tensor("model.language_model.layers.0.mlp.experts.gate_up_proj").shape == (4, 64, 48)
    assert written.tensor("model.language_model.layers.0.mlp.experts.down_proj").shape == (4, 24, 64)


@pytest.mark.parametrize("saved", ["qwen2_5_vl"], indirect=True)  # Qwen3-VL's are nested as every test loads them
def test_transformers_5_nested_names_and_top_level_text_fields_load(saved, model, tmp_path):
  # the checkpoint as transformers 5 names its modules, and config.json as the released models write it (the
  # language model's fields at the top level)
  reader = safetensors_io.SafetensorsReader(saved[1])
  nested = {n.replace("model.", "model.language_model.", 1).replace("visual.", "model.visual.", 1)
            if not n.startswith("lm_head") else n: np.asarray(reader.tensor(n)) for n in reader.names()}
  assert any(n.startswith("model.visual.") for n in nested)
  (tmp_path / "nested").mkdir()
  safetensors_io.write_file(str(tmp_path / "nested" / "model.safetensors"), nested)
  config = json.loads(open(f"{saved[1]}/config.json").read())
  flat = {**{k: v for k, v in config.items() if k != "text_config"}, **config["text_config"],
          "model_type": "qwen2_5_vl", "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
  flat.pop("rope_parameters")
  (tmp_path / "nested" / "config.json").write_text(json.dumps(flat))
  loaded = M.from_pretrained(str(tmp_path / "nested"))
  assert loaded.cfg.mrope_section == (2, 3, 3) and loaded.cfg.vision == model.cfg.vision
  pix = pixels(2)
  np.testing.assert_array_equal(np.asarray(loaded.visual(images(loaded, pix))[0]),
                                np.asarray(model.visual(images(model, pix))[0]))
  assert checkpoint.released_name("model.language_model.layers.0.mlp.up_proj.weight") == \
      "model.layers.0.mlp.up_proj.weight"


def test_a_sharded_load_places_every_parameter_and_gives_the_same_logits(saved, model):
  mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
  rules = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"), ("layers", None)]
  sharded = M.from_pretrained(saved[1], mesh=mesh, rules=rules)
  want = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for path, var in nnx.to_flat_state(nnx.state(sharded, nnx.Param)):
    value = var[...]
    assert value.sharding.spec == logical_to_spec(param_names(var), value.shape, mesh, rules), path
    for shard in value.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(want[path][...])[shard.index])
  # the blocks' parameters stacked over the tower's depth; its 2 heads do not split 4 ways, its MLP does
  assert sharded.visual.blocks.qkv[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None, None, None)
  assert sharded.visual.blocks.up[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  assert sharded.visual.merger.fc1[...].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  ids, mask = batch()
  positions, _ = vision.rope_index(ids, mask, GRIDS, IMAGE, 2)
  pix = pixels(3)
  run = jax.jit(lambda m, p, i: m(jnp.asarray(ids), jnp.asarray(mask), p, images=i))
  np.testing.assert_allclose(np.asarray(run(sharded, jnp.asarray(positions), images(sharded, pix))),
                             np.asarray(run(model, jnp.asarray(positions), images(model, pix))), atol=2e-5)


@dense_families
def test_config_errors_name_the_field(saved):
  config = json.loads(open(f"{saved[1]}/config.json").read())
  assert from_hf_dict(to_hf_dict(from_hf_dict(config))) == from_hf_dict(config)
  broken = json.loads(json.dumps(config))
  broken["text_config"]["rope_parameters"].pop("mrope_section")
  with pytest.raises(ValueError, match="mrope_section"):
    from_hf_dict(broken)
  broken = json.loads(json.dumps(config))
  broken["text_config"]["rope_parameters"]["mrope_section"] = [2, 3, 4]
  with pytest.raises(ValueError, match=r"mrope_section=\[2, 3, 4\] must be 3 sizes summing to head_dim / 2 = 8"):
    from_hf_dict(broken)
  broken = json.loads(json.dumps(config))
  broken["vision_config"]["out_hidden_size"] = 32
  with pytest.raises(ValueError, match="out_hidden_size=32 must equal the language model's hidden_size=64"):
    from_hf_dict(broken)
  ids, mask = batch()
  with pytest.raises(ValueError, match="a run of 15 image tokens for an image of 2 x 2 x 2 merged patches"):
    vision.rope_index(ids, mask, GRIDS[[1, 0, 2]], IMAGE, 2)
  with pytest.raises(ValueError, match="multiples of spatial_merge_size=2"):
    vision.image_layout(np.array([[1, 3, 4]]), from_hf_dict(config).vision)
  with pytest.raises(ValueError, match="grid_thw lists 4 images, but the prompts' runs of image tokens use only 3"):
    vision.rope_index(ids, mask, np.concatenate([GRIDS, GRIDS[:1]]), IMAGE, 2)
  with pytest.raises(ValueError, match="video tokens .id 291. in the prompts"):
    vision.rope_index(np.where(ids == 5, 291, ids), mask, GRIDS, IMAGE, 2, video_token_id=291)
  broken = json.loads(json.dumps(config))
  if from_hf_dict(config).vision.qwen3:
    broken["vision_config"]["num_position_embeddings"] = 15
    with pytest.raises(ValueError, match="num_position_embeddings=15 must be the square of a grid side"):
      from_hf_dict(broken)
    broken = json.loads(json.dumps(config))
    broken["vision_config"]["deepstack_visual_indexes"] = [1, 0]
    with pytest.raises(ValueError, match=r"deepstack_visual_indexes=\[1, 0\] must be increasing block indexes"):
      from_hf_dict(broken)
  else:
    broken["vision_config"]["window_size"] = 4
    with pytest.raises(ValueError, match="window_size=4 must be at least patch_size x spatial_merge_size = 8"):
      from_hf_dict(broken)
  # a config.json that names its architecture only
  nameless = {k: v for k, v in config.items() if k != "model_type"}
  assert from_hf_dict(nameless) == from_hf_dict(config)


@dense_families
def test_a_text_model_refuses_images(saved, model):
  text = M.CausalLM(model.cfg.replace(vision=None, mrope_section=None, model_type="qwen3"), nnx.Rngs(0))
  ids, mask = batch()
  with pytest.raises(ValueError, match="has no vision tower"):
    text(jnp.asarray(ids), jnp.asarray(mask), images=images(model, pixels()))
  with pytest.raises(ValueError, match="M-RoPE positions"):
    model(jnp.asarray(ids), jnp.asarray(mask), images=images(model, pixels()))


@dense_families
def test_the_rollout_engine_decodes_image_prompts_as_greedy_generation(saved, model):
  """The sampler over JetStream's prefill / insert / generate: each prompt's images prefilled once for its two
  responses, each slot decoding at its own M-RoPE offset, on 8 devices (slots over data)."""
  from rljax.rollout.engine import make_engine
  from rljax.rollout.sampler import RolloutSampler
  from rljax.rollout.sampling import SamplingParams

  ids, mask = batch()
  pix = pixels(4)
  want = M.greedy_generate(model, ids, mask, 6, images=images(model, pix), grid_thw=GRIDS)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  engine = make_engine(model, max_concurrent_decodes=8, prefill_buckets=(64,), max_decode_length=6,
                       sampling_params=SamplingParams(greedy=True), mesh=mesh, rules=[("cache_batch", "data")])
  inputs = np.empty(3, object)
  inputs[:] = [{"pixel_values": pix[:92], "image_grid_thw": GRIDS[:2]},
               {"pixel_values": pix[92:], "image_grid_thw": GRIDS[2:]}, {}]
  text = np.concatenate([ids, np.where(mask[:1] > 0, 7, 0)]), np.concatenate([mask, mask[:1]])
  rollout = RolloutSampler(engine, pad_id=0).generate(nnx.state(model), *text, 2, jax.random.key(0),
                                                      rows={"multi_modal_inputs": inputs})
  np.testing.assert_array_equal(rollout.responses[:4], np.repeat(want, 2, axis=0))
  # the text-only row beside them decodes as a text prompt
  alone = M.greedy_generate(model, text[0][2:], text[1][2:], 6)
  np.testing.assert_array_equal(rollout.responses[4:], np.repeat(alone, 2, axis=0))
  # 8-bit rollout weights: the language model's kernels in int8, the tower (run once per prompt, in its prefill)
  # as it is; the image prompts decode what the model with those weights decodes greedily
  quantized = make_engine(model, max_concurrent_decodes=8, prefill_buckets=(64,), max_decode_length=6,
                          sampling_params=SamplingParams(greedy=True), mesh=mesh, rules=[("cache_batch", "data")],
                          quantization=jnp.int8)
  params = quantized.compute_params(nnx.state(model))
  stored = lambda tree: [type(v.get_value()).__name__ for _, v in nnx.to_flat_state(tree)]  # noqa: E731
  assert "QuantizedWeight" not in stored(params["visual"]) and "QuantizedWeight" in stored(params["layers"])
  as_rolled_out = nnx.merge(nnx.graphdef(model), params)
  want = M.greedy_generate(as_rolled_out, ids, mask, 6, images=images(model, pix), grid_thw=GRIDS)
  rollout = RolloutSampler(quantized, pad_id=0).generate(nnx.state(model), *text, 2, jax.random.key(0),
                                                         rows={"multi_modal_inputs": inputs})
  np.testing.assert_array_equal(rollout.responses[:4], np.repeat(want, 2, axis=0))


def test_the_presets_vision_language_architectures_read_as_their_families():
  # rljax.compile builds a preset's model from these when its checkpoint is not on the machine
  from rljax.models import known
  qwen2_5, qwen3 = (from_hf_dict(known.ARCHITECTURES[name]) for name in ("Qwen2.5-VL-7B-Instruct",
                                                                          "Qwen3-VL-8B-Instruct"))
  assert (qwen2_5.vision.family, qwen2_5.mrope_section, qwen2_5.qkv_bias, qwen2_5.vision.window_size) == (
      "qwen2_5_vl", (16, 24, 24), True, 112)
  assert (qwen3.vision.family, qwen3.mrope_interleaved, qwen3.qk_norm, qwen3.vision.deepstack_visual_indexes,
          qwen3.vision.position_side, qwen3.rope_theta) == ("qwen3_vl", True, True, (8, 16, 24), 48, 5000000)


def test_a_lora_adapter_exports_for_peft_under_transformers_module_names_and_reads_back(saved, tmp_path):
  """verl's vision-language LoRA line (the tower left out): PEFT loads the exported adapter onto transformers'
  model (whose language model sits at model.language_model) with rljax's logits on image prompts; rljax reads it
  back."""
  peft = pytest.importorskip("peft")
  from rljax.models import lora
  from tests.models.test_lora import perturb
  # an alpha for one module, its key anchored on rljax's (released) names, which PEFT's nested ones do not match
  config = lora.LoRAConfig(rank=4, alpha=8, exclude_modules=".*visual.*",
                           alpha_pattern={r"model\.layers\.0\.self_attn\.q_proj": 32})
  adapted = perturb(lora.apply_lora(M.from_pretrained(saved[1]), config, jax.random.key(5)), scale=0.1)
  ids, mask = batch()
  pix = pixels(1)
  positions, _ = vision.rope_index(ids, mask, GRIDS, IMAGE, 2)
  run = lambda m: np.asarray(m(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions),  # noqa: E731
                               images=images(m, pix))) * mask[..., None]
  ours = run(adapted)
  lora.save_peft(adapted, config, str(tmp_path / "adapter"), saved[1])
  assert "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight" in lora.peft_tensors(adapted)
  base = type(saved[0]).from_pretrained(saved[1]).eval()
  with torch.no_grad():
    plain = base(**hf_inputs(ids, mask, pix)).logits.numpy() * mask[..., None]
    theirs = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()(
        **hf_inputs(ids, mask, pix)).logits.numpy() * mask[..., None]
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  written = json.loads((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())
  assert written["alpha_pattern"] == {r"model\.language_model\.layers\.0\.self_attn\.q_proj": 32}
  assert np.abs(ours - plain).max() > 1e-2  # the adapters change the logits
  fresh = lora.apply_lora(M.from_pretrained(saved[1]), config, jax.random.key(9))
  lora.load_peft_weights(fresh, str(tmp_path / "adapter"))
  np.testing.assert_allclose(run(fresh), ours, atol=1e-5)
  # an adapter of the released names (an older export, or PEFT over transformers 4) reads the same
  reader = safetensors_io.SafetensorsReader(str(tmp_path / "adapter" / lora.ADAPTER_WEIGHTS))
  (tmp_path / "flat").mkdir()
  (tmp_path / "flat" / lora.ADAPTER_CONFIG).write_text((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())
  safetensors_io.write_file(str(tmp_path / "flat" / lora.ADAPTER_WEIGHTS), {
      n.replace("model.language_model.", "model."): np.asarray(reader.tensor(n)) for n in reader.names()})
  fresh = lora.apply_lora(M.from_pretrained(saved[1]), config, jax.random.key(9))
  lora.load_peft_weights(fresh, str(tmp_path / "flat"))
  np.testing.assert_allclose(run(fresh), ours, atol=1e-5)
