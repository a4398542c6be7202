"""Offline evaluation: scores, mean@k and pass@k per data source of a responses parquet file.

    python -m rljax.eval --config=configs/eval.py [--config.KEY=VALUE ...] [KEY=VALUE ...] [--dry_run]

verl's `main_eval` with its evaluation.yaml keys (`data.path`,
`data.response_key`, `data.data_source_key`, `data.reward_model_key`,
`custom_reward_function.{path, name}`). Prints one line per data source and
writes a JSON report (`data.output_path`, default beside the input); the
metrics are defined in `rljax.evaluation.scoring`.
"""

import sys
from typing import Sequence

from rljax.evaluation import cli
from rljax.evaluation import config as eval_config
from rljax.evaluation import scoring


def main(argv: Sequence[str] | None = None) -> int:
  """The command line (default `sys.argv[1:]`) -> exit status (see `rljax.evaluation.cli.main`)."""
  return cli.main(sys.argv[1:] if argv is None else argv, "rljax.eval", __doc__.split("\n")[0],
                  eval_config.validate_eval, scoring.run, eval_config.get_eval_config)


if __name__ == "__main__":
  sys.exit(main())
