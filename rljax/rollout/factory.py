"""One way to build the rollout engine and sampler from a config's rollout node.

The RL trainer (`actor_rollout_ref.rollout`), offline generation
(`rollout`) and `rljax.compile` build their engines here, so prefill
buckets, stop and pad ids, the compute dtype, the attention kernel and the
decode loop's compiler options are chosen once.

On the CPU the decode loop's matmuls may run through Eigen instead of XLA's
default YNNPACK (`cpu_dot_options`); that choice is a compiler option of the
decode jit alone and is never made for an accelerator.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from rljax.config.choices import CPU_DOT_LIBRARIES
from rljax.config.errors import ConfigError
from rljax.data import tokenization
from rljax.models import CausalLM, ModelConfig, kv_quant, weight_quant
from rljax.agents import parsing
from rljax.rollout import agent_loop
from rljax.rollout.engine import Engine, make_engine
from rljax.rollout.sampler import RolloutSampler
from rljax.rollout.sampling import SamplingParams
from rljax.sharding import hosts, rules as rules_lib
from rljax.sharding.mesh import build_mesh

EIGEN_ROWS = (8, 24)


def cpu_dot_options(library: str, rows: int, avx512: bool | None = None) -> dict[str, str]:
  """XLA:CPU compiler options that run the decode loop's dots through `library`.

  XLA's CPU backend sends dots to YNNPACK by default. A decode step's dots
  have one row per slot held by the device ([rows, D] x [D, F]); on a
  2-core AVX2 host Eigen ran SmolLM2-135M's float32 decode step 1.25x
  faster than YNNPACK at 8 rows, 1.22x at 16, 1.11x at 24, the same at 32,
  and YNNPACK was 1.07x faster at 64; below 8 rows Eigen was 2-3x slower
  (2, 4 and 6 rows) or the same (1 row). On a 2-core AVX-512 host (an Intel
  Xeon with AMX) YNNPACK was faster at every count: 1.31x at 8 rows, 1.28x at
  16, 1.22x at 24, 4.4x at 2 (BENCHMARKS.md). "auto" picks Eigen for
  EIGEN_ROWS[0] to EIGEN_ROWS[1] rows on a host without AVX-512 only.

  Args:
    library: auto, ynnpack or eigen (actor_rollout_ref.rollout.cpu_dot_library).
    rows: decode rows per device.
    avx512: whether the host's CPU has AVX-512 (None: this host's, `host_has_avx512`).

  Returns:
    Options for `jax.jit(compiler_options=...)`; empty keeps XLA's default.
  """
  if library not in CPU_DOT_LIBRARIES:
    raise ValueError(f"cpu_dot_library={library!r}: must be one of {', '.join(CPU_DOT_LIBRARIES)}")
  wide = host_has_avx512() if avx512 is None else avx512
  eigen = library == "eigen" or (library == "auto" and not wide and EIGEN_ROWS[0] <= rows <= EIGEN_ROWS[1])
  return {"xla_cpu_experimental_ynn_fusion_type": ""} if eigen else {}


@functools.cache
def host_has_avx512() -> bool:
  """Whether this host's CPU has AVX-512 (its `avx512f` flag in /proc/cpuinfo; False where that is not read)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
      return any(line.startswith("flags") and "avx512f" in line.split() for line in info)
  except OSError:
    return False


def decode_compiler_options(mesh: Mesh, library: str, rows_per_device: int) -> dict[str, str]:
  """`cpu_dot_options` on a CPU mesh; none on an accelerator."""
  return cpu_dot_options(library, rows_per_device) if mesh.devices.flat[0].platform == "cpu" else {}


