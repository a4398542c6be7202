"""The dependency rules of the package map, written down here as `ALLOWED`: each package imports only the
packages below it.

Every `import rljax.X` / `from rljax.X import ...` in rljax/, at module level or inside a function, is an
arrow from the importing package to X. Below the config, packages may import only the config's leaf modules
(`LEAVES`: they import nothing from rljax themselves). The arrows form no circle, and neither do the imports
between modules (a function-local import does not make a circle acceptable).
"""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "rljax"

# The config's leaf modules: the error its checks raise, the values of its enum keys, verl's YAML reading.
LEAVES = ("config.errors", "config.choices", "config.yaml_io")

# package -> the packages (or config leaves) it may import. Top-level modules (train, launch, ...) are packages
# of their own.
ALLOWED = {
    "utils": set(),
    "algos": set(),
    "kernels": set(),
    "agents": {"utils", "config.yaml_io"},
    "sharding": {"config.errors"},
    "models": {"sharding", "kernels", "config.errors"},
    "rewards": {"utils"},
    "data": {"agents", "utils", "config.errors"},  # data.preflight: a bad data file is a config error
    "rollout": {"models", "sharding", "agents", "data", "config.errors", "config.choices"},
    "config": {"algos", "models", "sharding", *LEAVES},
    "training": {"models", "sharding", "config", *LEAVES},
    "rl": {"algos", "config", "data", "models", "rewards", "rollout", "sharding", "training", *LEAVES},
    "sft": {"config", "data", "launch", "models", "sharding", "training", *LEAVES},
    "export": {"config", "models", "sharding", "training", "utils", *LEAVES},
    "evaluation": {"config", "data", "export", "models", "rewards", "rollout", "sharding", "training", "utils",
                   *LEAVES},
    "compile": {"config", "launch", "models", "rl", "rollout", "sharding", "train", "training", *LEAVES},
    "launch": {"config", "sharding", "utils", *LEAVES},  # sharding.failures: a failed process of several stops the rest
    "train": {"config", "launch", "rl", "sharding", *LEAVES},
    "generate": {"evaluation"},
    "eval": {"evaluation"},
    "presets": {"config", *LEAVES},
    "docs_reference": {"config", "sft", "evaluation", *LEAVES},
}


def module_name(path: pathlib.Path) -> str:
  """rljax/a/b.py -> a.b; rljax/a/__init__.py -> a."""
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST) -> list[str]:
  """What a parsed file imports from rljax, without the rljax. prefix: `import rljax.a.b` gives a.b and
  `from rljax.a import b` gives a.b (a module, or a name in module a)."""
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out += [f"{node.module}.{a.name}" for a in node.names]
  return [name[len("rljax."):] for name in out if name.startswith("rljax.")]


def node_of(module: str) -> str:
  """The package (or config leaf) a module belongs to."""
  for leaf in LEAVES:
    if module == leaf or module.startswith(leaf + "."):
      return leaf
  return module.split(".")[0]


def package_arrows() -> dict[str, dict[str, set[str]]]:
  """package -> {imported package or leaf: the files importing it}."""
  arrows: dict[str, dict[str, set[str]]] = {}
  for path in sorted(ROOT.rglob("*.py")):
    source = module_name(path)
    if not source:
      continue
    tree = ast.parse(path.read_text())
    for target in imported_modules(tree):
      if node_of(target) != node_of(source) and not (node_of(source) in LEAVES and target.startswith("config")):
        arrows.setdefault(node_of(source), {}).setdefault(node_of(target), set()).add(str(path.relative_to(ROOT)))
  return arrows


def test_every_package_imports_only_what_the_map_allows():
  wrong = []
  for package, targets in sorted(package_arrows().items()):
    assert package in ALLOWED, f"rljax/{package} is not on the map: add it to ALLOWED (and DESIGN.md)"
    wrong += [f"{package} -> {target} ({', '.join(sorted(files))})" for target, files in sorted(targets.items())
              if target not in ALLOWED[package]]
  assert not wrong, "imports against the package map:\n" + "\n".join(wrong)


def test_the_leaves_import_nothing_from_rljax():
  for leaf in LEAVES:
    tree = ast.parse((ROOT / (leaf.replace(".", "/") + ".py")).read_text())
    assert imported_modules(tree) == [], leaf


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """A circle in `graph` (a list of nodes), or None."""
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_the_map_has_no_circle():
  assert _cycle({k: {t for t in v if t in ALLOWED} for k, v in ALLOWED.items()}) is None


def test_no_import_circle_between_modules():
  modules = {module_name(p): p for p in ROOT.rglob("*.py") if module_name(p)}
  graph = {}
  for name, path in modules.items():
    targets = set()
    for target in imported_modules(ast.parse(path.read_text())):
      while target and target not in modules:
        target = target.rpartition(".")[0]
      if target and target != name:
        targets.add(target)
    graph[name] = targets
  assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


@pytest.mark.parametrize("graph,expected", [({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]), ({"a": {"b"}, "b": set()}, None)])
def test_the_circle_finder_finds_circles(graph, expected):
  assert _cycle(graph) == expected


def test_building_and_compiling_import_no_jetstream_nor_tensorflow():
  """JetStream's engine_api imports TensorFlow (seconds, CUDA-driver noise on CPU hosts): only serving may import it."""
  code = ("import sys, rljax.rollout.engine, rljax.rollout, rljax.compile, rljax.train; "
          "print(sorted(m for m in ('jetstream', 'tensorflow', 'seqio') if m in sys.modules))")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
  assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
