"""The command-line tools keep JAX from starting libtpu on a host without a TPU, and only there."""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from rljax.utils import platforms

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def unset(monkeypatch):
  """JAX_PLATFORMS unset and JAX's jax_platforms None, as a user's shell leaves them (restored after)."""
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv("JAX_FORCE_TPU_INIT", raising=False)
  before = jax.config.jax_platforms
  jax.config.update("jax_platforms", None)  # the backends are up already: this changes no device of the tests
  monkeypatch.setattr(platforms, "_tpu_chips", lambda: 0)
  monkeypatch.setattr(platforms, "_other_plugins", lambda: False)
  yield monkeypatch
  jax.config.update("jax_platforms", before)


def test_a_host_without_a_tpu_or_other_plugin_runs_on_the_cpu(unset):
  assert platforms.skip_absent_tpu()
  assert os.environ["JAX_PLATFORMS"] == "cpu" and jax.config.jax_platforms == "cpu"


@pytest.mark.parametrize("case", ["tpu chip", "no pci test", "other plugin", "user's choice", "forced tpu"])
def test_a_tpu_or_a_choice_is_left_alone(unset, case):
  if case == "tpu chip":
    unset.setattr(platforms, "_tpu_chips", lambda: 4)
  elif case == "no pci test":
    unset.setattr(platforms, "_tpu_chips", lambda: None)
  elif case == "other plugin":
    unset.setattr(platforms, "_other_plugins", lambda: True)
  elif case == "user's choice":
    unset.setenv("JAX_PLATFORMS", "tpu,cpu")
  else:
    unset.setenv("JAX_FORCE_TPU_INIT", "1")
  assert not platforms.skip_absent_tpu()
  assert jax.config.jax_platforms is None
  assert os.environ.get("JAX_PLATFORMS", "") in ("", "tpu,cpu")


def test_a_cpu_run_prints_no_tpu_start_up_noise():
  """With libtpu installed (the dev extra) and JAX left to choose, libtpu used to print its accelerator-type errors."""
  if platforms._tpu_chips():  # pylint: disable=protected-access
    pytest.skip("this host has a TPU: JAX starts it, as it should")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
  done = subprocess.run([sys.executable, "-m", "rljax.train", f"--config={ROOT / 'configs' / 'grpo.py'}", "--dry_run"],
                        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "TPU" not in done.stderr, done.stderr[-2000:]
