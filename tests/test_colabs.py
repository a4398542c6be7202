"""The notebooks in colabs/: stored without outputs, and each runs top to bottom.

The run test executes every notebook with nbclient in a fresh kernel of this
interpreter, on one CPU device, after replacing its `parameters` cell (the
papermill convention) with tiny settings: the tiny random model of
tests/rl/tiny_run.py, 1 step of 2 prompts x 2 answers of 8 tokens. The
kernels share one JAX compilation cache, which saves a third of the time.
"""

import ast
import json
import os
import pathlib

import nbformat
import pytest

from tests import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLABS = ROOT / "colabs"
NOTEBOOKS = sorted(COLABS.glob("*.ipynb"))
NAMES = [path.stem for path in NOTEBOOKS]
EXPECTED = {"grpo_quickstart", "custom_reward", "algorithms", "tool_use"}
CUSTOM_SCORES = {-0.5, 0.0, 0.5, 1.0}  # what custom_reward.ipynb's compute_score returns


def parameters_cell(nb):
  cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(cells) == 1, f"expected one cell tagged 'parameters', found {len(cells)}"
  assert cells[0].cell_type == "code"
  return cells[0]


def assigned_names(source):
  tree = ast.parse(source)
  return {target.id for node in tree.body if isinstance(node, ast.Assign)
          for target in node.targets if isinstance(target, ast.Name)}


def tiny_parameters(name, model_dir, data_dir, out_dir):
  values = {
      "ON_ACCELERATOR": False,
      "MODEL_PATH": model_dir,
      "DATA_DIR": data_dir,
      "OUTPUT_DIR": out_dir,
      "TOTAL_STEPS": 1,
      "TRAIN_BATCH_SIZE": 2,
      "ROLLOUT_N": 2,
      "RESPONSE_LENGTH": 8,
      "MICRO_BATCH_SIZE": 4,
  }
  if name == "custom_reward":
    values["VAL_SAMPLES"] = 2
  if name == "algorithms":
    values["ALGORITHMS"] = ["grpo", "rloo", "reinforce_plus_plus", "ppo"]
  if name == "tool_use":  # its own task (calculator), a 1-step warm start of the tiny model
    values.update(DATA_DIR=os.path.join(out_dir, "calculator"), SFT_STEPS=1, MICRO_BATCH_SIZE=4)
  return values


def test_every_notebook_is_here():
  assert set(NAMES) == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_stored_without_outputs(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, (
          f"{path.name}: cell {cell.get('id')} holds outputs; clear them before committing")
  parameters_cell(nb)


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
  """A kernel spec that runs this interpreter, found first on JUPYTER_PATH."""
  from ipykernel.kernelspec import write_kernel_spec  # pylint: disable=import-outside-toplevel

  root = tmp_path_factory.mktemp("jupyter")
  write_kernel_spec(str(root / "kernels" / "rljax-test"))
  saved = os.environ.get("JUPYTER_PATH")
  os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(root), saved]))
  yield "rljax-test"
  if saved is None:
    os.environ.pop("JUPYTER_PATH", None)
  else:
    os.environ["JUPYTER_PATH"] = saved


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  """(tiny model directory, data directory), shared by every notebook."""
  from rljax.data import ensure_synthetic_data  # pylint: disable=import-outside-toplevel
  from tests.rl import tiny_run  # pylint: disable=import-outside-toplevel

  model_dir = tiny_run.tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))
  data_dir = str(tmp_path_factory.mktemp("data"))
  ensure_synthetic_data(data_dir)
  return model_dir, data_dir


def kernel_env():
  """One CPU device and this checkout importable; the session's compilation cache (conftest) is inherited."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = processes.xla_flags()
  env["JAX_PLATFORMS"] = "cpu"
  env["TOKENIZERS_PARALLELISM"] = "false"
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  return env


def outputs_of(nb, kind):
  return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
          if out.get("output_type") in ("display_data", "execute_result") and kind in out.get("data", {})]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_runs_top_to_bottom(path, kernel_name, shared, tmp_path):
  from nbclient import NotebookClient  # pylint: disable=import-outside-toplevel

  nb = nbformat.read(path, as_version=4)
  cell = parameters_cell(nb)
  out_dir = tmp_path / "out"
  model_dir, data_dir = shared
  values = tiny_parameters(path.stem, model_dir, data_dir, str(out_dir))
  assert assigned_names(cell.source) == set(values), "the test's tiny parameters no longer match the notebook's"
  cell.source = "\n".join(f"{key} = {value!r}" for key, value in values.items())

  client = NotebookClient(nb, kernel_name=kernel_name, timeout=600, allow_errors=False,
                          resources={"metadata": {"path": str(COLABS)}})
  client.execute(env=kernel_env())  # raises CellExecutionError on the first failing cell

  assert outputs_of(nb, "image/png"), "no plot was drawn inline"
  if path.stem == "grpo_quickstart":
    files = set(os.listdir(out_dir / "grpo_hf"))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files, files
  if path.stem == "custom_reward":
    rows = [json.loads(line) for line in open(out_dir / "grpo_custom_reward" / "generations.jsonl")]
    assert {row["step"] for row in rows} == {0, 1}
    scores = {row["score"] for row in rows}
    # The tiny random model writes no digits, so only the custom function gives -0.5.
    assert scores <= CUSTOM_SCORES and -0.5 in scores, scores
  if path.stem == "tool_use":
    history = [json.loads(line) for line in open(out_dir / "grpo_tool" / "metrics.jsonl")]
    assert [row["step"] for row in history] == [1] and "multi_turn/tool_call_rate" in history[0]
    assert os.path.isfile(out_dir / "sft_calculator_hf" / "model.safetensors")
  if path.stem == "algorithms":
    for name in values["ALGORITHMS"]:
      history = [json.loads(line) for line in open(out_dir / f"compare_{name}" / "metrics.jsonl")]
      assert [row["step"] for row in history] == [1], name
