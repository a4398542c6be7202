"""Tokenizers from HF directories: chat-template sources, jinja helpers, special ids."""

import json
import os
import shutil

import jinja2
import pytest
import transformers

import rljax.models as M
from tests import processes
from tests.models import helpers

TOOL_TEMPLATE = (
    "{% if tools %}{{ 'TOOLS:' + (tools | tojson) + '\n' }}{% endif %}"
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "{{ bos_token + m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tok"))
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=helpers.train_tokenizer(), bos_token="<|im_start|>",
      eos_token="<|endoftext|>", chat_template=TOOL_TEMPLATE).save_pretrained(path)
  return path


def _set_template(path, template):
  file = os.path.join(path, "tokenizer_config.json")
  with open(file) as f:
    cfg = json.load(f)
  cfg["chat_template"] = template
  with open(file, "w") as f:
    json.dump(cfg, f)


def test_tojson_tools_and_raise_exception_match_transformers(tok_dir):
  ours = M.load_tokenizer(tok_dir)
  ref = transformers.AutoTokenizer.from_pretrained(tok_dir)
  tools = [{"type": "function", "function": {"name": "f", "description": "é ü"}}]
  msgs = [{"role": "user", "content": "sum 1 2"}, {"role": "assistant", "content": "3"}]
  assert ours.apply_chat_template(msgs, tools=tools, tokenize=False) == \
      ref.apply_chat_template(msgs, tools=tools, tokenize=False)
  with pytest.raises(jinja2.TemplateError, match="bad role system"):
    ours.apply_chat_template([{"role": "system", "content": "x"}])


def test_pad_falls_back_to_eos_and_ids(tok_dir):
  tok = M.load_tokenizer(tok_dir)
  assert tok.pad_token == tok.eos_token == "<|endoftext|>"
  assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 0, 0)
  assert tok.eos_token_ids == [0]


def test_chat_template_sources(tok_dir, tmp_path):
  path = str(tmp_path / "t")
  shutil.copytree(tok_dir, path)
  msgs = [{"role": "user", "content": "hi"}]
  _set_template(path, [{"name": "tool_use", "template": "TOOL"},
                       {"name": "default", "template": "{{ messages[0]['content'] }}!"}])
  assert M.load_tokenizer(path).apply_chat_template(msgs, tokenize=False) == "hi!"
  _set_template(path, None)
  for name in os.listdir(path):
    if name.endswith(".jinja"):
      os.remove(os.path.join(path, name))
  with pytest.raises(ValueError, match="no chat_template"):
    M.load_tokenizer(path).apply_chat_template(msgs)
  with open(os.path.join(path, "chat_template.jinja"), "w") as f:
    f.write("[{{ messages[0]['content'] }}]")
  assert M.load_tokenizer(path).apply_chat_template(msgs, tokenize=False) == "[hi]"


def test_missing_tokenizer_json_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    M.load_tokenizer(str(tmp_path))


EFFORT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'effort=' + (reasoning_effort | default('low')) }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ ' no-think' }}{% endif %}{% endif %}"
)


def test_the_rl_tokenizer_renders_with_data_apply_chat_template_kwargs_as_transformers_does(tok_dir, tmp_path):
  from rljax import config as config_lib  # pylint: disable=import-outside-toplevel
  from rljax.rl import trainer  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "t")
  shutil.copytree(tok_dir, path)
  _set_template(path, EFFORT_TEMPLATE)
  if os.path.exists(os.path.join(path, "chat_template.jinja")):  # transformers would read this one first
    os.remove(os.path.join(path, "chat_template.jinja"))
  config = config_lib.load_config_file(os.path.join(processes.ROOT, "configs", "grpo.py"))
  config_lib.apply_overrides(config, [f"data.tokenizer={path}",
                                      "+data.apply_chat_template_kwargs.reasoning_effort=medium",
                                      "+data.apply_chat_template_kwargs.enable_thinking=false"])
  ours, ref = trainer.load_tokenizer(config), transformers.AutoTokenizer.from_pretrained(path)
  msgs = [{"role": "user", "content": "sum 1 2"}]
  text = ours.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
  assert text.endswith("effort=medium no-think")
  assert text == ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, reasoning_effort="medium",
                                         enable_thinking=False)
  # a call's own argument wins; the tokenizer it came from renders as before
  assert ours.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False,
                                  reasoning_effort="high").endswith("effort=high no-think")
  assert M.load_tokenizer(path).apply_chat_template(msgs, add_generation_prompt=True, tokenize=False).endswith(
      "effort=low")
  config_lib.apply_overrides(config, ["+data.apply_chat_template_kwargs.tokenize=true"])
  with pytest.raises(config_lib.ConfigError, match="data.apply_chat_template_kwargs.tokenize=True: is an argument of "
                                                   "transformers' apply_chat_template"):
    config_lib.validate(config)


def test_a_custom_chat_template_renders_every_prompt_as_verl_sets_it_on_the_tokenizer(tok_dir):
  # verl's geo3k multi-turn lines pass actor_rollout_ref.model.custom_chat_template (its agent loop sets it as the
  # tokenizer's chat_template); before, a config error said it was not applied
  from rljax import config as config_lib  # pylint: disable=import-outside-toplevel
  from rljax import train  # pylint: disable=import-outside-toplevel
  from rljax.rl import trainer  # pylint: disable=import-outside-toplevel
  config = config_lib.load_config_file(os.path.join(processes.ROOT, "configs", "grpo.py"))
  config_lib.apply_overrides(config, [f"data.tokenizer={tok_dir}", f"actor_rollout_ref.model.custom_chat_template="
                                      f'"{EFFORT_TEMPLATE}"', "+data.apply_chat_template_kwargs.reasoning_effort=medium"])
  train.resolve(config, [], device_count=1)
  ours, ref = trainer.load_tokenizer(config), transformers.AutoTokenizer.from_pretrained(tok_dir)
  msgs = [{"role": "user", "content": "sum 1 2"}]
  ref.chat_template = EFFORT_TEMPLATE
  assert ours.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == ref.apply_chat_template(
      msgs, add_generation_prompt=True, tokenize=False, reasoning_effort="medium") == (
      "user: sum 1 2<|endoftext|>effort=medium")
  assert ours.apply_chat_template(msgs, add_generation_prompt=True) == ref.apply_chat_template(
      msgs, add_generation_prompt=True, reasoning_effort="medium", return_dict=False)
  assert M.load_tokenizer(tok_dir).chat_template == TOOL_TEMPLATE  # the model's own stays as it was
  with pytest.raises(config_lib.ConfigError, match=r"actor_rollout_ref.model.custom_chat_template=.*: is not a valid "
                                                   r"Jinja template \(line 1: .*endfor"):
    train.resolve(config, ["actor_rollout_ref.model.custom_chat_template='{% for m in messages %}'"], device_count=1)
