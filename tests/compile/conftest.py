"""TPU programs compiled here have no TPU client to load them back from the session's compilation cache: the
cache is off while these modules run (they would write entries no test can read), and on again after them."""

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache


def _use_compilation_cache(enabled: bool) -> None:
  jax.config.update("jax_enable_compilation_cache", enabled)
  compilation_cache.reset_cache()  # JAX decides once per process whether it uses the cache: decide again


@pytest.fixture(autouse=True, scope="module")
def _no_compilation_cache():
  before = jax.config.jax_enable_compilation_cache
  _use_compilation_cache(False)
  yield
  _use_compilation_cache(before)
