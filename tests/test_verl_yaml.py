"""verl ppo_trainer.yaml files as experiments: values, links, errors, the ignored-key report, the CLI."""

import logging
import pathlib

import pytest
import yaml

from rljax import config as C
from rljax import train
from tests import processes
from rljax.config import verl_yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]

# An excerpt of a verl GRPO ppo_trainer.yaml as users write it: Hydra's
# defaults list and _target_ hints, absolute, relative, embedded, oc.select
# and oc.env interpolations, keys rljax ignores (some changed from verl's
# default, some not), a deprecated key and a free-form mapping.
PPO_TRAINER_YAML = """\
defaults:
  - actor@actor_rollout_ref.actor: dp_actor
  - _self_

data:
  tokenizer: null
  train_files: ~/data/gsm8k/train.parquet
  val_files: ~/data/gsm8k/test.parquet
  prompt_key: prompt
  max_prompt_length: 256
  max_response_length: 128
  train_batch_size: 32
  filter_overlong_prompts: True
  truncation: error

actor_rollout_ref:
  hybrid_engine: True
  model:
    path: ~/models/Qwen2.5-0.5B-Instruct
    use_remove_padding: False
    enable_gradient_checkpointing: True
    override_config:
      model_config:
        rope_theta: 50000
  actor:
    _target_: verl.workers.config.FSDPActorConfig
    strategy: fsdp
    ppo_mini_batch_size: 16
    ppo_micro_batch_size_per_gpu: 4
    ppo_max_token_len_per_gpu: ${oc.select:data.max_prompt_length,1024}
    use_kl_loss: True
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    entropy_coeff: 0
    use_torch_compile: True
    optim:
      lr: 1e-6
      warmup_style: cosine
    fsdp_config:
      param_offload: True
      optimizer_offload: False
  ref:
    log_prob_micro_batch_size_per_gpu: 8
    log_prob_max_token_len_per_gpu: ${..actor.ppo_max_token_len_per_gpu}
    log_prob_use_dynamic_bsz: ${actor_rollout_ref.actor.use_dynamic_bsz}
  rollout:
    name: vllm
    temperature: 1.0
    prompt_length: ${data.max_prompt_length}
    response_length: ${data.max_response_length}
    gpu_memory_utilization: 0.6
    tensor_model_parallel_size: 1
    log_prob_micro_batch_size_per_gpu: 8
    n: 4
    engine_kwargs:
      vllm:
        swap_space: 32
        max_loras: 2

critic:
  model:
    path: ${actor_rollout_ref.model.path}

custom_reward_function:
  path: ${oc.env:RLJAX_TEST_REWARD_FILE,null}
  name: compute_score

algorithm:
  adv_estimator: grpo
  use_kl_in_reward: False

trainer:
  logger: [console, jsonl]
  project_name: verl_grpo_example_gsm8k
  experiment_name: qwen2_5_0_5b
  default_local_dir: checkpoints/${trainer.project_name}/${trainer.experiment_name}
  n_gpus_per_node: 8
  nnodes: 1
  save_freq: 20
  test_freq: 5
  total_epochs: 15
"""

EXPECTED = {
    "data.max_prompt_length": 256,
    "data.train_batch_size": 32,
    "data.filter_overlong_prompts": True,
    "actor_rollout_ref.model.path": "~/models/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.model.override_config.model_config.rope_theta": 50000,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 256,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.warmup_style": "cosine",
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 256,
    "actor_rollout_ref.rollout.response_length": 128,
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": 32,
    "actor_rollout_ref.rollout.engine_kwargs.vllm.max_loras": 2,
    "critic.model.path": "~/models/Qwen2.5-0.5B-Instruct",
    "custom_reward_function.path": None,
    "algorithm.adv_estimator": "grpo",
    "trainer.logger": ["console", "jsonl"],
    "trainer.default_local_dir": "checkpoints/verl_grpo_example_gsm8k/qwen2_5_0_5b",
    "trainer.n_gpus_per_node": 8,
}


@pytest.fixture
def yaml_file(tmp_path, monkeypatch):
  monkeypatch.delenv("RLJAX_TEST_REWARD_FILE", raising=False)
  path = tmp_path / "ppo_trainer.yaml"
  path.write_text(PPO_TRAINER_YAML)
  return path


def test_excerpt_loads_to_the_written_values(yaml_file):
  config = verl_yaml.load_file(str(yaml_file))
  for key, value in EXPECTED.items():
    assert C.get_node(config, key) == value, key
  assert config.data.val_batch_size is None and config.actor_rollout_ref.rollout.top_p == 1.0  # verl's defaults
  resolved = train.resolve(config, [], device_count=8)
  assert resolved.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"  # the deprecated key still maps


