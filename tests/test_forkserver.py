"""The tests' fork server (`tests/forkserver.py`) starts a process as `python` would: its argv, environment,
working directory, output, exit status and signals; and starts plainly what it cannot start."""

import signal
import subprocess
import textwrap

import pytest

from tests import forkserver, processes

SHOW = textwrap.dedent("""
    import os, sys
    print(sys.argv, os.getcwd(), os.environ["XLA_FLAGS"].split()[-1], os.environ["ONE_OF_ITS_OWN"], flush=True)
    print("to stderr", file=sys.stderr)
    import jax
    print(jax.device_count())
    sys.exit(int(sys.argv[1]))
""")


def test_a_forked_process_gets_its_argv_environment_directory_devices_and_exit_status(tmp_path):
  done = processes.run(["-c", SHOW, "3"], devices=2, cwd=str(tmp_path), ONE_OF_ITS_OWN="yes")
  assert done.returncode == 3, done.stderr
  assert done.stdout.splitlines() == [f"['-c', '3'] {tmp_path} --xla_force_host_platform_device_count=2 yes", "2"]
  assert done.stderr == "to stderr\n"


def test_a_module_runs_as_main_and_an_uncaught_error_exits_1_with_its_traceback(tmp_path):
  (tmp_path / "script.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nraise ValueError('bad row 7')\n")
  done = processes.run([str(tmp_path / "script.py"), "a"], cwd=str(tmp_path))
  assert done.returncode == 1 and done.stdout == "__main__ ['a']\n"
  assert "Traceback" in done.stderr and done.stderr.strip().endswith("ValueError: bad row 7")
  usage = processes.run(["-m", "rljax.export", "--help"])
  assert usage.returncode == 0 and "--checkpoint" in usage.stdout


def test_a_killed_process_reports_the_signal_and_a_slow_one_times_out(monkeypatch):
  # what an earlier test left in this process's environment (libtpu's import sets TPU_ML_PLATFORM) is not the
  # process's: it is forked all the same (before, every later process of that pytest worker started plainly)
  monkeypatch.setenv("TPU_ML_PLATFORM", "JAX")
  code = "import os, time; print(os.environ.get('TPU_ML_PLATFORM'), flush=True); time.sleep(600)"
  proc = processes.start(["-c", code], 1, devices=1)[0]
  assert isinstance(proc, forkserver.Started)
  try:
    proc.wait(timeout=0.5)
    raise AssertionError("the sleeping process ended")
  except subprocess.TimeoutExpired:
    pass
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=30) == -signal.SIGKILL and processes.finish([proc]) == ["None\n"]


def test_what_the_server_cannot_start_starts_plainly():
  env = processes.child_environment(1, JAX_ENABLE_X64="1")  # JAX reads it as it is imported
  proc = forkserver.start(["-c", "import jax; print(jax.config.jax_enable_x64)"], env, processes.ROOT,
                          own=("JAX_ENABLE_X64",))
  assert isinstance(proc, subprocess.Popen) and proc.communicate(timeout=120)[0] == "True\n"
  with pytest.warns(UserWarning, match=r"started plainly, not forked: .* in \['UNNAMED'\]"):
    proc = forkserver.start(["-c", "pass"], {**processes.child_environment(1), "UNNAMED": "1"}, processes.ROOT)
  assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=60) == 0
  assert not forkserver.runnable(["-X", "importtime", "-m", "rljax.train"]) and forkserver.runnable(["script.py", "a"])
