"""A tiny random model with SmolLM2's tokenizer (cut to the tokens the tests write), synthetic data, and run configs
for trainer tests."""

import copy
import functools
import json
import pathlib

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from flax import nnx

from rljax import config as config_lib
from rljax import sharding
from rljax.data import ensure_synthetic_data, synthetic
from rljax.data.synthetic import arithmetic
from rljax.models import CausalLM, ModelConfig, load_tokenizer, save_pretrained

ROOT = pathlib.Path(__file__).resolve().parents[2]


# What the tests' prompts say beyond the synthetic data's rows: the lengthened prompts (`prompts_of_many_lengths`),
# an overlong one, tool calls and their answers
TEST_TEXTS = (" Think." * 3, " pad" * 3, '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call>',
              "<tool_response>\n</tool_response>")


def _synthetic_texts(tokenizer) -> list[str]:
  """The texts of the synthetic data's rows the tests read, as `tokenizer`'s chat template renders them: arithmetic's
  (both splits, every level and style) and calculator's worked tool-use conversations."""
  texts = []
  for split in ("train", "test"):
    for style in ("arithmetic", "word"):
      for row in synthetic.make_rows(split, 600, arithmetic.LEVELS, style):
        texts += [row["prompt"][0]["content"], row["extra_info"]["solution"]]
    for problem in synthetic.calculator.make_problems(split, 200, synthetic.calculator.LEVELS):
      messages = synthetic.calculator.conversation(f"What is {problem.expression}?", problem.expression,
                                                   str(problem.answer))
      texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
  return texts


@functools.lru_cache(maxsize=None)
def tiny_tokenizer():
  """SmolLM2's tokenizer cut to 1,280 tokens, so the tiny models' embedding and logits (vocabulary x 64) cost
  what their layers do rather than 40 times more: its first 1,024 tokens (the special tokens, the bytes, the
  commonest merges), every token SmolLM2 writes the tests' texts with (the synthetic rows through its chat template,
  TEST_TEXTS) and the tokens each is merged from, then the next tokens in SmolLM2's order up to a multiple of 128.
  Those texts tokenize as SmolLM2 tokenizes them (the same merges in the same order), each token renumbered by its
  place among the kept ones (the first 1,024 keep their ids); other texts in more, shorter tokens."""
  full = load_tokenizer("smollm2-135m-instruct")
  spec = json.loads(full.tok.to_str())
  vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
  parts = {a + b: (a, b) for a, b in merges}
  chat = full.apply_chat_template([{"role": "user", "content": "."}, {"role": "assistant", "content": "."}],
                                  tokenize=False)
  used = set()
  for text in [chat, *TEST_TEXTS, *_synthetic_texts(full)]:
    used.update(full.tok.encode(text, add_special_tokens=False).tokens)
  kept = {t for t, i in vocab.items() if i < 1024}
  pending = list(used)
  while pending:
    token = pending.pop()
    if token not in kept or token in used:
      kept.add(token)
      pending += [p for p in parts.get(token, ()) if p not in kept]
  for token in sorted(vocab, key=vocab.__getitem__):
    if len(kept) % 128 == 0:
      break
    if token not in kept and all(p in kept for p in parts.get(token, ())):
      kept.add(token)
  order = sorted(kept, key=vocab.__getitem__)
  spec["model"]["vocab"] = {t: i for i, t in enumerate(order)}
  spec["model"]["merges"] = [[a, b] for a, b in merges if a in kept and b in kept and a + b in kept]
  cut = copy.copy(full)
  cut.tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
  return cut


def tiny_model_dir(path: pathlib.Path) -> str:
  """Saves a 2-layer width-64 Llama with `tiny_tokenizer`'s vocabulary and tokenizer."""
  tokenizer = tiny_tokenizer()
  cfg = ModelConfig(model_type="llama", vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=100000.0,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
  save_pretrained(CausalLM(cfg, nnx.Rngs(0)), str(path), tokenizer=tokenizer)
  return str(path)


def overrides(model_dir: str, data_dir: str, run_dir: str, *extra: str) -> list[str]:
  """Shrinks an experiment to 2 steps of 4 prompts x 2 responses of 8 tokens on one device."""
  ensure_synthetic_data(data_dir)
  return [
      f"actor_rollout_ref.model.path={model_dir}",
      f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
      "data.train_batch_size=4", "data.max_prompt_length=96", "data.max_response_length=8",
      "data.val_max_samples=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
      "actor_rollout_ref.actor.optim.lr=1e-3", "critic.optim.lr=1e-3",
      "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=-1",
      "trainer.val_before_train=false", "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}",
      "reward_model.overlong_buffer.len=2", "trainer.n_gpus_per_node=1",
      *extra]


# 0, 0.5 or 1 by the response's text: a step's groups get different scores whatever the tiny model samples, so
# the policy gradient is not zero by luck
SCORE_BY_TEXT = """
import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  return float(zlib.crc32(solution_str.encode()) % 3) / 2.0
"""


def text_scorer(directory: pathlib.Path) -> str:
  """`custom_reward_function.path=` of a scorer by SCORE_BY_TEXT written into `directory`."""
  path = directory / "score_by_text.py"
  path.write_text(SCORE_BY_TEXT)
  return f"custom_reward_function.path={path}"


def run_config(name: str, model_dir: str, data_dir: str, run_dir: str, *extra: str):
  """configs/<name>.py with `overrides`, finalized and validated."""
  config = config_lib.load_config_file(str(ROOT / "configs" / f"{name}.py"))
  config_lib.apply_overrides(config, overrides(model_dir, data_dir, run_dir, *extra))
  if name == "ppo":
    config_lib.apply_overrides(config, ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                        "actor_rollout_ref.rollout.n=1"])
  config_lib.finalize(config, device_count=1)
  return config_lib.validate(config)


def fit_metrics(config, mesh=None) -> list[dict]:
  """Trains `config` to the end (on `mesh`, default the first device alone) and returns its metrics.jsonl records."""
  from rljax import rl  # pylint: disable=import-outside-toplevel
  trainer = rl.RLTrainer(config, mesh=mesh or one_device())
  try:
    trainer.fit()
  finally:
    trainer.close()
  return read_metrics(trainer.run_dir)


def read_metrics(run_dir: str) -> list[dict]:
  """The metrics.jsonl records of the run in `run_dir`, in the order they were logged."""
  import json  # pylint: disable=import-outside-toplevel
  return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def one_device():
  """A mesh of the first device alone (data = fsdp = tensor = sequence = 1)."""
  return sharding.build_mesh({"data": 1, "fsdp": 1, "tensor": 1, "sequence": 1}, jax.devices()[:1])


def prompts_of_many_lengths(data_dir: str, path, rows: int = 128, seed: int = 0) -> None:
  """Writes the first `rows` synthetic prompts of `data_dir`, each lengthened by 0-69 words, as a parquet file at
  `path`."""
  ensure_synthetic_data(data_dir)
  table = pq.read_table(f"{data_dir}/train.parquet").slice(0, rows).to_pylist()
  rng = np.random.default_rng(seed)
  for row in table:
    row["prompt"][0]["content"] += " Think." * int(rng.integers(0, 70))
  pq.write_table(pa.Table.from_pylist(table), path)
