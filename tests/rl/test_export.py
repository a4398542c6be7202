"""python -m rljax.export: checkpoint actor -> HF directory that transformers opens."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from flax import nnx

from rljax import config as config_lib
from rljax import export
from rljax import models
from rljax.training.checkpointing import Checkpointer
from tests import processes

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_CFG = models.ModelConfig(
    model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True, rms_norm_eps=1e-6,
    max_position_embeddings=128, eos_token_id=2,
)


def _write_tokenizer(path):
  vocab = {f"t{i}": i for i in range(_CFG.vocab_size)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "t2", "tokenizer_class": "PreTrainedTokenizerFast"}, f)


def _random_params(model_cfg, seed):
  """(graphdef, parameters): N(0, 0.1^2) weights, norm scales near 1; numpy-made (no compiles)."""
  abstract = nnx.eval_shape(lambda: models.CausalLM(model_cfg, nnx.Rngs(0)))
  graphdef, params = nnx.split(abstract, nnx.Param)
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = rng.normal(0.0, 0.1, leaf.shape).astype(np.float32)
    is_norm = any("norm" in str(getattr(k, "key", "")) for k in path)
    return jnp.asarray(noise + 1.0 if is_norm else noise)

  return graphdef, jax.tree_util.tree_map_with_path(draw, params)


@nnx.jit
def _logits(model, ids):
  return model(ids)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A base HF dir and a checkpoint dir whose latest step holds perturbed actor params."""
  root = tmp_path_factory.mktemp("export")
  base_dir, ckpt_dir = str(root / "base"), str(root / "ckpt")
  graphdef, base = _random_params(_CFG, seed=0)
  models.save_pretrained(nnx.merge(graphdef, base), base_dir)
  _write_tokenizer(base_dir)
  config = config_lib.get_base_config()
  config.actor_rollout_ref.model.path = base_dir
  config.trainer.default_local_dir = ckpt_dir
  _, trained = _random_params(_CFG, seed=1)
  _, early = _random_params(_CFG, seed=2)
  with Checkpointer.from_config(config) as ckpt:
    ckpt.save(3, {"actor": early, "critic": {"v": jnp.ones(4)}}, {"step": 3})
    ckpt.save(7, {"actor": trained, "critic": {"v": jnp.ones(4)}}, {"step": 7})
  return {"base": base_dir, "ckpt": ckpt_dir, "trained": nnx.merge(graphdef, trained),
          "early": nnx.merge(graphdef, early)}


def _max_logit_diff(hf_dir, model):
  ids = np.random.default_rng(0).integers(0, _CFG.vocab_size, size=(2, 9))
  hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                         attn_implementation="eager")
  with torch.no_grad():
    ref = hf(torch.as_tensor(ids)).logits.numpy()
  ours = np.asarray(_logits(model, jnp.asarray(ids)))
  return float(np.max(np.abs(ours - ref)))


@pytest.mark.slow
def test_cli_exports_latest_step_with_trained_logits(run, tmp_path):
  out = str(tmp_path / "hf")
  result = processes.run(["-m", "rljax.export", "--checkpoint", run["ckpt"], "--out", out], devices=1)
  assert result.returncode == 0, result.stderr
  assert os.path.exists(os.path.join(out, "tokenizer.json"))
  assert _max_logit_diff(out, run["trained"]) <= 1e-4
  assert _max_logit_diff(out, run["early"]) > 1e-2
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.convert_tokens_to_ids("t5") == 5


def test_on_every_host_only_process_zero_exports(run, tmp_path):
  out = tmp_path / "hf"
  result = processes.run(["-m", "rljax.export", "--checkpoint", run["ckpt"], "--out", str(out)], devices=1,
                         JAX_PROCESS_ID="1", JAX_NUM_PROCESSES="2")
  assert result.returncode == 0 and "leaves the export to process 0" in result.stdout and not out.exists()


def test_export_an_earlier_step(run, tmp_path):
  out = export.export(run["ckpt"], str(tmp_path / "hf3"), step=3)
  assert _max_logit_diff(out, run["early"]) <= 1e-4


def test_scan_layers_checkpoint(run, tmp_path):
  ckpt_dir = str(tmp_path / "ckpt")
  config = config_lib.get_base_config()
  config.actor_rollout_ref.model.path = run["base"]
  config.actor_rollout_ref.model.scan_layers = True
  graphdef, params = _random_params(_CFG.replace(scan_layers=True), seed=3)
  with Checkpointer(ckpt_dir) as ckpt:
    ckpt.save_config(config)
    ckpt.save(1, {"actor": params})
  out = export.export(ckpt_dir, str(tmp_path / "hf"))
  assert _max_logit_diff(out, nnx.merge(graphdef, params)) <= 1e-4


def test_a_run_s_custom_chat_template_goes_with_its_export_and_its_generations(run, tmp_path):
  # verl saves the tokenizer with the custom template set; generating from the checkpoint renders prompts as the
  # run trained on them
  from rljax.evaluation import config as eval_config, generation  # pylint: disable=import-outside-toplevel
  template = "{% for m in messages %}{{ 't9 ' + m['content'] }}{% endfor %}"
  ckpt_dir = str(tmp_path / "ckpt")
  config = config_lib.get_base_config()
  config.actor_rollout_ref.model.path = run["base"]
  config.actor_rollout_ref.model.custom_chat_template = template
  graphdef, params = _random_params(_CFG, seed=4)
  with Checkpointer(ckpt_dir) as ckpt:
    ckpt.save_config(config)
    ckpt.save(1, {"actor": params})
  out = export.export(ckpt_dir, str(tmp_path / "hf"))
  assert transformers.AutoTokenizer.from_pretrained(out).chat_template == template
  assert models.load_tokenizer(run["base"]).chat_template is None  # the base model's own is untouched
  generate = eval_config.get_generate_config()
  generate.model.checkpoint = ckpt_dir
  messages = [{"role": "user", "content": "t5"}]
  assert generation.load_tokenizer(generate).apply_chat_template(messages, tokenize=False) == "t9 t5"


