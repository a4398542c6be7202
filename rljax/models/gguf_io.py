"""GGUF files (llama.cpp): config, dequantized weights under HF names, tokenizer.

llama.cpp's converter permutes the rows of Llama's q_proj/k_proj so its
interleaved RoPE matches HF's half-split RoPE: within each head, HF row
``j * hd/2 + i`` is stored at GGUF row ``2 * i + j``. ``unpermute_rows``
undoes that, so the model keeps HF's rotation.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import gguf
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from rljax.models import checkpoint
from rljax.models import tokenizer as tokenizer_lib

_ARCH_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Pre-tokenizer regexes by tokenizer.ggml.pre (the published patterns).
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4


def hf_name(gguf_name: str) -> str:
  """The HF tensor name for a GGUF tensor name (blk.3.attn_q.weight -> model.layers.3...)."""
  if gguf_name in _TOP_NAMES:
    return _TOP_NAMES[gguf_name]
  m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
  if m and m.group(2) in _LAYER_NAMES:
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
  raise ValueError(f"GGUF tensor {gguf_name!r} has no HF counterpart in rljax.")


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's per-head interleaving of q/k rows: [N*hd, ...] -> HF order."""
  rest = w.shape[1:]
  return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
  f = reader.fields.get(key)
  return default if f is None else f.contents()


class _LazyTensor:
  """A GGUF tensor, dequantized to float32 (and un-permuted) on first read."""

  def __init__(self, tensor: Any, n_heads: int | None):
    self._tensor = tensor
    self._n_heads = n_heads
    self.shape = tuple(int(s) for s in reversed(tensor.shape))

  @functools.cached_property
  def value(self) -> np.ndarray:
    w = gguf.quants.dequantize(np.asarray(self._tensor.data), self._tensor.tensor_type)
    w = np.asarray(w, np.float32).reshape(self.shape)
    return unpermute_rows(w, self._n_heads) if self._n_heads else w

  def __getitem__(self, index: Any) -> np.ndarray:
    return self.value[index]


def _hf_config(reader: gguf.GGUFReader, arch: str, tied: bool) -> dict[str, Any]:
  """The HF config.json dict described by the GGUF metadata."""
  key = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
  heads = int(key("attention.head_count"))
  hidden = int(key("embedding_length"))
  tokens = _field(reader, "tokenizer.ggml.tokens")
  vocab = key("vocab_size") or (len(tokens) if tokens is not None else None)
  cfg: dict[str, Any] = {
      "model_type": _ARCH_TO_MODEL_TYPE[arch],
      "vocab_size": int(vocab) if vocab is not None else None,
      "hidden_size": hidden,
      "intermediate_size": int(key("feed_forward_length")),
      "num_hidden_layers": int(key("block_count")),
      "num_attention_heads": heads,
      "num_key_value_heads": int(key("attention.head_count_kv", heads)),
      "head_dim": int(key("attention.key_length", hidden // heads)),
      "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
      "rope_theta": float(key("rope.freq_base", 10000.0)),
      "max_position_embeddings": int(key("context_length", 4096)),
      "tie_word_embeddings": tied,
      "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
      "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
      "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
  }
  scaling = key("rope.scaling.type")
  if scaling and scaling != "none":
    cfg["rope_scaling"] = {
        "rope_type": scaling, "factor": float(key("rope.scaling.factor")),
        "original_max_position_embeddings": key("rope.scaling.original_context_length"),
    }
  return cfg


def read_gguf(path: str) -> tuple[dict[str, Any], checkpoint.TensorSource]:
  """(HF config dict, tensors under HF names in HF layout, dequantized lazily)."""
  reader = gguf.GGUFReader(path)
  arch = _field(reader, "general.architecture")
  if arch not in _ARCH_TO_MODEL_TYPE:
    raise ValueError(
        f"{path}: general.architecture={arch!r} is not supported; supported: "
        f"{sorted(_ARCH_TO_MODEL_TYPE)}."
    )
  names = {t.name for t in reader.tensors}
  if "rope_freqs.weight" in names:
    raise ValueError(f"{path}: tensor 'rope_freqs.weight' (per-dimension RoPE factors) "
                     "is not supported.")
  cfg = _hf_config(reader, arch, tied="output.weight" not in names)
  permute = arch == "llama"
  heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
  tensors = {}
  for t in reader.tensors:
    kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
    n_heads = heads.get(kind) if permute else None
    tensors[hf_name(t.name)] = _LazyTensor(t, n_heads)
  if cfg["vocab_size"] is None:
    cfg["vocab_size"] = tensors["model.embed_tokens.weight"].shape[0]
  return cfg, checkpoint.TensorSource(tensors, path)


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in (None, "default", "gpt2"):
    return byte_level
  if pre == "smollm":
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  patterns = {"llama-bpe": _LLAMA3_PATTERN, "qwen2": _QWEN2_PATTERN}
  if pre not in patterns:
    raise ValueError(f"tokenizer.ggml.pre={pre!r} is not supported; supported: "
                     f"default, gpt2, smollm, {', '.join(patterns)}.")
  return pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(patterns[pre]), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])


def _token(reader: gguf.GGUFReader, tokens: list[str], key: str) -> str | None:
  i = _field(reader, f"tokenizer.ggml.{key}")
  return None if i is None else tokens[int(i)]


def read_tokenizer(path: str) -> tokenizer_lib.Tokenizer:
  """The byte-level BPE tokenizer stored in a GGUF file, with its chat template."""
  reader = gguf.GGUFReader(path)
  kind = _field(reader, "tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{path}: tokenizer.ggml.model={kind!r} is not supported "
                     "(only byte-level BPE, 'gpt2').")
  tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
  types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
  pre = _field(reader, "tokenizer.ggml.pre")
  tok = tokenizers.Tokenizer(models.BPE(
      vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
      ignore_merges=pre == "llama-bpe"))
  tok.pre_tokenizer = _pre_tokenizer(pre)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k == _TOKEN_CONTROL])
  tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == _TOKEN_USER_DEFINED])
  bos = _token(reader, tokens, "bos_token_id")
  post = [processors.ByteLevel(trim_offsets=False)]
  if _field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
    bos_id = tokens.index(bos)
    post.append(processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]))
  tok.post_processor = processors.Sequence(post)
  eos_ids = [int(i) for i in (_field(reader, "tokenizer.ggml.eos_token_id"),
                              _field(reader, "tokenizer.ggml.eot_token_id")) if i is not None]
  return tokenizer_lib.Tokenizer(
      tok, chat_template=_field(reader, "tokenizer.chat_template"), bos_token=bos,
      eos_token=_token(reader, tokens, "eos_token_id"),
      pad_token=_token(reader, tokens, "padding_token_id"), extra_eos_ids=eos_ids,
  )
