"""The config tree against verl's documents, overrides, validation, CLI."""

import logging
import os
import pathlib

import pytest
import yaml

from rljax import config as C
from rljax import presets, sharding
from rljax import train
from tests import processes
from rljax.config import mapping
from rljax.rl import staleness
from rljax.config import mapping as config_mapping

ROOT = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "reference"  # verl's key paths, copied from the spec
CONFIGS = ["grpo", "ppo", "rloo", "reinforce_plus_plus", "dapo", "gspo"]


def experiment(name, arg=None):
  return C.load_config_file(f"{ROOT / 'configs' / name}.py" + (f":{arg}" if arg else ""))


def resolved(config, overrides=(), devices=1):
  return train.resolve(config, list(overrides), device_count=devices)


def verl_keys():
  path = REFERENCE / "verl_ppo_keys.txt"
  return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def test_every_verl_key_resolves_on_the_grpo_config():
  config = experiment("grpo")
  keys = verl_keys()
  assert len(keys) > 200
  missing = []
  for key in keys:
    try:
      C.get_node(config, key)
    except (KeyError, AttributeError):
      missing.append(key)
  assert not missing


# (key, value written in verl's documents; the newer document where they differ)
DOCUMENTED_DEFAULTS = [
    ("data.tokenizer", None),
    ("data.train_files", "~/data/rlhf/gsm8k/train.parquet"),
    ("data.val_files", "~/data/rlhf/gsm8k/test.parquet"),
    ("data.train_max_samples", -1),
    ("data.val_max_samples", -1),
    ("data.prompt_key", "prompt"),
    ("data.max_prompt_length", 512),
    ("data.max_response_length", 512),
    ("data.train_batch_size", 1024),
    ("data.return_raw_input_ids", False),
    ("data.return_raw_chat", False),
    ("data.return_full_prompt", False),
    ("data.shuffle", True),
    ("data.seed", 42),
    ("data.filter_overlong_prompts", False),
    ("data.filter_overlong_prompts_workers", 1),
    ("data.truncation", "error"),
    ("data.image_key", "images"),
    ("data.trust_remote_code", False),  # verl's generated ppo_trainer.yaml (tests/reference)
    ("data.custom_cls.path", None),
    ("actor_rollout_ref.hybrid_engine", True),
    ("actor_rollout_ref.model.path", "~/models/deepseek-llm-7b-chat"),
    ("actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_2"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", False),
    ("actor_rollout_ref.model.use_remove_padding", True),  # verl's generated ppo_trainer.yaml
    ("actor_rollout_ref.actor.strategy", "fsdp"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 256),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", None),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 8),
    ("actor_rollout_ref.actor.use_dynamic_bsz", False),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384),
    ("actor_rollout_ref.actor.grad_clip", 1.0),
    ("actor_rollout_ref.actor.clip_ratio", 0.2),
    ("actor_rollout_ref.actor.entropy_coeff", 0.0),
    ("actor_rollout_ref.actor.use_kl_loss", False),
    ("actor_rollout_ref.actor.rollout_is", False),
    ("actor_rollout_ref.actor.rollout_is_level", "token"),
    ("actor_rollout_ref.actor.rollout_is_mode", "truncate"),
    ("actor_rollout_ref.actor.use_torch_compile", True),
    ("actor_rollout_ref.actor.kl_loss_coef", 0.001),
    ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    ("actor_rollout_ref.actor.ppo_epochs", 1),
    ("actor_rollout_ref.actor.shuffle", False),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1),
    ("actor_rollout_ref.actor.optim.lr", 1e-6),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", -1),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", 0.0),
    ("actor_rollout_ref.actor.optim.min_lr_ratio", 0.0),
    ("actor_rollout_ref.actor.optim.num_cycles", 0.5),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", "constant"),
    ("actor_rollout_ref.actor.optim.total_training_steps", -1),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", False),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", False),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", -1),
    ("actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params", 0),
    ("actor_rollout_ref.actor.checkpoint.save_contents", ["model", "optimizer", "extra"]),
    ("actor_rollout_ref.actor.checkpoint.load_contents", ["model", "optimizer", "extra"]),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 16),
    ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", False),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", 16384),
    ("actor_rollout_ref.rollout.name", "vllm"),
    ("actor_rollout_ref.rollout.temperature", 1.0),
    ("actor_rollout_ref.rollout.top_k", -1),
    ("actor_rollout_ref.rollout.top_p", 1.0),
    ("actor_rollout_ref.rollout.prompt_length", 512),
    ("actor_rollout_ref.rollout.response_length", 512),
    ("actor_rollout_ref.rollout.dtype", "bfloat16"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.5),
    ("actor_rollout_ref.rollout.ignore_eos", False),
    ("actor_rollout_ref.rollout.enforce_eager", False),  # verl's generated ppo_trainer.yaml
    ("actor_rollout_ref.rollout.free_cache_engine", True),
    ("actor_rollout_ref.rollout.load_format", "dummy"),  # verl's generated ppo_trainer.yaml
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2),
    ("actor_rollout_ref.rollout.max_num_batched_tokens", 8192),
    ("actor_rollout_ref.rollout.max_num_seqs", 1024),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 16),
    ("actor_rollout_ref.rollout.do_sample", True),
    ("actor_rollout_ref.rollout.n", 1),
    ("actor_rollout_ref.rollout.calculate_log_probs", True),  # verl 0.9.1's (its documents of 0.8 say false)
    ("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space", None),
    ("actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend", None),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", -1),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", 1.0),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", 0.0),
    ("actor_rollout_ref.rollout.val_kwargs.n", 1),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample", False),
    ("reward_model.enable", False),
    ("reward_model.model.input_tokenizer", "~/models/deepseek-llm-7b-chat"),
    ("reward_model.model.path", "~/models/Anomy-RM-v0.1"),
    ("reward_model.micro_batch_size_per_gpu", 16),
    ("reward_model.max_length", None),
    ("reward_model.reward_manager", "naive"),
    ("custom_reward_function.path", None),
    ("custom_reward_function.name", "compute_score"),
    ("algorithm.gamma", 1.0),
    ("algorithm.lam", 1.0),
    ("algorithm.adv_estimator", "gae"),
    ("algorithm.use_kl_in_reward", False),
    ("algorithm.kl_penalty", "kl"),
    ("algorithm.kl_ctrl.type", "fixed"),
    ("algorithm.kl_ctrl.kl_coef", 0.005),
    ("algorithm.kl_ctrl.horizon", 10000),
    ("algorithm.kl_ctrl.target_kl", 0.1),
    ("algorithm.rollout_is", False),
    ("algorithm.rollout_is_threshold", None),
    ("algorithm.rollout_is_level", "token"),
    ("algorithm.rollout_is_veto_threshold", None),
    ("trainer.total_epochs", 30),
    ("trainer.project_name", "verl_examples"),
    ("trainer.experiment_name", "gsm8k"),
    ("trainer.logger", ["console", "wandb"]),
    ("trainer.log_val_generations", 0),
    ("trainer.nnodes", 1),
    ("trainer.n_gpus_per_node", 8),
    ("trainer.save_freq", -1),
    ("trainer.val_before_train", True),
    ("trainer.test_freq", 2),
    ("trainer.critic_warmup", 0),
    ("trainer.default_hdfs_dir", None),
    ("trainer.default_local_dir", "checkpoints/verl_examples/gsm8k"),
    ("trainer.resume_mode", "auto"),
    ("trainer.resume_from_path", None),
    ("trainer.remove_previous_ckpt_in_save", False),
    ("trainer.del_local_ckpt_after_load", False),
    ("trainer.ray_wait_register_center_timeout", 300),
]


