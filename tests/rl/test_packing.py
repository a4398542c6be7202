"""Packed training passes: every row's real tokens once, in buffers, and the padded pass's numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import rljax.models as M
from rljax import sharding
from rljax.rl import packing
from rljax.training.packing import first_fit_decreasing
from rljax.rl.critic import ValueModel
from rljax.rl.experience import Experience
from rljax.rl.sequences import make_sequences, response_log_probs
from tests.models import helpers
from tests.rl import tiny_run

P, R = 7, 6


def ragged_rows(vocab: int, rows: int, seed: int = 0, longest: int = P + R) -> Experience:
  """Left-padded prompts and right-padded responses of different lengths (one response of one token, one full),
  rows of at most `longest` tokens (2 or more)."""
  rng = np.random.default_rng(seed)
  prompt_len = rng.integers(1, min(P, longest - 1) + 1, rows)
  prompt_len[0] = min(P, longest - 1)
  prompt_mask = (np.arange(P)[None] >= P - prompt_len[:, None]).astype(np.int32)
  response_len = np.minimum(rng.integers(1, R + 1, rows), longest - prompt_len)
  response_len[:2] = (1, min(R, longest - prompt_len[1]))
  response_mask = (np.arange(R)[None] < response_len[:, None]).astype(np.int32)
  prompts = rng.integers(3, vocab, (rows, P)) * prompt_mask
  responses = rng.integers(3, vocab, (rows, R)) * response_mask
  return make_sequences(prompts, prompt_mask, responses, response_mask)


def whole_plan(rows: Experience, micro: int, shards: int) -> packing.PackPlan:
  starts, ends = packing.row_spans(rows.attention_mask)
  order = np.arange(len(starts)).reshape(micro, -1)
  return packing.make_plan(starts, ends, order, shards, P, R, slice(0, shards))


def test_a_plan_holds_every_real_token_once_and_points_each_response_token_at_its_predictor():
  rows = ragged_rows(100, 12)
  plan = whole_plan(rows, micro=2, shards=3)
  flat = rows.input_ids.reshape(-1)
  src = plan.src
  assert plan.real_tokens == rows.attention_mask.sum()
  held = np.sort(src[src >= 0])
  assert held.tolist() == np.flatnonzero(rows.attention_mask.reshape(-1)).tolist()
  assert plan.buffers == max(len(first_fit_decreasing(  # the fullest shard's, 1 or 2 (2 rows a shard)
      (rows.attention_mask[b * 2:b * 2 + 2]).sum(1), P + R)) for b in range(6))
  for m in range(2):
    for d in range(3):
      tokens = np.where(src[m, d] >= 0, flat[np.maximum(src[m, d], 0)], -1).reshape(-1)
      for k in range(2):
        row = m * 6 + d * 2 + k
        for t in range(R):
          at = plan.out_index[m, d, k, t]
          if rows.response_mask[row, t]:
            assert tokens[at + 1] == rows.responses[row, t]  # the next buffer token is the predicted one
          else:
            assert at == -1


def test_buffers_follow_the_longest_shard_on_a_quarter_octave_grid():
  assert [packing.grid_ceil(n, 100) for n in (1, 7, 8, 9, 11, 16, 17, 33)] == [1, 7, 8, 10, 12, 16, 20, 40]
  assert packing.grid_ceil(17, 18) == 18 and packing.grid_ceil(0, 4) == 1
  starts, ends = np.zeros(16, np.int64), np.full(16, 1)
  ends[5] = P + R  # one full row: its shard needs a buffer of its own
  plan = packing.make_plan(starts, ends, np.arange(16).reshape(1, 16), 2, P, R, slice(1, 2))
  assert plan.buffers == 2 and plan.src.shape == (1, 1, 2, P + R)


def test_a_row_with_gaps_between_its_tokens_is_refused_by_number():
  mask = np.array([[0, 1, 1, 0], [1, 1, 0, 1]])
  with pytest.raises(ValueError, match="row 1's attention mask has gaps.*use_remove_padding=false"):
    packing.row_spans(mask)


def packed_batch(rows: Experience, micro: int, shards: int) -> Experience:
  """`rows` packed as one process places them ([M, D, ...] arrays on the default device)."""
  plan = whole_plan(rows, micro, shards)
  ids, pos = (jnp.asarray(x)[None] for x in (rows.input_ids, rows.positions))
  src = jnp.asarray(plan.src)
  real = src >= 0
  take = lambda x: jnp.where(real, x.reshape(-1)[jnp.maximum(src, 0)], 0)  # noqa: E731
  packed = packing.PackedRows(input_ids=take(ids), positions=take(pos),
                              segment_ids=jnp.where(real, packing.member_numbers(src, P + R), 0),
                              out_index=jnp.asarray(plan.out_index))
  return Experience(response_mask=rows.response_mask.reshape(micro, -1, R), packed=packed)


def loss_of(model, batch):
  log_probs, entropy = response_log_probs(model, batch, 0.7)
  mask = batch.response_mask
  return jnp.sum((log_probs + 0.1 * entropy) * mask), (log_probs * mask, entropy * mask)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """family -> a directory holding a tiny random HF model of that family."""
  return {family: helpers.saved_family(tmp_path_factory, family)[1] for family in ("mistral", "gemma3", "qwen3",
                                                                                   "qwen3_moe_all")}


# rows of at most 4 tokens in one micro-batch on one shard: 3 buffers hold 8 rows, and the LM head runs on
# their 39 positions rather than the rows' 8 x 6 response positions
@pytest.mark.parametrize("family, longest, micro, shards", [
    ("mistral", P + R, 2, 2), ("gemma3", P + R, 2, 2), ("qwen3_moe_all", P + R, 2, 2), ("qwen3", 4, 1, 1)])
def test_packed_log_probs_entropy_and_gradients_equal_the_padded_ones(saved, family, longest, micro, shards):
  model = M.from_pretrained(saved[family])
  graphdef, state = nnx.split(model)
  rows = ragged_rows(model.cfg.vocab_size, 8, longest=longest)
  plan = whole_plan(rows, micro, shards)
  head_on_buffers = plan.buffers * (P + R) <= 8 // micro // shards * R
  assert head_on_buffers == (longest == 4)
  packed = packed_batch(rows, micro, shards)

  def padded(s):
    return loss_of(nnx.merge(graphdef, s), rows)

  def packed_loss(s):
    per_micro = [loss_of(nnx.merge(graphdef, s), jax.tree.map(lambda x, m=m: x[m], packed)) for m in range(micro)]
    return sum(p[0] for p in per_micro), tuple(jnp.concatenate(x) for x in zip(*(p[1] for p in per_micro)))

  (loss1, (lp1, ent1)), grad1 = jax.jit(jax.value_and_grad(padded, has_aux=True))(state)
  (loss2, (lp2, ent2)), grad2 = jax.jit(jax.value_and_grad(packed_loss, has_aux=True))(state)
  np.testing.assert_allclose(lp2, lp1, atol=2e-5)
  np.testing.assert_allclose(ent2, ent1, atol=2e-5)
  np.testing.assert_allclose(loss2, loss1, rtol=1e-5)
  helpers.assert_gradients_close(grad2, grad1)


def test_packed_values_over_eight_shards_equal_the_padded_ones(saved):
  model = M.from_pretrained(saved["qwen3"], scan_layers=True, remat=True)
  graphdef, state = nnx.split(ValueModel(model, nnx.Rngs(1)))
  rows = ragged_rows(model.cfg.vocab_size, 16, seed=3)
  packed = jax.tree.map(lambda x: x[0], packed_batch(rows, 1, 8))
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  packed = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec("data"))), packed)
  values = jax.jit(lambda s, b: nnx.merge(graphdef, s).response_values(b))
  mask = rows.response_mask > 0
  np.testing.assert_allclose(np.asarray(values(state, packed))[mask], np.asarray(values(state, rows))[mask],
                             atol=2e-5)


def run_metrics(model_dir, data_dir, run_dir, name, *extra):
  config = tiny_run.run_config(name, model_dir, data_dir, str(run_dir), "trainer.total_training_steps=2",
                               "trainer.save_freq=-1", tiny_run.text_scorer(run_dir.parent), *extra)
  return tiny_run.fit_metrics(config)


def same_metrics(packed, padded, row_cap):
  for a, b in zip(packed, padded, strict=True):
    padded_ratio = row_cap / (a["prompt_length/mean"] + a["response_length/mean"])
    assert a.pop("perf/packed_compute_ratio") < 0.6 * padded_ratio  # rows really shared buffers
    drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/", "actor/ppo_kl"))}  # noqa: E731
    assert drop(a) == pytest.approx(drop(b), rel=1e-4, abs=1e-5)
    assert a["actor/ppo_kl"] == pytest.approx(b["actor/ppo_kl"], abs=2e-5)


@pytest.mark.slow  # two 2-step runs each (about 40 s)
@pytest.mark.parametrize("name, extra", [
    ("grpo", ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")),
    ("ppo", ("critic.model.use_remove_padding=true", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum")),
    # the loss aggregations the two above leave out (token-mean is grpo's)
    ("grpo", ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",)),
    ("grpo", ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",)),
    ("grpo", ("actor_rollout_ref.actor.loss_agg_mode=token-sum",)),
    # PF-PPO: mini-batches of rows drawn again with replacement (a row packed twice into one buffer)
    ("ppo", ("critic.model.use_remove_padding=true", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
             "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.weight_pow=1")),
])
def test_a_packed_run_gives_the_padded_runs_metrics(model_dir, data_dir, tmp_path, name, extra):
  extra += ("data.max_prompt_length=200",)  # buffers of 208 tokens hold several rows of the synthetic prompts
  flags = {True: ("actor_rollout_ref.model.use_remove_padding=true",),
           False: ("actor_rollout_ref.model.use_remove_padding=false", "critic.model.use_remove_padding=false")}
  packed = run_metrics(model_dir, data_dir, tmp_path / "packed", name, *extra, *flags[True])
  padded = run_metrics(model_dir, data_dir, tmp_path / "padded", name, *extra, *flags[False])
  same_metrics(packed, padded, 208)


def test_steps_pack_by_the_verl_keys(model_dir, data_dir, tmp_path):
  from rljax.rl import steps as steps_lib  # pylint: disable=import-outside-toplevel
  config = tiny_run.run_config("ppo", model_dir, data_dir, str(tmp_path))
  assert steps_lib.packs_actor(config) and steps_lib.packs_critic(config)  # verl 0.9.1's defaults
  config.critic.model.use_remove_padding = False
  assert not steps_lib.packs_critic(config)
  config.actor_rollout_ref.model.use_remove_padding = False
  assert not steps_lib.packs_actor(config)
  config.actor_rollout_ref.model.use_remove_padding = True
  mesh = sharding.build_mesh({"data": 2, "fsdp": 4, "tensor": 1, "sequence": 1}, jax.devices()[:8])
  spec = packing.spec(2, 32, P, R, mesh, sharding.rules_from_config(config))
  assert spec.input_ids.shape == (2, 8, 2, P + R) and spec.out_index.shape == (2, 8, 2, R)


def test_a_token_budget_packs_each_shard_into_the_fewest_buffers_and_keeps_each_row_on_its_shard():
  lengths = np.array([10, 2, 3, 9, 1, 1, 8, 2, 10, 3, 3, 3, 2, 2, 1, 1])
  order = np.arange(16)[::-1].copy()  # shard 0 holds rows 15..8 (25 tokens, 3 buffers), shard 1 rows 7..0 (36, 4)
  # budget -> micro-batches of slots a shard: 4 buffers fit one micro-batch, 2 take two, 1 four
  for budget, micro, slots in ((40, 1, 8), (20, 2, 8), (10, 4, 4)):  # slots: a power of two
    arrangement = packing.budget_arrangement(lengths, order, 2, budget, width=10)
    assert arrangement.shape == (micro, 2 * slots)
    placed = arrangement[arrangement >= 0]
    assert sorted(placed.tolist()) == list(range(16))  # every row once
    for d, shard_rows in enumerate((set(order[:8].tolist()), set(order[8:].tolist()))):
      block = arrangement[:, d * slots:(d + 1) * slots]
      assert set(block[block >= 0].tolist()) == shard_rows  # a row stays on its shard
      for group in block:
        real = group[group >= 0]
        assert (group[len(real):] == -1).all()  # a block's rows, then its empty slots
        assert len(first_fit_decreasing(lengths[real], 10)) * 10 <= budget
    plan = packing.make_plan(np.zeros(16, np.int64), lengths, arrangement, 2, 10, 0, slice(0, 2))
    assert plan.buffers * micro == 4  # the fullest shard's 4 buffers, no more
    assert plan.real_tokens == lengths.sum()
  # a pass's outputs come back in row order from any arrangement of a process's rows, empty slots left out
  arrangement = packing.budget_arrangement(lengths, np.arange(16), 2, 20, width=10)
  out = packing.rows_in_place(np.where(arrangement >= 0, arrangement, 99)[..., None] * 10, arrangement, 0, 16)
  assert out[:, 0].tolist() == [10 * i for i in range(16)]


@pytest.mark.parametrize("needed, most, chosen", [
    (5, 4, (5, 1)),  # five micro-batches of a buffer: no two-buffer split computes as few
    (9, 4, (3, 3)),
    (11, 12, (1, 12)),  # an eighth more buffers buys one micro-batch for eleven
    (40, 8, (5, 8)),
])
def test_budget_micro_batches_compute_about_the_fewest_buffers_in_the_fewest_micro_batches(needed, most, chosen):
  assert packing.budget_grid(needed, most) == chosen


@pytest.mark.slow  # two 2-step runs each (about 40 s)
@pytest.mark.parametrize("name, extra", [
    ("grpo", ()),
    # the critic's passes by their own budgets, and a loss counting the mini-batch's rows (not the slots)
    ("ppo", ("critic.model.use_remove_padding=true", "critic.use_dynamic_bsz=true",
             "critic.ppo_max_token_len_per_gpu=416", "critic.forward_max_token_len_per_gpu=416",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")),
])
def test_a_token_budget_counts_real_tokens_and_trains_as_the_padded_budget_does(model_dir, data_dir, tmp_path,
                                                                                monkeypatch, name, extra):
  # 208-token rows of 46-186 real tokens; a budget of 416 tokens a device: 2 padded rows, or more packed
  tiny_run.ensure_synthetic_data(data_dir)
  tiny_run.prompts_of_many_lengths(data_dir, tmp_path / "varied.parquet")
  budget = ("data.max_prompt_length=200", f"data.train_files={tmp_path}/varied.parquet",
            "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=416",
            "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.model.share_prompt_forward=false", *extra)  # so the padded twins never pay
  arrangements = []
  arrange = packing.budget_arrangement
  monkeypatch.setattr(packing, "budget_arrangement", lambda *a, **k: arrangements.append(arrange(*a, **k))
                      or arrangements[-1])
  packed = run_metrics(model_dir, data_dir, tmp_path / "packed", name, *budget)
  assert any((a < 0).any() for a in arrangements)  # micro-batches of as many rows as their buffers hold
  padded = run_metrics(model_dir, data_dir, tmp_path / "padded", name, *budget,
                       "actor_rollout_ref.model.use_remove_padding=false", "critic.model.use_remove_padding=false")
  # the losses are each micro-batch's share of the mini-batch's, so the gradients do not depend on the
  # micro-batches; metrics averaged over micro-batches (entropy, clip fractions) do, in verl too
  keys = ["critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm"]
  keys += ["critic/vf_loss", "critic/grad_norm"] if name == "ppo" else ["actor/kl_loss"]
  for a, b in zip(packed, padded, strict=True):
    assert a["perf/packed_compute_ratio"] < 2.0
    for key in keys:
      assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key


def test_shared_prompts_over_short_responses_run_padded_and_long_tails_packed():
  # the default job: 16 rows, groups of 4 sharing a 64-token prompt, 32-token responses; 16 buffers of 96
  assert packing.padded_pays(16 * 96, 16, 64, 32, group=4)
  # responses of up to 512 tokens averaging 110: 6 buffers of 576 against 4 prompts and 16 full responses
  assert not packing.padded_pays(6 * 576, 16, 64, 512, group=4)
  assert not packing.padded_pays(16 * 96, 16, 64, 32, group=1)  # no sharing: packing never costs more


def test_each_member_of_a_buffer_has_its_own_segment_even_a_row_twice():
  # width 4: row 3's tokens 1..3 twice, then row 0's last token and row 1's first (consecutive places, two rows)
  src = jnp.array([[13, 14, 15, 13, 14, 15, 3, 4, -1]])
  np.testing.assert_array_equal(packing.member_numbers(src, 4), [[1, 1, 1, 2, 2, 2, 3, 4, 5]])


def varied_run(model_dir, data_dir, tmp_path, monkeypatch, steps, *extra):
  """A `steps`-step run of 32 rows a step whose prompts are 46-186 tokens (buffers of 208): the (pass, M, B, S)
  of every plan (pass 0 the update, 1 the reference's), the two passes' M in the layout, and after each step
  the programs they hold."""
  from rljax import rl  # pylint: disable=import-outside-toplevel
  tiny_run.ensure_synthetic_data(data_dir)
  tiny_run.prompts_of_many_lengths(data_dir, tmp_path / "varied.parquet")
  config = tiny_run.run_config(
      "grpo", model_dir, data_dir, str(tmp_path / "run"), f"data.train_files={tmp_path}/varied.parquet",
      "data.max_prompt_length=200", "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "actor_rollout_ref.actor.use_kl_loss=true",
      "actor_rollout_ref.model.share_prompt_forward=false",  # so the padded twins never pay
      f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", tiny_run.text_scorer(tmp_path), *extra)
  planned = []
  pack = packing.Packer.pack

  def recorded(self, plan, abstract):
    planned.append((abstract, plan.out_index.shape[0], plan.buffers, plan.out_index.shape[2]))
    return pack(self, plan, abstract)

  monkeypatch.setattr(packing.Packer, "pack", recorded)
  trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
  try:
    passes = (trainer.run.steps.actor_update, trainer.run.steps.ref_log_prob)
    lengths, programs = [], []
    for _ in range(steps):
      metrics = trainer.train_step(next(trainer.train_iter))
      trainer.count_step()
      lengths.append(metrics["prompt_length/mean"])
      programs.append([step.fn._cache_size() for step in passes])  # pylint: disable=protected-access
    assert not any(getattr(trainer.run.steps.padded, step.name).fn._cache_size()  # pylint: disable=protected-access
                   for step in passes)
    abstracts = [passes[0].args[2].packed, passes[1].args[1].packed]
  finally:
    trainer.close()
  assert len(set(lengths)) >= steps - 2  # the length mix moved from step to step
  planned = [(next(i for i, a in enumerate(abstracts) if a is abstract), *shape) for abstract, *shape in planned]
  return planned, [a.input_ids.shape[0] for a in abstracts], programs


@pytest.mark.slow  # a 12-step run of the tiny model that compiles about 6 buffer counts (about 40 s)
def test_a_run_whose_lengths_change_every_step_compiles_one_program_per_grid_buffer_count(
    model_dir, data_dir, tmp_path, monkeypatch):
  # 32 rows a step in one micro-batch of a device: 32 rows could need any of 1..32 buffers, the quarter-octave
  # grid allows 16 counts
  planned, micro, programs = varied_run(model_dir, data_dir, tmp_path, monkeypatch, 12)
  grid = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32}  # the quarter-octave grid up to 32
  assert micro == [1, 2]  # the update's one micro-batch of 32 rows, the reference pass's two of 16
  counts = [{b for k, m, b, _ in planned if k == i and m == micro[i]} for i in range(2)]
  assert counts[0] | counts[1] <= grid and all(len(c) >= 3 for c in counts)  # ... and with it the buffers
  # one program per buffer count a pass ran, whatever the lengths (at most the grid's 16), none per step after
  # the first few
  assert programs[-1] == [len(c) for c in counts] and programs[-4:] == [programs[-1]] * 4


@pytest.mark.slow  # a 12-step run of the tiny model (about 40 s)
def test_under_a_token_budget_a_run_compiles_one_program_per_micro_batch_shape_it_meets(
    model_dir, data_dir, tmp_path, monkeypatch):
  # a budget of 832 tokens a device: micro-batches of up to 4 buffers of 208, however many rows they hold
  planned, micro, programs = varied_run(model_dir, data_dir, tmp_path, monkeypatch, 12,
                                        "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=832")
  shapes = [{(m, b, s) for k, m, b, s in planned if k == i} for i in range(2)]
  assert all(len(s) >= 2 for s in shapes)  # the lengths moved the micro-batches
  for m, b, s in shapes[0] | shapes[1]:  # every row a slot, B within the budget, S a power of two
    assert m * s >= 32 and b <= 4 and s <= 32 and s & (s - 1) == 0
  # one program per (M, B, S) a pass ran, none per step after the first few
  assert programs[-1] == [len(s) for s in shapes] and programs[-4:] == [programs[-1]] * 4
