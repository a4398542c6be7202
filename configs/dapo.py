"""DAPO: GRPO advantages with clip-higher (0.2 / 0.28), token-mean loss
aggregation, the soft overlong penalty on reward, no KL term, and dynamic
sampling.

The overlong buffer is the last quarter of the response length (DAPO's
4096 of 20480 tokens, scaled), with penalty factor 1.0. Dynamic sampling
as verl's DAPO recipe sets it: each generation round samples 3 x
train_batch_size prompts (`data.gen_batch_size`), groups whose responses are
all right or all wrong (`acc`) are dropped, and rounds repeat (at most 10)
until train_batch_size groups are kept.
"""

from rljax.presets import experiment


def get_config(arg=None):
  config = experiment("dapo", arg, {
      "algorithm.adv_estimator": "grpo",
      "algorithm.use_kl_in_reward": False,
      "actor_rollout_ref.actor.use_kl_loss": False,
      "actor_rollout_ref.actor.kl_loss_coef": 0.0,
      "actor_rollout_ref.actor.clip_ratio_low": 0.2,
      "actor_rollout_ref.actor.clip_ratio_high": 0.28,
      "actor_rollout_ref.actor.clip_ratio_c": 10.0,
      "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
      "actor_rollout_ref.actor.entropy_coeff": 0.0,
      "reward_model.reward_manager": "dapo",
      "reward_model.overlong_buffer.enable": True,
      "reward_model.overlong_buffer.penalty_factor": 1.0,
  })
  config.reward_model.overlong_buffer.len = config.data.max_response_length // 4
  config.algorithm.filter_groups.enable = True
  config.algorithm.filter_groups.metric = "acc"
  config.algorithm.filter_groups.max_num_gen_batches = 10
  config.data.gen_batch_size = config.data.get_ref("train_batch_size") * 3
  return config
