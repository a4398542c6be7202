"""A fork server for the Python processes tests start: one process per pytest process that has imported what an
rljax job imports (JAX, Flax, orbax, grain, the rljax packages; no JAX backend started), and forks a child for each
`python -m MODULE ...`, `python -c CODE ...` or `python SCRIPT ...` a test runs. The child sets the test's
environment, working directory, argv and output pipes, then runs the module, code or script as `python` would, as
`__main__`, and exits as the interpreter does (atexit handlers, exit status, a traceback on an uncaught error).

Each child is a process of its own with its own JAX backend, started from the environment the test asked for: its
devices (`XLA_FLAGS`), its rank in a `jax.distributed` job, its ports. What it skips is importing those packages
again: 2.2 s of each process's 2-10 s, for about 100 processes in a run (the multi-process tests took 268 s on 2
workers with the server, 324 s without, on a 2-core Intel Xeon). The server imported them under the test session's
environment (`base_environment`); a request whose environment differs from it in anything but `PER_PROCESS`
variables (read only when a job starts its backend or its distributed runtime) and the caller's own (`own`, none of
JAX's or XLA's) is not one the server can start: `start` then runs a plain `subprocess.Popen`, as it does with
`RLJAX_TESTS_NO_FORKSERVER` set.

Only tests use this: rljax starts its processes itself nowhere (a pod's hosts each run `python -m rljax.train`).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import warnings

# the environment variables a request may set to its own values: each is read when a job starts its JAX backend
# (XLA_FLAGS: the CPU device count and compile flags) or its distributed runtime, never while a module is imported;
# pytest names the running test in PYTEST_CURRENT_TEST
PER_PROCESS = ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               "RLJAX_TRANSFER_ADDRESS", "RLJAX_HEARTBEAT_TIMEOUT_S", "PYTEST_CURRENT_TEST")

# what the server imports before it forks: every package an rljax job, SFT run, generation, evaluation or export
# imports (the entry modules' own code runs again in each child, as `__main__`)
PRELOADED = ("rljax.train", "rljax.rl", "rljax.sft.trainer", "rljax.generate", "rljax.eval", "rljax.export",
             "orbax.checkpoint", "grain", "pyarrow.parquet", "safetensors.numpy", "tensorstore")

_MAX_REQUEST = 1 << 20


def runnable(argv: list[str]) -> bool:
  """Whether `python argv...` is a form the server runs: `-m MODULE`, `-c CODE` or a script path first."""
  return bool(argv) and (argv[0] in ("-m", "-c") and len(argv) > 1 or not argv[0].startswith("-"))


def _without(env: dict[str, str], keys) -> dict[str, str]:
  return {k: v for k, v in env.items() if k not in keys}


class Started:
  """A process the server forked, as much of `subprocess.Popen`'s interface as tests use: `pid`, `returncode`,
  `poll`, `wait`, `communicate`, `send_signal`, `kill`, `terminate`. Its output is read as text; with
  `merged` (Popen's `stderr=STDOUT`) stderr goes to the stdout pipe."""

  def __init__(self, pid: int, args: list[str], status_fd: int, out_fd: int, err_fd: int | None):
    self.pid, self.args, self.returncode = pid, args, None
    self._status_fd, self._fds = status_fd, {out_fd: bytearray(), **({err_fd: bytearray()} if err_fd else {})}
    self._out_fd, self._err_fd, self._open = out_fd, err_fd, {out_fd, *([err_fd] if err_fd else [])}
    self._status = bytearray()
    for fd in (status_fd, *self._open):
      os.set_blocking(fd, False)

  def _pump(self, timeout: float | None, until_output_ends: bool) -> bool:
    """Reads what is ready until the exit status (and with `until_output_ends`, the end of every output pipe) has
    come, or `timeout` seconds pass; whether it came."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
      for fd in ([self._status_fd] if self._status_fd is not None else []) + sorted(self._open):
        selector.register(fd, selectors.EVENT_READ)
      while self.returncode is None or until_output_ends and self._open:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          return False
        for key, _ in selector.select(left):
          chunk = os.read(key.fd, 1 << 16)
          if key.fd == self._status_fd:
            self._status += chunk
            if not chunk:
              selector.unregister(key.fd)
              os.close(key.fd)
              self._status_fd = None
              self.returncode = int(self._status.decode() or -signal.SIGKILL)
          elif chunk:
            self._fds[key.fd] += chunk
          else:
            selector.unregister(key.fd)
            os.close(key.fd)
            self._open.discard(key.fd)
      return True

  def poll(self) -> int | None:
    self._pump(0, until_output_ends=False)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    if not self._pump(timeout, until_output_ends=False):
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
    """(stdout, stderr or None) once the process has ended and closed its pipes; as Popen's, a call after
    `TimeoutExpired` returns everything from the start."""
    if not self._pump(timeout, until_output_ends=True):
      raise subprocess.TimeoutExpired(self.args, timeout)
    text = {fd: bytes(data).decode(errors="replace") for fd, data in self._fds.items()}
    return text[self._out_fd], text.get(self._err_fd) if self._err_fd else None

  def send_signal(self, sig: int) -> None:
    if self.returncode is None:
      try:
        os.kill(self.pid, sig)
      except ProcessLookupError:
        pass

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)


class Client:
  """This pytest process's connection to its fork server (started by the first `start`)."""

  def __init__(self, base: dict[str, str]):
    self.base = base
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.server = subprocess.Popen([sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
                                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=base,
                                   pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
    theirs.close()
    self.sock = ours
    atexit.register(self.close)

  def unexpected(self, env: dict[str, str], own: tuple[str, ...]) -> list[str]:
    """The variables `env` has apart from the server's environment that neither `PER_PROCESS` nor `own` names."""
    ignored = (*PER_PROCESS, *own)
    env, base = _without(env, ignored), _without(self.base, ignored)
    return sorted(k for k in env.keys() | base.keys() if env.get(k) != base.get(k))

  def serves(self, env: dict[str, str], own: tuple[str, ...]) -> bool:
    """Whether `env` is the server's environment but for `PER_PROCESS` and `own` (the caller's own variables,
    which no module the server imported reads: none of JAX's, XLA's or Python's own)."""
    if any(k.startswith(("JAX_", "XLA_", "TF_", "PYTHON")) for k in own if k not in PER_PROCESS):
      return False
    return self.server.poll() is None and not self.unexpected(env, own)

  def start(self, argv: list[str], env: dict[str, str], cwd: str, merged: bool) -> Started:
    status_r, status_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = (None, None) if merged else os.pipe()
    request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
    try:
      socket.send_fds(self.sock, [request], [status_w, out_w, *([err_w] if err_w is not None else [])])
      reply = self.sock.recv(64)
      if not reply:  # the server ended (an import failed: its traceback is in this session's output)
        raise RuntimeError(f"the tests' fork server exited with status {self.server.wait()} before starting "
                           f"{argv}; set RLJAX_TESTS_NO_FORKSERVER=1 to start processes plainly")
      pid = int(reply.decode())
    finally:
      for fd in (status_w, out_w, err_w):
        if fd is not None:
          os.close(fd)
    return Started(pid, [sys.executable, *argv], status_r, out_r, err_r)

  def close(self) -> None:
    self.sock.close()
    try:
      self.server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.server.kill()
      self.server.wait()


_CLIENT: Client | None = None


def base_environment() -> dict[str, str]:
  """The environment the session's processes start from: the session's, as `tests/processes.py` hands it on."""
  from tests import processes  # pylint: disable=import-outside-toplevel
  return processes.child_environment()


def start(argv: list, env: dict[str, str], cwd, merged: bool = True,
          own: tuple[str, ...] = ()) -> Started | subprocess.Popen:
  """`python argv...` in `cwd` with environment `env` (`own`: the names of the variables this call sets for
  itself), its stdout (and stderr, unless `merged` puts it there too) a text pipe: forked by this session's server
  when it can start it (`runnable`, `Client.serves`), else a plain `subprocess.Popen`."""
  global _CLIENT  # pylint: disable=global-statement
  argv, cwd = [os.fspath(a) for a in argv], os.fspath(cwd)
  if runnable(argv) and os.environ.get("RLJAX_TESTS_NO_FORKSERVER") is None:
    if _CLIENT is None:
      _CLIENT = Client(base_environment())
    if _CLIENT.serves(env, own):
      return _CLIENT.start(argv, env, cwd, merged)
    if _CLIENT.server.poll() is not None:
      warnings.warn(f"{argv[:2]} started plainly, not forked: the fork server exited with status "
                    f"{_CLIENT.server.returncode}", stacklevel=2)
    elif unexpected := _CLIENT.unexpected(env, own):  # a test's own variable not named as one
      warnings.warn(f"{argv[:2]} started plainly, not forked: its environment differs from the session's in "
                    f"{unexpected}; pass a test's own variables to tests.processes as keywords", stacklevel=2)
  return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True)


# ---- the server side -------------------------------------------------------------------------------------------


def _serve(sock: socket.socket) -> dict | None:
  """Forks a child per request until the client closes the connection (then kills what still runs and returns
  None); in a child, returns its request. Reaps the children, writing each one's exit status (Popen's returncode:
  minus the signal that killed it) to its status pipe."""
  children: dict[int, int] = {}  # pid -> status pipe
  wakeup_r, wakeup_w = os.pipe()
  os.set_blocking(wakeup_w, False)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  signal.set_wakeup_fd(wakeup_w)
  selector = selectors.DefaultSelector()
  selector.register(sock, selectors.EVENT_READ)
  selector.register(wakeup_r, selectors.EVENT_READ)

  def reap():
    while children:
      pid, status = os.waitpid(-1, os.WNOHANG)
      if pid == 0:
        return
      fd = children.pop(pid, None)
      if fd is not None:
        os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
        os.close(fd)

  while True:
    for key, _ in selector.select():
      if key.fileobj is sock:
        message, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3)
        if not message:
          for pid in children:
            os.kill(pid, signal.SIGKILL)
          return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
          signal.set_wakeup_fd(-1)
          signal.signal(signal.SIGCHLD, signal.SIG_DFL)
          selector.close()
          for fd in (wakeup_r, wakeup_w, *children.values()):
            os.close(fd)
          sock.close()
          request = json.loads(message)
          request["fds"] = fds
          return request
        children[pid] = fds[0]
        for fd in fds[1:]:
          os.close(fd)
        sock.send(str(pid).encode())
      else:
        os.read(wakeup_r, 4096)
      reap()


def _become(request: dict) -> None:
  """In a forked child: the request's output pipes, environment, working directory and argv, then its module, code
  or script run as `__main__`."""
  import runpy  # pylint: disable=import-outside-toplevel
  status, out, *err = request["fds"]
  os.close(status)
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  os.dup2(out, 1)
  os.dup2(err[0] if err else out, 2)
  for fd in (devnull, out, *err):
    os.close(fd)
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  argv = request["argv"]
  if argv[0] == "-m":
    sys.argv = [argv[1], *argv[2:]]
    sys.path[0] = os.getcwd()
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
  elif argv[0] == "-c":
    sys.argv = ["-c", *argv[2:]]
    sys.path[0] = ""
    code = compile(argv[1], "<string>", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # pylint: disable=exec-used
  else:
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


def _main(fd: int) -> None:
  import importlib  # pylint: disable=import-outside-toplevel
  sock = socket.socket(fileno=fd)
  for name in PRELOADED:
    importlib.import_module(name)
  request = _serve(sock)
  if request is not None:
    _become(request)


if __name__ == "__main__":
  _main(int(sys.argv[1]))
