"""Offline generation (verl's main_generation): responses to the prompts of a parquet file.

With no argument, SmolLM2-135M-Instruct answers the offline arithmetic test
set (written on first use under ~/data/rljax/arithmetic/) with 4 samples per
prompt on the local devices, and writes test-responses.parquet beside it,
which configs/eval.py scores. `model.checkpoint=RUN_DIR` generates with a
trained actor instead (e.g. checkpoints/rljax/grpo_smollm2_arithmetic).
"""

from rljax import config as config_lib
from rljax.evaluation import get_generate_config
from rljax.presets import SYNTHETIC_DIR


def get_config(arg=None):
  if arg:
    raise config_lib.ConfigError("--config", f":{arg}", "configs/generate.py has no presets",
                                 "drop the ':ARG' and set keys with overrides")
  config = get_generate_config()
  config_lib.apply_overrides(config, [
      f"data.path={SYNTHETIC_DIR}/test.parquet",
      "data.n_samples=4",
      "data.batch_size=64",
      "model.path=smollm2-135m-instruct",
      "rollout.name=jetstream",
      "rollout.top_k=-1",
      "rollout.top_p=1.0",
      "rollout.prompt_length=64",
      "rollout.response_length=32",
      "rollout.dtype=float32",
      "rollout.max_num_seqs=64",
      "trainer.n_gpus_per_node=auto",
  ])
  return config
