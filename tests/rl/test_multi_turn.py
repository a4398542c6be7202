"""Multi-turn GRPO through the trainer: a table-driven policy that calls a deterministic tool or answers."""

import json
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import config as config_lib
from rljax.models import save_pretrained
from rljax import rl
from tests import processes
from tests.rollout import chain
from tests.rl import tiny_run

TOOL_PY = textwrap.dedent('''
    class Lookup:
        def __init__(self, config, tool_schema):
            self.schema = tool_schema
        def get_openai_tool_schema(self):
            return self.schema
        def create(self, instance_id=None, **kwargs):
            return instance_id
        def execute(self, instance_id, parameters, **kwargs):
            return "7", 0.0, {}
        def calc_reward(self, instance_id, **kwargs):
            return 1.0
        def release(self, instance_id, **kwargs):
            pass

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        answered = float("The answer is 7." in solution_str)
        return answered + 0.25 * (extra_info["num_turns"] > 2) + 0.0 * extra_info["rollout_reward_scores"]["lookup"]
''')
TOOLS_YAML = ("tools:\n  - class_name: {root}/calc_tools.py:Lookup\n    config: {{type: native}}\n    tool_schema:\n"
              "      type: function\n      function:\n        name: lookup\n        description: look a value up\n"
              "        parameters: {{type: object, properties: {{key: {{type: string}}}}, required: []}}\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(model dir, files dir) for a policy that calls the tool or answers, 1/2 each, after each generation prompt."""
  root = tmp_path_factory.mktemp("multi_turn")
  tok = chain.tokenizer()
  start, call, answer, eos = (chain.start_id(tok), chain.phrase_id(tok, "lookup"), chain.phrase_id(tok, "answer"),
                              tok.eos_token_id)
  model = chain.model(tok, {start: {call: 0.0, answer: 0.0}, call: {eos: 0.0}, answer: {eos: 0.0}})
  save_pretrained(model, str(root / "model"), tokenizer=tok)
  (root / "calc_tools.py").write_text(TOOL_PY)
  (root / "tools.yaml").write_text(TOOLS_YAML.format(root=root))
  rows = [{"data_source": "test/lookup", "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "tool",
           "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {"index": i},
           "agent_name": "tool_agent"} for i in range(8)]
  for split in ("train", "test"):
    pq.write_table(pa.Table.from_pylist(rows), str(root / f"{split}.parquet"))
  return str(root / "model"), root


def overrides(setup, run_dir, *extra):
  """The multi-turn job's command-line overrides: 2 steps of 4 prompts x 2 conversations."""
  model_dir, root = setup
  return [
      f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={root}/train.parquet",
      f"data.val_files={root}/test.parquet", "data.train_batch_size=4", "data.max_prompt_length=16",
      "data.max_response_length=48", "data.return_raw_chat=true", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2",
      "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.total_training_steps=2", "trainer.save_freq=-1",
      "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
      f"trainer.default_local_dir={run_dir}", "actor_rollout_ref.rollout.multi_turn.enable=true",
      f"actor_rollout_ref.rollout.multi_turn.tool_config_path={root}/tools.yaml",
      "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
      f"custom_reward_function.path={root}/calc_tools.py", f"trainer.rollout_data_dir={run_dir}/rollouts", *extra]


def run(setup, run_dir, *extra):
  config = config_lib.load_config_file(str(tiny_run.ROOT / "configs" / "grpo.py"))
  config_lib.apply_overrides(config, overrides(setup, run_dir, *extra))
  config_lib.finalize(config)
  config_lib.validate(config)
  trainer = rl.RLTrainer(config, mesh=None if "trainer.n_gpus_per_node=auto" in extra else tiny_run.one_device())
  try:
    trainer.fit()
  finally:
    trainer.close()
  return [json.loads(line) for line in open(f"{trainer.run_dir}/metrics.jsonl")]


@pytest.mark.slow  # four runs: one device, eight devices, two processes of four, sync and streamed (about 1 minute)
def test_two_multi_turn_grpo_steps_on_eight_devices_and_on_two_processes_equal_one(setup, tmp_path):
  one = run(setup, tmp_path / "one", "trainer.n_gpus_per_node=1",  # padded; the others pack (`rl.packing`)
            "actor_rollout_ref.model.use_remove_padding=false")
  assert len(one) == 2
  for step in one:
    assert 1.0 < step["num_turns/mean"] <= 7.0 and 0.0 < step["multi_turn/tool_call_rate"] < 1.0
    assert step["multi_turn/tokenization_mismatches"] == 0.0 and step["actor/grad_norm"] > 0
  assert one[0]["multi_turn/tool_errors"] == 0.0  # (updated, the policy may write two calls in a turn)
  dumped = [json.loads(line) for line in open(tmp_path / "one" / "rollouts" / "1.jsonl")]
  assert any("<|im_start|>tool" in r["output"] or "7" in r["output"] for r in dumped)
  eight = run(setup, tmp_path / "eight", "trainer.n_gpus_per_node=auto")
  for key in ("critic/score/mean", "num_turns/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
              "actor/entropy"):
    for a, b in zip(one, eight):
      assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
  # the same 8 devices as 2 processes: each host runs its own conversations and tools
  two = processes.run_metrics(["-m", "rljax.train", "--config=configs/grpo.py",
                               *overrides(setup, tmp_path / "two", "trainer.n_gpus_per_node=auto")], 2,
                              str(tmp_path / "two"))
  processes.assert_same_metrics(eight, two)
  # streamed on those 2 processes (colocate_async at threshold 1 with wait, which trains as sync does): each host
  # keeps its conversations in its own stream across the updates
  streamed = processes.run_metrics(["-m", "rljax.train", "--config=configs/grpo.py", *overrides(
      setup, tmp_path / "streamed", "trainer.n_gpus_per_node=auto", "trainer.v1.trainer_mode=colocate_async",
      "trainer.v1.sampler.max_off_policy_threshold=1", "trainer.v1.sampler.max_off_policy_strategy=wait")], 2,
                                   str(tmp_path / "streamed"))
  assert all(m["off_policy/staleness/max"] == 1 for m in streamed)
  processes.assert_same_metrics(eight, [{k: v for k, v in m.items() if not k.startswith("off_policy/")}
                                        for m in streamed])


@pytest.mark.slow
def test_multi_turn_streams_under_colocate_async(setup, tmp_path):
  """colocate_async at threshold 1 with wait equals the synchronous run; at threshold 2 a step trains conversations
  the previous weights began (their tool turns cached between versions), with the multi-turn metrics, and dynamic
  sampling judges each conversation group as it ends."""
  sync = run(setup, tmp_path / "sync", "trainer.n_gpus_per_node=1")
  streamed = ["trainer.n_gpus_per_node=1", "trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"]
  on_policy = run(setup, tmp_path / "on", *streamed, "trainer.v1.sampler.max_off_policy_threshold=1",
                  "trainer.v1.sampler.max_off_policy_strategy=wait")
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/", "off_policy/"))}
  assert [drop(m) for m in sync] == [drop(m) for m in on_policy] and len(sync) == 2
  # on a device of its own, on its thread (separate_async, weights after every update, nothing read ahead): the same
  apart = run(setup, tmp_path / "apart", "trainer.n_gpus_per_node=1", "trainer.v1.trainer_mode=separate_async",
              "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
              "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.v1.separate_async.parameter_sync_step=1",
              "trainer.v1.separate_async.num_warmup_batches=0", "trainer.v1.sampler.max_off_policy_threshold=1",
              "trainer.v1.sampler.max_off_policy_strategy=wait")
  assert [drop(m) for m in sync] == [drop(m) for m in apart]
  ahead = run(setup, tmp_path / "ahead", *streamed, "trainer.v1.sampler.max_off_policy_threshold=2",
              "trainer.v1.colocate_async.num_warmup_batches=1", "algorithm.rollout_correction.rollout_is=token",
              "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
              "trainer.total_epochs=20")
  second = ahead[1]  # its conversations began under the first step's weights, so their tokens are reweighted
  assert second["off_policy/mixed_version_frac"] > 0 and 0 < second["rollout_corr/k3_kl"] < 1e-2
  assert second["rollout_corr/rollout_is_min"] < 1 < second["rollout_corr/rollout_is_max"]
  assert second["off_policy/staleness/max"] == 2 and second["off_policy/token_lag/mean"] > 0
  assert sum(step["train/filtered_groups"] for step in ahead) >= 1
  for step in ahead:
    assert 1.0 < step["num_turns/mean"] <= 7.0 and step["multi_turn/tokenization_mismatches"] == 0.0
    assert step["actor/grad_norm"] > 0 and step["train/kept_groups"] == 4 and step["critic/advantages/max"] > 0
