"""Offline evaluation (verl's main_eval): scores, mean@k and pass@k per data source.

With no argument, scores the file configs/generate.py writes by default
(~/data/rljax/arithmetic/test-responses.parquet) with the built-in rule
rewards, and writes test-responses-eval.json beside it.
"""

from rljax import config as config_lib
from rljax.evaluation import get_eval_config
from rljax.presets import SYNTHETIC_DIR


def get_config(arg=None):
  if arg:
    raise config_lib.ConfigError("--config", f":{arg}", "configs/eval.py has no presets",
                                 "drop the ':ARG' and set keys with overrides")
  config = get_eval_config()
  config_lib.apply_overrides(config, [f"data.path={SYNTHETIC_DIR}/test-responses.parquet"])
  return config
