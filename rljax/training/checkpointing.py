"""Checkpoints of the RL run: orbax steps under `trainer.default_local_dir`.

Layout (verl's step naming, orbax's atomic commit)::

  default_local_dir/
    config.yaml              the run's resolved config (rljax.config.to_yaml)
    global_step_10/          one complete step
      commit_success.txt     orbax's commit marker, written last
      arrays/                every jax.Array pytree ("actor", "critic", optimiser states...)
      extras/                JSON: data-iterator state, rng key data, kl coefficient...
    global_step_20.orbax-checkpoint-tmp-*/   a save in flight (or killed): never a step

A step is *complete* when its directory has its final name (orbax renames
the temporary directory only after every file is written) and holds the
commit marker and both items. `latest_step()`, `all_steps()`, `restore()` and
`resolve_resume()` only ever see complete steps, so a run killed mid-save
resumes from the previous one. A writing Checkpointer deletes leftover
incomplete step directories when it opens (orbax deletes its temporary
ones); a read-only one (export) never deletes. Steps only move forward:
saving a step at or below the latest complete one is an error, as orbax
would silently skip it.

Keep limits: all roles of a step live in one orbax step, so one manager keeps
the newest `max(max_actor_ckpt_to_keep, max_critic_ckpt_to_keep)` steps (None
if either is None: keep all). Keeping actor and critic steps apart would
leave steps holding an actor but no critic, which cannot be resumed; the
price is that the role with the smaller limit keeps a few more copies.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.sharding import SingleDeviceSharding
from ml_collections import ConfigDict

from rljax.sharding import hosts
from rljax.sharding.distributed import is_main_process
from rljax import config as config_lib

STEP_PREFIX = "global_step"
CONFIG_FILE = "config.yaml"
COMMIT_MARKER = "commit_success.txt"
ARRAYS, EXTRAS = "arrays", "extras"
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}_(\d+)$")


def absolute(path: str) -> str:
  """`path` with ~ expanded and made absolute; URLs (gs://...) unchanged."""
  return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def step_dir(directory: str, step: int) -> str:
  """The directory of `step` under a checkpoint `directory`."""
  return str(epath.Path(directory) / f"{STEP_PREFIX}_{step}")


def is_complete(path: str) -> bool:
  """Whether `path` is a fully committed step directory (never a partial one)."""
  path = epath.Path(path)
  if not _STEP_DIR.match(path.name):
    return False
  return (
      (path / COMMIT_MARKER).is_file()
      and (path / ARRAYS).is_dir()
      and (path / EXTRAS).is_dir()
      and ocp.step.is_path_finalized(path)
  )


def complete_steps(directory: str) -> list[int]:
  """Steps with a complete directory under `directory`, ascending."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  steps = []
  for path in directory.iterdir():
    match = _STEP_DIR.match(path.name)
    if match and is_complete(path):
      steps.append(int(match.group(1)))
  return sorted(steps)


def split_step_path(path: str) -> tuple[str, int]:
  """`.../global_step_N` -> (checkpoint directory, N)."""
  path = epath.Path(absolute(str(path).rstrip("/")))
  match = _STEP_DIR.match(path.name)
  if not match:
    raise ValueError(f"{path} is not a step directory (expected a name like {STEP_PREFIX}_10).")
  return str(path.parent), int(match.group(1))


def keep_limit(trainer_config: ConfigDict) -> int | None:
  """Steps to keep: max of the actor and critic limits; None (keep all) if either is None."""
  limits = [trainer_config.max_actor_ckpt_to_keep, trainer_config.max_critic_ckpt_to_keep]
  if any(limit is None for limit in limits):
    return None
  for key, limit in zip(("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"), limits):
    if limit < 1:
      raise ValueError(f"trainer.{key}={limit}: keep at least 1 checkpoint, or set it to null (keep all).")
  return max(limits)


def _remove_incomplete_steps(directory: str) -> None:
  """Deletes step directories a killed run left without a commit marker (process 0).

  Orbax would count them as steps and then skip saving any older step.
  Temporary `*.orbax-checkpoint-tmp-*` directories are orbax's to clean.
  """
  directory = epath.Path(directory)
  if is_main_process() and directory.is_dir():
    for path in directory.iterdir():
      if _STEP_DIR.match(path.name) and not is_complete(path):
        logging.warning("removing incomplete checkpoint %s (no %s)", path, COMMIT_MARKER)
        path.rmtree()
  hosts.barrier("rljax_remove_incomplete_steps")


def _multiprocessing_options() -> ocp.options.MultiprocessingOptions:
  """Orbax's processes: every process, or this process's role's where roles split the job (the trainer's alone
  where a rollout process runs beside it)."""
  group = hosts.group()
  if hosts.count() == jax.process_count():
    return ocp.options.MultiprocessingOptions()
  return ocp.options.MultiprocessingOptions(primary_host=group[0], active_processes=set(group))


def _check_json(extras: Mapping[str, Any]) -> None:
  for key, value in extras.items():
    try:
      json.dumps(value)
    except (TypeError, ValueError) as e:
      raise TypeError(
          f"checkpoint extras[{key!r}] is not JSON-serialisable ({e}); store plain "
          "Python numbers, strings, lists and dicts (e.g. jax.random.key_data(k).tolist())."
      ) from e


def _abstract(leaf: Any) -> jax.ShapeDtypeStruct:
  """A restore target: shape, dtype and sharding (default: the first device)."""
  sharding = getattr(leaf, "sharding", None) or SingleDeviceSharding(jax.devices()[0])
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


class Checkpointer:
  """Saves and restores (arrays, extras) steps under one directory with orbax.

  Args:
    directory: checkpoint root (`trainer.default_local_dir`); any path orbax
      writes, gs:// included.
    max_to_keep: newest steps to keep; None keeps all (see `keep_limit`).
    async_save: write in a background thread; `save` returns once the
      arrays are copied off the devices.
    read_only: open an existing directory without creating or deleting.
  """

  def __init__(
      self,
      directory: str,
      max_to_keep: int | None = None,
      async_save: bool = True,
      *,
      read_only: bool = False,
  ):
    self.directory = absolute(directory)
    whole_job = hosts.count() == jax.process_count()
    if not (read_only or whole_job):  # orbax creates it only where every process saves
      epath.Path(self.directory).mkdir(parents=True, exist_ok=True)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save,
        step_prefix=STEP_PREFIX,
        create=whole_job and not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,
        multiprocessing_options=_multiprocessing_options(),
    )
    if not read_only:
      _remove_incomplete_steps(self.directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=options,
        item_handlers={ARRAYS: ocp.PyTreeCheckpointHandler(), EXTRAS: ocp.JsonCheckpointHandler()},
    )

  @classmethod
  def from_config(cls, config: ConfigDict, async_save: bool = True) -> "Checkpointer":
    """The run's checkpointer: `trainer.default_local_dir`, keep limits, config YAML saved."""
    ckpt = cls(config.trainer.default_local_dir, keep_limit(config.trainer), async_save)
    ckpt.save_config(config)
    return ckpt

  def save_config(self, config: ConfigDict, file_name: str = CONFIG_FILE) -> str:
    """Writes the resolved config to `directory/file_name` (process 0); returns the path."""
    path = epath.Path(self.directory) / file_name
    if is_main_process():
      tmp = path.parent / (file_name + ".tmp")
      tmp.write_text(config_lib.to_yaml(config))
      tmp.replace(path)
    return str(path)

  def save(
      self,
      step: int,
      arrays: Mapping[str, Any],
      extras: Mapping[str, Any] | None = None,
      force: bool = False,
  ) -> bool:
    """Starts saving `step`; waits first for a save still in flight.

    Args:
      step: the global step.
      arrays: name -> pytree of jax.Array (an nnx.State is a pytree).
      extras: JSON-serialisable run state.
      force: passed to orbax (save even where its interval policy would not).

    Returns:
      Whether a save was started.
    """
    extras = dict(extras or {})
    _check_json(extras)
    self._manager.wait_until_finished()
    latest = self.latest_step()
    if latest is not None and step <= latest:
      raise ValueError(
          f"cannot save step {step}: {self.directory} already holds step {latest} (orbax only "
          "saves newer steps); resume from it (trainer.resume_mode=auto) or point "
          "trainer.default_local_dir at a fresh directory."
      )
    if hosts.count() == 1 < jax.process_count():
      # orbax refuses a fully addressable array in a multi-process job (it takes it for a host-local one): where
      # the trainer is one process of several, its arrays are saved from the host, as the same stored arrays
      arrays = jax.device_get(dict(arrays))
    return self._manager.save(
        step,
        args=ocp.args.Composite(**{
            ARRAYS: ocp.args.PyTreeSave(dict(arrays)),
            EXTRAS: ocp.args.JsonSave(extras),
        }),
        force=force,
    )

  def wait(self) -> None:
    """Blocks until every save in flight is committed."""
    self._manager.wait_until_finished()

  def all_steps(self) -> list[int]:
    """Complete steps, ascending."""
    return complete_steps(self.directory)

  def latest_step(self) -> int | None:
    """The newest complete step, or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def array_metadata(self, step: int) -> Any:
    """The saved arrays' tree with per-leaf metadata (`.shape`, `.dtype`)."""
    self._require_complete(step)
    metadata = self._manager.item_metadata(step)[ARRAYS]
    return getattr(metadata, "tree", metadata)

  def restore(self, step: int, abstract_arrays: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restores `step`.

    Args:
      step: a complete step.
      abstract_arrays: name -> pytree of jax.ShapeDtypeStruct (or jax.Array)
        whose `.sharding` places each restored array; leaves without one go
        to the first device. May name a subset of the saved arrays.

    Returns:
      (arrays, extras).
    """
    self._require_complete(step)
    target = jax.tree.map(_abstract, dict(abstract_arrays))
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(**{
            ARRAYS: ocp.args.PyTreeRestore(
                item=target,
                restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                partial_restore=True,
            ),
            EXTRAS: ocp.args.JsonRestore(),
        }),
    )
    return dict(restored[ARRAYS]), dict(restored[EXTRAS] or {})

  def _require_complete(self, step: int) -> None:
    if not is_complete(step_dir(self.directory, step)):
      raise FileNotFoundError(
          f"{step_dir(self.directory, step)} is not a complete checkpoint "
          f"(complete steps in {self.directory}: {self.all_steps() or 'none'})."
      )

  def close(self) -> None:
    """Waits for saves in flight and releases orbax's threads."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def restore_from_path(path: str, abstract_arrays: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """Restores the step directory `path` (e.g. `resolve_resume`'s answer)."""
  directory, step = split_step_path(path)
  with Checkpointer(directory, read_only=True) as ckpt:
    return ckpt.restore(step, abstract_arrays)


def resolve_resume(trainer_config: ConfigDict) -> str | None:
  """The step directory to resume from, per `trainer.resume_mode`.

  auto: the latest complete step under `trainer.default_local_dir`, or None
  (start fresh). disable: None. resume_path: `trainer.resume_from_path`,
  which must be a complete step directory.
  """
  mode = trainer_config.resume_mode
  if mode == "disable":
    return None
  if mode == "auto":
    directory = absolute(trainer_config.default_local_dir)
    steps = complete_steps(directory)
    return step_dir(directory, steps[-1]) if steps else None
  if mode == "resume_path":
    return _checked_resume_path(trainer_config.resume_from_path)
  raise ValueError(f"trainer.resume_mode={mode!r}: expected one of auto, disable, resume_path.")


def _checked_resume_path(path: str | None) -> str:
  if not path:
    raise ValueError(
        "trainer.resume_mode=resume_path needs trainer.resume_from_path=DIR (a global_step_N directory).")
  path = absolute(path.rstrip("/"))
  if not epath.Path(path).exists():
    raise FileNotFoundError(f"trainer.resume_from_path={path} does not exist.")
  if not is_complete(path):
    steps = complete_steps(str(epath.Path(path).parent))
    raise ValueError(
        f"trainer.resume_from_path={path} is not a complete checkpoint (a "
        f"{STEP_PREFIX}_N directory with {COMMIT_MARKER}); complete steps beside it: "
        f"{steps or 'none'}."
    )
  return path
