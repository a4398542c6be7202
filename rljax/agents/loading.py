"""Reading verl's tool / interaction YAML files and importing the classes they name.

Both files list entries with a `class_name`, in one of two forms:

- verl's dotted form, `my_pkg.module.MyTool`: imported with importlib (the
  module must be importable, e.g. installed or on PYTHONPATH).
- a file form, `path/to/file.py:MyTool`, as rljax's custom reward functions
  name a function in a file. A relative path is looked up from the working
  directory first, then from the YAML file's directory.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from rljax.config.yaml_io import parse_yaml
from rljax.utils.user_code import load_from_file


def read_entries(path: str, key: str) -> list[dict[str, Any]]:
  """The list under `key` in the YAML file at `path`, each entry a dict with a class_name.

  Raises:
    FileNotFoundError / ValueError: naming the file, the key and the entry index.
  """
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{key} config file not found: {path}")
  with open(path) as f:
    text = f.read()
  try:
    tree = parse_yaml(text)
  except Exception as e:
    raise ValueError(f"{path}: not valid YAML: {e}") from e
  if not isinstance(tree, dict) or key not in tree:
    found = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
    raise ValueError(f"{path}: expected a top-level `{key}:` list; found {found}")
  entries = tree[key]
  if not isinstance(entries, list):
    raise ValueError(f"{path}: `{key}` must be a list of entries, got {type(entries).__name__}")
  for i, entry in enumerate(entries):
    if not isinstance(entry, dict):
      raise ValueError(f"{path}: {key}[{i}] must be a mapping, got {entry!r}")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name.strip():
      raise ValueError(f"{path}: {key}[{i}] has no class_name; add e.g. "
                       "`class_name: my_pkg.module.MyClass` or `class_name: path/to/file.py:MyClass`")
    config = entry.get("config")
    if config is not None and not isinstance(config, dict):
      raise ValueError(f"{path}: {key}[{i}].config must be a mapping, got {config!r}")
  return entries


def import_class(class_name: str, yaml_path: str, where: str) -> type:
  """The class `class_name` names (dotted `pkg.mod.Cls` or `file.py:Cls`).

  Args:
    class_name: the entry's class_name.
    yaml_path: the YAML file (for relative file paths and messages).
    where: the entry, e.g. "tools[1]", for messages.

  Raises:
    ImportError: naming the YAML file, the entry and class_name, with the cause.
  """
  prefix = f"{yaml_path}: {where}.class_name={class_name!r}"
  try:
    if ":" in class_name:
      file, name = class_name.rsplit(":", 1)
      cls = load_from_file(_resolve_file(file, yaml_path), name, "class_name")
    else:
      cls = _import_dotted(class_name)
  except Exception as e:
    raise ImportError(f"{prefix}: cannot import it: {type(e).__name__}: {e}. Fix: name an "
                      "importable class as `pkg.module.Class` or `path/to/file.py:Class`") from e
  if not isinstance(cls, type):
    raise ImportError(f"{prefix}: names {type(cls).__name__} {cls!r}, not a class")
  return cls


def _import_dotted(class_name: str) -> Any:
  """`pkg.module.Class` imported with importlib."""
  if "." not in class_name:
    raise ImportError("expected `pkg.module.Class` or `path/to/file.py:Class`")
  module_name, name = class_name.rsplit(".", 1)
  module = importlib.import_module(module_name)
  if not hasattr(module, name):
    raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
  return getattr(module, name)


def _resolve_file(file: str, yaml_path: str) -> str:
  """`file` as given (absolute, or relative to the working directory), else relative to the YAML's directory."""
  file = os.path.expanduser(file)
  if os.path.isabs(file) or os.path.isfile(file):
    return file
  beside = os.path.join(os.path.dirname(os.path.abspath(yaml_path)), file)
  if os.path.isfile(beside):
    return beside
  raise FileNotFoundError(f"{file} is neither in the working directory ({os.getcwd()}) "
                          f"nor beside the YAML file ({beside})")


def instantiate(cls: type, kwargs: dict[str, Any], yaml_path: str, where: str) -> Any:
  """cls(**kwargs), any exception re-raised naming the YAML file and entry."""
  try:
    return cls(**kwargs)
  except Exception as e:
    shown = ", ".join(f"{k}=..." for k in kwargs)
    raise RuntimeError(f"{yaml_path}: {where}: {cls.__name__}({shown}) "
                       f"raised {type(e).__name__}: {e}") from e


def check_methods(obj: Any, methods: tuple[str, ...], yaml_path: str, where: str,
                  class_name: str) -> None:
  """Raises TypeError (naming the YAML file, entry and class) if `obj` lacks one of `methods`."""
  missing = [m for m in methods if not callable(getattr(obj, m, None))]
  if missing:
    raise TypeError(f"{yaml_path}: {where}.class_name={class_name!r} lacks method(s) "
                    f"{', '.join(missing)}; it must define {', '.join(methods)} "
                    "(subclass the rljax.agents base class to inherit defaults)")
