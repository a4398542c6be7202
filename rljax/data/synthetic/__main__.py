"""python -m rljax.data.synthetic arithmetic --local_dir DIR [options]

Writes DIR/train.parquet and DIR/test.parquet (see rljax.data.synthetic).
"""

import argparse
from typing import Sequence

from rljax.data.synthetic import arithmetic


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m rljax.data.synthetic",
      description="Writes an offline task in verl's parquet schema.")
  parser.add_argument("task", choices=["arithmetic"])
  parser.add_argument("--local_dir", default=arithmetic.DEFAULT_LOCAL_DIR)
  parser.add_argument("--train_size", type=int, default=10000)
  parser.add_argument("--test_size", type=int, default=500)
  parser.add_argument("--difficulty", default="1",
                      help="a level 1-5, or several: 1,2,3")
  parser.add_argument("--style", choices=arithmetic.STYLES,
                      default="arithmetic")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  paths = arithmetic.generate(args.local_dir, args.task, args.train_size,
                              args.test_size, args.difficulty, args.style,
                              args.seed)
  for path in paths:
    print(path)


if __name__ == "__main__":
  main()
