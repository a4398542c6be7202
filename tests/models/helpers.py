"""Tiny HF reference models (transformers, PyTorch CPU) for the parity tests."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
import torch
import transformers
from flax import nnx
from tokenizers import decoders, models, pre_tokenizers, trainers

from rljax import sharding

torch.set_num_threads(1)

_BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

# Each family with something unusual.
FAMILIES: dict[str, tuple[type, dict[str, Any]]] = {
    # llama3 RoPE scaling, tied embeddings, attention and MLP biases.
    "llama3": (transformers.LlamaConfig, dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        rope_theta=500000.0, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    # linear RoPE scaling, head_dim != hidden / heads, untied.
    "llama_linear": (transformers.LlamaConfig, dict(
        head_dim=16, rope_scaling={"rope_type": "linear", "factor": 2.0},
        tie_word_embeddings=False)),
    # q/k/v biases, YaRN, untied.
    "qwen2": (transformers.Qwen2Config, dict(
        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 16},
        tie_word_embeddings=False)),
    # q/k RMSNorm, head_dim != hidden / heads, tied.
    "qwen3": (transformers.Qwen3Config, dict(head_dim=16, tie_word_embeddings=True)),
    # sliding window shorter than the sequence, MQA-ish GQA (4 -> 1).
    "mistral": (transformers.MistralConfig, dict(
        sliding_window=4, num_key_value_heads=1, tie_word_embeddings=False)),
    # mixture of experts: top-2 of 8 renormalised, layer 1 dense (mlp_only_layers), q/k norm.
    "qwen3_moe": (transformers.Qwen3MoeConfig, dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
        mlp_only_layers=[1], head_dim=16, tie_word_embeddings=False)),
    # mixture of experts in every layer: top-3 of 4, not renormalised, tied.
    "qwen3_moe_all": (transformers.Qwen3MoeConfig, dict(
        num_experts=4, num_experts_per_tok=3, moe_intermediate_size=16, norm_topk_prob=False,
        head_dim=8, tie_word_embeddings=True, router_aux_loss_coef=0.02)),
    # Gemma 3: sliding layers (window 4 < sequence, their own RoPE base) around a full layer with
    # linear RoPE scaling, query_pre_attn_scalar, final logit softcapping, tied; attn_logit_softcapping
    # is set too, and ignored as transformers ignores it.
    "gemma3": (transformers.Gemma3TextConfig, dict(
        head_dim=16, num_hidden_layers=3, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_theta=5000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_local_base_freq=100.0,
        query_pre_attn_scalar=24, final_logit_softcapping=5.0, attn_logit_softcapping=3.0,
        tie_word_embeddings=True, pad_token_id=0)),
}


def hf_model(family: str, seed: int = 0) -> transformers.PreTrainedModel:
  """A float32 HF model with every parameter random (norms ~1, biases nonzero)."""
  cls, extra = FAMILIES[family]
  cfg = cls(**{**_BASE, **extra})
  cfg._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  return model.eval()


def saved_family(tmp_path_factory, family: str) -> tuple[transformers.PreTrainedModel, str]:
  """(the HF model of `family`, the directory transformers saved it to)."""
  hf = hf_model(family)
  path = str(tmp_path_factory.mktemp(family))
  hf.save_pretrained(path)
  return hf, path


def loss_and_grad(model: Any, ids: np.ndarray, mask: np.ndarray, mesh: Any = None, rules: Any = None):
  """(sum of squared logits over real tokens, the logits, its gradient) of `model`, jitted (in `mesh` when given)."""
  graphdef, state = nnx.split(model)

  def loss(state):
    if mesh is None:
      logits = nnx.merge(graphdef, state)(ids, mask)
    else:
      with sharding.activation_sharding(mesh, rules):
        logits = nnx.merge(graphdef, state)(ids, mask)
    return jnp.sum(jnp.where(mask[..., None] == 1, logits, 0.0) ** 2), logits

  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return value, logits, grads


def batch(vocab: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded [3, 10] ids and mask (row 0 full, rows 1-2 padded)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, size=(3, 10)).astype(np.int32)
  mask = np.ones((3, 10), np.int32)
  mask[1, :3] = 0
  mask[2, :6] = 0
  ids[mask == 0] = 0
  return ids, mask


def hf_logits(model: transformers.PreTrainedModel, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """[B, T, V] logits with positions cumsum(mask) - 1 (left padding)."""
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.float().numpy()


def assert_gradients_close(got: Any, want: Any, rel: float = 2e-5) -> None:
  """Every leaf of `got` within `rel` times its `want` leaf's largest magnitude, naming the first that is not."""
  for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
    scale = float(np.max(np.abs(np.asarray(w)))) + 1e-6
    np.testing.assert_allclose(g, w, atol=rel * scale, err_msg=jax.tree_util.keystr(path))