def test_interpolations_follow_later_overrides_until_set(yaml_file):
  config = verl_yaml.load_file(str(yaml_file))
  C.apply_overrides(config, ["data.max_response_length=64", "data.max_prompt_length=100",
                             "trainer.experiment_name=run2", "actor_rollout_ref.model.path=/m/other"])
  assert config.actor_rollout_ref.rollout.response_length == 64
  assert config.actor_rollout_ref.rollout.prompt_length == 100
  assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 100  # oc.select
  assert config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 100  # relative ${..actor.x}
  assert config.trainer.default_local_dir == "checkpoints/verl_grpo_example_gsm8k/run2"
  assert config.critic.model.path == "/m/other"
  C.apply_overrides(config, ["actor_rollout_ref.rollout.response_length=7", "data.max_response_length=9"])
  assert config.actor_rollout_ref.rollout.response_length == 7


def test_oc_env_reads_the_environment(yaml_file, monkeypatch):
  monkeypatch.setenv("RLJAX_TEST_REWARD_FILE", "/rewards/mine.py")
  assert verl_yaml.load_file(str(yaml_file)).custom_reward_function.path == "/rewards/mine.py"


def test_unknown_key_names_the_key_the_file_and_the_line(tmp_path):
  path = tmp_path / "bad.yaml"
  path.write_text(PPO_TRAINER_YAML.replace("    ppo_mini_batch_size: 16\n", "    ppo_mini_batchsize: 16\n"))
  line = PPO_TRAINER_YAML.splitlines().index("    ppo_mini_batch_size: 16") + 1
  with pytest.raises(C.ConfigError) as info:
    verl_yaml.load_file(str(path))
  message = str(info.value)
  assert message.startswith("actor_rollout_ref.actor.ppo_mini_batchsize: unknown key")
  assert f"(in {path}, line {line})" in message
  assert "did you mean actor_rollout_ref.actor.ppo_mini_batch_size" in message


BAD_ENTRIES = [
    ("data:\n  max_response_length: ${data.max_respons_length}\n", "interpolates data.max_respons_length, which is not a key",
     "did you mean data.max_response_length"),
    ("data:\n  train_files: ${oc.env:RLJAX_TEST_UNSET_VARIABLE}\n", "environment variable RLJAX_TEST_UNSET_VARIABLE is not set",
     "export RLJAX_TEST_UNSET_VARIABLE=VALUE or give a default"),
    ("data:\n  seed: ${oc.decode:'42'}\n", "uses the resolver oc.decode", "write the value itself"),
    ("data:\n  seed: ${...seed}\n", "climbs above the top of the tree", "write an absolute key path"),
    ("trainer:\n  logger: ['${trainer.project_name}']\n", "interpolations inside a list", "write the list's values"),
    ("data:\n  max_prompt_length: ${data.max_prompt_length}\n", "in a cycle", "write the value of one of them"),
    ("data:\n  max_prompt_length: ${data.train_files}\n", "expects an integer", "give a whole number"),
    ("data:\n  train_batch_size: many\n", "data.train_batch_size='many': expects an integer", "give a whole number"),
    ("- data\n", "the top level must be a mapping", "write nested KEY: VALUE lines"),
]


@pytest.mark.parametrize("text,problem,fix", BAD_ENTRIES, ids=[p for _, p, _ in BAD_ENTRIES])
def test_bad_entries_name_the_problem_the_file_and_the_fix(tmp_path, monkeypatch, text, problem, fix):
  monkeypatch.delenv("RLJAX_TEST_UNSET_VARIABLE", raising=False)
  path = tmp_path / "bad.yaml"
  path.write_text(text)
  with pytest.raises(C.ConfigError) as info:
    verl_yaml.load_file(str(path))
  message = str(info.value)
  assert problem in message and str(path) in message and f"Fix: {fix}" in message.replace("Fix: e.g. ", "Fix: ")


def test_missing_path_and_missing_file_say_how_to_call_it(tmp_path):
  with pytest.raises(C.ConfigError, match="needs the verl YAML file after a colon"):
    C.load_config_file(str(ROOT / "configs" / "verl_yaml.py"))
  with pytest.raises(C.ConfigError, match="no such YAML file"):
    C.load_config_file(f"{ROOT / 'configs' / 'verl_yaml.py'}:{tmp_path / 'nope.yaml'}")


