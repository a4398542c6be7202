"""A verl user's launch line runs as it is: Hydra's spellings, verl's free-form dicts, file lists, model paths."""

import json
import logging
import os

import jax
import pytest

from rljax import config as C
from rljax import data, sharding, train
from rljax.config import verl_yaml
from rljax.evaluation import cli
from rljax.evaluation import config as eval_config
from rljax.sft import __main__ as sft_main
from rljax.sft import config as sft_config
from rljax.rl import run_models
from tests.data.conftest import make_tokenizer, prompt_row, write_rows
from tests.test_config import ROOT, experiment, resolved, run_cli

TINY = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0}
# A verl YAML file as a user passes it with --config-path/--config-name.
VERL_YAML = """\
defaults:
  - _self_
data:
  train_batch_size: 8
  max_response_length: 64
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 4
  rollout:
    n: 2
    tensor_model_parallel_size: 1
algorithm:
  adv_estimator: grpo
trainer:
  n_gpus_per_node: 1
"""


def error_of(fn, *args, **kwargs):
  with pytest.raises(C.ConfigError) as info:
    fn(*args, **kwargs)
  return str(info.value)


def test_plus_and_double_plus_set_an_existing_key_like_a_plain_override():
  hydra = C.apply_overrides(experiment("grpo"), ["+data.train_batch_size=64", "++actor_rollout_ref.rollout.n=8"])
  plain = C.apply_overrides(experiment("grpo"), ["data.train_batch_size=64", "actor_rollout_ref.rollout.n=8"])
  assert C.to_plain(hydra) == C.to_plain(plain)
  assert hydra.data.train_batch_size == 64 and hydra.actor_rollout_ref.rollout.n == 8


def test_plus_on_an_unknown_key_names_it_the_closest_key_and_where_plus_adds():
  message = error_of(C.apply_overrides, experiment("grpo"), ["+data.train_batchsize=4"])
  assert message.startswith("data.train_batchsize: unknown key")
  assert "did you mean data.train_batch_size" in message
  assert "`+` adds keys only below the free-form dictionaries rljax knows" in message
  assert "reward_model.reward_kwargs" in message


def test_split_overrides_keeps_hydras_spellings_in_order():
  argv = ["+data.seed=3", "++data.seed=4", "~data.seed", "~data.shuffle=true", "--dry_run", "--config=x.py"]
  overrides, rest = C.split_overrides(argv)
  assert overrides == argv[:4] and rest == ["--dry_run", "--config=x.py"]


def test_tilde_resets_a_key_a_section_and_an_added_entry_to_the_base_defaults():
  base = C.get_base_config()
  config = C.apply_overrides(experiment("grpo"), [
      "data.seed=7", "reward_model.overlong_buffer.len=9", "reward_model.overlong_buffer.enable=true",
      "+actor_rollout_ref.model.override_config.rope_theta=500000",
      "~data.seed", "~reward_model.overlong_buffer", "~actor_rollout_ref.model.override_config.rope_theta"])
  assert config.data.seed == base.data.seed
  assert C.to_plain(config)["reward_model"]["overlong_buffer"] == C.to_plain(base)["reward_model"]["overlong_buffer"]
  assert "rope_theta" not in config.actor_rollout_ref.model.override_config.model_config
  assert C.apply_overrides(experiment("grpo"), ["data.seed=7", "~data.seed=7"]).data.seed == base.data.seed
  assert "resets the key only where it holds that value" in error_of(
      C.apply_overrides, experiment("grpo"), ["data.seed=7", "~data.seed=8"])
  assert "did you mean data.seed" in error_of(C.apply_overrides, experiment("grpo"), ["~data.sed"])


def test_tilde_restores_each_tools_own_defaults():
  sft = sft_main.resolve(sft_config.get_sft_config(), ["model.partial_pretrain=/m/x", "~model.partial_pretrain",
                                                       "trainer.n_gpus_per_node=1"], device_count=1)
  assert sft.model.partial_pretrain == sft_config.get_sft_config().model.partial_pretrain
  command = cli.parse([f"--config={ROOT / 'configs' / 'generate.py'}", "data.n_samples=2", "~data.n_samples",
                       "+data.batch_size=3"], "rljax.generate", "")
  generate = cli.resolve(command, eval_config.validate_generate, eval_config.get_generate_config)
  assert generate.data.n_samples == eval_config.get_generate_config().data.n_samples
  assert generate.data.batch_size == 3


