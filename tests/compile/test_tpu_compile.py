"""rljax.compile: a tiny model's steps compiled by the real TPU compiler (libtpu) on this CPU.

The sharding properties are read from the compiled HLO: the actor update
all-gathers weights and reduce-scatters gradients (no activation
all-reduce) within 1.3x of the FSDP minimum, and decode moves no weight and
reads about its parameter shard plus its KV-cache shard.
"""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rljax import config as config_lib, sharding
from rljax.compile import engine_steps, hlo, plan, report, topology
from rljax.models import weight_quant
from rljax.models.layers import PerLayer
from rljax.rl import remote
from rljax.sharding import hosts, offload
from rljax.train import resolve

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Dimensions a TPU tiles without padding once split 4 ways (512 / 4 = 128), and no larger: libtpu compiles a step of
# this model in about 60% of the time one twice as wide took (hidden 1024, vocabulary 4096).
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 2048, "hidden_size": 512,
        "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "eos_token_id": 2}
OVERRIDES = [
    "data.train_batch_size=8", "data.max_prompt_length=128", "data.max_response_length=128",
    "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
    "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.rollout.max_num_seqs=16",
    "actor_rollout_ref.rollout.prefill_length_buckets=[128]", "actor_rollout_ref.model.share_prompt_forward=false",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tiny_tpu")
  (path / "config.json").write_text(json.dumps(TINY))
  return str(path)


def planned(model_dir, name, *extra, row_tokens=None, image_patches=None):
  target = topology.parse(name)
  devices = topology.devices(target)
  config = resolve(config_lib.load_config_file(str(ROOT / "configs" / "grpo.py")),
                   [f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES, *extra], device_count=len(devices))
  mesh = sharding.make_mesh(config, devices=devices)
  return {p.step.name.split("[")[0]: p for p in plan.rl_steps(config, mesh, row_tokens=row_tokens,
                                                              image_patches=image_patches)}, target


def test_topologies_parse_to_their_slices():
  assert topology.parse("v5p-8").topology_name == "v5p:2x2x1"
  assert topology.parse("v5litepod-16").topology_name == "v5e:4x4"
  assert topology.parse("v6e-8").grid == (2, 4) and topology.parse("v6e-8").host_bounds == (2, 4, 1)
  assert topology.parse("v5p:2x2x1").accelerator_type == "v5p-8"
  assert topology.parse("v5p-64").chips == 32 and topology.parse("v5p-64").host_bounds == (2, 2, 1)
  assert topology.parse("v4-8", num_slices=2).chips == 8
  with pytest.raises(ValueError, match="no v5p slice of 12 TensorCores"):
    topology.parse("v5p-12")
  with pytest.raises(ValueError, match="expected an accelerator type"):
    topology.parse("h100-8")


def test_mesh_sizes_that_are_no_products_of_physical_axes_split_them():
  # v5p-64 is 2x4x4 chips: fsdp 2 x tensor 2 x expert 8 (the Qwen3-30B-A3B preset's rollout mesh) needs a split axis
  devices = topology.devices(topology.parse("v5p-64"))
  mesh = sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 2, "sequence": 1, "expert": 8}, devices)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2, "sequence": 1, "expert": 8}
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_two_slices_span_the_outermost_axes_that_they_divide(model_dir):
  devices = topology.devices(topology.parse("v5p-8", num_slices=2))
  config = resolve(config_lib.load_config_file(str(ROOT / "configs" / "grpo.py")),
                   [f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES], device_count=len(devices))
  mesh = sharding.make_mesh(config, devices=devices)  # fsdp_size=-1: fsdp within a slice, data across them
  assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1, "sequence": 1, "expert": 1}
  assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [{0}, {1}]
  across = sharding.build_mesh({"data": 1, "fsdp": 8, "tensor": 1, "sequence": 1}, devices)  # fsdp_size=8
  assert [{d.slice_index for d in half} for half in across.devices.reshape(2, 4)] == [{0}, {1}]
  assert sharding.mesh.slice_shape((2, 4, 1, 1), 2) == (2, 1, 1, 1)
  with pytest.raises(ValueError, match="3 slices do not factor"):
    sharding.mesh.slice_shape((2, 4, 1, 1), 3)


