"""A verl `ppo_trainer.yaml`-style file as the experiment.

    python -m rljax.train --config=configs/verl_yaml.py:path/to/ppo_trainer.yaml [KEY=VALUE ...]

The YAML is applied onto rljax's base config (verl's defaults), keeping its
`${...}` interpolations as links; command-line overrides in either syntax
come after it. Loading rules and errors: `rljax.config.verl_yaml`.
"""

from rljax.config import verl_yaml


def get_config(arg=None):
  return verl_yaml.load_file(arg)
