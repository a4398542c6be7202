"""Offline tasks in verl's parquet schema, for a first run that works anywhere.

    python -m rljax.data.synthetic arithmetic --local_dir DIR

See `rljax.data.synthetic.arithmetic` for the problems and difficulty levels.
"""

from rljax.data.synthetic.arithmetic import DATA_SOURCE
from rljax.data.synthetic.arithmetic import DEFAULT_LOCAL_DIR
from rljax.data.synthetic.arithmetic import DEFAULT_TASKS
from rljax.data.synthetic.arithmetic import ensure_synthetic_data
from rljax.data.synthetic.arithmetic import generate
from rljax.data.synthetic.arithmetic import make_rows
from rljax.data.synthetic.arithmetic import maybe_generate_default
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
]
