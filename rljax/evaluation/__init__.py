"""Offline generation and evaluation: verl's two-step offline evaluation.

    python -m rljax.generate --config=configs/generate.py   # prompts -> responses parquet
    python -m rljax.eval --config=configs/eval.py           # responses -> scores, pass@k, JSON

`config` holds the two config trees (verl's generation.yaml and
evaluation.yaml keys) and their checks, `keys` a record per key of each;
`generation` (imported on its own: it brings in JAX and the engine) and
`scoring` the steps and each tool's `run(config)`; `table` the parquet
helpers; `cli` the shared command line.
"""

from rljax.evaluation.config import get_eval_config
from rljax.evaluation.config import get_generate_config
from rljax.evaluation.config import validate_eval
from rljax.evaluation.config import validate_generate
from rljax.evaluation.scoring import evaluate
from rljax.evaluation.scoring import group_metrics
from rljax.evaluation.scoring import pass_at
from rljax.evaluation.scoring import source_metrics
from rljax.evaluation.table import RESPONSES_COLUMN

__all__ = [
    "RESPONSES_COLUMN",
    "evaluate",
    "get_eval_config",
    "get_generate_config",
    "group_metrics",
    "pass_at",
    "source_metrics",
    "validate_eval",
    "validate_generate",
]