@pytest.mark.parametrize("text,value", [
    ("k=[a.parquet,b.parquet]", ["a.parquet", "b.parquet"]),
    ("k=['a.parquet','b.parquet']", ["a.parquet", "b.parquet"]),
    ("k=[/d/a.parquet, ~/b.parquet]", ["/d/a.parquet", "~/b.parquet"]),
    ("k={a: 1}", {"a": 1}),
    ("k={a:1,b:[x,y]}", {"a": 1, "b": ["x", "y"]}),
    ("k={rope_type:yarn,factor:4.0}", {"rope_type": "yarn", "factor": 4.0}),
    ("k=[1e-6,2]", [1e-6, 2]),
    ("k=1e-6", 1e-6),
])
def test_lists_and_dicts_read_as_hydra_reads_them(text, value):
  assert C.parse_override(text) == ("set", "k", value)


@pytest.mark.parametrize("spelling", ["[a.parquet,b.parquet]", "['a.parquet','b.parquet']", "\"['a.parquet','b.parquet']\"",
                                      "'[a.parquet,b.parquet]'"])
def test_data_files_take_a_list_however_it_is_quoted(spelling):
  config = resolved(experiment("grpo"), [f"data.train_files={spelling}", f"data.val_files={spelling}"])
  assert config.data.train_files == config.data.val_files == ["a.parquet", "b.parquet"]
  assert C.from_yaml(C.to_yaml(config)).data.train_files == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize("value", ["[]", "[a.parquet,3]", "{a: 1}"])
def test_data_files_that_are_no_paths_name_the_key(value):
  assert "data.train_files=" in error_of(resolved, experiment("grpo"), [f"data.train_files={value}"])
  assert "must be a parquet file or a list of them" in error_of(resolved, experiment("grpo"),
                                                                [f"data.train_files={value}"])


def test_sft_data_files_take_a_list():
  overrides = ["data.train_files=['a.parquet','b.parquet']", "data.val_files=[c.parquet]", "trainer.n_gpus_per_node=1"]
  config = sft_main.resolve(sft_config.get_sft_config(), overrides, device_count=1)
  assert config.data.train_files == ["a.parquet", "b.parquet"] and config.data.val_files == ["c.parquet"]
  assert "must be a parquet file or a list of them" in error_of(
      sft_main.resolve, sft_config.get_sft_config(), ["data.train_files=[]", "trainer.n_gpus_per_node=1"],
      device_count=1)


def test_the_trainers_loader_reads_every_file_of_a_list(tmp_path):
  first = write_rows(tmp_path / "a.parquet", [prompt_row(i, 2) for i in range(5)])
  second = write_rows(tmp_path / "b.parquet", [prompt_row(100 + i, 3) for i in range(7)])
  config = C.apply_overrides(C.get_base_config(), [
      f"data.train_files=['{first}','{second}']", "data.train_batch_size=4", "data.max_prompt_length=8",
      "data.shuffle=false", "trainer.total_epochs=1"])
  iterator = data.make_train_iterator(config, make_tokenizer())
  assert len(iterator.dataset) == 12 and iterator.batches_per_epoch == 3
  indices = sorted(int(i) for batch in iterator for i in batch["index"])
  assert indices == list(range(5)) + list(range(100, 107))


DAPO_REWARD_KWARGS = [
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=16",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
]


def test_dapo_reward_kwargs_land_on_rljaxs_overlong_buffer():
  config = resolved(experiment("grpo"), ["data.max_response_length=64", *DAPO_REWARD_KWARGS,
                                         "+reward_model.reward_kwargs.max_resp_len=64"])
  assert C.to_plain(config)["reward_model"]["overlong_buffer"] == {
      "enable": True, "len": 16, "penalty_factor": 1.0, "log": False, "max_resp_len": 64}
  as_dict = resolved(experiment("grpo"), [
      "data.max_response_length=64",
      "+reward_model.reward_kwargs={overlong_buffer_cfg: {enable: true, len: 16}, max_resp_len: 64}"])
  assert as_dict.reward_model.overlong_buffer.enable and as_dict.reward_model.overlong_buffer.len == 16