@pytest.mark.parametrize("key,documented", DOCUMENTED_DEFAULTS, ids=[k for k, _ in DOCUMENTED_DEFAULTS])
def test_base_default_matches_verl_documents(key, documented):
  value = C.get_node(C.get_base_config(), key)
  assert value == documented and type(value) is type(documented)


FOLLOWERS = [
    ("data.max_response_length", "actor_rollout_ref.rollout.response_length", 300, 77),
    ("data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length", 300, 77),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", True, False),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", 4096, 999),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.ref.ulysses_sequence_parallel_size", 2, 1),
    ("actor_rollout_ref.model.path", "critic.model.path", "/m/a", "/m/critic"),
    ("actor_rollout_ref.actor.checkpoint.save_contents", "actor_rollout_ref.actor.checkpoint.load_contents", ["model"], ["model", "extra"]),
    ("trainer.experiment_name", "trainer.default_local_dir", "exp2", "/ckpt"),
]


@pytest.mark.parametrize("source,follower,new_source,own", FOLLOWERS, ids=[f for _, f, _, _ in FOLLOWERS])
def test_interpolation_follows_until_set(source, follower, new_source, own):
  config = C.get_base_config()
  C.set_value(config, source, new_source)
  expected = "checkpoints/verl_examples/exp2" if follower == "trainer.default_local_dir" else new_source
  assert C.get_node(config, follower) == expected
  C.set_value(config, follower, own)
  assert C.get_node(config, follower) == own
  assert C.get_node(config, source) == new_source  # setting the follower left the source alone
  C.set_value(config, source, new_source if not isinstance(new_source, int) or isinstance(new_source, bool) else new_source + 1)
  assert C.get_node(config, follower) == own


# (overrides, world size, fragment of the message)
BAD_INPUTS = [
    (["data.train_batchsize=4"], 1, "did you mean data.train_batch_size"),
    (["actor_rollout_ref.rollout.ppo_mini_batch_size=4"], 1, "did you mean actor_rollout_ref.actor.ppo_mini_batch_size"),
    (["trainer.loger=[console]"], 1, "did you mean trainer.logger"),
    (["algorithm.adv_estimator=grop"], 1, "did you mean grpo"),
    (["actor_rollout_ref.actor.loss_agg_mode=token_mean"], 1, "must be one of token-mean"),
    (["actor_rollout_ref.actor.kl_loss_type=k4"], 1, "actor_rollout_ref.actor.kl_loss_type='k4'"),
    (["data.truncation=both"], 1, "data.truncation='both': must be one of error, left, right, middle"),
    (["trainer.resume_mode=latest"], 1, "trainer.resume_mode='latest'"),
    (["actor_rollout_ref.actor.optim.lr_decay_style=cosine"], 1,
     "actor_rollout_ref.actor.optim.lr_decay_style='cosine': is read by verl's Megatron engine only; "
     "actor_rollout_ref.actor.strategy=fsdp. Fix: set actor_rollout_ref.actor.strategy=megatron"),
    (["critic.strategy=megatron", "critic.optim.lr_scheduler_type=cosine"], 1,
     "critic.optim.lr_scheduler_type='cosine': is FSDP's; with critic.strategy=megatron verl's Megatron optimizer"),
    (["trainer.device=npu"], 1, "trainer.device='npu': npu is Huawei's Ascend NPU, which JAX has no backend for"),
    (["actor_rollout_ref.actor.optim.lr_scheduler_type=linear"], 1, "must be one of constant, cosine"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], 1, "is not divisible by ppo_mini_batch_size * rollout.n"),
    (["data.max_response_length=-5"], 1, "data.max_response_length=-5: must be positive"),
    (["data.max_prompt_length=0"], 1, "data.max_prompt_length=0: must be positive"),
    (["actor_rollout_ref.rollout.top_p=1.5"], 1, "must lie in (0.0, 1.0]"),
    (["algorithm.gamma=2"], 1, "algorithm.gamma=2.0: must lie in [0.0, 1.0]"),
    (["algorithm.adv_estimator=gae", "critic.enable=false"], 1, "needs a critic"),
    (["data.train_batch_size=abc"], 1, "data.train_batch_size='abc': expects an integer"),
    (["trainer.val_before_train=maybe"], 1, "expects a boolean"),
    (["actor_rollout_ref.actor.optim.lr=fast"], 1, "expects a number"),
    (["trainer.resume_mode=resume_path"], 1, "trainer.resume_from_path=None: trainer.resume_mode=resume_path needs a checkpoint path"),
    (["trainer.logger=[console,swanlab]"], 1, "'swanlab' is not a logger"),
    (["actor_rollout_ref.actor.clip_ratio_c=0.5"], 1, "dual-clip needs a lower bound > 1"),
    (["actor_rollout_ref.actor.tensor_model_parallel_size=3"], 8, "tensor (3) x sequence (actor_rollout_ref.actor.ulysses_sequence_parallel_size=1) does not divide the 8 devices"),
    (["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=50"], 1, "must hold one whole sequence"),
    # every pass's budget (those of passes the run has): the smallest value that works is named
    (["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=50"], 1,
     "log_prob_max_token_len_per_gpu=50: must hold one whole sequence"),
    (["critic.enable=true", "critic.use_dynamic_bsz=true", "critic.forward_max_token_len_per_gpu=50"], 1,
     "critic.forward_max_token_len_per_gpu=50: must hold one whole sequence"),
    (["reward_model.enable=true", "reward_model.model.path=/m", "reward_model.use_dynamic_bsz=true",
      "reward_model.forward_max_token_len_per_gpu=50"], 1, "reward_model.forward_max_token_len_per_gpu=50: must hold"),
    (["data.train_batch_size"], 1, "an override needs KEY=VALUE"),
    (["trainer.n_gpus_per_node=0"], None, "must be a positive integer or 'auto'"),
    (["actor_rollout_ref.actor.checkpoint.save_contents=[model,weights]"], 1, "unknown entries ['weights']"),
    (["actor_rollout_ref.rollout.dtype=int8"], 1, "actor_rollout_ref.rollout.dtype='int8'"),
    (["actor_rollout_ref.rollout.cpu_dot_library=mkl"], 1,
     "actor_rollout_ref.rollout.cpu_dot_library='mkl': must be one of auto, ynnpack, eigen"),
    (["actor_rollout_ref.rollout.kv_cache_dtype=int4"], 1,
     "actor_rollout_ref.rollout.kv_cache_dtype='int4': must be one of auto, int8, fp8, fp8_e4m3, fp8_e5m2"),
    (["actor_rollout_ref.rollout.quantization=int4"], 1,
     "actor_rollout_ref.rollout.quantization='int4': must be one of int8, fp8"),
]


