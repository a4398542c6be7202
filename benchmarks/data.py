"""Prompts per second through the data pipeline (template + tokenise + pad).

    python benchmarks/data.py [--num_prompts 100000] [--workers 0,1,2]

Writes `num_prompts` synthetic arithmetic prompts (levels 1-5, mixed styles)
to a temporary parquet file, then times one epoch of training batches
through `rljax.data` for each worker count (0: in this process; n > 0:
grain's `mp_prefetch` with n worker processes). The tokenizer is a
byte-level BPE trained here on the prompts, with SmolLM2's ChatML template
(nothing is downloaded). One JSON object per
line: the setup (parquet read and dataset build), then one line per worker
count with the time to the first batch and the steady-state rate.
"""

import argparse
import json
import os
import platform
import tempfile
import time

from absl import flags
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from rljax import data
from rljax.config import get_base_config
from rljax.data.synthetic import arithmetic

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class ChatTokenizer:
  """The tokenizer protocol of `rljax.data.tokenization` over `tokenizers`.

  Picklable (the template is compiled lazily), so grain's worker processes
  can receive it.
  """

  def __init__(self, tok, chat_template, pad_token):
    self.tok = tok
    self.chat_template = chat_template
    self.pad_token_id = tok.token_to_id(pad_token)
    self.eos_token_ids = [self.pad_token_id]
    self._template = None

  def apply_chat_template(self, messages, tokenize=True,
                          add_generation_prompt=False):
    if self._template is None:
      env = jinja2.sandbox.ImmutableSandboxedEnvironment()
      self._template = env.from_string(self.chat_template)
    text = self._template.render(messages=messages,
                                 add_generation_prompt=add_generation_prompt)
    return self.encode(text) if tokenize else text

  def encode(self, text, add_special_tokens=False):
    return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids, skip_special_tokens=True):
    return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def __getstate__(self):
    return {**self.__dict__, "_template": None}


def build_tokenizer(texts, vocab_size):
  """A byte-level BPE trained on `texts`, with SmolLM2's ChatML template."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=special, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return ChatTokenizer(tok, CHATML, pad_token="<|im_end|>")


def data_config(max_prompt_length):
  config = get_base_config().data
  config.update(max_prompt_length=max_prompt_length, truncation="error")
  return config


def time_epoch(dataset, batch_size, workers, seed):
  batches = data.batch_dataset(dataset, batch_size, num_epochs=1, seed=seed)
  start = time.perf_counter()
  count = 0
  with data.BatchIterator(batches, dataset, len(batches),
                          num_workers=workers) as iterator:
    first = next(iterator)
    count += len(first["index"])
    first_s = time.perf_counter() - start
    for batch in iterator:
      count += len(batch["index"])
  total_s = time.perf_counter() - start
  steady = (count - len(first["index"])) / max(total_s - first_s, 1e-9)
  return {"prompts": count, "seconds": round(total_s, 3),
          "first_batch_s": round(first_s, 3),
          "prompts_per_s": round(count / total_s, 1),
          "steady_prompts_per_s": round(steady, 1)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_prompts", type=int, default=100_000)
  parser.add_argument("--batch_size", type=int, default=256)
  parser.add_argument("--max_prompt_length", type=int, default=128)
  parser.add_argument("--vocab_size", type=int, default=4096)
  parser.add_argument("--workers", default="0,1,2")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()
  common = {"benchmark": "data_pipeline", "machine": platform.node(),
            "cpus": os.cpu_count(), "num_prompts": args.num_prompts,
            "batch_size": args.batch_size,
            "max_prompt_length": args.max_prompt_length}
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    rows = arithmetic.make_rows("train", args.num_prompts, (1, 2, 3, 4, 5),
                               "mixed", args.seed)
    path = os.path.join(tmp, "train.parquet")
    arithmetic.write_parquet(rows, path)
    generate_s = time.perf_counter() - start
    tokenizer = build_tokenizer(
        [r["prompt"][0]["content"] for r in rows[:5000]], args.vocab_size)
    start = time.perf_counter()
    dataset = data.make_dataset(path, tokenizer,
                                data_config(args.max_prompt_length))
    build_s = time.perf_counter() - start
    print(json.dumps({**common, "stage": "setup",
                      "generate_parquet_s": round(generate_s, 3),
                      "build_dataset_s": round(build_s, 3),
                      "vocab_size": args.vocab_size}), flush=True)
    for workers in (int(w) for w in args.workers.split(",")):
      result = time_epoch(dataset, args.batch_size, workers, args.seed)
      print(json.dumps({**common, "stage": "epoch", "workers": workers,
                        **result, "load_avg_1m": os.getloadavg()[0]}),
            flush=True)


if __name__ == "__main__":
  main()
