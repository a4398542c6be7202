"""A job of several processes (`jax.distributed` over gloo) whose run fails in one process ends in every process
within seconds, each printing the failed one's error (`rljax.sharding.failures`)."""

import socket
import time

import pytest

from tests import processes

# each process builds a job and runs it: process FAILING's run raises (a ConfigError or a RuntimeError), after
# which its close takes CLOSE_S; the other waits in a collective the failed one never joins. The grace before a
# stuck process exits, and process 0's wait for another to know of the failure, are cut to 2 s and 5 s
WORKER = """
import os
import time

import jax
from jax.experimental import multihost_utils

from rljax import sharding
from rljax.config.errors import ConfigError
from rljax.sharding import failures

failures._GRACE_S, failures._LEAVING_S = 2, 5


class Job:

  def close(self):
    time.sleep(float(os.environ["CLOSE_S"]) if jax.process_index() == int(os.environ["FAILING"]) else 0)
    print(f"process {jax.process_index()} closed", flush=True)


def body(job):
  if jax.process_index() == int(os.environ["FAILING"]):
    if os.environ["ERROR"] == "config":
      raise ConfigError("trainer.total_epochs", 0, "is not positive", "set it to 1 or more")
    raise RuntimeError("the run failed here")
  multihost_utils.sync_global_devices("the failed process never comes")
  return "done"


sharding.initialize()
print(failures.run_together(Job, body, Job.close))
"""


@pytest.mark.slow
@pytest.mark.parametrize("failing,error,close_s", [(0, "runtime", 0), (1, "config", 10)])
def test_a_failed_process_ends_every_process_within_seconds_naming_its_error(tmp_path, failing, error, close_s):
  # (1, config, 10): the failed process closes for longer than process 0, which holds the coordination service,
  # waits for another to know of the failure, and its grace after the news; process 0 still leaves last (before,
  # the failed process aborted, exit -6, when the service went with process 0)
  script = tmp_path / "worker.py"
  script.write_text(WORKER)
  started = time.monotonic()
  procs = processes.start([str(script)], 2, devices=2, FAILING=str(failing), ERROR=error, CLOSE_S=str(close_s))
  logs = processes.finish(procs, timeout=120)
  other = 1 - failing
  status = 2 if error == "config" else 1
  assert [procs[failing].returncode, procs[other].returncode] == [status, 1], logs
  assert time.monotonic() - started < 60
  told = ("config error: trainer.total_epochs=0: is not positive. Fix: set it to 1 or more" if error == "config" else
          "RuntimeError: the run failed here")
  assert told in logs[failing] and f"process {failing} closed" in logs[failing]
  assert "another process of this job failed" in logs[other] and told.split(": ", 1)[1] in logs[other]
  assert f"process {other} closed" not in logs[other] and "done" not in logs[other]  # it stopped in the collective


# each process joins the job (its watchdog looking at the service every millisecond, not every second, so that a
# look is under way whenever the process exits) and ends normally
ENDING = """
from rljax import sharding
from rljax.sharding import failures

failures.WAIT_MS = 1
sharding.initialize()
print("ended", flush=True)
"""


def test_processes_of_a_job_that_ends_well_exit_cleanly_while_their_watchdogs_look_at_the_service(tmp_path):
  # before the watching stopped at exit (JAX's shutdown barrier, then the watchdog joined), a process whose
  # watchdog was inside a call to the service's client as the interpreter finalized aborted ("terminate called after
  # throwing an instance of ''", exit -6): 14 of 20 such processes here did, and a CI run failed on one
  script = tmp_path / "ending.py"
  script.write_text(ENDING)
  procs = processes.start([str(script)], 4, devices=4)
  logs = processes.finish(procs, timeout=120)
  assert [p.returncode for p in procs] == [0] * 4, logs
  assert all("ended" in log for log in logs)


def test_a_jobs_coordinator_port_is_reserved_for_it_alone():
  # the test that a job's processes exit cleanly runs its coordinator on such a port; before, the port was chosen,
  # released, and bound by the coordinator later, and another suite's server took it once ("bind: Address already
  # in use")
  reservation = processes.reserved_port()
  with reservation, socket.socket() as other:
    with pytest.raises(OSError, match="Address already in use"):
      other.bind(("127.0.0.1", reservation.getsockname()[1]))


def test_each_process_serves_transfers_on_a_port_reserved_for_it():
  # separate_async's cross-host copies: each process's transfer server binds the port its launch reserved (before,
  # the coordinator's port + 1 + process id, which anything could hold)
  procs = processes.start(["-c", "import os; print(os.environ['RLJAX_TRANSFER_ADDRESS'])"], 2, devices=2)
  try:
    ports = [int(p.port_reservations[-1].getsockname()[1]) for p in procs]
    with socket.socket() as other:
      with pytest.raises(OSError, match="Address already in use"):
        other.bind(("127.0.0.1", ports[1]))
  finally:
    logs = processes.finish(procs, timeout=60)
  assert [log.strip() for log in logs] == [f"127.0.0.1:{port}" for port in ports] and len(set(ports)) == 2


def test_a_job_past_its_time_is_killed_and_its_processes_outputs_shown():
  # a hung (or slow) job's processes: the wait fails at its time with where each one was, and none outlives it
  procs = processes.start(["-c", "import os, time; print('process', os.environ['JAX_PROCESS_ID'], 'waiting', "
                           "flush=True); time.sleep(600)"], 2, devices=2)
  start = time.monotonic()
  with pytest.raises(AssertionError, match=r"(?s)processes \[0, 1\] still ran 3 s.*process 0 \(killed\).*"
                                           r"process 0 waiting.*process 1 \(killed\).*process 1 waiting"):
    processes.finish(procs, timeout=3)
  assert time.monotonic() - start < 10 and all(p.poll() is not None for p in procs)
