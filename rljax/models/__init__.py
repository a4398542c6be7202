"""Flax NNX decoder LMs (Llama, Mistral, Qwen2, Qwen3) and checkpoint I/O.

from_pretrained / save_pretrained read and write HF safetensors directories
(and read GGUF files); load_tokenizer gives a tokenizer with a chat template;
token_log_probs scores tokens without materialising full logits.
"""

from rljax.models.api import ALIASES, from_pretrained, load_tokenizer, resolve_path
from rljax.models.checkpoint import save_pretrained
from rljax.models.config import (
    SUPPORTED_MODEL_TYPES,
    ModelConfig,
    from_hf_dict,
    to_hf_dict,
)
from rljax.models.generate import greedy_generate
from rljax.models.logprobs import naive_token_log_probs, token_log_probs
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import (
    CausalLM,
    KVCache,
    init_cache,
    positions_from_mask,
)

__all__ = [
    "ALIASES",
    "CausalLM",
    "KVCache",
    "ModelConfig",
    "SUPPORTED_MODEL_TYPES",
    "Tokenizer",
    "from_hf_dict",
    "from_pretrained",
    "greedy_generate",
    "init_cache",
    "load_tokenizer",
    "naive_token_log_probs",
    "positions_from_mask",
    "resolve_path",
    "save_pretrained",
    "to_hf_dict",
    "token_log_probs",
]
