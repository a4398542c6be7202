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
    "Qwen2.5-VL-7B-Instruct": {
        "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_act": "silu",
        "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 128000, "max_window_layers": 28, "sliding_window": 32768,
        "use_sliding_window": False, "tie_word_embeddings": False, "attention_dropout": 0.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "bos_token_id": 151643,
        "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                          "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                          "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
                          "temporal_patch_size": 2}},
    "Qwen3-VL-8B-Instruct": {
        "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655,
        "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "tie_word_embeddings": False,
        "text_config": {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
                        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
                        "intermediate_size": 12288, "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
                        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
                        "rms_norm_eps": 1e-6, "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                                              "rope_type": "default"},
                        "rope_theta": 5000000, "vocab_size": 151936},
        "vision_config": {"deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
                          "hidden_size": 1152, "in_channels": 3, "intermediate_size": 4304, "model_type": "qwen3_vl",
                          "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 4096,
                          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}},
}


def known_architecture(path: str) -> dict[str, Any] | None:
  """The config.json dict of the model a path names by its last component (None if unknown)."""
  name = os.path.basename(os.path.normpath(os.path.expanduser(path)))
  return dict(ARCHITECTURES[name]) if name in ARCHITECTURES else None