def test_the_report_names_each_packed_pass_buffers_and_tokens_per_buffer(model_dir):
  steps, _ = planned(model_dir, "v5e:2x2", "reward_model.enable=true", f"reward_model.model.path={model_dir}",
                     "reward_model.model.use_remove_padding=true")
  # 8 prompts x 2 responses over 4 chips: the update's 2 micro-batches of 2 rows per chip, the log-prob and reward
  # passes' one of 4, each row in a buffer of prompt + response (128 + 128) at the largest
  assert plan.packed_buffers(steps["actor_update"].step) == (2, 4, 2, 256)
  assert plan.packed_buffers(steps["old_log_prob"].step) == (1, 4, 4, 256)
  assert plan.packed_buffers(steps["reward_model"].step) == (1, 4, 4, 256)
  assert plan.packed_buffers(steps["decode_step"].step) is None
  line = plan.packing_line(list(steps.values()))
  assert "actor_update 16 buffers of 256 tokens (2 micro-batches x 4 data shards x 2)" in line
  padded, _ = planned(model_dir, "v5e:2x2", "actor_rollout_ref.model.use_remove_padding=false")
  assert plan.packing_line(list(padded.values())) is None


@pytest.mark.slow  # two update compiles (about 30 s)
@jax.default_matmul_precision("default")
def test_packed_passes_compile_as_a_step_of_shorter_rows_runs_them(model_dir):
  # rows of 64 real tokens, four to a buffer of 256. Without a budget the update keeps its 2 micro-batches of 2
  # rows per chip, each now in one buffer; under a budget of 2 buffers a chip the update takes its 4 rows in one
  # micro-batch (the padded update takes 2), and the FSDP bound counts one weight gather
  steps, target = planned(model_dir, "v5e:2x2", row_tokens=64)
  assert plan.packed_buffers(steps["actor_update"].step) == (2, 4, 1, 256)
  assert plan.packed_buffers(steps["old_log_prob"].step) == (1, 4, 1, 256)
  assert "compiled for rows of 64 real tokens each: actor_update 8 buffers" in plan.packing_line(
      list(steps.values()), 64)
  budget = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512")
  largest, _ = planned(model_dir, "v5e:2x2", *budget)
  short, _ = planned(model_dir, "v5e:2x2", *budget, row_tokens=64)
  assert plan.packed_buffers(largest["actor_update"].step) == (2, 4, 2, 256)
  assert plan.packed_buffers(short["actor_update"].step) == (1, 4, 1, 256)
  assert short["actor_update"].bound[1] == pytest.approx(largest["actor_update"].bound[1] / 2, rel=0.05)
  flops = [plan.compile_step(s["actor_update"], target.hbm_bytes)[0].loop_flops for s in (largest, short)]
  assert flops[1] < 0.3 * flops[0]  # a quarter of the buffers


# TINY with a Qwen2.5-VL tower of 2 blocks (one windowed, one across the frame) of heads as wide as TINY's
TINY_VL = {**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")}, "model_type": "qwen2_5_vl",
           "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "image_token_id": 2000,
           "vision_config": {"depth": 2, "hidden_size": 256, "intermediate_size": 512, "num_heads": 2,
                             "out_hidden_size": 512, "patch_size": 14, "spatial_merge_size": 2, "window_size": 112,
                             "fullatt_block_indexes": [1], "temporal_patch_size": 2, "in_channels": 3}}


@pytest.mark.slow  # compiles a tiny VL update and image prefill for v5e (30-36 s; 73 s in a CI run beside a compile)
@jax.default_matmul_precision("default")
def test_a_vision_language_run_compiles_for_rows_of_realistic_images(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(TINY_VL))
  steps, target = planned(str(tmp_path), "v5e:2x2", image_patches=1000)  # a 448 x 448 image: 1,024 patches
  update, prefill = steps["actor_update"], steps["image_prefill"]
  # the update's packed buffers (at their largest, one row each) and the prefill's rows hold 1,024 patches
  images = plan._packed_of(update.step.args[plan._packed_arg(update.step)]).images
  assert images.pixels.shape[-2:] == (1024, 3 * 2 * 14 * 14) and images.layout.restore.shape[-1] == 256
  assert prefill.step.args[3].pixels.shape[1:] == (1024, 3 * 2 * 14 * 14)
  results = {name: plan.compile_step(steps[name], target.hbm_bytes)[0] for name in ("actor_update", "image_prefill")}
  assert all(r.fits and r.activation_all_reduce == 0 for r in results.values()), results
  assert results["actor_update"].ratio <= 1.3, (results["actor_update"].collectives, results["actor_update"].bound)


