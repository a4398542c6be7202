"""Keeping JAX from starting libtpu on a host without a TPU.

With JAX_PLATFORMS unset JAX tries every backend it knows. It skips CUDA when
no NVIDIA GPU is visible, but not the TPU: with libtpu installed (the `tpu`
and `dev` extras) it loads and initialises libtpu on any host, which prints
"could not determine TPU accelerator type" / "TPU_WORKER_HOSTNAMES" errors on
stderr and then fails, quietly by JAX's account, leaving the CPU. The
command-line tools call `skip_absent_tpu()` before anything asks JAX for a
device: when JAX could only pick the CPU anyway, they say so
(JAX_PLATFORMS=cpu) and libtpu is never started.

Nothing changes where a TPU may be used: JAX_PLATFORMS (or jax_platforms) set
by the user, JAX_FORCE_TPU_INIT, a TPU chip on the PCI bus (JAX's own test,
the one `cloud_tpu_init` uses to call a host a Cloud TPU VM), or any other
PJRT plugin installed (CUDA, ROCm, a plugin named in
PJRT_NAMES_AND_LIBRARY_PATHS). Compiling for a TPU topology
(`rljax.compile --topology`) loads libtpu as a compiler, not as a backend,
and runs with JAX_PLATFORMS=cpu in any case.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import jax


def _tpu_chips() -> int | None:
  """TPU chips on this host by JAX's PCI test (None if this JAX has no such test)."""
  try:
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
  except (ImportError, AttributeError, TypeError, IndexError, ValueError):
    return None


def _other_plugins() -> bool:
  """Whether a PJRT plugin other than the TPU's could give JAX a backend."""
  if os.environ.get("PJRT_NAMES_AND_LIBRARY_PATHS"):
    return True
  if importlib.metadata.entry_points(group="jax_plugins"):
    return True
  try:
    return importlib.util.find_spec("jax_plugins") is not None
  except (ImportError, ValueError):
    return True


def skip_absent_tpu() -> bool:
  """Sets JAX_PLATFORMS=cpu when JAX, left to choose, could only end on the CPU; True if it did.

  Call before JAX initialises its backends (before the first `jax.devices()`).
  """
  if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "JAX_FORCE_TPU_INIT" in os.environ:
    return False
  if _tpu_chips() != 0 or _other_plugins():
    return False
  os.environ["JAX_PLATFORMS"] = "cpu"  # and the processes this one starts
  jax.config.update("jax_platforms", "cpu")
  return True
