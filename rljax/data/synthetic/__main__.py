"""python -m rljax.data.synthetic {arithmetic,calculator,shapes} --local_dir DIR [options]

arithmetic writes DIR/train.parquet and DIR/test.parquet; calculator also
writes DIR/sft_train.parquet and DIR/sft_test.parquet (worked tool-use
conversations), and shapes the same with images (name a drawn shape's colour
and kind). See rljax.data.synthetic.
"""

import argparse
from typing import Sequence

from rljax.data.synthetic import arithmetic
from rljax.data.synthetic import calculator
from rljax.data.synthetic import shapes


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m rljax.data.synthetic",
      description="Writes an offline task in verl's parquet schema.")
  parser.add_argument("task", choices=["arithmetic", "calculator", "shapes"])
  parser.add_argument("--local_dir", default=None,
                      help=f"default: {arithmetic.DEFAULT_LOCAL_DIR} (arithmetic), "
                      f"{calculator.DEFAULT_LOCAL_DIR} (calculator)")
  parser.add_argument("--train_size", type=int, default=10000)
  parser.add_argument("--test_size", type=int, default=500)
  parser.add_argument("--difficulty", default=None,
                      help="arithmetic: a level 1-5, or several: 1,2,3 (default 1); "
                      f"calculator: levels 1-4 (default {calculator.DEFAULT_DIFFICULTY})")
  parser.add_argument("--style", choices=arithmetic.STYLES,
                      default="arithmetic", help="arithmetic only")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  if args.task == "shapes":
    paths = shapes.generate(args.local_dir or shapes.DEFAULT_LOCAL_DIR, args.train_size, args.test_size, args.seed)
  elif args.task == "calculator":
    paths = calculator.generate(args.local_dir or calculator.DEFAULT_LOCAL_DIR, args.train_size,
                                args.test_size, args.difficulty or calculator.DEFAULT_DIFFICULTY,
                                args.seed)
  else:
    paths = arithmetic.generate(args.local_dir or arithmetic.DEFAULT_LOCAL_DIR, args.task,
                                args.train_size, args.test_size, args.difficulty or "1",
                                args.style, args.seed)
  for path in paths:
    print(path)


if __name__ == "__main__":
  main()