def scattered_bytes(mesh, shape, dim, options):
  """{collective kind: bytes} of a bfloat16 [4, *shape] sum over its first axis, scattered over `dim`."""
  out = [None] * len(shape)
  out[dim] = "fsdp"
  reduce = jax.shard_map(lambda x: jax.lax.psum_scatter(x[0], "fsdp", scatter_dimension=dim, tiled=True),
                         mesh=mesh, in_specs=P("fsdp"), out_specs=P(*out), check_vma=False)
  parts = jax.ShapeDtypeStruct((4, *shape), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
  text = jax.jit(reduce, compiler_options=options).lower(parts).compile().as_text()
  return {kind: size for kind, size in hlo.collectives(text).by_kind.items() if size}


@pytest.mark.parametrize("shape,dim", [((18944, 3584), 1), ((4096, 64128), 0)])
def test_gradient_options_keep_reduce_scatters_that_libtpu_would_all_reduce(shape, dim):
  mesh = Mesh(np.array(topology.devices(topology.parse("v5p:2x2x1"))), ("fsdp",))
  assert set(scattered_bytes(mesh, shape, dim, {})) == {"all-reduce"}  # why the options exist
  assert set(scattered_bytes(mesh, shape, dim, sharding.gradient_compiler_options(mesh))) == {"reduce-scatter"}
  assert sharding.gradient_compiler_options(Mesh(np.array(jax.devices()), ("fsdp",))) == {}


@pytest.mark.slow
@jax.default_matmul_precision("default")  # Mosaic has no "highest" bfloat16 matmul (conftest sets highest)
@pytest.mark.parametrize("name", ["v5p:2x2x1", "v5e:2x2"])
def test_update_gathers_weights_and_reduce_scatters_gradients(model_dir, name):
  steps, target = planned(model_dir, name)
  update = steps["actor_update"]
  result, compiled = plan.compile_step(update, target.hbm_bytes)
  assert result.fits, result
  summary = hlo.collectives(compiled.as_text())
  assert not summary.unknown_loops
  params = sum(x.size * 2 for x in jax.tree.leaves(update.step.args[0]))  # bfloat16 bytes of the weights
  assert summary.by_kind["all-gather"] > params and summary.by_kind["reduce-scatter"] > params / 2
  # what is all-reduced is scalars and norm-scale gradients, never activations or weight gradients
  assert summary.by_kind["all-reduce"] < 0.01 * params, summary.largest("all-reduce")
  assert result.activation_all_reduce == 0
  assert result.ratio <= 1.3, (result.collectives, result.bound)


@pytest.mark.slow
@jax.default_matmul_precision("default")
def test_an_offloaded_optimizer_state_and_reference_hold_no_device_memory_between_their_steps(model_dir):
  offloaded = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
               "actor_rollout_ref.ref.fsdp_config.param_offload=true")
  (plain, target), (moved, _) = (planned(model_dir, "v5e:2x2", *extra) for extra in ((), offloaded))
  in_host = lambda tree: [x for x in jax.tree.leaves(tree) if offload.in_host(x)]  # noqa: E731
  moments = report.shard_bytes(in_host(moved["actor_update"].step.args[1]))
  reference = report.shard_bytes(in_host(moved["ref_log_prob"].step.args[0]))
  assert moments == report.shard_bytes(plain["actor_update"].step.args[1]) > 0
  assert reference == report.shard_bytes(plain["ref_log_prob"].step.args[0]) > 0
  (before, _), (after, compiled) = (plan.compile_step(p["actor_update"], target.hbm_bytes) for p in (plain, moved))
  # the moments are no argument in device memory, and the reference's copy stays in host memory beside the update
  assert before.arguments - after.arguments == pytest.approx(moments, abs=4096)  # the step counts: padded scalars
  assert plain["actor_update"].resident == reference and moved["actor_update"].resident == 0
  # beside the other steps neither stays in device memory (the update brings its state in: on this tiny model its
  # optimizer step is its peak, so only the reference's copy lowers the update's own need)
  assert plain["old_log_prob"].resident == reference + moments and moved["old_log_prob"].resident == 0
  assert after.required + after.resident < before.required + before.resident
  assert after.activation_all_reduce == 0 and after.ratio <= 1.3
  # the reference's pass brings its weights in: arguments of a few bytes in device memory, the weights in its peak
  ref, _ = plan.compile_step(moved["ref_log_prob"], target.hbm_bytes)
  assert ref.arguments < reference / 100 and ref.required > reference


@pytest.mark.slow
@jax.default_matmul_precision("default")
def test_tensor_parallel_update_reduce_scatters_activations_instead_of_all_reducing_them(model_dir):
  steps, target = planned(model_dir, "v5p:2x2x1", "actor_rollout_ref.actor.tensor_model_parallel_size=2")
  update = steps["actor_update"]
  gate = update.step.args[0]["layers"][0]["mlp"]["gate"]
  assert gate.get_value().sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  result, compiled = plan.compile_step(update, target.hbm_bytes)
  summary = hlo.collectives(compiled.as_text())
  # Megatron's all-reduces of [rows, T, D] per layer are reduce-scatters into the sequence-split residual stream
  # (and all-gathers out of it); only gradients of small parameters are all-reduced whole
  assert result.activation_all_reduce == 0, summary.largest("all-reduce")
  assert summary.by_kind["reduce-scatter"] > 0 and summary.by_kind["all-reduce"] < 0.2 * result.bound[1]