@pytest.mark.parametrize("overrides,world,fragment", BAD_INPUTS, ids=[" ".join(o) for o, _, _ in BAD_INPUTS])
def test_bad_input_names_key_and_fix(overrides, world, fragment):
  config = experiment("grpo")
  with pytest.raises(C.ConfigError) as info:
    if world is None:
      C.apply_overrides(config, overrides + ["trainer.nnodes=1"])
      C.finalize(config)
    else:
      resolved(config, overrides, devices=world)
  assert fragment in str(info.value)
  assert "Fix:" in str(info.value)


OVERRIDES = {
    "data.train_batch_size": "64",
    "actor_rollout_ref.rollout.n": "8",
    "trainer.logger": "[console,tensorboard]",
    "trainer.val_before_train": "true",
    "actor_rollout_ref.actor.use_kl_loss": "False",
    "actor_rollout_ref.actor.optim.lr": "3e-6",
    "actor_rollout_ref.rollout.prefill_length_buckets": "[64,128]",
    "trainer.default_local_dir": "/tmp/ckpt",
    "trainer.total_training_steps": "null",
}


def test_both_override_syntaxes_give_the_same_config():
  flag_style = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  verl_style = [f"{k}={v}" for k, v in OVERRIDES.items()]
  split_flags, rest_flags = C.split_overrides(flag_style + ["--dry_run"])
  split_verl, rest_verl = C.split_overrides(verl_style + ["--dry_run"])
  assert rest_flags == rest_verl == ["--dry_run"]
  a = C.to_plain(resolved(experiment("grpo"), split_flags))
  b = C.to_plain(resolved(experiment("grpo"), split_verl))
  assert a == b
  assert a["trainer"]["logger"] == ["console", "tensorboard"]
  assert a["trainer"]["val_before_train"] is True
  assert a["actor_rollout_ref"]["actor"]["use_kl_loss"] is False
  assert a["actor_rollout_ref"]["actor"]["optim"]["lr"] == 3e-6
  assert a["actor_rollout_ref"]["rollout"]["prefill_length_buckets"] == [64, 128]
  assert a["trainer"]["total_training_steps"] is None
  assert a["data"]["train_batch_size"] == 64


def test_separated_flag_value_and_mixed_order():
  overrides, rest = C.split_overrides(["--config.data.train_batch_size", "16", "data.train_batch_size=32", "--dry_run"])
  assert overrides == ["data.train_batch_size=16", "data.train_batch_size=32"] and rest == ["--dry_run"]
  assert resolved(experiment("grpo"), overrides).data.train_batch_size == 32


def run_cli(*args):
  return processes.run(["-m", "rljax.train", *args], cwd=str(ROOT), drop=("XLA_FLAGS",))


@pytest.mark.slow
def test_cli_dry_run_round_trips_and_both_syntaxes_agree():
  flag_run = run_cli("--config=configs/grpo.py", "--dry_run", *[f"--config.{k}={v}" for k, v in OVERRIDES.items()])
  verl_run = run_cli("--config=configs/grpo.py", "--dry_run", *[f"{k}={v}" for k, v in OVERRIDES.items()])
  assert flag_run.returncode == 0, flag_run.stderr
  assert flag_run.stdout == verl_run.stdout
  loaded = C.from_yaml(flag_run.stdout)
  C.finalize(loaded, device_count=1)
  assert C.to_plain(loaded) == yaml.safe_load(flag_run.stdout)
  assert C.to_plain(loaded) == C.to_plain(resolved(experiment("grpo"), [f"{k}={v}" for k, v in OVERRIDES.items()]))


def test_load_config_file_errors(tmp_path):
  with pytest.raises(C.ConfigError, match="no such file"):
    C.load_config_file(str(tmp_path / "missing.py"))
  (tmp_path / "empty.py").write_text("x = 1\n")
  with pytest.raises(C.ConfigError, match="defines no get_config"):
    C.load_config_file(str(tmp_path / "empty.py"))


@pytest.mark.slow
def test_cli_errors_name_the_key():
  bad = run_cli("--config=configs/grpo.py", "--dry_run", "algorithm.adv_estimator=ppo")
  assert bad.returncode == 2 and "algorithm.adv_estimator='ppo'" in bad.stderr
  unknown = run_cli("--config=configs/grpo.py", "--dry_run", "--config.trainer.save_frq=3")
  assert unknown.returncode == 2 and "did you mean trainer.save_freq" in unknown.stderr
  no_file = run_cli("--config=configs/nope.py", "--dry_run")
  assert no_file.returncode == 2 and "--config='configs/nope.py': no such file" in no_file.stderr


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("preset", [None, "qwen2_5_0_5b_gsm8k"])
@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_experiment_files_validate_on_any_device_count(name, preset, devices):
  config = resolved(experiment(name, preset), devices=devices)
  assert config.trainer.experiment_name == f"{name}_{preset or presets.DEFAULT_PRESET}"