def test_ignored_keys_are_reported_once_by_name(yaml_file, caplog):
  with caplog.at_level(logging.INFO, logger="rljax.config.verl_yaml"):
    verl_yaml.load_file(str(yaml_file))
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1, warnings
  report = warnings[0]
  assert "use_remove_padding" not in report  # honoured: packed or padded passes
  for changed in ("actor_rollout_ref.actor.fsdp_config.param_offload=true",
                  "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
                  "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=32",
                  "actor_rollout_ref.rollout.engine_kwargs.vllm.max_loras=2"):
    assert changed in report
  for at_default in ("use_torch_compile", "optimizer_offload", "hybrid_engine", "actor.strategy"):
    assert at_default not in report
  assert str(yaml_file) in report and "4 verl key(s)" in report
  assert any("rljax reads the engine it picks (none)" in r.getMessage() for r in caplog.records)


def test_a_file_with_only_honoured_keys_warns_nothing(tmp_path, caplog):
  path = tmp_path / "plain.yaml"
  path.write_text("data:\n  train_batch_size: 64\nactor_rollout_ref:\n  rollout:\n    n: 8\n")
  with caplog.at_level(logging.WARNING, logger="rljax.config.verl_yaml"):
    config = verl_yaml.load_file(str(path))
  assert not caplog.records
  assert (config.data.train_batch_size, config.actor_rollout_ref.rollout.n) == (64, 8)


def test_rljax_dry_run_yaml_loads_back_unchanged():
  config = train.resolve(C.load_config_file(str(ROOT / "configs" / "grpo.py")), [], device_count=1)
  loaded = train.resolve(verl_yaml.load_text(C.to_yaml(config), source="dry_run.yaml"), [], device_count=1)
  assert C.to_plain(loaded) == C.to_plain(config)


def run_cli(*args):
  return processes.run(["-m", "rljax.train", *args], cwd=str(ROOT), drop=("XLA_FLAGS", "RLJAX_TEST_REWARD_FILE"))


