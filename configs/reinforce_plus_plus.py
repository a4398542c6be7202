"""REINFORCE++: discounted returns whitened over the batch, KL as a loss term
with the k2 (mse) estimator (verl's REINFORCE++ example).
"""

from rljax.presets import experiment


def get_config(arg=None):
  return experiment("reinforce_plus_plus", arg, {
      "algorithm.adv_estimator": "reinforce_plus_plus",
      "algorithm.use_kl_in_reward": False,
      "actor_rollout_ref.actor.use_kl_loss": True,
      "actor_rollout_ref.actor.kl_loss_coef": 0.001,
      "actor_rollout_ref.actor.kl_loss_type": "mse",
  })
