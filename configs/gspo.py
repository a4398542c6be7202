"""GSPO: sequence-level importance ratios (geometric mean of token ratios)
with tight clipping, sequence-mean-token-mean aggregation, no KL term
(verl's GSPO recipe: clip_ratio_low 3e-4, clip_ratio_high 4e-4).
"""

from rljax.presets import experiment


def get_config(arg=None):
  return experiment("gspo", arg, {
      "algorithm.adv_estimator": "grpo",
      "algorithm.use_kl_in_reward": False,
      "actor_rollout_ref.actor.use_kl_loss": False,
      "actor_rollout_ref.actor.kl_loss_coef": 0.0,
      "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
      "actor_rollout_ref.actor.clip_ratio_low": 0.0003,
      "actor_rollout_ref.actor.clip_ratio_high": 0.0004,
      "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
  })