@pytest.mark.parametrize("name", ["v5p:2x2x1", "v5e:2x2"])
def test_decode_moves_no_weight_and_reads_its_shards(model_dir, name):
  steps, target = planned(model_dir, name)
  decode = steps["decode_step"]
  result, compiled = plan.compile_step(decode, target.hbm_bytes)
  assert result.fits
  summary = hlo.collectives(compiled.as_text())
  weights = report.shard_bytes(decode.step.args[0])
  assert summary.by_kind["all-gather"] < 0.05 * weights, summary.largest("all-gather")
  assert summary.by_kind["reduce-scatter"] == 0
  assert "tpu_custom_call" in compiled.as_text()  # the Pallas decode kernel (attention_kernel=auto on TPU)
  assert result.ratio <= 1.3, (result.hbm_traffic, result.bound)


@pytest.mark.slow
def test_an_int8_cache_halves_the_cache_shard_and_the_decode_steps_cache_traffic(model_dir):
  """64 slots on v5e-4 with rollout.kv_cache_dtype=int8: the cache shard is 0.51x the bfloat16 one (8 bits and a
  bfloat16 scale per 128-wide vector), and the decode step, the Pallas kernel reading the 8-bit blocks as stored,
  reads the weights plus about half the cache traffic, within 1.3x of its (smaller) shards."""
  larger = ["data.train_batch_size=32", "actor_rollout_ref.rollout.max_num_seqs=64"]
  results = {}
  for dtype in ("auto", "int8"):
    steps, target = planned(model_dir, "v5e:2x2", *larger, f"actor_rollout_ref.rollout.kv_cache_dtype={dtype}")
    decode = steps["decode_step"]
    result, compiled = plan.compile_step(decode, target.hbm_bytes)
    cache = decode.step.args[1].cache
    assert decode.step.name == "decode_step[64 slots]" and result.fits and result.ratio <= 1.3
    assert "tpu_custom_call" in compiled.as_text()
    results[dtype] = (report.shard_bytes((cache.k, cache.v)), result.hbm_traffic - report.shard_bytes(decode.step.args[0]))
  (full_cache, full_rest), (int8_cache, int8_rest) = results["auto"], results["int8"]
  assert int8_cache == pytest.approx(full_cache * (128 + 2) / 256)
  assert int8_rest < 0.6 * full_rest, (int8_rest, full_rest)


@pytest.mark.slow
def test_int8_weights_halve_the_decode_steps_weight_bytes_and_with_an_int8_cache_its_traffic(model_dir):
  """64 slots on v5e-4 with rollout.quantization=int8: the engine's weight shard is about half bfloat16's, the
  decode step reads about that shard and its cache (XLA fuses the convert into the dots), and with the cache in
  int8 as well the whole step reads under 0.6x of the bfloat16 step's bytes (measured 0.58x: the tiny model's
  embedding table, 1/6 of its weights, is read whole once it fits in VMEM)."""
  larger = ["data.train_batch_size=32", "actor_rollout_ref.rollout.max_num_seqs=64"]
  results = {}
  for weights, cache in ((None, "auto"), ("int8", "auto"), ("int8", "int8")):
    extra = [f"actor_rollout_ref.rollout.kv_cache_dtype={cache}"]
    extra += [f"actor_rollout_ref.rollout.quantization={weights}"] if weights else []
    steps, target = planned(model_dir, "v5e:2x2", *larger, *extra)
    decode = steps["decode_step"]
    result, _ = plan.compile_step(decode, target.hbm_bytes)
    # within 1.15x of its own (8-bit) parameter + cache shard: no projection is dequantized into a bfloat16 copy
    # (one of the LM head alone would add 0.3x)
    assert result.fits and result.ratio <= (1.3 if weights is None else 1.15), (result.hbm_traffic, result.bound)
    results[weights, cache] = (report.shard_bytes(decode.step.args[0]), result.hbm_traffic)
  (full_weights, full), (int8_weights, _), (_, both) = results.values()
  assert int8_weights < 0.55 * full_weights, (int8_weights, full_weights)
  assert both < 0.6 * full, (both, full)


MOE = {**TINY, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "moe_intermediate_size": 512,
       "num_experts": 8, "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tiny_moe_tpu")
  (path / "config.json").write_text(json.dumps(MOE))
  return str(path)


