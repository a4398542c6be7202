"""The docs/ pages against the code: generated reference, names, keys, quoted errors."""

import pathlib
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import algos, docs_reference, sharding
from rljax import config as C
from rljax.config import keys as config_keys
from rljax.config.overrides import rljax_path
from rljax.data import preflight
from rljax.models import api
from rljax.rewards import default
from rljax.sharding import distributed

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = ["configuration.md", "algorithms.md", "coming_from_verl.md", "coming_from_tunix.md", "troubleshooting.md"]
SECTIONS = ("data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function", "algorithm", "trainer",
            "ray_init")
KEY_MENTION = re.compile(r"(?<![\w./])((?:%s)(?:\.[A-Za-z_][\w\-]*)+)" % "|".join(SECTIONS))


def page(name):
  return (DOCS / name).read_text()


@pytest.mark.parametrize("path, render", docs_reference.PAGES.items(), ids=[p.name for p in docs_reference.PAGES])
def test_configuration_pages_are_generated_from_the_configs(path, render):
  assert path.exists(), f"docs/{path.name} is missing: run `{docs_reference.REGENERATE}`"
  assert path.read_text() == render(), (
      f"docs/{path.name} is out of date with its config trees or their key records: run `{docs_reference.REGENERATE}`")


def test_every_key_has_a_description_and_no_description_is_stale():
  paths = docs_reference.reference_paths(C.get_base_config())
  missing = [p for p in paths if p not in config_keys.KEYS or not config_keys.KEYS[p].meaning.strip()]
  assert not missing, f"keys without a record in rljax/config/keys.py KEYS: {missing}"
  stale = sorted(set(config_keys.KEYS) - set(paths) - set(C.OPEN_DICTS))
  assert not stale, f"records of keys the config does not have: {stale}"
  assert not {p for p, key in config_keys.KEYS.items() if key.type_note} - set(paths)


def test_every_key_has_a_group_a_section_text_and_a_type():
  config = C.get_base_config()
  paths = docs_reference.reference_paths(config)
  assert {docs_reference.group_of(p) for p in paths} <= set(config_keys.SECTIONS)
  untyped = [p for p in paths if docs_reference.type_name(config, p) == "any"]
  assert not untyped, f"keys of no single type need a type_note in their rljax/config/keys.py record: {untyped}"


