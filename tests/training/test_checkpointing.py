"""Checkpointer: atomic steps, keep limits, sharded restore, resume resolution."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax import config as config_lib
from rljax.training import checkpointing
from rljax.training.checkpointing import Checkpointer
from tests import processes


def _arrays(scale: float = 1.0) -> dict:
  return {
      "actor": {"w": scale * jnp.arange(6.0).reshape(2, 3), "b": jnp.full((3,), scale)},
      "critic": {"v": scale * jnp.ones((4,), jnp.bfloat16)},
  }


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _trainer_config(tmp_path, **changes):
  config = config_lib.get_base_config()
  config.trainer.default_local_dir = str(tmp_path / "ckpt")
  for key, value in changes.items():
    config.trainer[key] = value
  return config


def test_save_restore_round_trip_with_extras(tmp_path):
  extras = {"data_iter": {"epoch": 1, "index": 7}, "rng": [0, 42], "kl_coef": 0.001,
            "history": [{"critic/score/mean": 0.5}]}
  with Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.latest_step() is None
    assert ckpt.save(5, _arrays(2.0), extras)
    ckpt.wait()
    assert ckpt.all_steps() == [5]
    arrays, got = ckpt.restore(5, _abstract(_arrays()))
  assert got == extras
  want = _arrays(2.0)
  for path, leaf in jax.tree_util.tree_leaves_with_path(want):
    restored = arrays
    for key in path:
      restored = restored[key.key]
    assert restored.dtype == leaf.dtype
    np.testing.assert_array_equal(np.asarray(restored, np.float32), np.asarray(leaf, np.float32))


def test_partial_restore_of_one_role(tmp_path):
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, _arrays(3.0), {})
    ckpt.wait()
    arrays, _ = ckpt.restore(1, {"actor": _abstract(_arrays()["actor"])})
  assert set(arrays) == {"actor"}
  np.testing.assert_array_equal(arrays["actor"]["b"], np.full((3,), 3.0))


def test_nnx_state_round_trip(tmp_path):
  model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, {"actor": state})
    ckpt.wait()
    abstract = nnx.state(nnx.eval_shape(lambda: nnx.Linear(3, 2, rngs=nnx.Rngs(1))), nnx.Param)
    arrays, _ = ckpt.restore(1, {"actor": abstract})
  fresh = nnx.Linear(3, 2, rngs=nnx.Rngs(1))
  nnx.update(fresh, arrays["actor"])
  np.testing.assert_array_equal(fresh.kernel[...], model.kernel[...])


def test_sharded_save_restores_sharded(tmp_path):
  mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = NamedSharding(mesh, PartitionSpec("fsdp", None))
  value = jax.device_put(jnp.arange(64.0).reshape(16, 4), sharding)
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(3, {"actor": {"w": value}})
    ckpt.wait()
    arrays, _ = ckpt.restore(3, {"actor": {"w": _abstract(value)}})
    restored = arrays["actor"]["w"]
    assert restored.sharding.is_equivalent_to(sharding, 2)
    assert len(restored.addressable_shards) == 8
    assert restored.addressable_shards[1].data.shape == (2, 4)
    np.testing.assert_array_equal(restored, value)
    replicated = NamedSharding(mesh, PartitionSpec())
    target = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=replicated)
    arrays, _ = ckpt.restore(3, {"actor": {"w": target}})
    assert arrays["actor"]["w"].sharding.is_equivalent_to(replicated, 2)
    np.testing.assert_array_equal(arrays["actor"]["w"], value)


def test_back_to_back_async_saves_and_keep_limit(tmp_path):
  with Checkpointer(str(tmp_path), max_to_keep=2, async_save=True) as ckpt:
    for step in (1, 2, 3):
      ckpt.save(step, _arrays(float(step)), {"step": step})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    arrays, extras = ckpt.restore(3, _abstract(_arrays()))
  assert extras == {"step": 3}
  np.testing.assert_array_equal(arrays["actor"]["b"], np.full((3,), 3.0))


def test_keep_limit_is_max_of_roles_and_none_keeps_all():
  trainer = config_lib.get_base_config().trainer
  assert checkpointing.keep_limit(trainer) is None
  trainer.max_actor_ckpt_to_keep, trainer.max_critic_ckpt_to_keep = 1, 3
  assert checkpointing.keep_limit(trainer) == 3
  trainer.max_critic_ckpt_to_keep = None
  assert checkpointing.keep_limit(trainer) is None
  trainer.max_critic_ckpt_to_keep = 0
  with pytest.raises(ValueError, match="trainer.max_critic_ckpt_to_keep"):
    checkpointing.keep_limit(trainer)


def test_from_config_writes_resolved_yaml(tmp_path):
  config = _trainer_config(tmp_path, max_actor_ckpt_to_keep=1, max_critic_ckpt_to_keep=1)
  config.actor_rollout_ref.model.path = "/models/base"
  with Checkpointer.from_config(config) as ckpt:
    for step in (1, 2):
      ckpt.save(step, _arrays(), {})
    ckpt.wait()
    assert ckpt.all_steps() == [2]
  with open(tmp_path / "ckpt" / "config.yaml") as f:
    loaded = config_lib.from_yaml(f.read())
  assert loaded.actor_rollout_ref.model.path == "/models/base"
  assert loaded.trainer.default_local_dir == str(tmp_path / "ckpt")


def test_non_json_extras_name_the_key(tmp_path):
  with Checkpointer(str(tmp_path)) as ckpt:
    with pytest.raises(TypeError, match="extras\\['rng'\\]"):
      ckpt.save(1, _arrays(), {"rng": jax.random.key_data(jax.random.key(0))})
    assert ckpt.all_steps() == []


def _break_steps(directory):
  """global_step_3: a copy of step 1 without its commit marker; step 4: a tmp dir."""
  good = checkpointing.step_dir(str(directory), 1)
  shutil.copytree(good, checkpointing.step_dir(str(directory), 3))
  os.remove(os.path.join(checkpointing.step_dir(str(directory), 3), checkpointing.COMMIT_MARKER))
  shutil.copytree(good, os.path.join(str(directory), "global_step_4.orbax-checkpoint-tmp-1234"))


def test_truncated_steps_are_never_returned(tmp_path):
  with Checkpointer(str(tmp_path)) as ckpt:
    ckpt.save(1, _arrays(), {"step": 1})
    ckpt.wait()
  _break_steps(tmp_path)
  broken = checkpointing.step_dir(str(tmp_path), 3)
  with Checkpointer(str(tmp_path), read_only=True) as reader:
    assert reader.latest_step() == 1
    assert reader.all_steps() == [1]
    with pytest.raises(FileNotFoundError, match="global_step_3 is not a complete checkpoint"):
      reader.restore(3, _abstract(_arrays()))
  assert os.path.isdir(broken)
  with Checkpointer(str(tmp_path)) as ckpt:
    assert not os.path.exists(broken)
    ckpt.save(2, _arrays(2.0), {"step": 2})
    ckpt.save(3, _arrays(3.0), {"step": 3})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2, 3]
    _, extras = ckpt.restore(3, _abstract(_arrays()))
    assert extras == {"step": 3}
    with pytest.raises(ValueError, match="cannot save step 2: .* already holds step 3"):
      ckpt.save(2, _arrays(), {})


_KILLED_SAVE = textwrap.dedent("""
    import sys, time
    import jax.numpy as jnp
    from orbax.checkpoint._src.path import atomicity
    from rljax.training.checkpointing import Checkpointer

    ckpt = Checkpointer(sys.argv[1], async_save=True)
    ckpt.save(1, {"actor": {"w": jnp.ones((8, 8))}}, {"step": 1})
    ckpt.wait()

    async def hang(self):
      print("IN_FLIGHT", flush=True)
      time.sleep(120)

    atomicity.AtomicRenameTemporaryPath.finalize = hang
    ckpt.save(2, {"actor": {"w": jnp.zeros((8, 8))}}, {"step": 2})
    ckpt.wait()
