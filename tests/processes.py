"""Running an rljax command line as a multi-process job on this machine's CPU (`jax.distributed` over gloo,
each process with its own virtual devices), as every host of a pod runs it."""

import json
import os
import socket
import subprocess
import sys
import time

from tests import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# on every started process's PYTHONPATH: its sitecustomize lets each process write the compilation cache
CHILD_SITE = os.path.join(ROOT, "tests", "child_site")


def reserved_port() -> socket.socket:
  """A socket holding a port the OS handed out, for a job's coordinator or a process's cross-host transfer server:
  bound with SO_REUSEPORT and left open until the job ends, so that JAX's coordination service (gRPC) and XLA's
  transfer server (both bind with SO_REUSEPORT) bind it, while nothing else (another suite's server, another job)
  can take it between choosing and binding."""
  reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
  reservation.bind(("127.0.0.1", 0))
  return reservation


# what `rljax.compile.topology.devices` sets in this process to compile for a TPU slice: a child process is no TPU VM
COMPILER_ENV = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "ALLOW_MULTIPLE_LIBTPU_LOAD")


def xla_flags(devices: int = 1) -> str:
  """This test session's XLA flags (conftest's, such as its optimization level) with `devices` CPU devices."""
  kept = [f for f in SESSION_ENVIRONMENT.get("XLA_FLAGS", "").split()
          if not f.startswith("--xla_force_host_platform_device_count")]
  return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


# this session's environment as conftest set it, before any test: what every process a test starts begins from, and
# the fork server's (`tests.forkserver`). Not this process's environment when the process starts: what tests ran here
# before leaves variables in it (a TPU compile, through libtpu's import, sets GRPC_VERBOSITY, TPU_ML_PLATFORM,
# LIBTPU_INIT_ARGS and more), and a process would then start differently, and plainly, after them.
SESSION_ENVIRONMENT = dict(os.environ)


def child_environment(devices: int | None = None, base=None, **env_vars: str) -> dict[str, str]:
  """The environment of a process a test starts: `base`'s (the session's, `SESSION_ENVIRONMENT`, if None; a TPU
  compile's settings aside) on the CPU, writing the session's compilation cache (`CHILD_SITE`), with `devices` CPU
  devices (`base`'s count if None) and `env_vars` (a test's own variables: passed here, never set in this process's
  environment for its processes to inherit)."""
  base = SESSION_ENVIRONMENT if base is None else base
  env = dict({k: v for k, v in base.items() if k not in COMPILER_ENV}, JAX_PLATFORMS="cpu", **env_vars)
  if devices is not None:
    env["XLA_FLAGS"] = xla_flags(devices)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_SITE, env.get("PYTHONPATH")) if p)
  return env


def start(argv: list[str], processes: int, devices: int = 8, **env_vars: str) -> list:
  """`python argv...` as `processes` processes sharing `devices` CPU devices (one process: no coordinator), with
  `env_vars` set in each, each writing the programs it compiles to the session's compilation cache (`CHILD_SITE`),
  each forked by the session's fork server (`tests.forkserver`: Popen's interface, output merged into stdout).
  The coordinator's port and each process's transfer port (`RLJAX_TRANSFER_ADDRESS`, which a separate_async job's
  cross-host copies serve on) stay reserved (`reserved_port`) until `finish`."""
  coordinator, procs = reserved_port() if processes > 1 else None, []
  for rank in range(processes):
    env = child_environment(devices // processes, **env_vars)
    reservations = []
    if coordinator is not None:
      reservations = [coordinator, reserved_port()]
      env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{coordinator.getsockname()[1]}",
                 JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(rank),
                 RLJAX_TRANSFER_ADDRESS=f"127.0.0.1:{reservations[-1].getsockname()[1]}")
    procs.append(forkserver.start(argv, env, ROOT, own=tuple(env_vars)))
    procs[-1].port_reservations = reservations
  return procs


def finish(procs: list, timeout: float = 400) -> list[str]:
  """Each process's output. Whatever still runs `timeout` seconds after the call (all processes together) is
  killed, and the call fails with the end of every process's output: a slow job and a hung one show where each
  process was."""
  deadline, outputs = time.monotonic() + timeout, []
  try:
    for p in procs:
      try:
        outputs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1.0))[0])
      except subprocess.TimeoutExpired:
        running = [i for i, q in enumerate(procs) if q.poll() is None]
        for q in procs:
          if q.poll() is None:
            q.kill()
        outputs += [q.communicate()[0] or "" for q in procs[len(outputs):]]
        tails = "\n".join(f"--- process {i} ({'killed' if i in running else f'exit {q.returncode}'}), its last "
                          f"output:\n{out[-3000:]}" for i, (q, out) in enumerate(zip(procs, outputs)))
        raise AssertionError(f"processes {running} still ran {timeout:.0f} s after the job was awaited; killed "
                             f"them\n{tails}") from None
    return outputs
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
      for reservation in p.port_reservations:
        reservation.close()


def run(argv: list[str], devices: int | None = None, cwd: str = ROOT, timeout: float = 120, drop: tuple[str, ...] = (),
        merged: bool = False, **env_vars: str) -> subprocess.CompletedProcess:
  """`python argv...` run to its end as `subprocess.run(..., capture_output=True, text=True)` runs it (with
  `merged`, its stderr in its stdout), in `child_environment(devices, **env_vars)` without the variables `drop`
  names, forked by the session's fork server: a command line's output and exit status. Killed after `timeout`
  seconds (`subprocess.TimeoutExpired`)."""
  env = child_environment(devices, **env_vars)
  for name in drop:
    env.pop(name, None)
  proc = forkserver.start(argv, env, cwd, merged=merged, own=tuple(env_vars))
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    raise
  return subprocess.CompletedProcess([sys.executable, *argv], proc.returncode, out, err)


def run_metrics(argv: list[str], processes: int, run_dir: str, devices: int = 8) -> list[dict]:
  """The metrics.jsonl records of `argv` (writing to run_dir) run as `processes` processes sharing `devices` CPU
  devices; all must succeed."""
  procs = start(argv, processes, devices)
  logs = finish(procs)
  assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
  return [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]


def assert_same_metrics(one: list[dict], many: list[dict], atol: float = 1e-7) -> None:
  """Equal steps and metric names, values within 1e-5 relative or `atol` (timings, throughputs, each host's decode-slot
  occupancy and its packed passes' buffer use aside: hosts pack their own rows, a padded run packs none)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  timing = ("timing_s/", "perf/time", "perf/throughput", "perf/mfu", "perf/slot_occupancy", "perf/packed_compute_ratio")
  assert [m["step"] for m in one] == [m["step"] for m in many]
  for a, b in zip(one, many):
    names = sorted(k for k in a if not k.startswith(timing))
    assert names == sorted(k for k in b if not k.startswith(timing))
    np.testing.assert_allclose([b[k] for k in names], [a[k] for k in names], rtol=1e-5, atol=atol,
                               err_msg=str(names))