@jax.default_matmul_precision("default")
def test_expert_parallel_decode_reads_its_experts_in_place(moe_dir):
  steps, target = planned(moe_dir, "v5p:2x2x1", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2")
  decode = steps["decode_step"]
  gate = decode.step.args[0]["layers"][0]["mlp"]["gate"].get_value()
  assert gate.sharding.spec == jax.sharding.PartitionSpec("expert", "fsdp", None)  # 4 of 8 experts, half their rows
  result, compiled = plan.compile_step(decode, target.hbm_bytes)
  summary = hlo.collectives(compiled.as_text())
  weights = report.shard_bytes(decode.step.args[0])
  assert summary.by_kind["all-gather"] < 0.01 * weights, summary.largest("all-gather")  # no expert is gathered
  assert result.ratio <= 1.3, (result.hbm_traffic, result.bound)


@pytest.mark.slow
@jax.default_matmul_precision("default")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_scanned_expert_parallel_decode_reads_its_experts_in_place(tmp_path, quantization):
  # the engine holds a scanned model's experts per layer: a static slice of a stacked kernel feeding the grouped
  # matmul was copied out every step (2.99x the shard here); each chip's grouped matmuls take 64 of the 16 slots'
  # 128 token copies, or all of them past that (a conditional). Float8 experts go to the Pallas grouped matmul
  # (`rljax.kernels.grouped_matmul`) per device, inside the conditional's branches
  (tmp_path / "config.json").write_text(json.dumps({**MOE, "num_hidden_layers": 8, "num_experts": 64,
                                                    "moe_intermediate_size": 768, "num_experts_per_tok": 8}))
  extra = [f"actor_rollout_ref.rollout.quantization={quantization}"] if quantization else []
  steps, target = planned(str(tmp_path), "v5p:2x2x1", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4",
                          "actor_rollout_ref.model.scan_layers=true", *extra)
  decode = steps["decode_step"]
  gate = decode.step.args[0]["layers"]["mlp"]["gate"].get_value()
  expert = (64, MOE["hidden_size"], 768)
  assert isinstance(gate, PerLayer) and [weight_quant.shape(g) for g in gate.layers] == [expert] * 8
  assert all(isinstance(g, weight_quant.QuantizedWeight) == bool(quantization) for g in gate.layers)
  result, compiled = plan.compile_step(decode, target.hbm_bytes)
  assert "conditional" in compiled.as_text()
  assert ("jit(grouped_matmul)/pallas_call" in compiled.as_text()) == bool(quantization)
  assert result.ratio <= 1.3, (result.hbm_traffic, result.bound)


@pytest.mark.slow
@jax.default_matmul_precision("default")
def test_moe_dispatch_flops_are_those_of_the_activated_experts():
  from rljax.models import moe
  tokens, d, f, e, k = 2048, 1024, 512, 8, 2
  device = topology.devices(topology.parse("v5p:2x2x1"))[:1]
  one = NamedSharding(Mesh(np.array(device), ("x",)), P())
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=one)  # noqa: E731
  ids = jax.ShapeDtypeStruct((1, tokens, k), jnp.int32, sharding=one)
  compiled = jax.jit(moe.dispatch).lower(spec(1, tokens, d), ids, spec(1, tokens, k), spec(e, d, f), spec(e, d, f),
                                         spec(e, f, d)).compile()
  activated = 2 * tokens * k * 3 * d * f  # gate, up and down of k experts per token
  assert activated <= compiled.cost_analysis()["flops"] <= 1.3 * activated


@pytest.mark.slow
def test_cli_reports_a_step_that_does_not_fit_with_the_fix(model_dir):
  command = [sys.executable, "-m", "rljax.compile", f"--config={ROOT / 'configs' / 'grpo.py'}", "--topology=v5e:2x2",
             "--only=insert", f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES,
             "actor_rollout_ref.rollout.max_num_seqs=4096", "data.train_batch_size=4096",
             "actor_rollout_ref.actor.ppo_mini_batch_size=4096", "data.max_response_length=8192"]
  done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert done.returncode == 1, done.stderr[-2000:]
  assert "into 4096]" in done.stdout and "NO" in done.stdout
  assert "do not fit in 15.75 GiB per device" in done.stderr and "max_num_seqs" in done.stderr


