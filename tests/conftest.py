"""Test set-up: 8 CPU devices before JAX starts, so every sharding path runs."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
