"""Tokenizer: a ``tokenizers.Tokenizer`` plus special ids and a jinja2 chat template.

``apply_chat_template`` renders the template the way transformers does
(sandboxed jinja2, trim_blocks, lstrip_blocks, loop controls, ``tojson``,
``raise_exception``, ``strftime_now``) and tokenizes the result without
adding special tokens. No torch, no transformers.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox
import numpy as np
import tokenizers


def _token_str(value: Any) -> str | None:
  """A special token from tokenizer_config.json: a string or {"content": ...}."""
  if isinstance(value, dict):
    return value.get("content")
  return value


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _as_list(x: Any) -> list[int]:
  if x is None:
    return []
  return [int(i) for i in x] if isinstance(x, (list, tuple)) else [int(x)]


def _raise(message: str) -> None:
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _compile_template(template: str) -> jinja2.Template:
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template)


class Tokenizer:
  """Text <-> ids, special ids, chat template.

  Attributes:
    bos_token, eos_token, pad_token: strings or None.
    bos_token_id, eos_token_id, pad_token_id: ints or None (pad falls back to
      eos when the checkpoint names none, as verl does).
    eos_token_ids: every id that ends a response (eos plus e.g. <|im_end|>
      and <|endoftext|> from generation_config.json).
    chat_template: jinja2 source or None.
    template_kwargs: the template's extra arguments on every rendering (`with_template_kwargs`; an argument a
      call passes wins).
  """

  def __init__(
      self,
      tok: tokenizers.Tokenizer,
      *,
      chat_template: str | None = None,
      bos_token: str | None = None,
      eos_token: str | None = None,
      pad_token: str | None = None,
      extra_eos_ids: Sequence[int] = (),
      config: Mapping[str, Any] | None = None,
  ):
    self.tok = tok
    self.chat_template = chat_template
    self.bos_token, self.eos_token = bos_token, eos_token
    self.pad_token = pad_token if pad_token is not None else eos_token
    self.bos_token_id = self._id(self.bos_token)
    self.eos_token_id = self._id(self.eos_token)
    self.pad_token_id = self._id(self.pad_token)
    ids = ([] if self.eos_token_id is None else [self.eos_token_id]) + list(extra_eos_ids)
    self.eos_token_ids = list(dict.fromkeys(ids))
    self._config = dict(config or {})
    self._template = _compile_template(chat_template) if chat_template else None
    self.template_kwargs: dict[str, Any] = {}

  def with_chat_template(self, template: str) -> "Tokenizer":
    """A copy rendering `template` (jinja2 source) instead of its own chat template (verl's
    actor_rollout_ref.model.custom_chat_template, SFT's data.chat_template)."""
    tokenizer = copy.copy(self)
    tokenizer.chat_template, tokenizer._template = template, _compile_template(template)
    return tokenizer

  def with_template_kwargs(self, kwargs: Mapping[str, Any]) -> "Tokenizer":
    """A copy whose chat template renders with `kwargs` besides each call's own (verl's
    data.apply_chat_template_kwargs, e.g. enable_thinking=False or reasoning_effort="medium")."""
    tokenizer = copy.copy(self)
    tokenizer.template_kwargs = {**self.template_kwargs, **kwargs}
    return tokenizer

  def _id(self, token: str | None) -> int | None:
    if token is None:
      return None
    i = self.tok.token_to_id(token)
    if i is None:
      raise ValueError(f"special token {token!r} is not in the vocabulary.")
    return i

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def batch_encode(
      self, texts: Sequence[str], max_length: int, add_special_tokens: bool = True
  ) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded (input_ids [B, max_length], attention_mask [B, max_length]).

    Raises ValueError if a text is longer than max_length tokens (no silent
    truncation).
    """
    ids = np.full((len(texts), max_length), self.pad_token_id or 0, np.int32)
    mask = np.zeros((len(texts), max_length), np.int32)
    for row, text in enumerate(texts):
      toks = self.encode(text, add_special_tokens)
      if len(toks) > max_length:
        raise ValueError(f"text {row} has {len(toks)} tokens > max_length={max_length}.")
      if toks:
        ids[row, -len(toks):] = toks
        mask[row, -len(toks):] = 1
    return ids, mask

  def apply_chat_template(
      self,
      messages: Sequence[Mapping[str, Any]],
      add_generation_prompt: bool = False,
      tokenize: bool = True,
      tools: Sequence[Any] | None = None,
      **kwargs: Any,
  ) -> str | list[int]:
    """Renders ``messages`` with the chat template (as transformers does)."""
    if self._template is None:
      raise ValueError("this tokenizer has no chat_template.")
    text = self._template.render(
        messages=list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or "", eos_token=self.eos_token or "",
        pad_token=self.pad_token or "", **{**self.template_kwargs, **kwargs},
    )
    return self.encode(text, add_special_tokens=False) if tokenize else text

  @classmethod
  def from_dir(cls, path: str) -> "Tokenizer":
    """Loads tokenizer.json, tokenizer_config.json (or chat_template.jinja) and the
    eos ids in generation_config.json / config.json of an HF directory."""
    file = os.path.join(path, "tokenizer.json")
    if not os.path.exists(file):
      raise FileNotFoundError(f"{path} has no tokenizer.json (only fast tokenizers are read).")
    tok = tokenizers.Tokenizer.from_file(file)
    cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
    template = cfg.get("chat_template")
    if isinstance(template, list):
      template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = os.path.join(path, "chat_template.jinja")
    if template is None and os.path.exists(jinja_file):
      with open(jinja_file) as f:
        template = f.read()
    extra = _as_list(_read_json(os.path.join(path, "generation_config.json")).get("eos_token_id"))
    extra += _as_list(_read_json(os.path.join(path, "config.json")).get("eos_token_id"))
    return cls(
        tok, chat_template=template, bos_token=_token_str(cfg.get("bos_token")),
        eos_token=_token_str(cfg.get("eos_token")), pad_token=_token_str(cfg.get("pad_token")),
        extra_eos_ids=extra, config=cfg,
    )

  def save_pretrained(self, path: str) -> None:
    """Writes tokenizer.json and tokenizer_config.json (transformers' AutoTokenizer reads them)."""
    os.makedirs(path, exist_ok=True)
    self.tok.save(os.path.join(path, "tokenizer.json"))
    cfg = {k: v for k, v in self._config.items()
           if k not in ("chat_template", "bos_token", "eos_token", "pad_token",
                        "added_tokens_decoder", "tokenizer_class", "auto_map")}
    cfg.update(
        tokenizer_class="PreTrainedTokenizerFast", bos_token=self.bos_token,
        eos_token=self.eos_token, pad_token=self.pad_token,
        chat_template=self.chat_template,
    )
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump(cfg, f, indent=2, ensure_ascii=False)