def test_verl_09_reward_node_keys_land_on_the_keys_rljax_holds_them_under(caplog):
  """verl 0.9 gathers the reward settings under `reward.*` (and a top-level `sandbox_fusion`)."""
  with caplog.at_level(logging.WARNING, logger="rljax.train"):
    config = resolved(experiment("grpo"), [
        "data.max_response_length=64", "reward.reward_manager.name=dapo", "reward.num_workers=3",
        "reward.custom_reward_function.name=my_score", "reward.reward_model.enable=false",
        "reward.reward_model.model_path=/models/rm", "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=16", "+reward.reward_kwargs.max_resp_len=64",
        "sandbox_fusion.url=http://localhost:8080"])
  assert (config.reward_manager.name, config.reward_model.num_workers, config.custom_reward_function.name) == (
      "dapo", 3, "my_score")
  assert config.reward_model.model.path == "/models/rm"
  assert config.reward_model.overlong_buffer.enable and config.reward_model.overlong_buffer.len == 16
  warnings = [r.getMessage() for r in caplog.records if r.name == "rljax.train"]
  assert len(warnings) == 1 and "reward_model.sandbox_fusion.url=http://localhost:8080" in warnings[0]


def test_a_fully_async_dapo_launch_line_runs_as_colocate_async():
  """A DAPO launch line of verl's fully-async recipe (verl 0.9 keys: reward.*, async_training.*, rollout.*): 4
  syncs of 2 mini-batches of 16 prompts make a step of 128, and 1280 rollout prompts make 10 steps."""
  config = resolved(experiment("grpo"), [
      "data.max_prompt_length=512", "data.max_response_length=1024", "data.train_batch_size=0",
      "data.gen_batch_size=1", "actor_rollout_ref.rollout.n=8", "algorithm.adv_estimator=grpo",
      "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
      "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
      "actor_rollout_ref.rollout.calculate_log_probs=True", "reward.reward_manager.name=dapo",
      "+reward.reward_kwargs.overlong_buffer_cfg.enable=True", "+reward.reward_kwargs.overlong_buffer_cfg.len=256",
      "+reward.reward_kwargs.max_resp_len=1024", "trainer.nnodes=1", "trainer.n_gpus_per_node=8",
      "rollout.nnodes=1", "rollout.n_gpus_per_node=8", "rollout.total_rollout_steps=1280", "rollout.total_epochs=2",
      "rollout.test_freq=5", "async_training.staleness_threshold=0.25", "async_training.trigger_parameter_sync_step=4",
      "async_training.require_batches=2", "async_training.partial_rollout=True"], devices=8)
  assert (config.trainer.v1.trainer_mode, config.data.train_batch_size, config.data.gen_batch_size) == (
      "colocate_async", 128, 128)
  assert (config.trainer.total_training_steps, config.trainer.total_epochs, config.trainer.test_freq) == (10, 2, 5)
  assert config.reward_manager.name == "dapo" and config.reward_model.overlong_buffer.len == 256


def test_a_max_resp_len_other_than_max_response_length_says_to_set_them_equal():
  message = error_of(resolved, experiment("grpo"), ["data.max_response_length=64", *DAPO_REWARD_KWARGS,
                                                    "+reward_model.reward_kwargs.max_resp_len=4096"])
  assert message.startswith("reward_model.overlong_buffer.max_resp_len=4096: differs from data.max_response_length (64)")
  assert "set them equal" in message


def test_other_reward_kwargs_are_named():
  message = error_of(C.apply_overrides, experiment("grpo"), ["+reward_model.reward_kwargs.overlong_buffer_cfg.ramp=2"])
  assert message.startswith("reward_model.reward_kwargs.overlong_buffer_cfg.ramp=2: is not a reward-manager argument")


def built_actor(model_dir, *overrides):
  """The actor's ModelConfig as the trainer builds it (abstract weights, one device)."""
  config = resolved(experiment("grpo"), [f"actor_rollout_ref.model.path={model_dir}", *overrides])
  mesh = sharding.make_mesh(config, devices=jax.devices()[:1])
  return run_models.abstract_actor(config, mesh, sharding.rules_from_config(config)).cfg