def max_diff_on_mask(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
  return float(np.abs(np.asarray(a) - np.asarray(b))[mask.astype(bool)].max())


CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HARD_STRINGS = [
    "Hello, world! It's 2024-06-01; we'll see.",
    "naïve café — Größe, 日本語のテキスト, emoji 🤖👩‍💻 and ŝ̷̨t̸r̷a̴n̶g̵e",
    "digits 1234567890 3.14159 -42 1e-9 0x1F",
    "def f(x):\n    return x ** 2  # square\n\n\tif x != 0: pass\r\n",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces,\n\n\ntrailing   ",
    "",
]


def train_tokenizer() -> tokenizers.Tokenizer:
  """A byte-level BPE with SmolLM's pre-tokenizer (single digits) and ChatML specials."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  tok.decoder = decoders.ByteLevel()
  corpus = [s * 3 for s in HARD_STRINGS] + ["the quick brown fox jumps over the lazy dog"] * 5
  trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(corpus, trainer)
  return tok


def uneven_routing(n: int) -> np.ndarray:
  """[n, 1, 2] expert ids over 8 experts: tokens 0-9 to experts 0 and 1, the others spread over 2-7, so that
  over 4 expert shards of 2 experts the first takes 20 of the 2n copies and the others 4 each."""
  first = np.where(np.arange(n) < 10, np.arange(n) % 2, 2 + np.arange(n) % 6)
  second = np.where(np.arange(n) < 10, 1 - np.arange(n) % 2, 2 + (np.arange(n) + 1) % 6)
  return np.stack([first, second], -1)[:, None].astype(np.int32)


def uneven_dispatch(n: int, d: int, f: int, seed: int) -> tuple:
  """`moe.dispatch`'s arguments, float32: x [n, 1, d], ids [n, 1, 2] (`uneven_routing`), weights [n, 1, 2],
  gate and up [8, d, f], down [8, f, d]."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(n, 1, d)), jnp.float32)
  ids = jnp.asarray(uneven_routing(n))
  weights = jnp.asarray(rng.uniform(size=(n, 1, 2)), jnp.float32)
  gate, up = (jnp.asarray(rng.normal(size=(8, d, f)), jnp.float32) for _ in range(2))
  down = jnp.asarray(rng.normal(size=(8, f, d)), jnp.float32)
  return x, ids, weights, gate, up, down


def _expert_split(fn, decode: bool):
  """fn traced over 8 devices, fsdp 2 x expert 4: as a decode step's weight-stationary pass, or as an update's
  pass, which gathers its weights."""
  from rljax import config as config_lib
  from rljax.sharding import rules as rules_lib
  mesh = sharding.build_mesh({"data": 1, "fsdp": 2, "tensor": 1, "sequence": 1, "expert": 4})
  rules = sharding.rules_from_config(config_lib.get_base_config())
  rules = rules_lib.decode_rules(rules) if decode else rules

  def step(*args):
    with rules_lib.activation_sharding(mesh, rules, gather_weights=not decode):
      return fn(*args)

  return step


def expert_split_decode(fn):
  """fn traced as a decode step's weight-stationary pass over 8 devices: fsdp 2 x expert 4."""
  return _expert_split(fn, decode=True)


def expert_split_update(fn):
  """fn traced as an update's pass (its weights gathered) over 8 devices: fsdp 2 x expert 4."""
  return _expert_split(fn, decode=False)


class MiMoMTPLayer(torch.nn.Module):
  """A reference MiMo multi-token prediction layer (MiMo's published modeling code: norms, input_proj over
  [hidden; embeddings], a Qwen2 decoder layer, a final norm), from transformers' Qwen2 modules."""

  def __init__(self, config: transformers.Qwen2Config):
    super().__init__()
    norm = lambda: transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm(  # noqa: E731
        config.hidden_size, eps=config.rms_norm_eps)
    self.token_layernorm, self.hidden_layernorm, self.final_layernorm = norm(), norm(), norm()
    self.input_proj = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
    self.layer = transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer(config, layer_idx=0)

  def forward(self, embeds, hidden, mask4d, rotary):
    x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embeds)], dim=-1))
    return self.final_layernorm(self.layer(x, attention_mask=mask4d, position_embeddings=rotary))

  def hf_tensors(self, depth: int) -> dict[str, torch.Tensor]:
    """The layer's tensors under MiMo's checkpoint names (``model.mtp_layers.{depth}.*``)."""
    out = {}
    for name, p in self.named_parameters():
      name = name.removeprefix("layer.")
      out[f"model.mtp_layers.{depth}.{name}"] = p.detach().contiguous()
    return out


