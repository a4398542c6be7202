"""Trainer paths beyond the core loop: a reward model, validation, rollout dtype, SIGTERM, bad data sources."""

import json
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import rl
from tests import processes
from tests.rl import tiny_run

def hf_scores(path, sequences):
  """transformers' reward for each unpadded token sequence."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
  with torch.no_grad():
    return np.array([model(torch.tensor([list(seq)], dtype=torch.long)).logits[0, 0].item() for seq in sequences])


def first_rollout(config):
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    batch = next(trainer.train_iter)
    return trainer, batch, trainer.source.rows(batch, trainer.step, {}, {})
  finally:
    trainer.close()


def assert_scores_on_last_token(scores, response_mask, expected):
  lengths = response_mask.sum(1)
  assert np.count_nonzero(scores) == len(expected)
  np.testing.assert_allclose(scores[np.arange(len(lengths)), lengths - 1], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    (),  # padded rows (verl's default for the reward model)
    ("reward_model.model.use_remove_padding=true",),  # packed: each row's real tokens, scored at the last
    # packed micro-batches of at most two buffers of P + R = 104 tokens: rows dealt out of order
    ("reward_model.model.use_remove_padding=true", "reward_model.use_dynamic_bsz=true",
     "reward_model.forward_max_token_len_per_gpu=208"),
], ids=["padded", "packed", "packed_by_budget"])
def test_reward_model_scores_match_transformers(model_dir, data_dir, reward_model_dir, tmp_path, extra):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "reward_model.enable=true",
                               f"reward_model.model.path={reward_model_dir}", *extra)
  trainer, _, rows = first_rollout(config)
  assert (trainer.run.reward_model.step.args[1].__class__.__name__ == "PackedRows") == bool(extra)
  sequences = [ids[mask > 0] for ids, mask in zip(rows.input_ids, rows.attention_mask)]
  assert_scores_on_last_token(rows.token_level_scores, rows.response_mask, hf_scores(reward_model_dir, sequences))
  # other row counts than a step's (remax's baselines, dynamic sampling's rounds): 3 rows, and 11 in 2 pieces (the
  # second holding other rows than the first one's first three)
  for index in (np.arange(3), np.r_[0:8, 7, 5, 3]):
    np.testing.assert_allclose(trainer.scorer.model_reward(rows.take(index)), rows.token_level_scores[index], atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])  # right-padded chats, packed or not
def test_reward_model_with_its_own_tokenizer_rerenders_the_chat(model_dir, data_dir, reward_model_dir, tmp_path,
                                                                packed):
  import transformers  # pylint: disable=import-outside-toplevel
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "reward_model.enable=true",
                               f"reward_model.model.path={reward_model_dir}", "data.return_raw_chat=true",
                               f"reward_model.model.input_tokenizer={reward_model_dir}",
                               f"reward_model.model.use_remove_padding={str(packed).lower()}")
  trainer, batch, rows = first_rollout(config)
  tok = transformers.AutoTokenizer.from_pretrained(reward_model_dir)
  idx = rows.group
  chats = []
  for raw, response, mask in zip(np.asarray(batch["raw_prompt"])[idx], rows.responses, rows.response_mask):
    text = trainer.tokenizer.decode(response[mask > 0], skip_special_tokens=True)
    chats.append(tok.apply_chat_template(list(raw) + [{"role": "assistant", "content": text}], tokenize=True,
                                         return_dict=False))
  assert_scores_on_last_token(rows.token_level_scores, rows.response_mask, hf_scores(reward_model_dir, chats))


def test_reward_model_config_errors_name_the_key(model_dir, data_dir, reward_model_dir, tmp_path):
  from rljax.config import ConfigError  # pylint: disable=import-outside-toplevel
  with pytest.raises(ConfigError, match="data.return_raw_chat"):
    tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "reward_model.enable=true",
                        f"reward_model.model.path={reward_model_dir}",
                        f"reward_model.model.input_tokenizer={reward_model_dir}")
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "reward_model.enable=true",
                               f"reward_model.model.path={model_dir}")
  with pytest.raises(ValueError, match="score.weight"):
    rl.RLTrainer(config, mesh=tiny_run.one_device())


def test_unknown_data_source_fails_before_training(model_dir, data_dir, tmp_path):
  tiny_run.ensure_synthetic_data(data_dir)  # whichever test of the module this worker runs first
  table = pq.read_table(os.path.join(data_dir, "train.parquet"))
  sources = table.column("data_source").to_pylist()
  sources[3] = "my/new_task"
  path = tmp_path / "train.parquet"
  pq.write_table(table.set_column(table.schema.get_field_index("data_source"), "data_source",
                                  pa.array(sources)), path)
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), f"data.train_files={path}")
  with pytest.raises(ValueError, match=r"train.parquet: row 3 has data_source 'my/new_task'.*custom_reward_function"):
    rl.RLTrainer(config, mesh=tiny_run.one_device())


@pytest.mark.slow
def test_rollout_dtype_sets_the_engine_compute_dtype_and_keeps_weights_in_place(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "actor_rollout_ref.rollout.dtype=bfloat16")
  trainer, batch, rows = first_rollout(config)
  engine = trainer.sampler.engine
  assert engine.cfg.dtype == jnp.bfloat16
  assert engine.init_decode_state().cache.k[0].dtype == jnp.bfloat16
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(trainer.actor_params))
  assert rows.responses.shape == (8, 8) and np.isfinite(rows.rollout_log_probs).all()
  del batch


def run_metrics(config):
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    trainer.fit()
  finally:
    trainer.close()
  return trainer, [json.loads(line) for line in open(f"{trainer.run_dir}/metrics.jsonl")]


@pytest.mark.slow
def test_an_int8_rollout_trains_from_the_full_precision_weights_and_reports_its_mismatch(model_dir, data_dir,
                                                                                         tmp_path):
  """rollout.quantization=int8: the engine decodes with 8-bit copies of the trainer's float32 weights, the step
  recomputes the old log-probs (the responses came from other weights) and reports rollout_corr/* from them."""
  trainer, metrics = run_metrics(tiny_run.run_config(
      "grpo", model_dir, data_dir, str(tmp_path), "trainer.total_training_steps=1",
      "actor_rollout_ref.rollout.quantization=int8"))
  assert not trainer.run.on_policy and "timing_s/old_log_prob" in metrics[0]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(trainer.actor_params))
  assert 0 < metrics[0]["rollout_corr/log_ppl_abs_diff"] < 0.05 and 0 <= metrics[0]["rollout_corr/k3_kl"] < 0.01
  assert np.isfinite(metrics[0]["actor/pg_loss"])


@pytest.mark.slow
def test_forward_micro_batches_change_memory_not_results(model_dir, data_dir, tmp_path):
  common = ("trainer.total_training_steps=1", "actor_rollout_ref.actor.ppo_epochs=2")
  _, whole = run_metrics(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "whole"), *common))
  micro, split = run_metrics(tiny_run.run_config(
      "grpo", model_dir, data_dir, str(tmp_path / "micro"), *common,
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
      "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=420"))
  assert micro.run.layout.forward_micros["old_log_prob"] == 4 and micro.run.layout.forward_micros["ref"] == 2
  # actor/ppo_kl compares two passes of the same weights: it is float rounding (~1e-6) whatever the split.
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/", "actor/ppo_kl"))}
  assert drop(split[0]) == pytest.approx(drop(whole[0]), rel=1e-5, abs=1e-6)
  assert split[0]["actor/ppo_kl"] == pytest.approx(whole[0]["actor/ppo_kl"], abs=2e-5)


@pytest.mark.slow
def test_validation_logs_per_source_metrics_and_generations(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "trainer.total_training_steps=1",
                               "trainer.val_before_train=true", "trainer.test_freq=1",
                               "trainer.log_val_generations=3", "actor_rollout_ref.rollout.val_kwargs.n=2",
                               "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                               "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    trainer.fit()
  finally:
    trainer.close()
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  val = [r for r in records if "val-core/rljax/arithmetic/reward/mean@2" in r]
  assert [r["step"] for r in val] == [0, 1]
  for record in val:
    assert 0.0 <= record["val-core/rljax/arithmetic/reward/mean@2"] <= record["val-aux/rljax/arithmetic/reward/best@2/mean"] <= 1.0
  generations = [json.loads(line) for line in open(tmp_path / "generations.jsonl")]
  assert [g["step"] for g in generations] == [0, 0, 0, 1, 1, 1]
  assert all({"prompt", "response", "score"} <= g.keys() for g in generations)


def test_val_only_validates_and_stops(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "trainer.val_before_train=true",
                               "trainer.val_only=true")
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    metrics = trainer.fit()
  finally:
    trainer.close()
  assert "val-core/rljax/arithmetic/reward/mean@1" in metrics
  assert trainer.step == 0 and not os.path.exists(tmp_path / "global_step_1")


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(model_dir, data_dir, tmp_path):
  args = tiny_run.overrides(model_dir, data_dir, str(tmp_path), "trainer.total_training_steps=200",
                            "trainer.save_freq=-1")
  proc = processes.start(["-m", "rljax.train", "--config=configs/grpo.py", *args], 1, devices=1)[0]
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while (not metrics.exists() or not metrics.read_text().strip()) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  output = proc.communicate(timeout=300)[0]
  assert proc.returncode == 0, output[-3000:]
  steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
  last = max(steps)
  assert last < 200 and "SIGTERM" in output
  assert (tmp_path / f"global_step_{last}" / "commit_success.txt").exists()


@pytest.mark.slow
def test_remax_uses_the_greedy_response_reward_as_baseline(model_dir, data_dir, reward_model_dir, tmp_path):
  # the reward model scores the 4 greedy rows in a pass compiled for a step's 8
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "algorithm.adv_estimator=remax",
                               "trainer.total_training_steps=1", "reward_model.enable=true",
                               f"reward_model.model.path={reward_model_dir}")
  trainer, batch, rows = first_rollout(config)
  assert rows.reward_baselines.shape == (8,) and np.count_nonzero(rows.reward_baselines) == 8
  np.testing.assert_array_equal(rows.reward_baselines[0::2], rows.reward_baselines[1::2])
  _, records = run_metrics(config)
  assert "timing_s/gen_max" in records[0] and np.isfinite(records[0]["actor/pg_loss"])
  del trainer, batch


@pytest.mark.slow
def test_remax_streams_with_baselines_from_the_updates_weights(model_dir, data_dir, tmp_path):
  # under colocate_async each update generates its groups' greedy baselines with the weights it starts from: at
  # threshold 1 with wait, the synchronous run exactly; further ahead, a baseline for groups older weights sampled
  common = ("algorithm.adv_estimator=remax", "trainer.total_training_steps=2")
  streamed = ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_strategy=wait")
  runs = [run_metrics(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / name), *common, *extra))
          for name, extra in (("sync", ()), ("on", (*streamed, "trainer.v1.sampler.max_off_policy_threshold=1")),
                              ("ahead", (*streamed, "trainer.v1.sampler.max_off_policy_threshold=2",
                                         "actor_rollout_ref.rollout.free_cache_engine=false")))]
  trainer, runs = runs[2][0], [metrics for _, metrics in runs]
  # the baselines' cache is freed after each call (the stream keeps the engine's), and so are the stream's weights
  assert trainer.sampler._state is None and trainer.source.stream.stream.params is None  # pylint: disable=protected-access
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/", "off_policy/"))}
  assert [drop(m) for m in runs[0]] == [drop(m) for m in runs[1]] and len(runs[0]) == 2
  ahead = runs[2][1]
  assert ahead["off_policy/staleness/max"] == 2 and "timing_s/gen_max" in ahead and np.isfinite(ahead["actor/pg_loss"])
  # the batch read ahead trains at the second update: every group spans its 2 versions
  assert (ahead["off_policy/staleness/frac_1"], ahead["off_policy/staleness/frac_2_or_more"]) == (0, 1)


GDPO_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
  fmt = float(solution_str.strip() != "")
  acc = float(ground_truth in solution_str)
  return {"score": fmt + acc, "fmt": fmt, "acc": acc}
'''


@pytest.mark.slow
def test_gdpo_reads_reward_components_and_names_missing_ones(model_dir, data_dir, tmp_path):
  reward = tmp_path / "reward.py"
  reward.write_text(GDPO_REWARD)
  common = ("algorithm.adv_estimator=gdpo", "trainer.total_training_steps=1", f"custom_reward_function.path={reward}")
  _, records = run_metrics(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "ok"), *common,
                                               "algorithm.gdpo_reward_keys=[fmt,acc]"))
  assert np.isfinite(records[0]["actor/pg_loss"])
  with pytest.raises(ValueError, match=r"gdpo_reward_keys names \['length'\].*'acc', 'fmt', 'score'"):
    run_metrics(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "bad"), *common,
                                    "algorithm.gdpo_reward_keys=[acc,length]"))


@pytest.mark.slow
def test_rollout_and_validation_dumps(model_dir, data_dir, tmp_path):
  run_metrics(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "trainer.total_training_steps=1",
                                  "trainer.val_before_train=true", f"trainer.rollout_data_dir={tmp_path}/rollouts",
                                  f"trainer.validation_data_dir={tmp_path}/val"))
  rollouts = [json.loads(line) for line in open(tmp_path / "rollouts" / "1.jsonl")]
  val = [json.loads(line) for line in open(tmp_path / "val" / "0.jsonl")]
  assert len(rollouts) == 8 and len(val) == 4
  for record in rollouts + val:
    assert {"input", "output", "gts", "score", "step"} <= record.keys() and record["gts"] is not None
  metrics = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert np.mean([r["score"] for r in rollouts]) == pytest.approx(metrics[-1]["critic/score/mean"])


def test_trainer_unsupported_settings_are_config_errors(model_dir, data_dir, tmp_path):
  from rljax.config import ConfigError  # pylint: disable=import-outside-toplevel
  for extra, key in (("algorithm.adv_estimator=optimal_token_baseline",
                      "actor_rollout_ref.actor.calculate_sum_pi_squared=False: algorithm.adv_estimator="
                      "optimal_token_baseline reads the sum of squared token probabilities"),
                     ("algorithm.adv_estimator=tir_optimal_token_baseline actor_rollout_ref.actor.calculate_sum_pi_"
                      "squared=true algorithm.rollout_correction.bypass_mode=true",
                      "algorithm.rollout_correction.bypass_mode=True: .* which bypass mode skips"),
                     ("algorithm.adv_estimator=gae algorithm.use_pf_ppo=true algorithm.pf_ppo.reweight_method=maxmin",
                      "algorithm.pf_ppo.reweight_method='maxmin': must be one of pow, max_min, max_random. Fix: did "
                      "you mean max_min"),
                     ("actor_rollout_ref.rollout.max_model_len=50", "actor_rollout_ref.rollout.max_model_len")):
    with pytest.raises(ConfigError, match=key):
      tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), *extra.split())


def test_save_freq_minus_one_saves_no_checkpoint_as_in_verl(model_dir, data_dir, tmp_path):
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "trainer.total_training_steps=1",
                               "trainer.save_freq=-1")
  assert [m["step"] for m in tiny_run.fit_metrics(config)] == [1]
  assert not list(tmp_path.glob("global_step_*"))


def test_pf_ppo_trains_gae_on_the_rows_drawn_again_by_their_scores(model_dir, data_dir, tmp_path):
  # pow with weight_pow=50: a row scoring 1 weighs 1, one scoring 0.5 or 0 about 1e-8, so the critic's and the
  # actor's update train on the rows that scored 1 alone (drawn again, with replacement; test_packing holds the
  # packed passes of drawn rows to the padded ones)
  base = ("trainer.total_training_steps=1", tiny_run.text_scorer(tmp_path))
  plain = tiny_run.fit_metrics(tiny_run.run_config("ppo", model_dir, data_dir, str(tmp_path / "plain"), *base))
  drawn = tiny_run.fit_metrics(tiny_run.run_config("ppo", model_dir, data_dir, str(tmp_path / "pf"), *base,
                                                   "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.weight_pow=50"))
  assert drawn[0]["critic/score/mean"] == plain[0]["critic/score/mean"]  # the same rollout and its metrics
  assert 0 < plain[0]["critic/score/max"] == 1.0 and plain[0]["critic/score/min"] < 1.0
  for name in ("actor/pg_loss", "critic/vf_loss"):
    assert np.isfinite(drawn[0][name]) and drawn[0][name] != plain[0][name], name


@pytest.mark.slow  # two 1-step runs (about 30 s)
def test_a_micro_batch_size_is_a_cap_and_the_update_does_not_depend_on_it(model_dir, data_dir, tmp_path):
  # 8 rows a mini-batch on one device: ppo_micro_batch_size_per_gpu=100 runs them as one micro-batch (verl does;
  # rljax refused it), =3 as four of 2 (the most rows within 3 that split 8 evenly); the update is the same
  runs = {micro: tiny_run.fit_metrics(tiny_run.run_config(
      "grpo", model_dir, data_dir, str(tmp_path / str(micro)), "trainer.total_training_steps=1",
      f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}", tiny_run.text_scorer(tmp_path)))[0]
          for micro in (100, 3)}
  assert runs[100]["actor/pg_loss"] != 0
  for name in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
    assert runs[100][name] == pytest.approx(runs[3][name], rel=1e-5, abs=1e-7), name


def test_grpo_with_one_response_per_prompt_takes_the_score_as_the_advantage(model_dir, data_dir, tmp_path):
  # verl's singleton group (mean 0, std 1): with rollout.n=1 each response's advantage is its score / (1 + 1e-6)
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / "run"), "actor_rollout_ref.rollout.n=1",
                               "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                               "trainer.total_training_steps=1", tiny_run.text_scorer(tmp_path))
  metrics = tiny_run.fit_metrics(config, tiny_run.one_device())[-1]
  assert metrics["critic/score/max"] > metrics["critic/score/min"]  # the text scorer gives different scores
  for stat in ("max", "min"):
    np.testing.assert_allclose(metrics[f"critic/advantages/{stat}"], metrics[f"critic/score/{stat}"] / (1 + 1e-6),
                               rtol=1e-5, atol=1e-6)
  assert np.isfinite(metrics["actor/pg_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baselines_read_the_old_passs_sum_of_squared_probabilities(estimator, model_dir, data_dir,
                                                                                 tmp_path, monkeypatch):
  """verl's actor.calculate_sum_pi_squared: the old-log-prob pass (packed, and padded) computes Σ_v π_v² of
  each response token, equal to `transformers`' softmax of the initial weights' logits, and the advantages are
  verl's optimal token baseline of it (tests/algos/np_ref_advantages.py); one mini-batch, still off-policy:
  the baseline reads the old log-probs before the update."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from rljax.rl import stages  # pylint: disable=import-outside-toplevel
  from tests.algos import np_ref_advantages as ref  # pylint: disable=import-outside-toplevel
  seen, advantages = [], stages.advantages

  def recorded(parts, state, rows, step_metrics):
    out, state = advantages(parts, state, rows, step_metrics)
    seen.append((jax.tree.map(np.asarray, rows), np.asarray(out.advantages)))
    return out, state

  monkeypatch.setattr(stages, "advantages", recorded)
  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
  for padding in ("true", "false"):
    config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / padding), "trainer.total_training_steps=1",
                                 "trainer.save_freq=-1", f"algorithm.adv_estimator={estimator}",
                                 tiny_run.text_scorer(tmp_path),
                                 "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
                                 f"actor_rollout_ref.model.use_remove_padding={padding}")
    metrics = tiny_run.fit_metrics(config)
    assert metrics[0]["actor/grad_norm"] > 0
    rows, adv = seen[-1]
    prompt = rows.prompt_mask.shape[1]
    with torch.no_grad():
      logits = model(input_ids=torch.tensor(rows.input_ids, dtype=torch.long),
                     attention_mask=torch.tensor(rows.attention_mask), position_ids=torch.tensor(
                         rows.positions, dtype=torch.long)).logits[:, prompt - 1:-1].double()
    want = (torch.softmax(logits, -1) ** 2).sum(-1).numpy()
    mask = rows.response_mask.astype(bool)
    np.testing.assert_allclose(rows.sum_pi_squared[mask], want[mask], rtol=1e-3)
    reference = getattr(ref, estimator)(rows.token_level_scores, rows.response_mask, rows.group, rows.old_log_probs,
                                        rows.sum_pi_squared, None)[0]
    np.testing.assert_allclose(adv, reference, rtol=1e-5, atol=1e-6)
    assert np.abs(adv[mask]).max() > 0
