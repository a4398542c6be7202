"""Flax NNX decoder LMs (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text) and checkpoint I/O.

One CausalLM serves every family; ModelConfig's fields say how a family
differs (Gemma 3: sliding and full layer_types with their own RoPE,
(1 + w) and sandwich norms, GeGLU, scaled embeddings, final logit
softcapping).

from_pretrained / save_pretrained read and write HF safetensors directories
(and read GGUF files); load_tokenizer gives a tokenizer with a chat template;
token_log_probs scores tokens without materialising full logits;
rljax.models.lora adds LoRA adapters (apply_lora, split_trainable, merge_lora,
save_peft).
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
from rljax.models.lora import LoRAConfig, apply_lora, merge_lora, save_peft, split_trainable, trainable_filter
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
    "LoRAConfig",
    "ModelConfig",
    "SUPPORTED_MODEL_TYPES",
    "Tokenizer",
    "apply_lora",
    "from_hf_dict",
    "from_pretrained",
    "greedy_generate",
    "init_cache",
    "load_tokenizer",
    "merge_lora",
    "naive_token_log_probs",
    "positions_from_mask",
    "resolve_path",
    "save_peft",
    "save_pretrained",
    "split_trainable",
    "to_hf_dict",
    "token_log_probs",
    "trainable_filter",
]
