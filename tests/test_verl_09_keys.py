"""verl 0.9.1's own key spellings on a launch line: the keys it moved (critic engine, Megatron router replay),
its new defaults, and its new features refused by name."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax import config as C
from rljax import train
from rljax.config import verl_yaml
from rljax.models import CausalLM, ModelConfig
from rljax.rl import steps
from rljax.rl.critic import ValueModel
from rljax.rl.experience import Experience
from tests.test_config import experiment


def resolved(*overrides, name="grpo"):
  return train.resolve(experiment(name), list(overrides), device_count=1)


def test_keys_verl_09_moved_land_where_rljax_reads_them():
  config = resolved("critic.fsdp.param_offload=true", "critic.fsdp.model_dtype=bf16",
                    "actor_rollout_ref.actor.megatron.router_replay.mode=R2", "data.gen_batch_size=null",
                    "reward.reward_manager.name=dapo", "+reward.reward_kwargs.overlong_buffer_cfg.len=4",
                    name="ppo")
  assert config.critic.model.fsdp_config.param_offload and config.critic.model.fsdp_config.model_dtype == "bf16"
  assert config.actor_rollout_ref.actor.router_replay.mode == "R2"
  assert config.data.gen_batch_size == config.data.train_batch_size
  assert config.reward_model.reward_manager == "dapo" and config.reward_model.overlong_buffer.len == 4


def test_verl_09_defaults():
  base = C.get_base_config()
  assert base.algorithm.filter_groups.metric == "reward" and base.critic.model.use_remove_padding
  assert base.actor_rollout_ref.rollout.calculate_log_probs and base.actor_rollout_ref.actor.optim.zero_indexed_step
  mtp = base.actor_rollout_ref.model.mtp
  assert (mtp.speculative_num_steps, mtp.speculative_eagle_topk) == (3, 1)
  assert resolved("algorithm.filter_groups.enable=true").algorithm.filter_groups.metric == "reward"


@pytest.mark.parametrize("override, key", [
    ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "actor_rollout_ref.actor.fsdp_config.qat.enable"),
    ("critic.fsdp.qat.enable=true", "critic.model.fsdp_config.qat.enable"),
    ("critic.megatron.qat.enable=true", "critic.megatron.qat.enable"),
    ("actor_rollout_ref.actor.optim.exp_avg_dtype=bf16", "actor_rollout_ref.actor.optim.exp_avg_dtype"),
    ("distillation.enabled=true", "distillation.enabled"),
    ("skip.rollout.enable=true", "skip.rollout.enable"),
    ("trainer.checkpoint_callback_class=my.Callback", "trainer.checkpoint_callback_class"),
    ("critic.model.lora_adapter_path=/tmp/adapter", "critic.model.lora_adapter_path"),
    ("algorithm.filter_groups.max_inflight_gen_batches=2", "algorithm.filter_groups.max_inflight_gen_batches"),
])
def test_verl_09_features_rljax_lacks_are_config_errors_naming_the_key(override, key):
  with pytest.raises(C.ConfigError, match=key.replace(".", r"\.")):
    resolved(override, name="ppo")


def test_nested_oc_select_defaults_resolve_to_the_first_key_present(tmp_path):
  path = tmp_path / "nested.yaml"
  path.write_text("actor_rollout_ref:\n  rollout:\n    top_k: ${oc.select:missing.key,${oc.select:data.seed,7}}\n"
                  "  ref:\n    megatron:\n      override_transformer_config: "
                  "${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}\n"
                  "data:\n  seed: 5\n")
  config = verl_yaml.load_file(str(path))
  assert config.actor_rollout_ref.rollout.top_k == 5
  assert config.actor_rollout_ref.ref.megatron.override_transformer_config.attention_backend == "flash"


def test_verl_09_legacy_reward_keys_at_null_keep_rljax_defaults(tmp_path):
  path = tmp_path / "legacy.yaml"
  path.write_text("reward_model:\n  reward_manager: null\n  enable: null\ncustom_reward_function:\n  name: null\n"
                  "reward:\n  reward_manager:\n    name: prime\n")
  config = verl_yaml.load_file(str(path))
  assert config.reward_manager.name == "prime" and config.reward_model.enable is False
  assert config.custom_reward_function.name == "compute_score"


def test_legacy_reward_keys_a_file_sets_win_over_verl_09s_reward_node(tmp_path):
  path = tmp_path / "both.yaml"  # verl 0.9's migrate_legacy_reward_impl copies the set legacy values over
  path.write_text("custom_reward_function:\n  path: /tmp/my_reward.py\n  name: null\nreward_model:\n  enable: true\n"
                  "reward:\n  custom_reward_function:\n    path: null\n  reward_model:\n    enable: false\n"
                  "    model_path: /tmp/rm\n")
  config = verl_yaml.load_file(str(path))
  assert config.custom_reward_function.path == "/tmp/my_reward.py" and config.reward_model.enable is True
  assert config.reward_model.model.path == "/tmp/rm"  # set only under reward: taken from there


def test_glms_observation_token_ends_a_turn_where_tools_are_called():
  import tokenizers  # pylint: disable=import-outside-toplevel
  from rljax.models.tokenizer import Tokenizer  # pylint: disable=import-outside-toplevel
  from rljax.rollout import factory  # pylint: disable=import-outside-toplevel
  vocab = {"<eos>": 0, "<|observation|>": 1, "a": 2}
  tokenizer = Tokenizer(tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="a")), eos_token="<eos>")
  model_config = ModelConfig(eos_token_id=0)
  assert factory.stop_ids(tokenizer, model_config) == factory.stop_ids(tokenizer, model_config, "hermes") == (0,)
  assert factory.stop_ids(tokenizer, model_config, "glm") == (0, 1)


def test_the_critic_loss_divides_seq_mean_token_sum_norm_by_its_loss_scale_factor():
  cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=8)
  graphdef, params = nnx.split(ValueModel(CausalLM(cfg, nnx.Rngs(0)), nnx.Rngs(1)))
  ids = np.arange(2 * 6, dtype=np.int32).reshape(2, 6) % 32
  batch = Experience(input_ids=ids, attention_mask=np.ones_like(ids), positions=np.tile(np.arange(6), (2, 1)),
                     responses=ids[:, 2:], response_mask=np.ones((2, 4), np.int32),
                     values=np.zeros((2, 4), np.float32), returns=np.ones((2, 4), np.float32))
  info = {"dp_size": 1, "batch_num_tokens": jnp.asarray(8), "global_batch_size": 2}
  critic = C.get_base_config().critic
  critic.loss_agg_mode = "seq-mean-token-sum-norm"
  losses = []
  for factor in (None, 2.0):
    critic.loss_scale_factor = factor
    losses.append(float(steps.critic_loss(graphdef, critic, 1)(params, batch, info, None)[0]))
  assert losses[1] == pytest.approx(losses[0] * 4 / 2.0, rel=1e-6)  # divisor: the response length 4, then 2
