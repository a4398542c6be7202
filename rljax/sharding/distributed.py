"""Multi-host start-up with JAX's own distributed runtime.

One JAX process per host; `initialize()` connects them before any array is
made. On Cloud TPU VMs and pods JAX finds the topology itself. Elsewhere
(GPU or CPU clusters, or several processes on one machine for tests) the
coordinator comes from the environment:

* `JAX_COORDINATOR_ADDRESS` (host:port of process 0),
* `JAX_NUM_PROCESSES`, defaulting to `trainer.nnodes` when that is a number
  (not under separate_async, where it counts the trainer's nodes alone),
* `JAX_PROCESS_ID`.

CPU processes exchange collectives over gloo. Under separate_async the
trainer's process sends weights to the rollout's process device to device
(`jax.device_put` between their devices); where the backend has no transfer
of its own, over sockets: each process serves them at
`RLJAX_TRANSFER_ADDRESS` (host:port), by default its host at the
coordinator's port + 1 + its process id (on a TPU pod, where JAX finds the
coordinator itself, only where that variable is set). Once connected, each
process watches for another's failure, which ends it within seconds
(`rljax.sharding.failures`); a process that sends no heartbeat for
`RLJAX_HEARTBEAT_TIMEOUT_S` seconds (60 by default) is lost, and JAX's
coordination service stops the others.
"""

from __future__ import annotations

import os
import socket

import jax
from ml_collections import ConfigDict

from rljax.config.errors import ConfigError
from rljax.sharding import failures

# A process that sends no heartbeat for this long (seconds; `RLJAX_HEARTBEAT_TIMEOUT_S` overrides it) is lost:
# JAX's coordination service then stops every other process with an error naming it (a killed host stops the job
# instead of leaving the others waiting in a collective).
HEARTBEAT_TIMEOUT_S = 60

# A cross-host weight transfer (separate_async) waits this long for the other side at most; a lost process stops
# the job sooner, through the heartbeats.
TRANSFER_TIMEOUT_S = 3600

_ENV_ADDRESS = "JAX_COORDINATOR_ADDRESS"
_ENV_COUNT = "JAX_NUM_PROCESSES"
_ENV_ID = "JAX_PROCESS_ID"
_ENV_TRANSFER = "RLJAX_TRANSFER_ADDRESS"
_ENV_HEARTBEAT = "RLJAX_HEARTBEAT_TIMEOUT_S"


def _on_tpu_vm() -> bool:
  """A TPU VM's chips, or its worker list (not the warning JAX's TPU start-up writes there on other machines)."""
  workers = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return (os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")
          or bool(workers and not workers.startswith("WARNING")))


def _env_int(name: str, example: str = "0") -> int | None:
  """The integer environment variable `name`, or None where it is unset (`example`: a valid value, for the error)."""
  value = os.environ.get(name)
  if value is None:
    return None
  try:
    return int(value)
  except ValueError:
    raise ConfigError(name, value, "must be an integer", f"export {name}={example}") from None


def heartbeat_timeout_s() -> int:
  """Seconds without a heartbeat after which a process is lost: `RLJAX_HEARTBEAT_TIMEOUT_S`, else
  HEARTBEAT_TIMEOUT_S."""
  seconds = _env_int(_ENV_HEARTBEAT, str(HEARTBEAT_TIMEOUT_S))
  if seconds is None:
    return HEARTBEAT_TIMEOUT_S
  if seconds < 1:
    raise ConfigError(_ENV_HEARTBEAT, seconds, "must be a positive number of seconds",
                      f"export {_ENV_HEARTBEAT}={HEARTBEAT_TIMEOUT_S} (or unset it)")
  return seconds


