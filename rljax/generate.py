"""Offline generation: responses to every prompt of a verl-format parquet file.

    python -m rljax.generate --config=configs/generate.py [--config.KEY=VALUE ...] [KEY=VALUE ...] [--dry_run]

verl's `main_generation` with its generation.yaml keys (`data.path`,
`data.prompt_key`, `data.n_samples`, `data.batch_size`, `data.output_path`,
`model.path`, `rollout.*`), plus `model.checkpoint` to generate with the
actor of an rljax run. Writes the input table with a `responses` column
(see `rljax.evaluation.generation`); `rljax.eval` scores it.
"""

import sys
from typing import Sequence

from rljax.evaluation import cli
from rljax.evaluation import config as eval_config


def run(config) -> str:
  """`rljax.evaluation.generation.run`, imported only when there is work (not for --dry_run)."""
  from rljax.evaluation import generation  # pylint: disable=import-outside-toplevel
  return generation.run(config)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line (default `sys.argv[1:]`) -> exit status (see `rljax.evaluation.cli.main`)."""
  return cli.main(sys.argv[1:] if argv is None else argv, "rljax.generate", __doc__.split("\n")[0],
                  eval_config.validate_generate, run, eval_config.get_generate_config)


if __name__ == "__main__":
  sys.exit(main())
