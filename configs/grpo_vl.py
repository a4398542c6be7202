"""GRPO on images (verl's Qwen2.5-VL and Qwen3-VL recipes): group-normalised outcome advantages, KL to the reference policy as
a loss term (the preset's coefficient: 0.01 in verl's example), prompts with images (`data.image_key`).

Presets: `configs/grpo_vl.py` (the offline shapes task on a tiny Qwen2.5-VL that `benchmarks/visual_task.py`
builds and warm-starts, CPU), `configs/grpo_vl.py:qwen2_5_vl_7b_geo3k` and `configs/grpo_vl.py:qwen3_vl_8b_geo3k`
(verl's geometry3k examples, TPU VM).
"""

from rljax.presets import experiment


def get_config(arg=None):
  return experiment("grpo_vl", arg or "tiny_vl_shapes", {
      "algorithm.adv_estimator": "grpo",
      "algorithm.use_kl_in_reward": False,
      "actor_rollout_ref.actor.use_kl_loss": True,
      "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
      "actor_rollout_ref.actor.entropy_coeff": 0.0,
  })
