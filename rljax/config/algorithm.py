"""verl's `algorithm` node: advantage estimator, KL penalty in the reward, rollout correction."""

from __future__ import annotations

from ml_collections import ConfigDict

from rljax.config.fields import any_value, follow, null, older_rollout_is


def build_algorithm() -> ConfigDict:
  """verl's `algorithm` node."""
  return ConfigDict({
      "gamma": 1.0,
      "lam": 1.0,
      "adv_estimator": "gae",
      "norm_adv_by_std_in_grpo": True,
      "unbiased_advantage": False,
      "gdpo_reward_keys": [],
      "gdpo_reward_weights": null(list),
      "use_kl_in_reward": False,
      "kl_penalty": "kl",
      "kl_ctrl": {
          "type": "fixed",
          "kl_coef": 0.005,
          "horizon": 10000,
          "target_kl": 0.1,
      },
      "use_pf_ppo": False,
      "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0},
      "filter_groups": {"enable": False, "metric": "reward", "max_num_gen_batches": 0, "max_inflight_gen_batches": 1},
      **older_rollout_is(),
      "rollout_correction": {
          "rollout_is": null(str),
          "rollout_is_threshold": any_value(2.0),
          "rollout_is_batch_normalize": False,
          "rollout_rs": null(str),
          "rollout_rs_threshold": any_value(None),
          "bypass_mode": False,
          "loss_type": "ppo_clip",
          # verl 0.6-0.7 keys that verl 0.9 removed: accepted at their defaults only (keys.py says why)
          "rollout_rs_threshold_lower": null(float),
          "rollout_token_veto_threshold": null(float),
          "use_policy_gradient": False,
      },
  })


def build_policy_rollout_correction(source: ConfigDict) -> ConfigDict:
  """`actor.policy_loss.rollout_correction`: follows `algorithm.rollout_correction` (bypass mode reads it)."""
  node = ConfigDict()
  for key in ("loss_type", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
              "rollout_rs_threshold", "bypass_mode"):
    node[key] = follow(source, key)
  return node
