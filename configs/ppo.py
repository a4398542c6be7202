"""PPO with a critic and GAE (verl's default `adv_estimator=gae`).

The critic starts from the actor's weights (`critic.model.path` follows
`actor_rollout_ref.model.path`) and has its own optimizer under `critic.optim`.
One response per prompt, so the batch holds twice the prompts of GRPO's.
"""

from rljax.presets import experiment


def get_config(arg=None):
  config = experiment("ppo", arg, {
      "algorithm.adv_estimator": "gae",
      "algorithm.gamma": 1.0,
      "algorithm.lam": 1.0,
      "actor_rollout_ref.rollout.n": 1,
      "actor_rollout_ref.actor.use_kl_loss": False,
      "critic.optim.lr": 1e-5,
      "critic.cliprange_value": 0.5,
  })
  config.data.train_batch_size *= 2
  config.actor_rollout_ref.actor.ppo_mini_batch_size *= 2
  actor = config.actor_rollout_ref.actor
  if actor.ppo_micro_batch_size_per_gpu is not None:
    actor.ppo_micro_batch_size_per_gpu = min(actor.ppo_micro_batch_size_per_gpu, actor.ppo_mini_batch_size)
  return config