@pytest.mark.slow
def test_cli_dry_run_with_verl_overrides_after_the_file(yaml_file):
  run = run_cli(f"--config=configs/verl_yaml.py:{yaml_file}", "--dry_run", "data.max_response_length=64",
                "trainer.experiment_name=run2", "--config.actor_rollout_ref.rollout.n=8")
  assert run.returncode == 0, run.stderr
  printed = yaml.safe_load(run.stdout)
  assert printed["data"]["max_response_length"] == 64
  assert printed["actor_rollout_ref"]["rollout"]["response_length"] == 64
  assert printed["actor_rollout_ref"]["rollout"]["n"] == 8
  assert printed["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 16
  assert printed["trainer"]["default_local_dir"] == "checkpoints/verl_grpo_example_gsm8k/run2"
  assert run.stderr.count("have no effect in rljax") == 1
  bad = run_cli(f"--config=configs/verl_yaml.py:{yaml_file}", "--dry_run", "trainer.experiment_nam=run2")
  assert bad.returncode == 2 and "did you mean trainer.experiment_name" in bad.stderr


# verl 0.9.1's generated configs (full trees, Megatron sections included), copied into tests/reference from its
# PyPI wheel.
GENERATED = ROOT / "tests" / "reference" / "verl_generated_ppo_trainer.yaml"
GENERATED_MEGATRON = ROOT / "tests" / "reference" / "verl_generated_ppo_megatron_trainer.yaml"
# What the generated file needs to run here: a device count this machine has.
RUNNABLE = ["trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.logger=[console]"]
# Keys whose rljax default deliberately differs from verl's generated file.
RLJAX_DEFAULTS = {
    # verl's documented ppo_trainer.yaml gives 8 and 16; the generated file leaves them null (must be set).
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu", "reward_model.micro_batch_size_per_gpu",
    # Values of verl's documents that DOCUMENTED_DEFAULTS in test_config.py pins; the generated file has newer ones.
    "actor_rollout_ref.model.enable_gradient_checkpointing", "critic.model.enable_gradient_checkpointing",
    "actor_rollout_ref.rollout.max_num_seqs", "algorithm.kl_ctrl.kl_coef", "trainer.test_freq", "data.return_raw_chat",
    "data.seed",
    # Keys with rljax's meaning: grain loads in-process by default, JAX picks the platform.
    "data.dataloader_num_workers", "trainer.device",
    # A placeholder path.
    "reward_model.model.path",
    # verl 0.9's null means another key's value, which rljax's default follows: gen_batch_size is
    # train_batch_size, the critic's tokenizer its model's.
    "data.gen_batch_size", "critic.model.tokenizer_path",
}
# Values the Megatron file chooses for itself (its strategy and optimizer name).
MEGATRON_CHOICES = {
    "actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy", "reward_model.strategy",
    "actor_rollout_ref.actor.optim.optimizer", "critic.optim.optimizer",
    "actor_rollout_ref.model.use_remove_padding",
}


def plain(value):
  return value.to_dict() if isinstance(value, C.ConfigDict) else value


def default_mismatches(path, allowed):
  """`key: rljax default != verl's` for each key of the file, and the keys rljax lacks.

  Entries of free-form dictionaries (`OPEN_DICTS`) have no default to compare.
  """
  base, loaded = C.get_base_config(), verl_yaml.load_file(str(path))
  problems = []
  for entry in verl_yaml.read_entries(path.read_text(), str(path)):
    if entry.path in C.VERL_FREE_FORM:
      continue
    try:
      default = plain(C.get_node(base, entry.path))
    except (KeyError, AttributeError):
      if not any(entry.path.startswith(open_dict + ".") for open_dict in C.OPEN_DICTS):
        problems.append(f"{entry.path}: missing")
      continue
    verl = plain(C.get_node(loaded, entry.path))
    if default != verl and entry.path not in allowed:
      problems.append(f"{entry.path}: {default!r} != {verl!r}")
  return problems


@pytest.mark.parametrize("path,allowed", [(GENERATED, RLJAX_DEFAULTS),
                                          (GENERATED_MEGATRON, RLJAX_DEFAULTS | MEGATRON_CHOICES)])
def test_every_key_of_verls_generated_config_has_verls_default(path, allowed):
  assert not default_mismatches(path, allowed)


def test_verls_generated_config_loads_and_validates(tmp_path):
  model = tmp_path / "model"
  model.mkdir()
  (model / "config.json").write_text('{"model_type": "llama"}')
  overrides = [f"actor_rollout_ref.model.path={model}", *RUNNABLE]
  config = C.load_config_file(f"{ROOT / 'configs' / 'verl_yaml.py'}:{GENERATED}")
  assert C.to_plain(config) == C.to_plain(verl_yaml.load_file(str(GENERATED)))
  resolved = train.resolve(config, overrides, device_count=1)
  assert resolved.actor_rollout_ref.actor.grad_clip == 1.0
  assert resolved.reward_manager.name == resolved.reward_model.reward_manager == "naive"
  megatron = train.resolve(verl_yaml.load_file(str(GENERATED_MEGATRON)), overrides, device_count=1)
  assert megatron.actor_rollout_ref.actor.tensor_model_parallel_size == 1


def test_verls_generated_config_runs_through_config_path_and_config_name():
  run = run_cli("--config-path", str(GENERATED.parent), "--config-name", GENERATED.stem, *RUNNABLE,
                "actor_rollout_ref.model.path=/nonexistent/model", "actor_rollout_ref.nccl_timeout=1200",
                "actor_rollout_ref.actor.optim.clip_grad=0.5", "--dry_run")
  assert run.returncode == 0, run.stderr
  printed = yaml.safe_load(run.stdout)
  assert printed["actor_rollout_ref"]["nccl_timeout"] == 1200
  assert printed["actor_rollout_ref"]["actor"]["grad_clip"] == 0.5
  assert "have no effect in rljax" not in run.stderr  # the file holds verl's defaults only
  assert run.stderr.count("change nothing in rljax") == 1 and "actor_rollout_ref.nccl_timeout=1200" in run.stderr


def test_missing_values_keep_the_default_and_select_defaults_may_be_braces(tmp_path):
  path = tmp_path / "generated.yaml"
  source = "actor_rollout_ref.actor.megatron.override_transformer_config"
  path.write_text("actor_rollout_ref:\n  rollout:\n    name: ???\n  ref:\n    megatron:\n"
                  f"      override_transformer_config: ${{oc.select:{source},{{}}}}\n")
  config = verl_yaml.load_file(str(path))
  assert config.actor_rollout_ref.rollout.name == C.get_base_config().actor_rollout_ref.rollout.name
  assert config.actor_rollout_ref.ref.megatron.override_transformer_config.attention_backend == "flash"


# verl's examples/sglang_multiturn/config/gsm8k_multiturn_megatron_grpo.yaml's head: Hydra's search path for verl's
# configs, and the Megatron trainer config under the file's own keys
MEGATRON_MULTITURN_YAML = """\
hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_megatron_trainer
  - _self_

data:
  max_prompt_length: 64
actor_rollout_ref:
  model:
    lora:
      rank: 8
"""
STRATEGIES = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy")


def strategies(config):
  return [C.get_node(config, path) for path in STRATEGIES]


def test_a_defaults_list_picks_megatron_s_engines_and_a_hydra_block_is_listed(caplog):
  # before: "hydra.searchpath: unknown key", and the Megatron LoRA block refused under the fsdp strategy
  with caplog.at_level(logging.WARNING, logger="rljax.config.verl_yaml"):
    config = verl_yaml.load_text(MEGATRON_MULTITURN_YAML, "megatron.yaml")
  assert strategies(config) == ["megatron"] * 3 and config.data.max_prompt_length == 64
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and "1 verl key(s)" in warnings[0]
  assert "hydra.searchpath=[file://verl/trainer/config]" in warnings[0] and "strategy" not in warnings[0]
  resolved = train.resolve(config, [], device_count=1)
  assert resolved.actor_rollout_ref.model.lora.rank == 8
  # verl 0.9's spelling, verl 0.8's per-role files, and the file's own keys after them unless _self_ comes first
  for defaults in ("  - ppo_trainer\n  - override model_engine: megatron\n",
                   "  - actor@actor_rollout_ref.actor: megatron_actor\n  - ref@actor_rollout_ref.ref: megatron_ref\n"
                   "  - critic@critic: megatron_critic\n  - data@data: legacy_data\n"):
    assert strategies(verl_yaml.load_text(f"defaults:\n{defaults}  - _self_\n")) == ["megatron"] * 3
  # Hydra's order: the choices before _self_, the file's keys, those after it (no _self_: the file's keys last); an
  # override applies where the trainer config it changes does
  own = "critic:\n  strategy: fsdp\n"
  for defaults, critic in (("  - ppo_megatron_trainer\n  - _self_\n", "fsdp"),
                           ("  - ppo_megatron_trainer\n", "fsdp"),
                           ("  - ppo_trainer\n  - _self_\n  - override model_engine: megatron\n", "fsdp"),
                           ("  - _self_\n  - critic@critic: megatron_critic\n", "megatron")):
    assert strategies(verl_yaml.load_text(f"defaults:\n{defaults}{own}"))[2] == critic, defaults
  assert strategies(verl_yaml.load_text("defaults:\n  - ppo_trainer\n  - _self_\n")) == ["fsdp"] * 3
  # what rljax cannot follow: a file of the user's composed by name; verl's defaults replacing the file's keys
  for defaults, problem in (("  - my_base\n  - _self_\n", "'my_base': in x.yaml composes another YAML file"),
                            ("  - _self_\n  - ppo_megatron_trainer\n", "comes after _self_ in x.yaml")):
    with pytest.raises(C.ConfigError, match=problem):
      verl_yaml.load_text(f"defaults:\n{defaults}{own}", "x.yaml")


def test_verl_s_own_trainer_configs_by_name_are_rljax_s_base_config(tmp_path, monkeypatch):
  # verl's Megatron lines: --config-path=config --config-name='ppo_megatron_trainer.yaml', which Hydra reads in
  # verl's package; here no config/ holds it
  monkeypatch.chdir(tmp_path)
  for name in ("ppo_megatron_trainer.yaml", "ppo_megatron_trainer"):
    spec, rest = C.hydra_config_file(["--config-path=config", f"--config-name={name}", "--dry_run"])
    assert rest == ["--dry_run"] and strategies(C.load_config_file(spec)) == ["megatron"] * 3
  spec, _ = C.hydra_config_file(["--config-path=config", "--config-name=ppo_trainer"])
  assert C.to_plain(C.load_config_file(spec)) == C.to_plain(C.get_base_config())
  # a file of that name in --config-path is the file
  (tmp_path / "config").mkdir()
  (tmp_path / "config" / "ppo_trainer.yaml").write_text("data:\n  max_prompt_length: 64\n")
  spec, _ = C.hydra_config_file(["--config-path=config", "--config-name=ppo_trainer"])
  assert spec == "config/ppo_trainer.yaml" and C.load_config_file(spec).data.max_prompt_length == 64
  with pytest.raises(C.ConfigError, match="no such YAML file config/ppo_trainer_v2.yaml"):
    C.hydra_config_file(["--config-path=config", "--config-name=ppo_trainer_v2"])
  with pytest.raises(C.ConfigError, match="no such YAML file myconf/ppo_trainer.yaml"):  # not verl's path: a typo
    C.hydra_config_file(["--config-path=myconf", "--config-name=ppo_trainer"])