def test_activation_all_reduce_tells_weight_gradients_from_activations():
  params = {"embed": jax.ShapeDtypeStruct((128256, 4096), jnp.float32),
            "mlp": jax.ShapeDtypeStruct((32, 4096, 14336), jnp.float32),
            "mlp_bias": jax.ShapeDtypeStruct((32, 14336), jnp.float32)}

  def summary(*shapes):
    collectives = [hlo.Collective("all-reduce", 1 << 20, 1, "", shape) for shape in shapes]
    return hlo.CollectiveSummary({"all-reduce": len(shapes) << 20}, collectives, [])

  # a scanned layer's gradient, and LM-head blocks as logprobs reduces them ([D, block], [D, parts, block])
  # and a scanned layer's gradients combined with its bias's (a vision tower's block, libtpu's multi-axis
  # all-reduce of a reduce-scatter on a 2 x 4 torus)
  gradients = summary("bf16[4096,14336]{1,0}", "bf16[4096,64128]{0,1}", "(bf16[4096,2,32064]{2,1,0}, f32[])",
                      "(bf16[14336]{0}, bf16[4096,14336]{1,0})")
  assert report.activation_all_reduce(gradients, params) == 0
  activations = summary("bf16[8,1536,4096]{2,1,0}", "f32[12288,4096]{1,0}", "bf16[4096,256512]{1,0}")
  assert report.activation_all_reduce(activations, params) == 3 << 20


def test_collectives_that_share_a_channel_over_other_groups_each_count():
  mesh = Mesh(np.array(topology.devices(topology.parse("v5p:2x2x1"))), ("fsdp",))

  def two_stages(x):  # a sum over 4 chips scattered in two halvings; JAX gives both one channel_id
    half = jax.lax.psum_scatter(x[0], "fsdp", scatter_dimension=0, tiled=True, axis_index_groups=[[0, 1], [2, 3]])
    return jax.lax.psum_scatter(half, "fsdp", scatter_dimension=0, tiled=True, axis_index_groups=[[0, 2], [1, 3]])

  parts = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
  reduce = jax.shard_map(two_stages, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"), check_vma=False)
  summary = hlo.collectives(jax.jit(reduce).lower(parts).compile().as_text())
  assert [c.bytes for c in summary.collectives] == [1 << 20, 1 << 19]  # half of 2 MiB, then half of 1 MiB


def test_the_data_center_network_part_of_a_multislice_sum_counts_as_dcn():
  devices = topology.devices(topology.parse("v5p-8", num_slices=2))
  mesh = sharding.build_mesh({"data": 2, "fsdp": 4, "tensor": 1, "sequence": 1}, devices)
  total = jax.shard_map(lambda x: jax.lax.psum(x, "data"), mesh=mesh, in_specs=P("data", "fsdp"),
                        out_specs=P(None, "fsdp"), check_vma=False)
  parts = jax.ShapeDtypeStruct((2, 4096, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("data", "fsdp")))
  summary = hlo.collectives(jax.jit(total).lower(parts).compile().as_text())
  assert summary.by_kind["dcn"] == 1024 * 1024 * 2  # each chip sends its [1, 1024, 1024] bfloat16 block once


def four_hosts():
  """v5e-16's chips as a [host, chip] mesh (4 hosts of 2x2 chips)."""
  devices = topology.devices(topology.parse("v5litepod-16"))
  return Mesh(np.array([hosts.process_devices(p, devices) for p in range(4)]), ("hosts", "chips"))


def cross_host(mesh, fn, spec, shape=(16, 4096)):
  """What reaches the busiest host when `fn` runs on a bfloat16 array of `shape` laid out by `spec`."""
  arg = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
  compiled = jax.jit(fn).lower(arg).compile()
  return hlo.cross_host_bytes(hlo.collectives(compiled.as_text()), report.partition_hosts(arg))


def test_cross_host_bytes_count_what_reaches_a_host_from_the_others():
  mesh = four_hosts()
  whole = 16 * 4096 * 2
  gather = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))
  assert cross_host(mesh, gather, P(("hosts", "chips"))) == whole * 12 / 16  # the 12 shards held elsewhere
  within = jax.shard_map(lambda x: jax.lax.psum(x, "chips"), mesh=mesh, in_specs=P("hosts", "chips"),
                         out_specs=P("hosts"), check_vma=False)
  assert cross_host(mesh, within, P("hosts", "chips")) == 0
  across = jax.shard_map(lambda x: jax.lax.psum(x, "hosts"), mesh=mesh, in_specs=P("hosts", "chips"),
                         out_specs=P(None, "chips"), check_vma=False)
  block = whole // 16
  # each of a host's 4 chips sums with one chip of each other host: 3/4 of its block in, reduced, 3/4 back
  assert cross_host(mesh, across, P("hosts", "chips")) == 4 * 1.5 * block


