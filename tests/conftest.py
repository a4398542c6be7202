"""Test set-up: 8 CPU devices before JAX starts, so every sharding path runs."""

import atexit
import os
import shutil
import tempfile

# LLVM at -O0 and XLA's CPU fusions emitted directly to LLVM IR (not through its MLIR fusion emitters): the tests'
# programs are tiny, so compiling them is much of the suite's time and running them little; both compile the same
# HLO with the same semantics (tests compare programs against each other and against references, never their
# machine code). On a 2-core Intel Xeon, tests/models/test_moe.py and tests/rl/test_shared_prompt.py took 129 s at
# -O2 and 92 s at -O0; tests/models/test_moe.py with tests/rollout/test_rollout.py took 120 s with the fusion
# emitters and 86 s without. Processes that tests start inherit both (`processes.xla_flags`).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _session_compilation_cache():
  """One persistent compilation cache for the session, read by every test and by the processes tests start:
  tests build the same tiny models' programs again and again (new engines and steps, each module's programs
  dropped after it), and a program is compiled once. A run starts with an empty cache (removed at exit), so
  the suite takes the same time on a fresh machine as here. A `JAX_COMPILATION_CACHE_DIR` set by the caller is used
  as it is, with JAX's own thresholds (a developer's cache does not fill with every tiny program)."""
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  path = tempfile.mkdtemp(prefix="rljax_tests_jax_cache_")
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


_session_compilation_cache()

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module: one process runs the whole suite, and what every
  module compiled (models, engines, steps over 8 devices) would otherwise stay in memory to the end."""
  yield
  jax.clear_caches()
  gc.collect()
