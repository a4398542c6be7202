"""RLOO: leave-one-out baseline over the n responses of each prompt, with
the KL to the reference policy folded into the reward (verl's RLOO example).
"""

from rljax.presets import experiment


def get_config(arg=None):
  return experiment("rloo", arg, {
      "algorithm.adv_estimator": "rloo",
      "algorithm.use_kl_in_reward": True,
      "algorithm.kl_penalty": "kl",
      "algorithm.kl_ctrl.kl_coef": 0.001,
      "actor_rollout_ref.actor.use_kl_loss": False,
  })
