"""Supervised fine-tuning with verl's sft_trainer keys: `python -m rljax.sft --config=configs/sft.py`.

get_sft_config / finalize / validate build and check the SFT config tree
(`rljax.sft.keys` describes its keys); SFTDataset turns parquet rows into
examples with response-only loss masks;
`rljax.sft.packing` lays examples out as rows (packed or not);
`rljax.sft.step` holds the loss and the jitted steps; `rljax.sft.trainer`
(SFTTrainer, run) joins them with the checkpoints, tracking and outer loop that
RL training shares (`rljax.training`). The trainer is imported from its module, so reading and checking a
config (`--dry_run`) does not load the training stack.
"""

from rljax.sft.config import export_view, finalize, get_sft_config, optim_view, validate
from rljax.sft.data import SFTDataset, multi_turn_example, single_turn_example, truncate_example

__all__ = [
    "SFTDataset", "export_view", "finalize", "get_sft_config", "multi_turn_example", "optim_view",
    "single_turn_example", "truncate_example", "validate",
]