def test_unset_micro_batch_is_the_whole_per_device_mini_batch_and_an_explicit_one_is_checked():
  assert experiment("grpo").actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is None
  for devices, rows in [(1, 16), (2, 8), (8, 2)]:
    config = resolved(experiment("grpo"), devices=devices)
    assert config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == rows
    assert config.critic.ppo_micro_batch_size_per_gpu == rows
  with pytest.raises(C.ConfigError, match="ppo_micro_batch_size_per_gpu=0: must be a positive integer"):
    resolved(experiment("grpo"), ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"], devices=8)
  # 6 rows over 4 devices: 8 row slots, 2 a device (tests/rl/test_row_slots.py runs it); 24 over 48: 1 a device
  uneven = ["actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "data.train_batch_size=3"]
  assert resolved(experiment("grpo"), uneven, devices=4).actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2
  assert resolved(experiment("grpo"), ["actor_rollout_ref.rollout.n=8", *uneven[1:]],
                  devices=48).actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1


def test_experiment_files_change_what_their_algorithm_needs():
  dapo = experiment("dapo")
  assert (dapo.actor_rollout_ref.actor.clip_ratio_low, dapo.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.28)
  assert dapo.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
  assert dapo.reward_model.overlong_buffer.enable
  assert dapo.reward_model.overlong_buffer.len == dapo.data.max_response_length // 4
  assert not dapo.actor_rollout_ref.actor.use_kl_loss and not dapo.algorithm.use_kl_in_reward
  assert dapo.algorithm.filter_groups.enable and dapo.algorithm.filter_groups.metric == "acc"
  assert dapo.algorithm.filter_groups.max_num_gen_batches == 10
  assert dapo.data.gen_batch_size == 3 * dapo.data.train_batch_size
  C.apply_overrides(dapo, ["data.train_batch_size=8"])
  assert dapo.data.gen_batch_size == 24  # follows the train batch, as the recipe's gen_prompt_bsz does
  assert experiment("gspo").actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
  ppo = experiment("ppo")
  assert ppo.algorithm.adv_estimator == "gae" and ppo.actor_rollout_ref.rollout.n == 1
  assert ppo.critic.model.path == ppo.actor_rollout_ref.model.path
  assert experiment("rloo").algorithm.use_kl_in_reward
  assert experiment("reinforce_plus_plus").actor_rollout_ref.actor.kl_loss_type == "mse"
  grpo = experiment("grpo")
  assert grpo.actor_rollout_ref.actor.use_kl_loss and grpo.algorithm.adv_estimator == "grpo"
  with pytest.raises(C.ConfigError, match="unknown preset"):
    experiment("grpo", "nope")


def test_deprecated_keys_map_and_warn_once(caplog):
  config_mapping._WARNED.clear()  # pylint: disable=protected-access
  config = experiment("grpo")
  overrides = [
      "actor_rollout_ref.actor.ppo_micro_batch_size=4",
      "actor_rollout_ref.ref.log_prob_micro_batch_size=8",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size=2",
      "actor_rollout_ref.actor.optim.warmup_style=cosine",
      "actor_rollout_ref.actor.checkpoint.contents=[model]",
      "data.val_batch_size=16",
  ]
  with caplog.at_level(logging.WARNING, logger="rljax.config"):
    resolved(config, overrides, devices=2)
    C.finalize(config, device_count=2)
  actor = config.actor_rollout_ref.actor
  assert actor.ppo_micro_batch_size_per_gpu == 4 * 4 // 2
  assert config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 8 * 4 // 2
  assert config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 2 * 4 // 2
  assert actor.optim.lr_scheduler_type == "cosine"
  assert actor.checkpoint.save_contents == ["model"] and actor.checkpoint.load_contents == ["model"]
  messages = [r.getMessage() for r in caplog.records]
  for old in ("ppo_micro_batch_size", "warmup_style", "checkpoint.contents", "data.val_batch_size"):
    assert sum(old in m and "deprecated" in m for m in messages) == 1, (old, messages)


def test_documented_rollout_is_keys_map_onto_rollout_correction():
  config = resolved(experiment("grpo"), ["algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2.0",
                                         "algorithm.rollout_is_level=sequence"])
  assert config.algorithm.rollout_correction.rollout_is == "sequence"
  assert config.algorithm.rollout_correction.rollout_is_threshold == 2.0
  masked = resolved(experiment("grpo"), ["algorithm.rollout_is=true", "algorithm.rollout_is_threshold=4.0",
                                         "algorithm.rollout_is_mode=mask"])
  assert masked.algorithm.rollout_correction.rollout_is_threshold == "0.25_4.0"
  with pytest.raises(C.ConfigError, match="rollout_is_veto_threshold"):
    resolved(experiment("grpo"), ["algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2.0",
                                  "algorithm.rollout_is_veto_threshold=1e-4"])


def test_open_dicts_take_new_keys_and_closed_ones_do_not():
  config = resolved(experiment("grpo"), ["+actor_rollout_ref.model.override_config.model_config.rope_theta=50000",
                                         "actor_rollout_ref.rollout.engine_kwargs.vllm.max_loras=2"])
  assert config.actor_rollout_ref.model.override_config.model_config.rope_theta == 50000
  with pytest.raises(C.ConfigError, match="unknown key"):
    resolved(experiment("grpo"), ["+actor_rollout_ref.actor.brand_new=1"])


def test_key_tables_name_real_keys():
  config = C.get_base_config()
  paths = C.leaf_paths(config)
  for table in (C.IGNORED_KEYS, C.MAPPED_KEYS, C.RLJAX_KEYS):
    for key in table:
      prefix = key[:-2] if key.endswith(".*") else None
      if prefix:
        assert any(p.startswith(prefix + ".") for p in paths), key
      else:
        C.get_node(config, key)
  for old, (new, _) in C.DEPRECATED_KEYS.items():
    C.get_node(config, old)
    if new:
      C.get_node(config, new)


def test_enum_tables_match_the_kernel_registries():
  from rljax import algos  # pylint: disable=import-outside-toplevel
  assert sorted(C.ADV_ESTIMATORS) == algos.adv_estimator_names()
  assert sorted(C.POLICY_LOSSES) == algos.POLICY_LOSS_REGISTRY.names()
  assert sorted(C.LOSS_AGG_MODES) == sorted(algos.LOSS_AGG_MODES)


def test_cosmos_dr_grpo_keys_map_onto_verl_keys():
  config = resolved(experiment("grpo"), ["actor_rollout_ref.actor.unbiased_loss_max_tokens=4096",
                                         "algorithm.unbiased_advantage=true"])
  assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"
  assert config.actor_rollout_ref.actor.loss_scale_factor == 4096.0
  assert config.algorithm.norm_adv_by_std_in_grpo is False
  follow = config.actor_rollout_ref.actor.policy_loss.rollout_correction
  C.set_value(config, "algorithm.rollout_correction.rollout_is", "token")
  assert follow.rollout_is == "token" and follow.loss_type == "ppo_clip"


@pytest.mark.parametrize("key", ["actor_rollout_ref.rollout.use_fire_sampling"])
def test_accepted_but_unimplemented_switches_are_errors_when_on(key):
  resolved(experiment("grpo"), [f"{key}=false"])
  with pytest.raises(C.ConfigError, match=f"{key}=True: .*not implemented.*Fix: set {key}=false"):
    resolved(experiment("grpo"), [f"{key}=true"])


def test_verl_v1_trainer_keys_choose_a_mode_and_refuse_what_does_not_stream(caplog):
  """verl 0.9's `trainer.use_v1` and `trainer.v1.*`: sync, colocate_async and separate_async run (the last on
  actor_rollout_ref.rollout.nnodes x n_gpus_per_node devices of its own); the asynchronous settings change nothing
  in sync (listed in the ignored-key warning) and are read by the asynchronous modes (not listed)."""
  async_keys = ["trainer.v1.sampler.max_off_policy_threshold=2", "trainer.v1.sampler.max_off_policy_strategy=wait"]
  with caplog.at_level(logging.WARNING, logger="rljax.train"):
    config = resolved(experiment("grpo"), ["trainer.use_v1=true", "trainer.v1.trainer_mode=sync", *async_keys])
    assert config.trainer.v1.trainer_mode == "sync"
    resolved(experiment("grpo"), ["trainer.v1.trainer_mode=colocate_async", *async_keys])
  warnings = [r.getMessage() for r in caplog.records if r.name == "rljax.train"]
  assert len(warnings) == 1 and warnings[0].startswith("2 override(s)") and "max_off_policy_strategy" in warnings[0]
  separate = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1",
              "actor_rollout_ref.rollout.n_gpus_per_node=4", "trainer.n_gpus_per_node=auto"]
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="rljax.train"):  # each mode's keys change nothing in the others
    resolved(experiment("grpo"), ["trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.rollout.nnodes=1"])
    config = resolved(experiment("grpo"), [*separate, "trainer.v1.colocate_async.num_warmup_batches=2"], devices=8)
  warnings = [r.getMessage() for r in caplog.records if r.name == "rljax.train"]
  assert len(warnings) == 2 and warnings[0].startswith("2 override(s)") and warnings[1].startswith("1 override(s)")
  assert "parameter_sync_step=2" in warnings[0] and "colocate_async.num_warmup_batches=2" in warnings[1]
  assert sharding.rollout_device_count(config) == 4 and sharding.resolve_world_size(config, 8) == 4
  with pytest.raises(C.ConfigError, match="actor_rollout_ref.rollout.nnodes=0: trainer.v1.trainer_mode=separate_async "
                                          "generates on devices of its own"):
    resolved(experiment("grpo"), ["trainer.v1.trainer_mode=separate_async"])
  for overrides, match in (
      (["trainer.v1.sampler.max_off_policy_threshold=0"], "max_off_policy_threshold=0: must be a whole number"),
      (["trainer.v1.sampler.max_off_policy_strategy=skip"], "max_off_policy_strategy='skip': must be one of drop, wait"),
      (["trainer.v1.colocate_async.num_warmup_batches=-1"], "num_warmup_batches=-1: must be a whole number")):
    with pytest.raises(C.ConfigError, match=match):
      resolved(experiment("grpo"), ["trainer.v1.trainer_mode=colocate_async", *overrides])
  for overrides, match in (
      (["trainer.v1.sampler.max_off_policy_threshold=4"], "max_off_policy_threshold=4: is below the 5 policy "
                                                           "versions a group spans under separate_async's schedule"),
      (["trainer.v1.separate_async.parameter_sync_step=0"], "parameter_sync_step=0: must be a whole number"),
      (["trainer.v1.sampler.max_off_policy_strategy=wait"], "max_off_policy_strategy='wait': wait, under "
                                                             "separate_async with num_warmup_batches >= 1"),
      (["trainer.v1.separate_async.num_warmup_batches=-1"], "separate_async.num_warmup_batches=-1"),
      (["trainer.v1.separate_async.hybrid_rollout.enable_switch=true"], "enable_switch=True: switching rollout")):
    with pytest.raises(C.ConfigError, match=match):
      resolved(experiment("grpo"), [*separate, *overrides], devices=8)


