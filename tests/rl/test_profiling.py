"""verl's profiler keys record jax.profiler traces of the listed steps."""

import os

import pytest

from rljax import rl
from rljax.rl import profiling
from tests.rl import tiny_run


@pytest.mark.slow
def test_listed_steps_are_traced_when_a_role_enables_profiling(model_dir, data_dir, tmp_path):
  traces = tmp_path / "profile"
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), "global_profiler.steps=[2]",
                               f"global_profiler.save_path={traces}", "actor_rollout_ref.actor.profiler.enable=true",
                               "trainer.save_freq=-1")
  assert profiling.traced_steps(config) == {2}
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    trainer.fit()
  finally:
    trainer.close()
  written = [name for _, _, names in os.walk(traces / "step_2") for name in names]
  assert any(name.endswith(".xplane.pb") for name in written), written
  assert any(name.endswith(".trace.json.gz") for name in written), written
  assert not (traces / "step_1").exists()
  off = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "off"), "global_profiler.steps=[2]")
  assert profiling.traced_steps(off) == frozenset()  # verl profiles only roles whose profiler.enable is true
