"""Loaded by every process a test starts (`tests/processes.py` puts this folder on its PYTHONPATH): each process of
a multi-process job writes the programs it compiles to the session's persistent compilation cache.

JAX writes that cache from process 0 only (a shared bucket would see every host write each entry), and a process's
programs over its own devices have keys of their own (the device ids are in the key): processes 1..N-1 of every
job compiled all their programs again, and process 0 waited for them at the first collective of each pass. A
2-process GRPO job of two steps took 16.9 s with a warm cache, 11.8 s with each process writing its own entries.
The cache is this machine's folder: a reader that meets an entry still being written fails to decompress it, warns
and compiles. The job itself (its programs, collectives and numbers) is untouched.
"""

import importlib.abc
import importlib.util
import sys


def _every_process_writes(compiler) -> None:
  """Wraps `jax._src.compiler._cache_write` so that it writes as process 0 would, in any process."""
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  write = compiler._cache_write  # pylint: disable=protected-access

  def cache_write(*args, **kwargs):
    process_id = distributed.global_state.process_id
    distributed.global_state.process_id = 0
    try:
      return write(*args, **kwargs)
    finally:
      distributed.global_state.process_id = process_id

  compiler._cache_write = cache_write  # pylint: disable=protected-access


class _WhenJaxCompilerLoads(importlib.abc.MetaPathFinder):
  """Patches JAX's compiler module as it is imported: a process that never imports JAX does not pay for it."""

  def find_spec(self, name, path, target=None):  # pylint: disable=unused-argument
    if name != "jax._src.compiler":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    execute = spec.loader.exec_module

    def exec_module(module):
      execute(module)
      _every_process_writes(module)

    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _WhenJaxCompilerLoads())
