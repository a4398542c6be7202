"""Architectures (config.json fields, no weights) of the models rljax's presets name.

`rljax.compile` needs a model's shapes, not its weights: on a machine
without the checkpoint, a model path whose last component is one of these
names (`~/models/Qwen2.5-7B-Instruct`) compiles with the architecture below,
copied from the model's published config.json.
"""

from __future__ import annotations

import os
from typing import Any

_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "rms_norm_eps": 1e-6,
          "rope_theta": 1000000.0, "max_position_embeddings": 32768, "bos_token_id": 151643,
          "eos_token_id": 151645, "use_sliding_window": False}

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen2.5-0.5B-Instruct": {**_QWEN2, "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
                              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                              "tie_word_embeddings": True},
    "Qwen2.5-7B-Instruct": {**_QWEN2, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                            "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                            "tie_word_embeddings": False},
    "Llama-3.1-8B-Instruct": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
    "Qwen3-8B": {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu", "vocab_size": 151936,
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960, "tie_word_embeddings": False, "attention_bias": False,
        "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645},
    "Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_act": "silu",
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "output_router_logits": False,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
        "bos_token_id": 151643, "eos_token_id": 151645},
}


def known_architecture(path: str) -> dict[str, Any] | None:
  """The config.json dict of the model a path names by its last component (None if unknown)."""
  name = os.path.basename(os.path.normpath(os.path.expanduser(path)))
  return dict(ARCHITECTURES[name]) if name in ARCHITECTURES else None