@pytest.fixture(name="model_dir")
def fixture_model_dir(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(TINY))
  return str(tmp_path)


def test_hf_fields_of_override_config_change_the_built_model(model_dir):
  before = built_actor(model_dir)
  after = built_actor(model_dir, "+actor_rollout_ref.model.override_config.rope_theta=500000",
                      "+actor_rollout_ref.model.override_config.rms_norm_eps=1e-5",
                      "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
                      "+actor_rollout_ref.model.override_config.resid_pdrop=0")
  assert (before.rope_theta, before.rms_norm_eps) == (10000.0, 1e-6)
  assert (after.rope_theta, after.rms_norm_eps) == (500000.0, 1e-5)


@pytest.mark.parametrize("field", ["attention_dropout=0.1", "use_cache=false", "layer_types=[sliding_attention]"])
def test_hf_fields_rljax_does_not_read_are_named(field):
  message = error_of(resolved, experiment("grpo"), [f"+actor_rollout_ref.model.override_config.{field}"])
  name = field.split("=")[0]
  assert message.startswith(f"actor_rollout_ref.model.override_config.model_config.{name}=")
  assert "rljax's models do not read" in message


def test_override_optimizer_config_maps_lr_and_weight_decay_and_names_the_rest():
  config = C.apply_overrides(experiment("grpo"), [
      "+actor_rollout_ref.actor.optim.override_optimizer_config.weight_decay=0.1",
      "+critic.optim.override_optimizer_config.lr=3e-6"])
  assert config.actor_rollout_ref.actor.optim.weight_decay == 0.1 and config.critic.optim.lr == 3e-6
  message = error_of(C.apply_overrides, experiment("grpo"),
                     ["+actor_rollout_ref.actor.optim.override_optimizer_config.betas=[0.9,0.95]"])
  assert message.startswith("actor_rollout_ref.actor.optim.override_optimizer_config.betas=[0.9, 0.95]: is an "
                            "optimizer argument rljax does not implement")


def test_megatrons_optimizer_offload_entries_land_on_the_optim_node_and_only_the_overlap_is_listed(caplog):
  overrides = ["+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1.0",
               "+critic.optim.override_optimizer_config.optimizer_offload_fraction=0.5",
               "+actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=true"]
  with caplog.at_level(logging.WARNING, logger="rljax.train"):
    config = resolved(experiment("grpo"), overrides)
  assert config.actor_rollout_ref.actor.optim.optimizer_offload_fraction == 1.0  # rljax.sharding.offload reads it
  assert config.critic.optim.optimizer_offload_fraction == 0.5
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and "1 override(s) set verl keys that change nothing" in warnings[0]
  assert "override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True" in warnings[0]
  assert "offload_fraction" not in warnings[0]
  assert C.ignored_reason("critic.optim.optimizer_offload_fraction") is None
  assert "XLA schedules" in C.ignored_reason("actor_rollout_ref.actor.optim.overlap_cpu_optimizer_d2h_h2d")
  # a verl YAML file's entry is listed the same way
  with caplog.at_level(logging.WARNING, logger="rljax.config.verl_yaml"):
    caplog.clear()
    verl_yaml.load_text("actor_rollout_ref:\n  actor:\n    optim:\n      override_optimizer_config:\n"
                        "        overlap_cpu_optimizer_d2h_h2d: true\n")
  assert "actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=true" in caplog.text
  # verl's Megatron lines (deepseek671b, qwen3-235b, qwen3moe-30b) switch on Megatron's CPU optimizer and its
  # precision-aware optimizer at float32 dtypes: memory choices, listed; a lower-precision state is an error
  megatron = ["+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=true",
              "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=true"]
  assert len(C.ignored_overrides(megatron, resolved(experiment("grpo"), megatron))) == 2
  message = error_of(C.apply_overrides, experiment("grpo"),
                     ["+actor_rollout_ref.actor.optim.override_optimizer_config.exp_avg_dtype=bf16"])
  assert message.startswith("actor_rollout_ref.actor.optim.override_optimizer_config.exp_avg_dtype='bf16': is an "
                            "optimizer argument rljax does not implement")