def rollout_mesh(mesh: Mesh, tensor: int) -> Mesh:
  """The rollout's mesh over the training mesh's devices, with a tensor axis of `tensor`.

  verl's `actor_rollout_ref.rollout.tensor_model_parallel_size`: decode is
  weight-stationary (`rljax.sharding.decode_rules`), so each step moves
  [slots, D / shards]-sized partial sums over the fsdp axis for every
  [D, F] weight, and a tensor axis splits F instead (each device then
  multiplies [slots, D / fsdp] by [D / fsdp, F / tensor]). The training mesh
  itself when the sizes agree (weights then read in place); otherwise the
  sampler reshards its cast copy of the weights once per rollout
  (`Engine.compute_params`). The data and expert axes are kept, fsdp takes the rest.
  When the mesh spans several processes (a multi-process job, or `rljax.compile`
  for a slice of several hosts), this host's devices alone (`rljax.sharding.hosts`).

  Raises:
    ConfigError: naming the key when `tensor` does not divide the devices left after the data axis.
  """
  devices = list(mesh.devices.flat)
  if len(hosts.processes(devices)) > 1:
    return _host_rollout_mesh(devices, tensor)
  if mesh.shape["tensor"] == tensor and mesh.shape["sequence"] == 1:
    return mesh
  data, expert = mesh.shape["data"], mesh.shape["expert"]
  rest = mesh.size // (data * expert)
  if tensor < 1 or rest % tensor:
    raise ConfigError("actor_rollout_ref.rollout.tensor_model_parallel_size", tensor,
                                 f"does not divide the {rest} devices of a data-parallel replica",
                                 f"choose a divisor of {rest}")
  return build_mesh({"data": data, "fsdp": rest // tensor, "tensor": tensor, "sequence": 1, "expert": expert},
                    devices)


def _host_rollout_mesh(devices: list[jax.Device], tensor: int) -> Mesh:
  """A multi-process job's rollout mesh: this host's share of `devices` (each host decodes its own prompts),
  fsdp by tensor."""
  local = len(hosts.process_devices(jax.process_index(), devices))
  if tensor < 1 or local % tensor:
    raise ConfigError("actor_rollout_ref.rollout.tensor_model_parallel_size", tensor,
                      f"does not divide the {local} devices of a host (each host decodes its own prompts)",
                      f"choose a divisor of {local}")
  return hosts.local_mesh({"data": 1, "fsdp": local // tensor, "tensor": tensor, "sequence": 1, "expert": 1}, devices)


def slots_per_device(mesh: Mesh, rules: Any, slots: int) -> int:
  """Decode slots each device holds: the share of the `cache_batch` rule (the batch rule's axes by default)."""
  spec = rules_lib.logical_to_spec(("cache_batch",), (slots,), mesh, rules_lib.with_cache_batch(rules))
  return NamedSharding(mesh, spec).shard_shape((slots,))[0]


def prefill_buckets(prompt_length: int, buckets: Sequence[int]) -> tuple[int, ...]:
  """The configured buckets below `prompt_length`, then `prompt_length` itself (the longest prompt)."""
  return tuple(sorted({b for b in buckets if b < prompt_length} | {prompt_length}))


def stop_ids(tokenizer: Any, model_cfg: ModelConfig, tool_format: str | None = None) -> tuple[int, ...]:
  """Every id that ends a response: the tokenizer's EOS ids and the model config's, and where tools are called in
  `tool_format` (multi_turn.format), the tokens that end a calling turn that the tokenizer holds (GLM's
  <|observation|>, `rljax.agents.parsing.format_stop_tokens`)."""
  ids = list(tokenization.eos_token_ids(tokenizer)) if tokenizer is not None else []
  eos = model_cfg.eos_token_id
  ids += eos if isinstance(eos, list) else ([eos] if eos is not None else [])
  if tool_format is not None and hasattr(tokenizer, "tok"):
    ids += [i for i in map(tokenizer.tok.token_to_id, parsing.format_stop_tokens(tool_format)) if i is not None]
  return tuple(sorted({int(i) for i in ids}))


def pad_id(tokenizer: Any, stop: Sequence[int]) -> int:
  """The tokenizer's pad id, else the first stop id, else 0."""
  pad = getattr(tokenizer, "pad_token_id", None)
  return int(pad) if pad is not None else (int(stop[0]) if stop else 0)


def dtype_of(name: str) -> jnp.dtype:
  """A config dtype name (fp32, bf16, fp16 or a numpy name) as a JAX dtype."""
  return jnp.dtype({"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(name, name))


def attention_kernel(setting: str, mesh: Mesh) -> str:
  """`actor_rollout_ref.model.attention_kernel` resolved for the mesh: auto is pallas on TPU, else xla."""
  if setting != "auto":
    return setting
  return "pallas" if mesh.devices.flat[0].platform == "tpu" else "xla"


def build_engine(model: CausalLM, rollout: ConfigDict, *, prompt_length: int, slots: int, mesh: Mesh, rules: Any,
                 stop: Sequence[int], tokenizer: Any = None, record_routing: bool = False,
                 multi_turn: bool = False) -> Engine:
  """The JetStream engine for `rollout` (a config's rollout node) over `model`'s graph.

  Args:
    model: the policy (its parameters are passed to each call, never copied).
    rollout: `actor_rollout_ref.rollout` or a generation config's `rollout`.
    prompt_length: the longest prompt (the last prefill bucket).
    slots: decode slots (at most rollout.max_num_seqs).
    mesh, rules: where the KV cache lives and how activations are laid out.
    stop: ids that end a response.
    tokenizer: for JetStream's tokenizer hooks.
    record_routing: record each token's experts (verl's R3 router replay).
    multi_turn: the engine appends tool turns to its slots (`agent_loop.append_buckets`).
  """
  return make_engine(
      model, compute_dtype=dtype_of(rollout.dtype), max_concurrent_decodes=slots,
      prefill_buckets=prefill_buckets(prompt_length, rollout.prefill_length_buckets),
      max_decode_length=rollout.response_length, sampling_params=SamplingParams.from_rollout_config(rollout),
      eos_ids=stop, ignore_eos=rollout.ignore_eos, mesh=mesh, rules=rules, tokenizer=tokenizer,
      decode_compiler_options=decode_compiler_options(mesh, rollout.cpu_dot_library,
                                                      slots_per_device(mesh, rules, slots)),
      record_routing=record_routing, kv_cache_dtype=kv_quant.KV_CACHE_DTYPES[rollout.kv_cache_dtype],
      quantization=weight_quant.QUANTIZATIONS.get(rollout.quantization),
      append_buckets=agent_loop.append_buckets(rollout.response_length) if multi_turn else ())


def build_sampler(engine: Engine, rollout: ConfigDict, pad: int, tokenizer: Any = None) -> RolloutSampler:
  """The RL sampler over `engine` (`rollout.free_cache_engine` keeps or drops the cache between calls): the tool
  agent loop's when `rollout.multi_turn.enable` (the engine then needs `multi_turn=True`; offline generation's
  rollout node has no multi_turn)."""
  if "multi_turn" in rollout and rollout.multi_turn.enable:
    return agent_loop.AgentSampler(engine, pad, tokenizer, agent_loop.AgentSettings.from_config(rollout),
                                   free_cache=rollout.free_cache_engine)
  return RolloutSampler(engine, pad_id=pad, free_cache=rollout.free_cache_engine)


__all__ = ["EIGEN_ROWS", "attention_kernel", "build_engine", "build_sampler", "cpu_dot_options", "host_has_avx512",
           "decode_compiler_options", "dtype_of", "pad_id", "prefill_buckets", "rollout_mesh", "slots_per_device",
           "stop_ids"]
