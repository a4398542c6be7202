"""Meshes from the config, rule-driven shard shapes, sharded steps equal one device, two processes."""

import os
import pathlib

import jax
import numpy as np
import pytest

from rljax import config as config_lib
from rljax import sharding
from rljax.sharding import distributed
from tests import processes
from tests.sharding import tiny_step

ROOT = pathlib.Path(__file__).resolve().parents[2]
MESHES = [(8, 1, 1), (1, 8, 1), (1, 2, 4), (2, 2, 2)]


def assert_params_close(actual, desired, name):
  """Adam's first step is lr * g / (|g| + eps): where |g| is at float32 noise
  level the update can move by up to lr (1e-2), so entries may differ by a
  small fraction of lr; a wrong sharding moves them by O(lr)."""
  np.testing.assert_allclose(actual, desired, rtol=1e-4, atol=1e-4, err_msg=name)


def flat(tree):
  return {"/".join(map(str, k)): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.fixture(scope="module")
def one_device():
  mesh = sharding.build_mesh({"data": 1, "fsdp": 1, "tensor": 1, "sequence": 1}, jax.devices()[:1])
  loss, host, params, opt_state = tiny_step.run_step(mesh)
  return loss, flat(host), sharding.addressable_bytes((params, opt_state))


# logical axis of each parameter dimension, written out from the model's layout
EXPECTED_AXES = {
    "embed": ("tensor", "fsdp"),           # [vocab, embed]
    "lm_head": ("tensor", "fsdp"),         # [vocab, embed]
    "q": ("fsdp", "tensor", None),         # [embed, heads, head_dim]
    "k": ("fsdp", "tensor", None),         # [embed, kv_heads, head_dim]
    "v": ("fsdp", "tensor", None),
    "o": ("tensor", None, "fsdp"),         # [heads, head_dim, embed]
    "gate": ("fsdp", "tensor"),            # [embed, mlp]
    "up": ("fsdp", "tensor"),
    "down": ("tensor", "fsdp"),            # [mlp, embed]
    "scale": ("fsdp",),                    # [embed]
}


def expected_shard(name, shape, mesh):
  leaf = [p for p in name.split("/") if p.strip("[]'.") and not p.startswith(".value")]
  key = leaf[-1].strip("[]'") if leaf else name
  axes = EXPECTED_AXES[key]
  return tuple(d // (mesh.shape[a] if a else 1) for d, a in zip(shape, axes))


@pytest.mark.slow
@pytest.mark.parametrize("data,fsdp,tensor", MESHES)
def test_sharded_step_equals_one_device(one_device, data, fsdp, tensor):
  config = tiny_step.mesh_config(fsdp, tensor)
  mesh = sharding.make_mesh(config)
  assert dict(mesh.shape) == {"data": data, "fsdp": fsdp, "tensor": tensor, "sequence": 1, "expert": 1}
  sharding.check_model_fits(mesh, tiny_step.TINY.num_heads, tiny_step.TINY.num_kv_heads)
  loss, host, params, opt_state = tiny_step.run_step(mesh)
  ref_loss, ref_params, ref_bytes = one_device
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  got = flat(host)
  assert got.keys() == ref_params.keys()
  for name, value in got.items():
    assert_params_close(value, ref_params[name], name)
  for name, leaf in flat_arrays(params).items():
    assert leaf.addressable_shards[0].data.shape == expected_shard(name, leaf.shape, mesh), name
  per_device = sharding.addressable_bytes((params, opt_state))
  assert per_device == pytest.approx(ref_bytes / (fsdp * tensor), rel=0.03)


def flat_arrays(tree):
  return {"/".join(map(str, k)): v for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_opt_state_is_sharded_like_params():
  mesh = sharding.make_mesh(tiny_step.mesh_config(2, 4))
  _, _, params, opt_state = tiny_step.run_step(mesh)
  param_specs = [x.sharding.spec for x in jax.tree.leaves(params)]
  mu = opt_state[0].mu
  assert [x.sharding.spec for x in jax.tree.leaves(mu)] == param_specs


@pytest.mark.parametrize("overrides,fragment", [
    (["actor_rollout_ref.actor.tensor_model_parallel_size=3"], "does not divide the 8 devices"),
    (["actor_rollout_ref.actor.fsdp_config.fsdp_size=3"], "fsdp_config.fsdp_size=3: does not divide the 8 devices"),
    (["actor_rollout_ref.actor.tensor_model_parallel_size=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8"], "does not divide the 8 devices"),
])
def test_impossible_meshes_name_their_keys(overrides, fragment):
  config = config_lib.get_base_config()
  config_lib.apply_overrides(config, ["trainer.n_gpus_per_node=auto", *overrides])
  with pytest.raises(config_lib.ConfigError, match="Fix:") as info:
    sharding.make_mesh(config)
  assert fragment in str(info.value)


def test_device_count_mismatch_and_kv_heads():
  config = config_lib.get_base_config()
  config_lib.apply_overrides(config, ["trainer.n_gpus_per_node=4"])
  with pytest.raises(config_lib.ConfigError, match="JAX sees 8"):
    sharding.make_mesh(config)
  mesh = sharding.make_mesh(tiny_step.mesh_config(1, 8))
  with pytest.raises(config_lib.ConfigError, match=r"num_key_value_heads \(4\)"):
    sharding.check_model_fits(mesh, tiny_step.TINY.num_heads, tiny_step.TINY.num_kv_heads)


def test_distributed_args_from_environment(monkeypatch):
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(name, raising=False)
  assert sharding.distributed_args() is None or sharding.distributed_args() == {}
  if not os.path.exists("/dev/accel0"):  # JAX's TPU start-up writes this warning there on a machine without TPUs
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "WARNING: could not determine TPU worker hostnames or IP addresses")
    assert sharding.distributed_args() is None
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1234")
  with pytest.raises(config_lib.ConfigError, match="JAX_NUM_PROCESSES"):
    sharding.distributed_args()
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "2")
  with pytest.raises(config_lib.ConfigError, match=r"must lie in \[0, 2\)"):
    sharding.distributed_args()
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  assert sharding.distributed_args() == {"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 1}


def test_each_process_serves_weight_transfers_beside_the_coordinators_port(monkeypatch):
  monkeypatch.delenv("RLJAX_TRANSFER_ADDRESS", raising=False)
  assert distributed.transfer_address("localhost:1234", 1) == "127.0.0.1:1236"
  assert distributed.transfer_address("[::1]:1234", 0) == "127.0.0.1:1235"
  assert distributed.transfer_address("10.1.2.3:1234", 0).endswith(":1235")  # this machine's, on the way there
  with pytest.raises(config_lib.ConfigError, match=r"JAX_COORDINATOR_ADDRESS='10.1.2.3': must be HOST:PORT"):
    distributed.transfer_address("10.1.2.3", 0)
  monkeypatch.setenv("RLJAX_TRANSFER_ADDRESS", "10.9.9.9:7000")
  assert distributed.transfer_address("localhost:1234", 1) == "10.9.9.9:7000"


def test_a_lost_process_is_declared_after_the_heartbeat_timeout_the_environment_sets(monkeypatch):
  monkeypatch.delenv("RLJAX_HEARTBEAT_TIMEOUT_S", raising=False)
  assert distributed.heartbeat_timeout_s() == distributed.HEARTBEAT_TIMEOUT_S == 60
  monkeypatch.setenv("RLJAX_HEARTBEAT_TIMEOUT_S", "300")
  assert distributed.heartbeat_timeout_s() == 300
  for bad, why in (("0", "must be a positive number of seconds"), ("1m", "must be an integer")):
    monkeypatch.setenv("RLJAX_HEARTBEAT_TIMEOUT_S", bad)
    with pytest.raises(config_lib.ConfigError, match=f"RLJAX_HEARTBEAT_TIMEOUT_S=.*{why}.*TIMEOUT_S=60"):
      distributed.heartbeat_timeout_s()


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
  out = tmp_path / "result.npz"
  procs = processes.start([str(ROOT / "tests/sharding/multihost_worker.py"), str(out)], 2)
  logs = processes.finish(procs, timeout=240)
  assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-4000:]
  result = np.load(out)
  mesh = sharding.build_mesh({"data": 2, "fsdp": 2, "tensor": 2, "sequence": 1})
  loss, host, _, _ = tiny_step.run_step(mesh)
  np.testing.assert_allclose(float(result["loss"]), loss, rtol=1e-5)
  for name, value in flat(host).items():
    assert_params_close(result[name], value, name)
