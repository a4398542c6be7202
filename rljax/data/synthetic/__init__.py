"""Offline tasks in verl's parquet schema, for a first run that works anywhere.

    python -m rljax.data.synthetic arithmetic --local_dir DIR
    python -m rljax.data.synthetic calculator --local_dir DIR
    python -m rljax.data.synthetic shapes --local_dir DIR

See `rljax.data.synthetic.arithmetic` for the problems and difficulty levels,
`rljax.data.synthetic.calculator` for the multi-turn tool-use task (a
calculator tool, `rljax.data.synthetic.calculator_tool`), and
`rljax.data.synthetic.shapes` for the visual task (images in verl's
multimodal schema).
"""

import os

from rljax.data.synthetic.arithmetic import DATA_SOURCE
from rljax.data.synthetic.arithmetic import DEFAULT_LOCAL_DIR
from rljax.data.synthetic.arithmetic import DEFAULT_TASKS
from rljax.data.synthetic.arithmetic import ensure_synthetic_data
from rljax.data.synthetic.arithmetic import generate
from rljax.data.synthetic.arithmetic import make_rows
from rljax.data.synthetic import arithmetic as _arithmetic
from rljax.data.synthetic import calculator
from rljax.data.synthetic import shapes
from rljax.data.synthetic.arithmetic import WORD_LOCAL_DIR

__all__ = [
    "DATA_SOURCE",
    "DEFAULT_LOCAL_DIR",
    "DEFAULT_TASKS",
    "ensure_synthetic_data",
    "generate",
    "make_rows",
    "maybe_generate_default",
    "WORD_LOCAL_DIR",
    "calculator",
    "shapes",
]


def maybe_generate_default(path: str | os.PathLike) -> None:
  """Writes a default synthetic directory (arithmetic's or calculator's) if `path` is its absent file."""
  _arithmetic.maybe_generate_default(path)
  calculator.maybe_generate_default(path)