def test_a_hub_id_model_path_fails_validation_with_how_to_download():
  message = error_of(resolved, experiment("grpo"), ["actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct"])
  assert message.startswith("actor_rollout_ref.model.path='Qwen/Qwen2-7B-Instruct': is not a local directory")
  assert ("huggingface-cli download Qwen/Qwen2-7B-Instruct --local-dir ~/models/Qwen2-7B-Instruct, then set "
          "actor_rollout_ref.model.path=~/models/Qwen2-7B-Instruct") in message
  assert "critic.model.path='org/critic'" in error_of(resolved, experiment("ppo"), ["critic.model.path=org/critic"])
  assert resolved(experiment("grpo"), ["critic.model.path=org/critic"])  # grpo runs no critic
  assert "model.partial_pretrain='Qwen/Qwen2-7B'" in error_of(
      sft_main.resolve, sft_config.get_sft_config(), ["model.partial_pretrain=Qwen/Qwen2-7B",
                                                      "trainer.n_gpus_per_node=1"], device_count=1)
  command = cli.parse([f"--config={ROOT / 'configs' / 'generate.py'}", "model.path=Qwen/Qwen2-7B"], "rljax.generate", "")
  assert "model.path='Qwen/Qwen2-7B'" in error_of(cli.resolve, command, eval_config.validate_generate,
                                                   eval_config.get_generate_config)


def test_a_missing_local_model_stops_the_run_before_any_work(tmp_path, model_dir):
  missing = str(tmp_path / "no-such-model")
  config = resolved(experiment("grpo"), [f"actor_rollout_ref.model.path={missing}"])
  message = error_of(train.train, config)
  assert message.startswith(f"actor_rollout_ref.model.path='{missing}': is not a local directory")
  assert f"--local-dir {missing}" in message
  for path in (model_dir, "smollm2-135m-instruct"):
    C.check_model_path("actor_rollout_ref.model.path", path, must_exist=True)


