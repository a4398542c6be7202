"""A scripted policy for multi-turn tests: a real CausalLM whose next token depends on the current token alone.

Every attention and MLP output is zero, so the residual stream is the
token's embedding (one-hot), and the LM head reads the next-token logits
from a table. A tokenizer with whole tool calls and answers as single
tokens lets such a model write a hermes tool call, or an answer, in one
token after the assistant's generation prompt, then end its turn.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import tokenizers
from flax import nnx

from rljax.models import CausalLM, ModelConfig
from rljax.models.tokenizer import Tokenizer
from tests.models import helpers

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def call(name: str, **arguments) -> str:
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


PHRASES = {
    "lookup": call("lookup", key="x"),
    "boom": call("boom"),
    "sleepy": call("sleepy"),
    "chatty": call("chatty"),
    "malformed": '<tool_call>{"name": "lookup", "arguments": </tool_call>',
    "answer": "The answer is 7.",
}
UNLIKELY = -30.0


def tokenizer() -> Tokenizer:
  """The test BPE (ChatML specials) with each of PHRASES as one token; eos <|im_end|>."""
  tok = helpers.train_tokenizer()
  tok.add_tokens([tokenizers.AddedToken(p, normalized=False) for p in PHRASES.values()])
  return Tokenizer(tok, chat_template=CHATML, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def phrase_id(tok: Tokenizer, name: str) -> int:
  ids = tok.encode(PHRASES[name], add_special_tokens=False)
  assert len(ids) == 1, ids
  return ids[0]


def start_id(tok: Tokenizer) -> int:
  """The id every assistant turn starts after (the generation prompt's last token)."""
  return tok.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True)[-1]


def model(tok: Tokenizer, table: dict[int, dict[int, float]]) -> CausalLM:
  """A one-layer Llama whose logits after token a are table[a] (UNLIKELY for every id it does not list)."""
  vocab = tok.vocab_size
  width = -(-vocab // 64) * 64
  cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=width, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=width // 4, tie_word_embeddings=False,
                    bos_token_id=0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                    dtype=jnp.float32)
  lm = CausalLM(cfg, nnx.Rngs(0))
  logits = np.full((vocab, vocab), UNLIKELY, np.float32)  # [current, next]
  for current, row in table.items():
    for following, value in row.items():
      logits[current, following] = value
  embed = np.zeros((vocab, width), np.float32)
  embed[np.arange(vocab), np.arange(vocab)] = 1.0
  head = np.zeros((vocab, width), np.float32)
  head[:, :vocab] = logits.T / np.sqrt(width)  # RMSNorm turns the one-hot row into sqrt(width) x one-hot
  lm.embed[...] = jnp.asarray(embed)
  lm.lm_head[...] = jnp.asarray(head)
  for layer in lm.layers:
    layer.attn.o[...] = jnp.zeros_like(layer.attn.o[...])
    layer.mlp.down[...] = jnp.zeros_like(layer.mlp.down[...])
  lm.final_norm.scale[...] = jnp.ones_like(lm.final_norm.scale[...])
  return lm
