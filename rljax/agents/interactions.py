"""verl's interaction interface (a simulated user), and its YAML
(actor_rollout_ref.rollout.multi_turn.interaction_config_path):

    interaction:
      - name: gsm8k                           # optional; default from the class name
        class_name: my_pkg.module.Gsm8kInteraction   # or path/to/file.py:Gsm8kInteraction
        config: {...}                         # passed to the class, with "name" added

A row's interaction_kwargs["name"] picks the interaction (`select_interaction`).
"""

from __future__ import annotations

import uuid
from typing import Any

from rljax.agents.loading import check_methods, import_class, instantiate, read_entries

INTERACTION_METHODS = ("start_interaction", "generate_response", "calculate_score",
                       "finalize_interaction")


class BaseInteraction:
  """verl's BaseInteraction: start -> generate_response* -> calculate_score -> finalize, per instance.

  Every method may be overridden as sync or `async def`.
  """

  def __init__(self, config: dict):
    self.config = dict(config or {})
    self.name: str = self.config.get("name", "interaction_agent")

  def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
    """Starts an instance (one per conversation); returns its id (a new uuid when none is given)."""
    return instance_id if instance_id is not None else str(uuid.uuid4())

  def generate_response(self, instance_id: str, messages: list[dict], **kwargs: Any
                        ) -> tuple[bool, str, float, dict]:
    """The user's reply to the conversation so far: (should_terminate, text, turn score, extra)."""
    return False, "Your current result seems acceptable.", 0.8, {}

  def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
    """The instance's score at the end of the conversation."""
    return 0.0

  def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
    """Frees the instance's state."""


def default_interaction_name(class_name: str) -> str:
  """verl's default name: the class name lowercased, without a trailing "interaction"
  (`pkg.Gsm8kInteraction` -> "gsm8k")."""
  simple = class_name.rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()
  return simple[:-len("interaction")] if simple.endswith("interaction") and simple != "interaction" else simple


def load_interaction_config(path: str) -> dict[str, Any]:
  """{name: interaction object} of the YAML file at `path`, in file order.

  Each class is built as `cls(config)` with config["name"] set to the entry's
  name (as verl does).

  Raises:
    FileNotFoundError / ValueError / ImportError / TypeError / RuntimeError:
      naming the file, the entry index and the class_name / name.
  """
  interactions: dict[str, Any] = {}
  for i, entry in enumerate(read_entries(path, "interaction")):
    where, class_name = f"interaction[{i}]", entry["class_name"]
    name = entry.get("name") or default_interaction_name(class_name)
    if not isinstance(name, str):
      raise ValueError(f"{path}: {where}.name={name!r} must be a string")
    if name in interactions:
      raise ValueError(f"{path}: {where} is named {name!r}, like an earlier entry; interaction "
                       "names must be unique. Fix: give each entry its own `name:`")
    cls = import_class(class_name, path, where)
    config = {**(entry.get("config") or {}), "name": name}
    interaction = instantiate(cls, {"config": config}, path, where)
    check_methods(interaction, INTERACTION_METHODS, path, where, class_name)
    interactions[name] = interaction
  return interactions


def select_interaction(interactions: dict[str, Any], interaction_kwargs: dict | None) -> Any:
  """The interaction a row's interaction_kwargs["name"] names; the only one when it names none.

  Raises:
    KeyError: an unknown name, or no name while several are loaded (listing them).
  """
  name = (interaction_kwargs or {}).get("name")
  if name is None and len(interactions) == 1:
    return next(iter(interactions.values()))
  if name not in interactions:
    shown = "no name" if name is None else f"name={name!r}"
    raise KeyError(f"the row's interaction_kwargs has {shown}; the interactions are: "
                   f"{', '.join(interactions) or 'none'}. Fix: set extra_info.interaction_kwargs.name "
                   "to one of them")
  return interactions[name]