def distributed_args(config: ConfigDict | None = None) -> dict | None:
  """`jax.distributed.initialize` keyword arguments from env and config.

  Returns:
    None for a single-process run, {} to let JAX detect a TPU pod, or the
    explicit coordinator/process arguments.
  """
  address = os.environ.get(_ENV_ADDRESS)
  count = _env_int(_ENV_COUNT)
  # under separate_async trainer.nnodes counts the trainer's nodes alone, not the job's processes
  if count is None and config is not None and isinstance(config.trainer.nnodes, int) and not _separate_async(config):
    count = config.trainer.nnodes
  if address is None:
    if _on_tpu_vm() and (count is None or count > 1):
      return {}
    if count not in (None, 1):
      raise ConfigError(
          "trainer.nnodes", count, f"a {count}-process run needs a coordinator",
          f"export {_ENV_ADDRESS}=HOST:PORT, {_ENV_ID}=RANK on every process (or run on a TPU VM)")
    return None
  process_id = _env_int(_ENV_ID)
  if count is None or process_id is None:
    raise ConfigError(
        _ENV_ADDRESS, address, f"needs {_ENV_COUNT} and {_ENV_ID} beside it",
        f"export {_ENV_COUNT}=N and {_ENV_ID}=RANK on every process")
  if not 0 <= process_id < count:
    raise ConfigError(_ENV_ID, process_id, f"must lie in [0, {count})", f"number processes 0..{count - 1}")
  return {"coordinator_address": address, "num_processes": count, "process_id": process_id}


def initialize(config: ConfigDict | None = None) -> bool:
  """Starts the distributed runtime when this is a multi-process job.

  Returns:
    True if `jax.distributed.initialize` was called.
  """
  args = distributed_args(config)
  if args is None:
    return False
  if args:
    # Only the CPU client reads this; it must be set before any backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if _separate_async(config):
    # the rollout takes its weights between two decode chunks: a send may wait that long for it
    jax.config.update("jax_cross_host_transfer_timeout_seconds", TRANSFER_TIMEOUT_S)
    if args or os.environ.get(_ENV_TRANSFER):
      jax.config.update("jax_cross_host_transfer_socket_address",
                        transfer_address(args.get("coordinator_address", ""), args.get("process_id", 0)))
  jax.distributed.initialize(**args, heartbeat_timeout_seconds=heartbeat_timeout_s())
  if failures.joined():  # another process's failure ends this one, wherever it is
    failures.watch()
  return True


def _separate_async(config: ConfigDict | None) -> bool:
  """Whether `config` is an RL job under trainer.v1.trainer_mode=separate_async (other jobs have no such key)."""
  v1 = config.get("trainer", {}).get("v1") if config is not None else None
  return v1 is not None and v1.get("trainer_mode") == "separate_async"


def transfer_address(coordinator: str, process_id: int) -> str:
  """host:port where this process serves cross-host array transfers: `RLJAX_TRANSFER_ADDRESS`, else this host (the
  loopback address when the coordinator is on it) at the coordinator's port + 1 + `process_id`."""
  if os.environ.get(_ENV_TRANSFER):
    return os.environ[_ENV_TRANSFER]
  host, _, port = coordinator.rpartition(":")
  try:
    port_number = int(port)
  except ValueError:
    raise ConfigError(_ENV_ADDRESS, coordinator, "must be HOST:PORT", f"export {_ENV_ADDRESS}=HOST:PORT") from None
  address = _address_towards(host.strip("[]"))
  return f"{f'[{address}]' if ':' in address else address}:{port_number + 1 + process_id}"


def _address_towards(host: str) -> str:
  """This machine's address on the route to `host` (the coordinator's): the loopback address when it is this
  machine, else the one the route leaves from (no packet is sent; `RLJAX_TRANSFER_ADDRESS` overrides it)."""
  if host in ("localhost", "::1") or host.startswith("127."):
    return "127.0.0.1"
  try:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
      probe.connect((host, 9))
      return probe.getsockname()[0]
  except OSError:  # no route from here: the name this machine gives itself
    return socket.gethostbyname(socket.gethostname())


def launch_index() -> int:
  """This process's `JAX_PROCESS_ID` in a multi-process launch (0 otherwise), without starting the runtime."""
  return _env_int(_ENV_ID) or 0


def is_main_process() -> bool:
  """Only process 0 writes logs and plots."""
  return jax.process_index() == 0