""")


def test_process_killed_mid_save_resumes_from_previous_step(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": processes.xla_flags()}
  proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(tmp_path)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    assert proc.stdout.readline().strip() == "IN_FLIGHT"
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.wait(timeout=30)
  assert any(".orbax-checkpoint-tmp" in name for name in os.listdir(tmp_path))
  trainer = _trainer_config(tmp_path).trainer
  trainer.default_local_dir = str(tmp_path)
  assert checkpointing.resolve_resume(trainer) == checkpointing.step_dir(str(tmp_path), 1)
  with Checkpointer(str(tmp_path)) as ckpt:
    assert ckpt.latest_step() == 1
    ckpt.save(2, {"actor": {"w": jnp.zeros((8, 8))}}, {"step": 2})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2]
  assert not any(".orbax-checkpoint-tmp" in name for name in os.listdir(tmp_path))


def test_resolve_resume_modes(tmp_path):
  config = _trainer_config(tmp_path)
  trainer = config.trainer
  assert checkpointing.resolve_resume(trainer) is None
  with Checkpointer(trainer.default_local_dir) as ckpt:
    ckpt.save(1, _arrays(), {})
    ckpt.save(2, _arrays(), {})
  assert checkpointing.resolve_resume(trainer) == checkpointing.step_dir(trainer.default_local_dir, 2)
  trainer.resume_mode = "disable"
  assert checkpointing.resolve_resume(trainer) is None
  trainer.resume_mode = "resume_path"
  trainer.resume_from_path = checkpointing.step_dir(trainer.default_local_dir, 1)
  path = checkpointing.resolve_resume(trainer)
  assert checkpointing.split_step_path(path) == (trainer.default_local_dir, 1)
  arrays, _ = checkpointing.restore_from_path(path, _abstract(_arrays()))
  np.testing.assert_array_equal(arrays["actor"]["b"], np.ones(3))


def test_resolve_resume_path_errors_name_key_and_path(tmp_path):
  trainer = _trainer_config(tmp_path, resume_mode="resume_path").trainer
  missing = str(tmp_path / "nope" / "global_step_9")
  trainer.resume_from_path = missing
  with pytest.raises(FileNotFoundError, match=f"trainer.resume_from_path={missing} does not exist"):
    checkpointing.resolve_resume(trainer)
  with Checkpointer(trainer.default_local_dir) as ckpt:
    ckpt.save(1, _arrays(), {})
  _break_steps(trainer.default_local_dir)
  trainer.resume_from_path = checkpointing.step_dir(trainer.default_local_dir, 3)
  with pytest.raises(ValueError, match="trainer.resume_from_path=.*global_step_3 is not a complete"):
    checkpointing.resolve_resume(trainer)
  trainer.resume_from_path = None
  with pytest.raises(ValueError, match="trainer.resume_from_path"):
    checkpointing.resolve_resume(trainer)