def test_a_fully_async_recipe_launch_line_runs_as_colocate_async(caplog):
  """verl's fully-async recipe (`async_training.*`, its top-level `rollout.*`): one rljax step is one weight sync
  of trigger_parameter_sync_step x require_batches x ppo_mini_batch_size prompts, generation runs
  staleness_threshold of a step ahead with no version bound, the recipe's log-prob defaults apply unless set,
  and its resource keys are listed in the one warning."""
  recipe = ["async_training.staleness_threshold=0.5", "async_training.trigger_parameter_sync_step=2",
            "async_training.require_batches=1", "async_training.partial_rollout=true", "rollout.nnodes=1",
            "rollout.n_gpus_per_node=4", "rollout.total_rollout_steps=64", "rollout.test_freq=3",
            "async_training.checkpoint_engine.enable=true", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.train_batch_size=0"]
  with caplog.at_level(logging.WARNING, logger="rljax.train"):
    config = resolved(experiment("grpo"), recipe)
  warnings = [r.getMessage() for r in caplog.records if r.name == "rljax.train"]
  assert len(warnings) == 1 and warnings[0].startswith("3 override(s)") and "rollout.nnodes=1" in warnings[0]
  v1 = config.trainer.v1
  assert (v1.trainer_mode, config.data.train_batch_size, config.trainer.total_training_steps) == ("colocate_async", 8, 8)
  assert v1.sampler.max_off_policy_threshold == mapping.UNBOUNDED_VERSIONS and config.trainer.test_freq == 3
  assert config.algorithm.rollout_correction.bypass_mode
  policy = staleness.policy_of(config, 8)
  assert (policy.capacity, policy.on_policy, staleness.streams_off_policy(config)) == (12, False, True)
  kept = resolved(experiment("grpo"), [*recipe, "algorithm.rollout_correction.bypass_mode=false"])
  assert not kept.algorithm.rollout_correction.bypass_mode
  on_policy = resolved(experiment("grpo"), ["async_training.staleness_threshold=0"])
  assert on_policy.data.train_batch_size == 4 * on_policy.actor_rollout_ref.actor.ppo_mini_batch_size
  assert staleness.policy_of(on_policy, 4).on_policy and not staleness.streams_off_policy(on_policy)
  assert resolved(experiment("grpo")).trainer.v1.trainer_mode == "sync"
  for overrides, match in (
      (["async_training.partial_rollout=false"], "partial_rollout=False: rljax continues in-flight responses"),
      (["rollout.total_rollout_steps=10"], "total_rollout_steps=10: is not a whole number of weight syncs of 8"),
      (["actor_rollout_ref.actor.ppo_epochs=2"], "trigger_parameter_sync_step=2: with actor_rollout_ref.actor.ppo_epochs=2"),
      (["trainer.v1.colocate_async.num_warmup_batches=2"], "num_warmup_batches=2: conflicts with async_training"),
      (["async_training.staleness_threshold=-0.5"], "staleness_threshold=-0.5: is the share"),
      (["rollout.n=4", "actor_rollout_ref.rollout.n=2"], "rollout.n=4: conflicts with actor_rollout_ref.rollout.n=2")):
    with pytest.raises(C.ConfigError, match=match):
      resolved(experiment("grpo"), [*recipe, *overrides])


def test_overrides_of_ignored_keys_are_listed_in_one_warning(caplog):
  with caplog.at_level(logging.WARNING, logger="rljax.train"):
    resolved(experiment("grpo"), ["actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                                  "+actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                  "data.train_batch_size=8"])
  warnings = [r.getMessage() for r in caplog.records if r.name == "rljax.train"]
  assert len(warnings) == 1 and warnings[0].startswith("2 override(s)")
  assert "gpu_memory_utilization=0.3" in warnings[0] and "param_offload=True" in warnings[0]
  assert "train_batch_size" not in warnings[0]


def error_text(overrides, devices=1):
  with pytest.raises(C.ConfigError) as info:
    resolved(experiment("grpo"), overrides, devices)
  return str(info.value)


@pytest.mark.parametrize("section", ["actor_rollout_ref.actor", "critic"])
def test_optim_clip_grad_is_verls_newer_name_of_grad_clip(section):
  config = resolved(experiment("grpo"), [f"{section}.optim.clip_grad=0.5"])
  assert C.get_node(config, f"{section}.grad_clip") == 0.5
  assert C.get_node(resolved(experiment("grpo"), [f"{section}.grad_clip=0.25"]), f"{section}.grad_clip") == 0.25
  text = error_text([f"{section}.grad_clip=0.25", f"{section}.optim.clip_grad=0.5"])
  assert f"{section}.optim.clip_grad=0.5: conflicts with {section}.grad_clip=0.25" in text
  assert f"set only one of {section}.optim.clip_grad and {section}.grad_clip" in text


def test_megatron_parallel_sizes_set_the_actors_mesh_axes():
  megatron = "actor_rollout_ref.actor.megatron"
  config = resolved(experiment("grpo"), [f"{megatron}.tensor_model_parallel_size=2",
                                         f"{megatron}.context_parallel_size=2"], devices=4)
  actor = config.actor_rollout_ref.actor
  assert (actor.tensor_model_parallel_size, actor.ulysses_sequence_parallel_size) == (2, 2)
  assert config.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2
  same = resolved(experiment("grpo"), [f"{megatron}.tensor_model_parallel_size=2",
                                       "actor_rollout_ref.actor.tensor_model_parallel_size=2"], devices=2)
  assert same.actor_rollout_ref.actor.tensor_model_parallel_size == 2


@pytest.mark.parametrize("key,target", list(C.MEGATRON_MESH_KEYS.items()))
def test_megatron_sizes_that_conflict_with_the_mesh_keys_name_both(key, target):
  text = error_text([f"actor_rollout_ref.actor.megatron.{key}=2", f"{target}=4"], devices=8)
  assert f"actor_rollout_ref.actor.megatron.{key}=2: conflicts with {target}=4" in text
  assert f"set only one of actor_rollout_ref.actor.megatron.{key} and {target}" in text


def test_megatron_expert_parallel_size_is_the_meshs_expert_axis():
  config = resolved(experiment("grpo"), ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"], devices=8)
  assert sharding.mesh_shape(config, 8) == {"data": 1, "fsdp": 4, "tensor": 1, "sequence": 1, "expert": 2}
  text = error_text(["actor_rollout_ref.actor.megatron.expert_model_parallel_size=3"], devices=8)
  assert "expert_model_parallel_size=3: does not divide the 8 devices left after tensor x sequence" in text
  text = error_text(["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                     "actor_rollout_ref.actor.fsdp_config.fsdp_size=8"], devices=8)
  assert "fsdp_size=8: does not divide the 4 devices left after tensor x sequence x expert" in text


MEGATRON_24 = ["trainer.nnodes=3", "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
               "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3",
               "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1", "data.train_batch_size=12",
               "actor_rollout_ref.actor.ppo_mini_batch_size=6"]


@pytest.mark.parametrize("expert,axis", [(4, 1), (8, 2)])
def test_megatron_expert_groups_only_tensor_x_data_holds_span_the_tensor_axis(expert, axis):
  # Megatron carves expert 4 (or 8) out of tensor 4 x data; the 6 devices left after tensor hold neither
  overrides = [*MEGATRON_24, f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={expert}"]
  config = resolved(experiment("grpo"), overrides, devices=24)
  assert ["exp", ["expert", "tensor"]] in [list(entry) for entry in config.trainer.logical_axis_rules]
  assert sharding.mesh_shape(config, 24) == {"data": 1, "fsdp": 6 // axis, "tensor": 4, "sequence": 1, "expert": axis}
  # a size the expert axis holds stays on it, and one neither holds is an error naming the key and the sizes
  held = resolved(experiment("grpo"), [*MEGATRON_24, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"],
                  devices=24)
  assert ["exp", "expert"] in [list(entry) for entry in held.trainer.logical_axis_rules]
  assert sharding.mesh_shape(held, 24)["expert"] == 2
  text = error_text([*MEGATRON_24, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=5"], devices=24)
  assert "expert_model_parallel_size=5: does not divide the 6 devices left after tensor x sequence" in text
  assert "or a multiple of tensor (4) whose quotient divides 6" in text


def test_megatron_expert_groups_span_tensor_and_context_where_tensor_alone_is_too_few():
  # verl's run_qwen3_vl-30b-megatron.sh: tensor 2, context 2, expert 8 on 8 devices (2 left after tensor x context)
  config = resolved(experiment("grpo"), [
      "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.context_parallel_size=2",
      "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8"], devices=8)
  assert ["exp", ["expert", "tensor", "sequence"]] in [list(entry) for entry in config.trainer.logical_axis_rules]
  assert sharding.mesh_shape(config, 8) == {"data": 1, "fsdp": 1, "tensor": 2, "sequence": 2, "expert": 2}


def test_megatron_expert_groups_leave_rules_a_launch_line_sets_alone():
  rules = ('trainer.logical_axis_rules=[["batch",["data","fsdp","expert"]],["exp","expert"],'
           '["embed",["fsdp","expert"]],["mlp","tensor"],["heads","tensor"],["kv_heads","tensor"],["vocab","tensor"]]')
  text = error_text([*MEGATRON_24, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4", rules],
                    devices=24)
  assert "expert_model_parallel_size=4: does not divide the 6 devices left after tensor x sequence" in text


MEGATRON_LORA = ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.lora.rank=16",
                 "actor_rollout_ref.model.lora.alpha=32"]


def test_megatron_lora_block_trains_the_actors_adapters_as_megatron_bridge_does():
  from rljax.models import lora  # pylint: disable=import-outside-toplevel
  # verl's run_qwen2-7b_math_megatron_lora.sh: type lora (fused linear_qkv / linear_fc1), kaiming A
  config = resolved(experiment("grpo"), [*MEGATRON_LORA, "actor_rollout_ref.model.lora.lora_A_init_method=kaiming"])
  model = config.actor_rollout_ref.model
  assert (model.lora_rank, model.lora_alpha) == (16, 32.0)
  assert list(model.target_modules) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  fused = lora.LoRAConfig.from_model_config(model)
  assert fused.shared_a == (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
  assert (fused.a_init, fused.megatron, fused.rank, fused.alpha) == ("kaiming", True, 16, 32.0)
  canonical = resolved(experiment("grpo"), [
      *MEGATRON_LORA, "actor_rollout_ref.model.lora.type=canonical_lora",
      "actor_rollout_ref.model.lora.target_modules=[linear_q,linear_v,linear_fc1_up]"]).actor_rollout_ref.model
  assert list(canonical.target_modules) == ["q_proj", "v_proj", "up_proj"]
  assert lora.LoRAConfig.from_model_config(canonical).shared_a == ()
  assert lora.LoRAConfig.from_model_config(canonical).a_init == "xavier"
  assert "actor_rollout_ref.model.lora.merge=True" in C.ignored_overrides(
      [*MEGATRON_LORA, "actor_rollout_ref.model.lora.merge=true"])
  assert not any("lora.rank" in o or "lora.alpha" in o for o in C.ignored_overrides(MEGATRON_LORA))


@pytest.mark.parametrize("overrides,message", [
    (["actor_rollout_ref.model.lora.rank=16"],
     "lora.rank=16: is read only by verl's Megatron engine; with actor_rollout_ref.actor.strategy=fsdp"),
    ([*MEGATRON_LORA, "actor_rollout_ref.model.lora.type=dora"], "lora.type='dora': is not implemented"),
    ([*MEGATRON_LORA, "actor_rollout_ref.model.lora.type=canonical_lora"],
     "canonical_lora adapts Megatron's linear_q, linear_k, linear_v"),
    ([*MEGATRON_LORA, "actor_rollout_ref.model.lora.dropout_position=post"],
     "lora.dropout_position='post': dropout after the adapter is not implemented"),
    ([*MEGATRON_LORA, "actor_rollout_ref.model.lora.exclude_modules=[decoder.layers.0.self_attention.linear_qkv]"],
     "exclusions by Megatron module name are not implemented"),
    ([*MEGATRON_LORA, "actor_rollout_ref.model.lora_rank=8"], "conflicts with actor_rollout_ref.model.lora_rank=8"),
    ([*MEGATRON_LORA, "actor_rollout_ref.model.use_rslora=true"],
     "use_rslora=True: is a PEFT key that verl's Megatron LoRA does not read"),
])
def test_megatron_lora_block_names_what_rljax_does_not_do(overrides, message):
  assert message in error_text(overrides)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_group_estimator_with_one_response_per_prompt_runs_as_verl_runs_it_with_a_warning(estimator, caplog):
  # verl's rollout_correction examples run rloo and grpo with rollout.n=1: each prompt is a singleton group
  config_mapping._WARNED.discard(f"singleton groups of {estimator}")  # warned once per process: maybe already
  with caplog.at_level(logging.WARNING, logger="rljax.config"):
    config = resolved(experiment("grpo"), [f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=1",
                                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"])
  assert config.actor_rollout_ref.rollout.n == 1
  assert f"actor_rollout_ref.rollout.n=1: algorithm.adv_estimator={estimator} compares the responses" in caplog.text


def test_reward_manager_name_is_verls_newer_name_of_reward_models_reward_manager():
  config = resolved(experiment("grpo"), ["reward_manager.name=dapo"])
  assert config.reward_model.reward_manager == "dapo"
  assert resolved(experiment("grpo"), ["reward_model.reward_manager=prime"]).reward_manager.name == "prime"


@pytest.mark.parametrize("override,problem", [
    ("global_profiler.steps=[0]", "must be a list of step numbers"),
    ("actor_rollout_ref.actor.optim.optimizer=SGD", "rljax's optimizer is optax's AdamW"),
    ("actor_rollout_ref.actor.optim.lr_decay_style=cosine", "is read by verl's Megatron engine only"),
    # verl 0.6-0.7's rollout-correction keys, removed in verl 0.9: never silently dropped
    ("algorithm.rollout_correction.rollout_rs_threshold_lower=0.5",
     "rollout_rs_threshold_lower=0.5: verl 0.9 removed it with the token, sequence and geometric rejection modes"),
    ("algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
     "rollout_token_veto_threshold=0.0001: verl 0.9 removed the per-token veto"),
    ("algorithm.rollout_correction.use_policy_gradient=true",
     "Fix: drop it and set algorithm.rollout_correction.loss_type=reinforce"),
])
def test_verl_values_rljax_does_not_implement_are_errors(override, problem):
  assert problem in error_text([override])


def test_optimizer_names_meaning_adamw_are_accepted_and_betas_reach_it():
  for name in ("AdamW", "adam"):
    resolved(experiment("grpo"), [f"actor_rollout_ref.actor.optim.optimizer={name}", f"critic.optim.optimizer={name}"])
  config = resolved(experiment("grpo"), ["actor_rollout_ref.actor.optim.betas=[0.5,0.6]"])
  assert list(config.actor_rollout_ref.actor.optim.betas) == [0.5, 0.6]
  assert C.ignored_reason("actor_rollout_ref.actor.optim.betas") is None


def test_engine_and_megatron_knobs_are_accepted_and_listed_as_ignored():
  overrides = ["actor_rollout_ref.nccl_timeout=1200", "actor_rollout_ref.actor.megatron.param_offload=true",
               "actor_rollout_ref.actor.fsdp_config.use_orig_params=true", "critic.profiler.tool=nsys",
               "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
               "reward_model.rollout.gpu_memory_utilization=0.8", "actor_rollout_ref.rollout.layered_summon=true"]
  resolved(experiment("grpo"), overrides)
  listed = [text.split("=")[0] for text in C.ignored_overrides(overrides)]
  assert listed == [text.lstrip("+").split("=")[0] for text in overrides]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engines_kv_cache_dtype_is_read_as_rollout_kv_cache_dtype(engine):
  """vLLM's and SGLang's engine argument sets the 8-bit cache (not listed as ignored); a value rljax's cache does
  not store, or one conflicting with rollout.kv_cache_dtype on the same line, is an error naming the key."""
  key = f"actor_rollout_ref.rollout.engine_kwargs.{engine}.kv_cache_dtype"
  assert resolved(experiment("grpo"), [f"+{key}=fp8_e5m2"]).actor_rollout_ref.rollout.kv_cache_dtype == "fp8_e5m2"
  assert C.ignored_overrides([f"+{key}=fp8"]) == []
  assert f"{key}='fp8_inc': must be one of auto, int8, fp8" in error_text([f"+{key}=fp8_inc"])
  assert "conflicts with actor_rollout_ref.rollout.kv_cache_dtype='int8'" in error_text(
      [f"+{key}=fp8", "actor_rollout_ref.rollout.kv_cache_dtype=int8"])
  same = resolved(experiment("grpo"), [f"+{key}=int8", "actor_rollout_ref.rollout.kv_cache_dtype=int8"])
  assert same.actor_rollout_ref.rollout.kv_cache_dtype == "int8"


@pytest.mark.parametrize("name", ["sglang", "trtllm", "hf", "jetstream"])
def test_every_verl_inference_server_name_resolves_as_vllm_does(name):
  # The engine reads no rollout.name: every server name verl accepts leaves the rest of the run as vllm does
  vllm = resolved(experiment("grpo"), ["actor_rollout_ref.rollout.name=vllm"]).to_dict()
  other = resolved(experiment("grpo"), [f"actor_rollout_ref.rollout.name={name}"]).to_dict()
  assert other["actor_rollout_ref"]["rollout"].pop("name") == name
  vllm["actor_rollout_ref"]["rollout"].pop("name")
  assert other == vllm
  engine_kwarg = f"+actor_rollout_ref.rollout.engine_kwargs.{name}.some_arg=1"
  if name in ("sglang", "trtllm"):
    assert C.ignored_overrides([engine_kwarg]) == [engine_kwarg.lstrip("+")]


def test_megatron_tensor_size_counts_in_the_filled_micro_batch():
  # 8 devices, tensor 2 via Megatron's key: 4 data-parallel devices share the 16-row mini-batch
  config = resolved(experiment("grpo"), ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                         "actor_rollout_ref.rollout.n=4", "data.train_batch_size=4"], devices=8)
  assert config.actor_rollout_ref.actor.tensor_model_parallel_size == 2
  assert config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4


@pytest.mark.parametrize("overrides,match", [
    (["actor_rollout_ref.actor.router_replay.mode=R3"], "router_replay.mode='R3': R3 replays the rollout's routing, "
                                                         "which the rollout records only with"),
    (["actor_rollout_ref.actor.router_replay.mode=R1"], "router_replay.mode='R1': must be one of"),
    (["actor_rollout_ref.ref.router_replay.mode=R2"], "ref.router_replay.mode='R2': the reference pass follows"),
    (["actor_rollout_ref.rollout.enable_rollout_routing_replay=true"], "is replayed only by .*router_replay.mode=R3"),
    (["actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=true"],
     "freeze_moe_router=True: is read by verl's Megatron engine only; with actor_rollout_ref.actor.strategy=fsdp"),
    (["+actor_rollout_ref.actor.megatron.override_mcore_model_config.moe_config.freeze_moe_router=true"],
     "megatron.override_mcore_model_config.moe_config.freeze_moe_router=True: is read by verl's Megatron engine only"),
    (["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
      "+critic.megatron.override_mcore_model_config.moe_config.freeze_moe_router=true"],
     "freezing a mixture-of-experts critic's routers is not implemented"),
])
def test_router_replay_values_rljax_does_not_implement_are_errors(overrides, match):
  with pytest.raises(C.ConfigError, match=match):
    resolved(experiment("grpo"), overrides)
  assert resolved(experiment("grpo"), ["actor_rollout_ref.actor.router_replay.mode=R2"])
  assert resolved(experiment("grpo"), ["actor_rollout_ref.actor.router_replay.mode=R3",
                                       "actor_rollout_ref.rollout.enable_rollout_routing_replay=true"])


def test_qwen3_moe_preset_splits_its_experts_over_the_expert_axis():
  config = resolved(experiment("grpo", "qwen3_30b_a3b_gsm8k"), devices=32)
  assert sharding.mesh_shape(config, 32) == {"data": 1, "fsdp": 4, "tensor": 1, "sequence": 1, "expert": 8}


def test_multi_turn_keys_are_checked_and_verl_s_older_names_map(tmp_path, caplog):
  from rljax import agents
  assert [set(x) for x in (C.TOOL_CALL_FORMATS, C.TRUNCATE_SIDES, C.SANITY_CHECK_MODES)] == [
      set(x) for x in (agents.FORMATS, agents.TRUNCATE_SIDES, agents.SANITY_MODES)]
  on = ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true"]
  with pytest.raises(C.ConfigError, match="data.return_raw_chat=False: multi-turn"):
    resolved(experiment("grpo"), on[:1])
  with pytest.raises(C.ConfigError, match=r"multi_turn.format='json': must be one of hermes, llama3_json, mistral"):
    resolved(experiment("grpo"), on + ["actor_rollout_ref.rollout.multi_turn.format=json"])
  with pytest.raises(C.ConfigError, match=r"multi_turn.tool_config_path='/nope.yaml': is not a file"):
    resolved(experiment("grpo"), on + ["actor_rollout_ref.rollout.multi_turn.tool_config_path=/nope.yaml"])
  with pytest.raises(C.ConfigError, match=r"max_assistant_turns=0: must be null or an integer >= 1"):
    resolved(experiment("grpo"), on + ["actor_rollout_ref.rollout.multi_turn.max_turns=0"])
  with pytest.raises(C.ConfigError, match="enable_rollout_routing_replay=True: the engine does not record"):
    resolved(experiment("grpo"), on + ["actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
                                       "actor_rollout_ref.actor.router_replay.mode=R3"])
  config = resolved(experiment("grpo"), on + ["actor_rollout_ref.rollout.multi_turn.max_turns=4",
                                              "actor_rollout_ref.rollout.multi_turn.enable_tokenization_sanity_check=false"])
  node = config.actor_rollout_ref.rollout.multi_turn
  assert node.max_assistant_turns == 4 and node.tokenization_sanity_check_mode == "disable"


@pytest.mark.parametrize("devices", [1, 8])
def test_the_tool_experiment_validates(devices):
  config = resolved(C.load_config_file(str(ROOT / "configs" / "grpo_tool.py")), devices=devices)
  node = config.actor_rollout_ref.rollout.multi_turn
  assert node.enable and os.path.isfile(node.tool_config_path) and config.data.tool_config_path == node.tool_config_path
  with pytest.raises(C.ConfigError, match="this experiment has no presets"):
    C.load_config_file(str(ROOT / "configs" / "grpo_tool.py") + ":qwen2_5_0_5b_gsm8k")


def test_ulysses_groups_lie_inside_verls_fsdp_group():
  # verl: fsdp_size=32 with Ulysses 4 on 64 devices is 2 FSDP groups of 32, each 8 Ulysses groups of 4
  config = resolved(experiment("grpo"), ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
                                         "actor_rollout_ref.actor.fsdp_config.fsdp_size=32",
                                         "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
                    devices=64)
  assert sharding.mesh_shape(config, 64) == {"data": 2, "fsdp": 8, "tensor": 1, "sequence": 4, "expert": 1}
  text = error_text(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
                     "actor_rollout_ref.actor.fsdp_config.fsdp_size=6"], devices=64)
  assert "fsdp_size=6: does not divide the 16 devices left" in text and "holds the Ulysses groups" in text


def test_a_token_budget_per_device_holds_a_sequence_over_its_ulysses_group():
  # verl: 2048 + 20480 tokens with 11264 per GPU and Ulysses 2 (22528 tokens per sequence-parallel group)
  lengths = ["data.max_prompt_length=2048", "data.max_response_length=20480",
             "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=11264"]
  ulysses = "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
  resolved(experiment("grpo"), [*lengths, ulysses], devices=8)
  assert ">= 22528" in error_text(lengths, devices=8)
  text = error_text([*lengths, ulysses, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=11000"], devices=8)
  assert "ppo_max_token_len_per_gpu=11000: must hold a device's share of one whole sequence" in text
  assert ">= 11264" in text


def test_activation_offload_keeps_layer_inputs_so_it_needs_full_remat():
  config = experiment("grpo")
  for key, value in (("actor_rollout_ref.model.enable_activation_offload", True),
                     ("actor_rollout_ref.model.enable_gradient_checkpointing", True),
                     ("actor_rollout_ref.model.remat_policy", "dots")):
    C.set_value(config, key, value)
  with pytest.raises(C.ConfigError, match=r"actor_rollout_ref\.model\.enable_activation_offload=True: keeps each "
                                          r"layer's input alone in host memory, which needs remat_policy=full"):
    resolved(config)
  C.set_value(config, "actor_rollout_ref.model.remat_policy", "full")
  assert C.ignored_reason("actor_rollout_ref.model.enable_activation_offload") is None


def test_a_micro_batch_size_caps_a_devices_micro_batch():
  from rljax.rl import layout  # pylint: disable=import-outside-toplevel
  config = resolved(experiment("grpo"), ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"])
  # (mini-batch rows, data-parallel devices) -> micro-batches: 32 rows on a device take the most within 5 that
  # divide 32 (4): 8 micro-batches; 4 rows a device, fewer than 5, one
  assert [layout.micro_batch_count(config, rows, dp, 64) for rows, dp in ((32, 1), (32, 8), (30, 1))] == [8, 1, 6]


def test_calculate_sum_pi_squared_is_read_by_the_optimal_token_baselines_alone():
  """Under an optimal token baseline the switch is honoured (and required); under any other estimator nothing reads
  the sum, so the key is listed as ignored."""
  switch = "actor_rollout_ref.actor.calculate_sum_pi_squared=true"
  for estimator, listed in (("grpo", [switch.replace("true", "True")]), ("optimal_token_baseline", []),
                            ("tir_optimal_token_baseline", [])):
    overrides = [f"algorithm.adv_estimator={estimator}", switch]
    assert C.ignored_overrides(overrides, resolved(experiment("grpo"), overrides)) == listed
  assert "set actor_rollout_ref.actor.calculate_sum_pi_squared=true" in error_text(
      ["algorithm.adv_estimator=optimal_token_baseline"])