def test_reference_rows_say_what_rljax_does():
  text = docs_reference.render_config_reference()
  rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
  assert len(rows) == len(docs_reference.reference_paths(C.get_base_config()))
  assert "accepted, ignored: the actor's weights stay in device memory" in rows["actor_rollout_ref.actor.fsdp_config.param_offload"]
  assert "mapped: the optimizer state stays in host memory" in rows["actor_rollout_ref.actor.fsdp_config.optimizer_offload"]
  assert "accepted, ignored: vLLM/SGLang/TensorRT-LLM engine arguments" in rows["actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space"]
  assert "mapped: size of the mesh's fsdp axis times ulysses" in rows["actor_rollout_ref.actor.fsdp_config.fsdp_size"]
  assert "deprecated: read as `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu`" in rows["actor_rollout_ref.actor.ppo_micro_batch_size"]
  assert "rljax key:" in rows["trainer.logical_axis_rules"]
  assert "mapped: a PEFT adapter directory the actor's adapters start from" in rows[
      "actor_rollout_ref.model.lora_adapter_path"]
  assert "mapped: null (rollout.dtype), fp8 (e4m3) or int8" in rows["actor_rollout_ref.rollout.quantization"]
  assert "mapped: a value other than 1 sets actor_rollout_ref.actor.tensor_model_parallel_size" in rows[
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"]
  assert "`512` (follows `data.max_response_length`)" in rows["actor_rollout_ref.rollout.response_length"]
  assert "(follows `trainer.project_name`, `trainer.experiment_name`)" in rows["trainer.default_local_dir"]
  assert "| int or 'auto' |" in rows["trainer.nnodes"]
  assert "| str or null |" in rows["data.tokenizer"]


def test_missing_description_names_the_key_and_the_file(monkeypatch):
  monkeypatch.delitem(config_keys.KEYS, "data.seed")
  with pytest.raises(KeyError, match=r"data\.seed has no description: add it to rljax/config/keys.py"):
    docs_reference.render_config_reference()


TOOLS = {tool.command: tool for tool in docs_reference.TOOLS}


@pytest.mark.parametrize("tool", docs_reference.TOOLS, ids=list(TOOLS))
def test_every_key_of_the_sft_generation_and_evaluation_trees_has_a_record(tool):
  config = tool.build()
  paths = docs_reference.reference_paths(config)
  records = tool.described.records
  missing = [p for p in paths if p not in records or not records[p].meaning.strip()]
  assert not missing, f"keys of `{tool.command}` without a record in {tool.described.home}: {missing}"
  stale = sorted(set(records) - set(paths))
  assert not stale, f"records in {tool.described.home} of keys the tree does not have: {stale}"
  untyped = [p for p in paths if docs_reference.type_name(config, p, tool.described) == "any"]
  assert not untyped, f"keys of no single type need a type_note in their record: {untyped}"
  for section in (key.removesuffix(".*") for key in tool.described.ignored if key.endswith(".*")):
    assert any(p.startswith(section + ".") for p in paths), section


def test_sft_generation_and_evaluation_rows_say_what_rljax_does():
  text = docs_reference.render_sft_eval_reference()
  rows = [line for line in text.splitlines() if line.startswith("| `")]
  assert len(rows) == sum(len(docs_reference.reference_paths(tool.build())) for tool in docs_reference.TOOLS)

  def row(key):
    return next(line for line in rows if line.startswith(f"| `{key}` "))

  assert "alias of `optim.warmup_steps_ratio`" in row("optim.lr_warmup_steps_ratio")
  assert "deprecated: read as `data.micro_batch_size_per_gpu`" in row("data.micro_batch_size")
  assert "accepted, ignored: FSDP options of verl's rollout worker" in row("actor.fsdp_config.fsdp_size")
  assert "rljax key: a response passes when its score is >= this" in row("eval.pass_threshold")
  assert "(follows `trainer.project_name`, `trainer.experiment_name`)" in row("trainer.default_local_dir")


def test_missing_sft_description_names_the_key_and_the_file(monkeypatch):
  monkeypatch.delitem(TOOLS["python -m rljax.sft"].described.records, "optim.betas")
  with pytest.raises(KeyError, match=r"optim\.betas has no description: add it to rljax/sft/keys.py KEYS"):
    docs_reference.render_sft_eval_reference()


@pytest.mark.parametrize("name", algos.adv_estimator_names())
def test_every_advantage_estimator_is_documented(name):
  text = page("algorithms.md")
  assert f"`{name}`" in text
  assert f"algorithm.adv_estimator={name}" in text


@pytest.mark.parametrize("name", algos.POLICY_LOSS_REGISTRY.names())
def test_every_policy_loss_is_documented(name):
  text = page("algorithms.md")
  assert f"`{name}`" in text
  assert f"actor_rollout_ref.actor.policy_loss.loss_mode={name}" in text


def _resolves(config, key):
  """Whether `key` (or the key verl 0.9's spelling of it lands on, `rljax_path`) is in `config`."""
  try:
    C.get_node(config, rljax_path(key + ".").rstrip("."))
  except (KeyError, AttributeError, TypeError):
    return False
  return True


@pytest.mark.parametrize("name", PAGES)
def test_every_key_a_page_names_exists(name):
  config = C.get_base_config()
  mentioned = {m.rstrip(".") for m in KEY_MENTION.findall(page(name))}
  assert mentioned
  unknown = sorted(k for k in mentioned if not _resolves(config, k))
  assert not unknown, f"docs/{name} names keys the config does not have: {unknown}"


def test_readme_lists_every_page():
  readme = (ROOT / "README.md").read_text()
  for name in PAGES + [path.name for path in docs_reference.PAGES]:
    assert f"docs/{name}" in readme


def _validate_error(overrides, world):
  config = C.apply_overrides(C.get_base_config(), overrides)
  with pytest.raises(C.ConfigError) as info:
    C.validate(config, world)
  return str(info.value)


VALIDATE_ERRORS = [
    (["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=24"], 8),
    (["actor_rollout_ref.actor.tensor_model_parallel_size=3"], 8),
    (["actor_rollout_ref.actor.tensor_model_parallel_size=2", "actor_rollout_ref.actor.fsdp_config.fsdp_size=3"], 8),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=3"], 8),
    ([], 1),
    (["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512"], 8),
    (["actor_rollout_ref.rollout.prefill_length_buckets=[128,64]"], 8),
]


@pytest.mark.parametrize("overrides,world", VALIDATE_ERRORS, ids=[" ".join(o) or "base" for o, _ in VALIDATE_ERRORS])
def test_troubleshooting_quotes_validate_exactly(overrides, world):
  message = _validate_error(overrides, world)
  assert message in page("troubleshooting.md"), f"quote this message in docs/troubleshooting.md:\n{message}"


def _raised(exception, fn, *args):
  with pytest.raises(exception) as info:
    fn(*args)
  return str(info.value)


def test_troubleshooting_quotes_mesh_and_file_errors_exactly():
  text = page("troubleshooting.md")
  mismatch = C.apply_overrides(C.get_base_config(), ["trainer.n_gpus_per_node=4"])
  mesh = sharding.build_mesh({"data": 1, "fsdp": 4, "tensor": 2, "sequence": 1})
  messages = [
      _raised(C.ConfigError, sharding.make_mesh, mismatch),
      _raised(C.ConfigError, sharding.check_model_fits, mesh, 9, 3),
      _raised(FileNotFoundError, api.resolve_path, "/models/Qwen2.5-0.5B-Instruct"),
      _raised(C.ConfigError, preflight.file_columns, "data.train_files", "/data/gsm8k/train.parquet"),
  ]
  for message in messages:
    assert message in text, f"quote this message in docs/troubleshooting.md:\n{message}"


def test_troubleshooting_quotes_the_unknown_data_source_error(tmp_path):
  path = tmp_path / "train.parquet"
  pq.write_table(pa.table({"data_source": ["my_task"], "prompt": ["hi"]}), path)
  message = _raised(ValueError, default.check_data_sources, [str(path)])
  quoted = message.replace(str(path), "/data/my_task/train.parquet")
  assert quoted in page("troubleshooting.md"), f"quote this message in docs/troubleshooting.md:\n{quoted}"


def test_troubleshooting_quotes_the_multi_host_errors(monkeypatch):
  monkeypatch.setattr(distributed, "_on_tpu_vm", lambda: False)  # on a TPU VM, JAX would find the pod itself
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(name, raising=False)
  text = page("troubleshooting.md")
  two_nodes = C.apply_overrides(C.get_base_config(), ["trainer.nnodes=2"])
  no_coordinator = _raised(C.ConfigError, sharding.distributed_args, two_nodes)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  half_set = _raised(C.ConfigError, sharding.distributed_args, C.get_base_config())
  for message in (no_coordinator, half_set):
    assert message in text, f"quote this message in docs/troubleshooting.md:\n{message}"