def test_a_vision_language_actor_is_configured_and_what_it_cannot_do_is_refused(tmp_path):
  # the RL actor and the SFT model may be Qwen2.5-VL or Qwen3-VL (tests/rl/test_vision_language_rl.py); the parts
  # their images do not reach yet are config errors naming their key
  (tmp_path / "vl").mkdir()
  (tmp_path / "vl" / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
  path = str(tmp_path / "vl")
  resolved(experiment("grpo"), [f"actor_rollout_ref.model.path={path}"])
  # verl's examples/grpo_trainer/run_qwen2_5_vl-7b_freeze_vision.sh, its data and model local
  resolved(experiment("grpo"), [
      "algorithm.adv_estimator=grpo", "data.train_batch_size=512", "data.max_prompt_length=1024",
      "data.max_response_length=2048", "data.filter_overlong_prompts=True", "data.truncation='error'",
      "data.image_key=images", f"actor_rollout_ref.model.path={path}", "actor_rollout_ref.actor.optim.lr=1e-6",
      "actor_rollout_ref.actor.freeze_vision_tower=True", "actor_rollout_ref.model.use_remove_padding=True",
      "actor_rollout_ref.actor.ppo_mini_batch_size=128", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10",
      "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01",
      "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
      "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.enable_chunked_prefill=False",
      "actor_rollout_ref.rollout.free_cache_engine=True", "actor_rollout_ref.rollout.n=5",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
      "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
      "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15"])
  # verl's examples/grpo_trainer/run_qwen3_vl-8b-megatron.sh (Megatron's parallel sizes and offload hints)
  (tmp_path / "qwen3_vl").mkdir()
  (tmp_path / "qwen3_vl" / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
  line_8b = [
      "algorithm.adv_estimator=grpo", "data.train_batch_size=512", "data.max_prompt_length=1024",
      "data.max_response_length=2048", "data.filter_overlong_prompts=True", "data.truncation='error'",
      f"actor_rollout_ref.model.path={tmp_path / 'qwen3_vl'}", "actor_rollout_ref.actor.optim.lr=1e-6",
      "actor_rollout_ref.actor.ppo_mini_batch_size=128", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.context_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
      "actor_rollout_ref.actor.kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
      "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.actor.use_dynamic_bsz=True",
      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
      "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096",
      "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096", "actor_rollout_ref.rollout.name=vllm",
      "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.7", "actor_rollout_ref.rollout.n=5",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.megatron.use_mbridge=True",
      "actor_rollout_ref.actor.megatron.param_offload=True", "actor_rollout_ref.actor.megatron.optimizer_offload=True",
      "actor_rollout_ref.actor.megatron.grad_offload=True", "actor_rollout_ref.ref.megatron.param_offload=True",
      "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1",
      "+actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True",
      "+actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True",
      "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True",
      "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
      "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
      "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1",
      "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
      "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15"]
  resolved(experiment("grpo"), line_8b)
  # verl's examples/grpo_trainer/run_qwen3_vl-30b-megatron.sh: Qwen3-VL-MoE, its experts over 8 devices
  (tmp_path / "qwen3_vl_moe").mkdir()
  (tmp_path / "qwen3_vl_moe" / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe"}))
  moe_path = f"actor_rollout_ref.model.path={tmp_path / 'qwen3_vl_moe'}"
  moe_line = [moe_path if o.startswith("actor_rollout_ref.model.path") else
              o.replace("pipeline_model_parallel_size=2", "pipeline_model_parallel_size=1") for o in line_8b]
  moe_overrides = "+actor_rollout_ref.actor.megatron.override_transformer_config"
  resolved(experiment("grpo"), [
      *moe_line, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
      "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1", f"{moe_overrides}.moe_router_dtype=fp32",
      f"{moe_overrides}.moe_enable_deepep=True", f"{moe_overrides}.moe_token_dispatcher_type=flex",
      f"{moe_overrides}.gradient_accumulation_fusion=True", f"{moe_overrides}.moe_permute_fusion=True",
      f"{moe_overrides}.moe_aux_loss_coeff=0.01", f"{moe_overrides}.moe_z_loss_coeff=0.001"], devices=8)
  message = error_of(resolved, experiment("grpo"), [f"actor_rollout_ref.model.path={tmp_path / 'qwen3_vl'}",
                                                    "actor_rollout_ref.model.lora_rank=8"])
  assert "is a vision-language model (qwen3_vl)" in message and "linear_fc1" in message, message
  for extra, key in (("reward_model.enable=true", "reward_model.enable"),
                     ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.exclude_modules")):
    message = error_of(resolved, experiment("grpo"), [f"actor_rollout_ref.model.path={path}", extra])
    assert message.startswith(f"{key}=") and "is a vision-language model (qwen2_5_vl)" in message, message
  message = error_of(resolved, experiment("ppo"), [f"actor_rollout_ref.model.path={path}"])
  assert message.startswith("critic") and "vision-language" in message, message
  sft_main.resolve(sft_config.get_sft_config(), [f"model.partial_pretrain={path}", "trainer.n_gpus_per_node=1"],
                   device_count=1)  # SFT on images (tests/sft/test_vision_language_sft.py)
  lora_sft = [f"model.partial_pretrain={path}", "trainer.n_gpus_per_node=1", "model.lora_rank=8"]
  message = error_of(sft_main.resolve, sft_config.get_sft_config(), lora_sft, device_count=1)
  assert message.startswith("model.exclude_modules=") and "vision tower" in message, message
  sft_main.resolve(sft_config.get_sft_config(), [*lora_sft, "model.exclude_modules=.*visual.*"], device_count=1)


def test_config_name_and_path_pick_a_verl_yaml_file(tmp_path, monkeypatch):
  (tmp_path / "ppo.yaml").write_text(VERL_YAML)
  for argv in (["--config-path", str(tmp_path), "--config-name", "ppo"],
               [f"--config-path={tmp_path}", "--config-name=ppo.yaml"]):
    assert C.hydra_config_file([*argv, "--dry_run"]) == (str(tmp_path / "ppo.yaml"), ["--dry_run"])
  monkeypatch.chdir(tmp_path)
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "mine.yaml").write_text(VERL_YAML)
  assert C.hydra_config_file(["--config-name=mine"]) == (os.path.join("configs", "mine.yaml"), [])
  assert C.hydra_config_file(["--dry_run"]) == (None, ["--dry_run"])
  assert "use one" in error_of(C.hydra_config_file, ["--config-name=mine", "--config=configs/grpo.py"])
  assert "add --config-name" in error_of(C.hydra_config_file, [f"--config-path={tmp_path}"])
  assert "no such YAML file" in error_of(C.hydra_config_file, ["--config-name=missing"])
  assert "is a verl YAML file, which configures rljax.train" in error_of(
      cli.parse, ["--config-name=mine"], "rljax.generate", "")


def test_a_yaml_config_file_loads_as_configs_verl_yaml_does(tmp_path):
  path = tmp_path / "ppo.yaml"
  path.write_text(VERL_YAML)
  assert C.to_plain(C.load_config_file(str(path))) == C.to_plain(verl_yaml.load_file(str(path)))
  assert C.to_plain(C.load_config_file(str(path))) == C.to_plain(
      C.load_config_file(f"{ROOT / 'configs' / 'verl_yaml.py'}:{path}"))


@pytest.mark.slow
def test_cli_runs_a_verl_launch_line_with_hydras_spellings(tmp_path):
  (tmp_path / "ppo.yaml").write_text(VERL_YAML)
  overrides = ["actor_rollout_ref.model.path=smollm2-135m-instruct", "data.train_files=[a.parquet,b.parquet]",
               *DAPO_REWARD_KWARGS, "+reward_model.reward_kwargs.max_resp_len=64",
               "+actor_rollout_ref.model.override_config.attention_dropout=0.", "~trainer.logger", "--dry_run"]
  hydra = run_cli("--config-path", str(tmp_path), "--config-name", "ppo", *overrides)
  assert hydra.returncode == 0, hydra.stderr
  spelled = run_cli(f"--config=configs/verl_yaml.py:{tmp_path / 'ppo.yaml'}", *overrides)
  assert hydra.stdout == spelled.stdout
  printed = C.parse_yaml(hydra.stdout)
  assert printed["data"]["train_files"] == ["a.parquet", "b.parquet"]
  assert printed["reward_model"]["overlong_buffer"]["max_resp_len"] == 64


def test_cli_dry_run_rejects_a_hub_id_model_path():
  run = run_cli("--config=configs/grpo.py", "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct", "--dry_run")
  assert run.returncode == 2
  assert "config error: actor_rollout_ref.model.path='Qwen/Qwen2-7B-Instruct'" in run.stderr
  assert "huggingface-cli download Qwen/Qwen2-7B-Instruct" in run.stderr


def test_tilde_on_a_key_that_follows_another_follows_it_again():
  config = C.apply_overrides(experiment("grpo"), ["data.gen_batch_size=7", "data.train_batch_size=32",
                                                   "~data.gen_batch_size"])
  assert config.data.gen_batch_size == 32
  C.apply_overrides(config, ["data.train_batch_size=16"])
  assert config.data.gen_batch_size == 16


def test_keys_verl_0_9_1_reads_nowhere_are_listed(caplog):
  # verl 0.9.1 declares rollout.over_sample_rate (workers/config/rollout.py), data.sampler.class_path/class_name (its
  # create_rl_sampler reads data.shuffle and data.seed alone), router_replay's files and two multi-turn keys, and no
  # code reads them: its lines that set them run every request to its end and take the rows in data.shuffle's order,
  # as rljax does (verl's curriculum lines); sampler_kwargs reaches only a custom sampler class (an error here)
  overrides = ["actor_rollout_ref.rollout.over_sample_rate=0.1", "data.sampler.class_path=pkg://tests.utils.sampler",
               "data.sampler.class_name=RandomCurriculumSampler", "actor_rollout_ref.actor.router_replay.record_file=/r",
               "actor_rollout_ref.ref.router_replay.replay_file=/r",
               "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2",
               "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=True",
               "trainer.v1.sampler.sampler_kwargs={a: 1}"]
  listed = [*overrides[:-1], "trainer.v1.sampler.sampler_kwargs={'a': 1}"]
  with caplog.at_level(logging.WARNING, logger="rljax.train"):
    config = resolved(experiment("grpo"), overrides)
  assert config.actor_rollout_ref.rollout.over_sample_rate == 0.1
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1 and all(override in warnings[0] for override in listed), warnings
  for override in overrides[:-1]:
    assert "reads it nowhere" in C.ignored_reason(override.split("=")[0])
