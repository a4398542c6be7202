"""GRPO with tool calls: verl's multi-turn rollouts (`actor_rollout_ref.rollout.multi_turn.*`) on the offline
calculator task.

SmolLM2-135M-Instruct answers sums and products of 4-6 digit numbers
(`rljax.data.synthetic.calculator`, written under ~/data/rljax/calculator on
first use) with a `calculator` tool (configs/tools/calculator.yaml, verl's
tool YAML) called in the hermes format; the tool's answer comes back as a
tool turn and the model then answers. The reward (data_source
rljax/calculator) is 1 for the right final number, 0.2 for a well-formed
call with a wrong answer, 0 otherwise; the loss counts only the model's own
tokens (tool turns have response_mask 0).

The base model never writes a well-formed call (BENCHMARKS.md); warm-start
it on worked tool-use conversations first, as users do:

    python -m rljax.sft --config=configs/sft.py:smollm2_calculator trainer.total_training_steps=1
    python -m rljax.export --checkpoint checkpoints/rljax/sft_smollm2_calculator --out /tmp/calc_sft
    python -m rljax.train --config=configs/grpo_tool.py actor_rollout_ref.model.path=/tmp/calc_sft
"""

import os

from rljax.config import ConfigError, load_config_file, set_value
from rljax.data.synthetic import calculator

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "tools", "calculator.yaml")


def get_config(arg=None):
  if arg:
    raise ConfigError("--config", f"configs/grpo_tool.py:{arg}", "this experiment has no presets",
                      "drop the ':...' and change sizes with KEY=VALUE overrides")
  config = load_config_file(os.path.join(HERE, "grpo.py"))  # GRPO's settings on SmolLM2
  set_value(config, "trainer.experiment_name", "grpo_tool_smollm2_calculator")
  for key, value in {
      "data.train_files": f"{calculator.DEFAULT_LOCAL_DIR}/train.parquet",
      "data.val_files": f"{calculator.DEFAULT_LOCAL_DIR}/test.parquet",
      "data.max_prompt_length": 160,
      "data.max_response_length": 128,
      "data.return_raw_chat": True,
      "data.train_batch_size": 8,
      "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
      "actor_rollout_ref.actor.optim.lr": 1e-5,
      "actor_rollout_ref.rollout.n": 4,
      "actor_rollout_ref.rollout.max_num_seqs": 32,
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 32,
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 32,
      "actor_rollout_ref.rollout.multi_turn.enable": True,
      "actor_rollout_ref.rollout.multi_turn.format": "hermes",
      "actor_rollout_ref.rollout.multi_turn.tool_config_path": TOOLS,
      "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 2,
      "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": 32,
      "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
      "trainer.total_training_steps": 12,
  }.items():
    set_value(config, key, value)
  return config
