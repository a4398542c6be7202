"""Pure JAX RL kernels with verl's names and numbers.

Advantage estimators (`get_adv_estimator`), policy losses (`get_policy_loss`),
loss aggregation (`agg_loss`), KL penalties and controllers, the value loss,
entropy, and rollout correction. Nothing here imports the rest of rljax.
"""

from rljax.algos.advantages import (
    AdvantageInputs, EstimatorInputs, adv_estimator_names, compute_advantage, compute_gae_advantage_return,
    compute_gdpo_outcome_advantage, compute_gpg_outcome_advantage, compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage, compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage, compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage, compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage, compute_rloo_outcome_advantage, compute_rloo_vectorized_outcome_advantage,
    estimator, estimator_inputs, get_adv_estimator,
)
from rljax.algos.agg import LOSS_AGG_MODES, agg_loss, global_batch_info
from rljax.algos.entropy import (
    compute_entropy_loss, entropy_from_logits, entropy_from_logits_with_chunking, logprobs_from_logits,
)
from rljax.algos.kl import (
    AdaptiveKLController, FixedKLController, apply_kl_penalty, compute_rewards, get_kl_controller, kl_penalty,
    kl_penalty_full,
)
from rljax.algos.masked import group_mean_std, masked_mean, masked_sum, masked_var, masked_whiten
from rljax.algos.policy_loss import PolicyInputs, get_policy_loss, positive_nll_loss, ppo_loss
from rljax.algos.registry import POLICY_LOSS_REGISTRY
from rljax.algos.rollout_corr import (
    compute_offpolicy_metrics, compute_rollout_correction_and_rejection_mask, compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from rljax.algos.value_loss import compute_value_loss

__all__ = [
    "AdaptiveKLController",
    "AdvantageInputs",
    "EstimatorInputs",
    "FixedKLController",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "PolicyInputs",
    "adv_estimator_names",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_offpolicy_metrics",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_value_loss",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "estimator",
    "estimator_inputs",
    "get_adv_estimator",
    "get_kl_controller",
    "get_policy_loss",
    "global_batch_info",
    "group_mean_std",
    "kl_penalty",
    "kl_penalty_full",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "positive_nll_loss",
    "ppo_loss",
]
