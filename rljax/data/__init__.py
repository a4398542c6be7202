"""Data: verl-format parquet prompts -> grain batches; offline synthetic tasks.

The tokenizer protocol is documented in `rljax.data.tokenization`; the batch
layout in `rljax.data.dataset` (items) and `rljax.data.pipeline` (batches).
"""

from rljax.data.dataset import collate
from rljax.data.dataset import load_dataset_class
from rljax.data.dataset import make_dataset
from rljax.data.dataset import RLHFDataset
from rljax.data.parquet import as_file_list
from rljax.data.parquet import read_parquet
from rljax.data.pipeline import batch_dataset
from rljax.data.pipeline import ensure_config_data
from rljax.data.pipeline import BatchIterator
from rljax.data.pipeline import eval_batch_dataset
from rljax.data.pipeline import make_train_iterator
from rljax.data.pipeline import make_val_batches
from rljax.data.synthetic import ensure_synthetic_data
from rljax.data.tokenization import Tokenizer

__all__ = [
    "BatchIterator",
    "RLHFDataset",
    "Tokenizer",
    "as_file_list",
    "batch_dataset",
    "collate",
    "ensure_config_data",
    "ensure_synthetic_data",
    "eval_batch_dataset",
    "load_dataset_class",
    "make_dataset",
    "make_train_iterator",
    "make_val_batches",
    "read_parquet",
]
