"""check_finite and PreemptionGuard."""

import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.training.loop import NonFiniteError, PreemptionGuard, check_finite


def test_check_finite_passes_finite_and_non_numeric():
  check_finite({"a": 1.0, "b": np.float32(2.0), "c": jnp.asarray(3.0), "d": 4, "note": "x"}, step=1)


def test_check_finite_names_step_and_every_bad_metric():
  metrics = {"actor/pg_loss": jnp.asarray(jnp.nan), "critic/vf_loss": np.float32(np.inf),
             "actor/entropy": 0.5, "actor/ppo_kl": -float("inf")}
  with pytest.raises(NonFiniteError, match=r"step 7: .*actor/pg_loss, actor/ppo_kl, critic/vf_loss") as e:
    check_finite(metrics, step=7)
  assert e.value.step == 7
  assert e.value.names == ["actor/pg_loss", "actor/ppo_kl", "critic/vf_loss"]
  assert "actor/entropy" not in str(e.value)


def test_preemption_guard_sets_flag_and_restores_handler():
  calls = []
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
  try:
    with PreemptionGuard() as guard:
      assert not guard.should_stop
      os.kill(os.getpid(), signal.SIGTERM)
      assert guard.should_stop
    assert calls == []
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == [signal.SIGTERM]
  finally:
    signal.signal(signal.SIGTERM, previous)