def mimo_model(depths: int, seed: int = 0) -> tuple[transformers.PreTrainedModel, list[MiMoMTPLayer]]:
  """A tiny Qwen2 trunk (``hf_model("qwen2")``) and `depths` random MiMo MTP layers beside it."""
  hf = hf_model("qwen2", seed)
  torch.manual_seed(seed + 1)
  layers = [MiMoMTPLayer(hf.config) for _ in range(depths)]
  with torch.no_grad():
    for layer in layers:
      for name, p in layer.named_parameters():
        p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.15 * torch.randn_like(p))
  return hf, [layer.eval() for layer in layers]


def save_mimo(hf: transformers.PreTrainedModel, layers: list[MiMoMTPLayer], path: str) -> None:
  """Writes a MiMo checkpoint directory: the trunk's tensors and the MTP layers', config.json as MiMo's."""
  import json
  import os

  from safetensors.torch import save_file
  tensors = {k: v.detach().contiguous() for k, v in hf.state_dict().items()}
  for depth, layer in enumerate(layers):
    tensors.update(layer.hf_tensors(depth))
  os.makedirs(path, exist_ok=True)
  save_file(tensors, os.path.join(path, "model.safetensors"))
  config = {**hf.config.to_dict(), "model_type": "mimo", "architectures": ["MiMoForCausalLM"],
            "num_nextn_predict_layers": len(layers)}
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)


def mimo_reference(hf: transformers.PreTrainedModel, layers: list[MiMoMTPLayer], ids: np.ndarray,
                   mask: np.ndarray) -> np.ndarray:
  """[K, B, T, D] each MTP depth's hidden states as Megatron-LM chains them (depth k reads the token k places on;
  left-padded rows, positions cumsum(mask) - 1)."""
  positions = torch.tensor(np.maximum(np.cumsum(mask, axis=1) - 1, 0), dtype=torch.long)
  t = ids.shape[1]
  allowed = np.tril(np.ones((t, t), bool))[None] & mask.astype(bool)[:, None, :]
  mask4d = torch.tensor(np.where(allowed, 0.0, np.finfo(np.float32).min)[:, None], dtype=torch.float32)
  out = []
  with torch.no_grad():
    hidden = hf.model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                      position_ids=positions).last_hidden_state
    rotary = hf.model.rotary_emb(hidden, positions)
    for depth, layer in enumerate(layers, start=1):
      ahead = np.concatenate([ids[:, depth:], np.zeros_like(ids[:, :depth])], axis=1)
      hidden = layer(hf.model.embed_tokens(torch.tensor(ahead, dtype=torch.long)), hidden, mask4d, rotary)
      out.append(hidden.numpy())
  return np.stack(out)