def test_a_run_s_tokenizer_path_is_its_tokenizer_in_training_export_and_generation(run, tmp_path):
  # verl 0.9.1's model config loads the tokenizer from actor_rollout_ref.model.tokenizer_path; data.tokenizer (older
  # verl) comes first where set
  from rljax.evaluation import config as eval_config, generation  # pylint: disable=import-outside-toplevel
  from rljax.rl import trainer  # pylint: disable=import-outside-toplevel
  tok_dir, ckpt_dir = tmp_path / "tok", str(tmp_path / "ckpt")
  tok_dir.mkdir()
  _write_tokenizer(str(tok_dir))
  config_path = tok_dir / "tokenizer_config.json"
  config_path.write_text(json.dumps({**json.loads(config_path.read_text()),
                                     "chat_template": "{% for m in messages %}{{ 't7 ' + m['content'] }}{% endfor %}"}))
  config = config_lib.get_base_config()
  config.actor_rollout_ref.model.path = run["base"]
  config.actor_rollout_ref.model.tokenizer_path = str(tok_dir)
  assert config_lib.tokenizer_key(config) == "actor_rollout_ref.model.tokenizer_path"
  messages = [{"role": "user", "content": "t5"}]
  assert trainer.load_tokenizer(config).apply_chat_template(messages, tokenize=False) == "t7 t5"
  graphdef, params = _random_params(_CFG, seed=5)
  with Checkpointer(ckpt_dir) as ckpt:
    ckpt.save_config(config)
    ckpt.save(1, {"actor": params})
  out = export.export(ckpt_dir, str(tmp_path / "hf"))
  assert transformers.AutoTokenizer.from_pretrained(out).apply_chat_template(messages, tokenize=False) == "t7 t5"
  generate = eval_config.get_generate_config()
  generate.model.checkpoint = ckpt_dir
  assert generation.load_tokenizer(generate).apply_chat_template(messages, tokenize=False) == "t7 t5"
  config.data.tokenizer = run["base"]
  assert config_lib.tokenizer_key(config) == "data.tokenizer"
  config.data.tokenizer = None
  config.actor_rollout_ref.model.tokenizer_path = str(tmp_path / "missing")
  with pytest.raises(config_lib.ConfigError, match="actor_rollout_ref.model.tokenizer_path='.*missing': its "
                                                   "tokenizer does not load"):
    trainer.load_tokenizer(config)


def _cli_error(capsys, *args):
  with pytest.raises(SystemExit) as e:
    export.main(list(args))
  assert e.value.code == 1
  return capsys.readouterr().err


def test_missing_checkpoint_dir(tmp_path, capsys):
  missing = str(tmp_path / "nope")
  err = _cli_error(capsys, "--checkpoint", missing, "--out", str(tmp_path / "o"))
  assert f"checkpoint directory {missing} does not exist" in err


def test_missing_config_yaml(run, tmp_path, capsys):
  ckpt_dir = tmp_path / "ckpt"
  ckpt_dir.mkdir()
  err = _cli_error(capsys, "--checkpoint", str(ckpt_dir), "--out", str(tmp_path / "o"))
  assert f"{ckpt_dir / 'config.yaml'} does not exist" in err


def test_no_complete_checkpoint(run, tmp_path, capsys):
  ckpt_dir = tmp_path / "ckpt"
  (ckpt_dir / "global_step_5.orbax-checkpoint-tmp-99").mkdir(parents=True)
  (ckpt_dir / "config.yaml").write_text(open(os.path.join(run["ckpt"], "config.yaml")).read())
  err = _cli_error(capsys, "--checkpoint", str(ckpt_dir), "--out", str(tmp_path / "o"))
  assert "no complete checkpoint" in err and str(ckpt_dir) in err
  err = _cli_error(capsys, "--checkpoint", run["ckpt"], "--step", "5", "--out", str(tmp_path / "o"))
  assert "global_step_5 is not a complete checkpoint" in err and "[3, 7]" in err
  assert not (tmp_path / "o").exists()


def test_missing_base_model_names_the_key(tmp_path, capsys):
  config = config_lib.get_base_config()
  config.actor_rollout_ref.model.path = str(tmp_path / "gone")
  with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
    ckpt.save_config(config)
    ckpt.save(1, {"actor": {"w": jnp.ones(2)}})
  err = _cli_error(capsys, "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o"))
  assert f"actor_rollout_ref.model.path={tmp_path / 'gone'}" in err


def test_peft_format_needs_a_lora_run(run, tmp_path, capsys):
  err = _cli_error(capsys, "--checkpoint", run["ckpt"], "--out", str(tmp_path / "o"), "--format", "peft")
  assert "needs a LoRA run (actor_rollout_ref.model.lora_rank > 0)" in err
  assert not (tmp_path / "o").exists()
