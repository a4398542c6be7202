"""The SFT config tree, its checks, the command line, and verl's SFT schedules written out."""

import math

import numpy as np
import optax
import pytest

from rljax import config as config_lib
from rljax.sft import config as sft_config
from rljax.training.optim import make_optimizer, make_schedule
from tests.sft import helpers
from tests import processes


def _config(*overrides, devices=8):
  config = sft_config.get_sft_config()
  config_lib.apply_overrides(config, ["trainer.n_gpus_per_node=auto", *overrides])
  sft_config.finalize(config, devices)
  return sft_config.validate(config, devices)


def _schedule(scheduler, ratio, total):
  config = _config(f"optim.lr_scheduler={scheduler}", f"optim.warmup_steps_ratio={ratio}", "optim.lr=2.0")
  return np.asarray([float(make_schedule(sft_config.optim_view(config.optim), total, 1)(s)) for s in range(total + 2)])


def test_cosine_schedule_is_verls_formula():
  total, warmup = 20, 2  # int(0.1 * 20)
  want = [2.0 * (s / warmup if s < warmup else
                 max(0.0, 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))) for s in range(total + 2)]
  np.testing.assert_allclose(_schedule("cosine", 0.1, total), want, rtol=1e-6, atol=1e-7)


def test_wsd_schedule_is_verls_formula():
  total, warmup = 53, 5  # int(0.1 * 53); stable = int(0.9 * 48) = 43 steps; decay = 5 steps
  stable, decay = 43, 5

  def factor(s):
    if s < warmup:
      return s / warmup
    if s < warmup + stable:
      return 1.0
    if s < total:
      return 0.5 * (1 + math.cos(math.pi * (s - warmup - stable) / decay))
    return 0.0

  got = _schedule("wsd", 0.1, total)
  np.testing.assert_allclose(got, [2.0 * factor(s) for s in range(total + 2)], rtol=1e-6, atol=1e-7)
  assert got[warmup + stable - 1] == 2.0 and 0.0 < got[warmup + stable + 1] < 2.0


def test_betas_reach_adamw():
  config = _config("optim.betas=[0.5,0.6]", "optim.clip_grad=0", "optim.weight_decay=0")
  tx = make_optimizer(sft_config.optim_view(config.optim), 0.0, 10, 1)
  state = tx.init({"w": np.zeros(2, np.float32)})
  _, state = tx.update({"w": np.ones(2, np.float32)}, state, {"w": np.zeros(2, np.float32)})
  np.testing.assert_allclose(optax.tree_utils.tree_get(state, "mu")["w"], 0.5)  # mu = (1 - b1) * g
  np.testing.assert_allclose(optax.tree_utils.tree_get(state, "nu")["w"], 0.4)  # nu = (1 - b2) * g^2


def test_aliases_deprecations_and_checks():
  config = _config("optim.lr_warmup_steps_ratio=0.3", "data.micro_batch_size=16")
  assert config.optim.warmup_steps_ratio == 0.3 and config.data.micro_batch_size_per_gpu == 2
  with pytest.raises(config_lib.ConfigError, match="did you mean optim.lr_scheduler"):
    _config("optim.lr_schedule=wsd")
  with pytest.raises(config_lib.ConfigError, match="data.train_batch_size=100: .* multiple of 32"):
    _config("data.train_batch_size=100")
  assert _config("model.lora_rank=8", "model.r_pattern={'layers\\.0\\..*': 4}").model.r_pattern == {"layers\\.0\\..*": 4}
  with pytest.raises(config_lib.ConfigError, match="model.lora_dropout=1.5: must lie in"):
    _config("model.lora_rank=8", "model.lora_dropout=1.5")
  with pytest.raises(config_lib.ConfigError, match="model.target_modules"):
    _config("model.lora_rank=8", "model.target_modules=[qkv]")
  with pytest.raises(config_lib.ConfigError, match="data.truncation='middle'"):
    _config("data.truncation=middle")


@pytest.mark.slow
def test_command_line_dry_run(tmp_path):
  result = processes.run(  # one CPU device, as the preset is sized for
      ["-m", "rljax.sft", "--config=configs/sft.py", "--dry_run", "--config.optim.lr=3e-5",
       "optim.lr_scheduler=wsd", f"trainer.default_local_dir={tmp_path}"], devices=1, cwd=str(helpers.ROOT))
  assert result.returncode == 0, result.stderr[-2000:]
  config = config_lib.from_yaml(result.stdout, base=sft_config.get_sft_config())
  assert config.optim.lr == 3e-5 and config.optim.lr_scheduler == "wsd"
  assert config.model.partial_pretrain == "smollm2-135m-instruct"