@pytest.mark.parametrize("attributes, groups", [
    ("replica_groups=mesh['a'=2,'b'=2] {'a'}", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2], device_ids=([2,2]T(1,0)) {'a'}", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[4]", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0)", [[0, 2], [1, 3]]),
    ("replica_groups={{0,3},{1,2}}, dimensions={0}", [[0, 3], [1, 2]]),
    ("source_target_pairs={{0,1},{1,0}}", [[0, 1], [1, 0]]),
])
def test_replica_groups_are_read_in_each_form_hlo_writes(attributes, groups):
  assert hlo.replica_groups(attributes) == groups


@pytest.mark.slow
def test_a_slice_of_four_hosts_rolls_out_on_each_host_after_one_weight_all_gather(model_dir):
  """v5e-16 is 4 hosts: each decodes its own share of the responses on its own 4 chips (compiled on a one-host
  slice, with a slot for each of them, not for every host's) after one all-gather
  that brings each host the 3/4 of the weights it does not hold, within 1.3x of that; the trainer's state
  counts towards each rollout step's fit."""
  target = topology.parse("v5litepod-16")
  devices = topology.devices(target)
  config = resolve(config_lib.load_config_file(str(ROOT / "configs" / "grpo.py")),
                   [f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES, "data.train_batch_size=16",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=16"], device_count=len(devices))
  host = topology.devices(topology.one_host(target))
  steps = {p.step.name.split("[")[0]: p for p in plan.rl_steps(config, sharding.make_mesh(config, devices=devices),
                                                                host)}
  weights, _ = plan.compile_step(steps["rollout_weights"], target.hbm_bytes)
  copies = steps["rollout_weights"].parts  # per array: gathered across hosts, then laid out within each
  bf16 = sum(x.size * 2 for part, feeds in copies if feeds for x in jax.tree.leaves(part.args))
  assert [feeds for _, feeds in copies] == [True, False] * len(jax.tree.leaves(steps["actor_update"].step.args[0]))
  assert weights.fits and weights.bound == ("host share", 0.75 * bf16)
  assert 1.0 <= weights.ratio <= 1.3, weights.cross_host
  decode = steps["decode_step"]
  assert set(jax.tree.leaves(decode.step.args[0])[0].sharding.device_set) <= set(host)
  assert decode.step.name == "decode_step[8 slots]"  # a slot for each of the host's 16 x 2 / 4 responses
  result, _ = plan.compile_step(decode, target.hbm_bytes)
  assert result.fits and result.cross_host is None and result.ratio <= 1.3
  # beside the rollout, each chip keeps its 1/16 of the trainer's float32 weights, Adam's two moments and the
  # reference's copy: 4 x 4 bytes per parameter over 16 chips
  parameters = bf16 // 2
  assert result.resident == pytest.approx(4 * 4 * parameters / 16, rel=1e-3)
  assert weights.resident == result.resident  # the copy's argument is a cast: the float32 weights stay too
  assert steps["actor_update"].resident == pytest.approx(4 * parameters / 16, rel=1e-3)  # the reference's copy


@pytest.mark.slow
def test_an_append_of_8_of_256_slots_computes_and_reads_their_rows_only(model_dir):
  """A multi-turn engine of 256 slots on v5e-4 (4 shards of 64): 8 slots appending (2 per shard) cost 8/256 of the
  all-slot append's FLOPs, and read the weights plus each appending row's cache about 4 times (copied out, read by
  attention, put back in place), a quarter of the all-slot append's HBM traffic; no weight moves."""
  from rljax.rl import assembly  # pylint: disable=import-outside-toplevel

  target = topology.parse("v5e:2x2")
  devices = topology.devices(target)
  config = resolve(config_lib.load_config_file(str(ROOT / "configs" / "grpo.py")),
                   [f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES, "data.train_batch_size=128",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=128", "actor_rollout_ref.rollout.max_num_seqs=256",
                    "actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true"],
                   device_count=len(devices))
  run, state = assembly.build_run(config, sharding.make_mesh(config, devices=devices), abstract=True, tokenizer=None,
                                  batches_per_epoch=1)
  engine, params = run.engine, run.actor_params(state)
  assert (engine.max_concurrent_decodes, engine.slot_shards) == (256, 4)
  assert engine.append_rows_per_shard(range(0, 256, 32)) == 2
  every, _ = plan.compile_step(plan.PlannedStep(engine_steps.append_step(engine, params, 16)), target.hbm_bytes)
  planned = plan.PlannedStep(engine_steps.append_step(engine, params, 16, 2))
  few, compiled = plan.compile_step(planned, target.hbm_bytes)
  assert planned.step.name == "append[8 of 256 slots x 16]" and every.fits and few.fits
  assert few.loop_flops == pytest.approx(every.loop_flops * 8 / 256, rel=0.02)
  weights = report.shard_bytes(engine.compute_params(params))
  cache = report.shard_bytes(list(engine.abstract_decode_state().cache.k) + list(engine.abstract_decode_state().cache.v))
  assert weights < few.hbm_traffic <= weights + 4 * cache * 2 / 64 + 2**20, (few.hbm_traffic, weights, cache)
  assert few.hbm_traffic < 0.3 * every.hbm_traffic
  # no weight moves: what is gathered is the appending rows' new keys and values (8 x 16 tokens, 6% of these weights;
  # one layer's attention output alone is 15%)
  assert hlo.collectives(compiled.as_text()).by_kind["all-gather"] < 0.1 * weights


@pytest.mark.slow
def test_separate_async_compiles_each_side_on_its_own_hosts_and_counts_what_it_sends(model_dir):
  """separate_async on v5p-16 with a rollout of one host: the trainer's steps compile on one host's 4 chips and
  the engine's on the other's, each rollout step beside the weight versions its schedule holds (the one it
  decodes under, the next, sent while it decodes, and one arriving) and its cache, none of the trainer's arrays;
  a weight sync sends the bf16 weights, each rollout chip receiving its quarter."""
  target = topology.parse("v5p-16")
  config = resolve(config_lib.load_config_file(str(ROOT / "configs" / "grpo.py")),
                   [f"actor_rollout_ref.model.path={model_dir}", *OVERRIDES, "trainer.v1.trainer_mode=separate_async",
                    "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=4",
                    "trainer.n_gpus_per_node=auto"], device_count=target.chips)
  half = topology.sub_slice(target, 4)
  devices = topology.devices(half) + topology.devices(half)
  trainer_devices, rollout_devices = sharding.split_devices(config, devices)
  mesh = sharding.make_mesh(config, devices=devices)
  assert set(mesh.devices.flat) == set(trainer_devices) and len(rollout_devices) == 4
  steps = {p.step.name.split("[")[0]: p for p in plan.rl_steps(config, mesh, rollout_devices=rollout_devices)}
  decode = steps["decode_step"]
  assert set(jax.tree.leaves(decode.step.args[0])[0].sharding.device_set) == set(rollout_devices)
  sent, per_device = plan.weights_sent(list(steps.values()))
  parameters = sum(x.size for x in jax.tree.leaves(steps["actor_update"].step.args[0]))
  assert sent == 2 * parameters and per_device == pytest.approx(sent / 4, rel=0.01)  # bf16, split 4 ways
  cache = report.shard_bytes([x for x in jax.tree.leaves(decode.step.args[1])
                              if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)])
  # beside its own weights (arguments): the next version's and one arriving (verl's default schedule)
  assert decode.resident == pytest.approx(2 * per_device, rel=0.01)
  assert steps["prefill"].resident == pytest.approx(2 * per_device + cache, rel=0.01)
  result, _ = plan.compile_step(decode, target.hbm_bytes)
  assert result.fits and result.ratio <= 1.3
  weights, _ = plan.compile_step(steps["rollout_weights"], target.hbm_bytes)  # the cast, on the trainer's chips
  assert weights.fits and not weights.collectives.get("all-gather")
  line = report.sent_line((sent, per_device), 4, 4, target.chip)
  assert line.startswith("separate_async: every 4 update(s) the trainer sends") and "no compiler estimate" in line
  # a rollout of two hosts (v5p-32 split 2/2, one process per host): each host receives a copy of its own
  assert f"sends {report.gib(2 * sent)} GiB of weights to the rollout's 8 devices (2 hosts, a copy of " \
         f"{report.gib(sent)} GiB each)" in report.sent_line((sent, per_device), 8, 4, target.chip, 2)
  # validating: in one process it decodes on the rollout's chips, beside the stream (one more weight copy there);
  # with the rollout on a host (a process) of its own, on the trainer's chips (`rljax.rl.remote`)
  config.trainer.test_freq, config.data.val_files = 2, "val.parquet"
  assert remote.roles(config, topology.devices(target)) == ((0,), (1,))
  for on_its_own_host in (False, True):
    steps = {p.step.name.split("[")[0]: p for p in plan.rl_steps(config, mesh, rollout_devices=rollout_devices,
                                                                 remote=on_its_own_host)}
    beside = 2 * per_device if on_its_own_host else 3 * per_device + cache  # validation's copy and cache
    assert steps["decode_step"].resident == pytest.approx(beside, rel=0.01)
    validation = steps.get("validation_decode_step")
    assert (validation is not None) == on_its_own_host
  assert set(jax.tree.leaves(validation.step.args[0])[0].sharding.device_set) == set(trainer_devices)
  assert validation.resident > 0  # beside the trainer's arrays
