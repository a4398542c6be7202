"""Rewards: rule scorers (verl's gsm8k, MATH, DAPO, numina, geometry3k and
Search-R1 scorers, and the synthetic task; see `rljax.rewards.default`),
user functions from files, and the reward managers that turn a batch of
responses into token-level rewards (see `rljax.rewards.managers` for the
call signature).
"""

from rljax.rewards.custom import FileFunction
from rljax.rewards.default import check_data_sources
from rljax.rewards.default import default_compute_score
from rljax.rewards.default import has_builtin_scorer
from rljax.rewards.default import known_data_sources
from rljax.rewards.managers import BatchRewardManager
from rljax.rewards.managers import DAPORewardManager
from rljax.rewards.managers import load_compute_score
from rljax.rewards.managers import make_reward_manager
from rljax.rewards.managers import MANAGERS
from rljax.rewards.managers import NaiveRewardManager
from rljax.rewards.managers import overlong_penalty
from rljax.rewards.managers import PrimeRewardManager
from rljax.rewards.managers import RewardManager
from rljax.rewards.managers import RewardResult

__all__ = [
    "BatchRewardManager",
    "DAPORewardManager",
    "FileFunction",
    "MANAGERS",
    "NaiveRewardManager",
    "PrimeRewardManager",
    "RewardManager",
    "RewardResult",
    "check_data_sources",
    "default_compute_score",
    "has_builtin_scorer",
    "known_data_sources",
    "load_compute_score",
    "make_reward_manager",
    "overlong_penalty",
]
