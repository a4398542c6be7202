"""GRPO (verl's `algorithm.adv_estimator=grpo` recipe): group-normalised
outcome advantages, KL to the reference policy as a loss term.

Presets: `configs/grpo.py` (SmolLM2-135M on the offline arithmetic task, CPU)
and `configs/grpo.py:qwen2_5_0_5b_gsm8k` (verl's GSM8K example, TPU VM).
"""

from rljax.presets import experiment


def get_config(arg=None):
  return experiment("grpo", arg, {
      "algorithm.adv_estimator": "grpo",
      "algorithm.use_kl_in_reward": False,
      "actor_rollout_ref.actor.use_kl_loss": True,
      "actor_rollout_ref.actor.kl_loss_coef": 0.001,
      "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
      "actor_rollout_ref.actor.entropy_coeff": 0.0,
  })
