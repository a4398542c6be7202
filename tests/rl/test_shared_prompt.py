"""Shared-prompt passes: each group's prompt runs once, and every number equals running each row."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

import rljax.models as M
from rljax import rl
from rljax.rl.sequences import make_sequences, prompts_shared, response_log_probs
from rljax.rl.experience import Experience
from rljax.rl import layout
from rljax.rl.critic import ValueModel
from tests.models import helpers
from tests.rl import tiny_run

GROUP = 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """family -> a directory holding a tiny random HF model of that family."""
  out = {}
  for family in helpers.FAMILIES:
    path = str(tmp_path_factory.mktemp(family))
    helpers.hf_model(family).save_pretrained(path)
    out[family] = path
  return out


def grouped_rows(vocab: int, prompts: int = 2, group: int = GROUP, prompt_len: int = 9, response_len: int = 6,
                 seed: int = 0) -> Experience:
  """Rows p * group + j answering prompt p: left-padded prompts of different lengths, and responses
  right-padded to different lengths (one ends after a single token)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, (prompts, prompt_len)).astype(np.int32)
  mask = np.ones_like(ids)
  for p in range(prompts):
    mask[p, :(2 * p + 1) % prompt_len] = 0
  ids = np.where(mask > 0, ids, 0)
  rows = prompts * group
  responses = rng.integers(3, vocab, (rows, response_len)).astype(np.int32)
  response_mask = (np.arange(response_len)[None] < rng.integers(1, response_len + 1, rows)[:, None]).astype(np.int32)
  response_mask[1] = [1] + [0] * (response_len - 1)
  return make_sequences(np.repeat(ids, group, 0), np.repeat(mask, group, 0), responses * response_mask,
                        response_mask)


def masked_loss(model, batch, group_size):
  log_probs, entropy = response_log_probs(model, batch, 0.7, group_size=group_size)
  mask = batch.response_mask
  return jnp.sum((log_probs + 0.1 * entropy) * mask), (log_probs * mask, entropy * mask)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(helpers.FAMILIES))
def test_log_probs_entropy_and_gradients_equal_per_row_passes(saved, family):
  model = M.from_pretrained(saved[family])
  graphdef, state = nnx.split(model)
  batch = grouped_rows(model.cfg.vocab_size)
  assert prompts_shared(batch, GROUP)

  def run(group_size):
    fn = lambda s: masked_loss(nnx.merge(graphdef, s), batch, group_size)  # noqa: E731
    return jax.jit(jax.value_and_grad(fn, has_aux=True))(state)

  (loss1, (lp1, ent1)), grad1 = run(1)
  (loss3, (lp3, ent3)), grad3 = run(GROUP)
  np.testing.assert_allclose(lp3, lp1, atol=2e-5)
  np.testing.assert_allclose(ent3, ent1, atol=2e-5)
  np.testing.assert_allclose(loss3, loss1, rtol=1e-5)
  helpers.assert_gradients_close(grad3, grad1)


def test_scanned_layers_and_the_critic_share_prompts_too(saved):
  model = M.from_pretrained(saved["qwen3"], scan_layers=True, remat=True)
  critic = ValueModel(model, nnx.Rngs(1))
  batch = grouped_rows(model.cfg.vocab_size, seed=1)
  graphdef, state = nnx.split(critic)
  values = {g: jax.jit(lambda s, g=g: nnx.merge(graphdef, s).response_values(batch, g))(state) for g in (1, GROUP)}
  mask = batch.response_mask > 0
  np.testing.assert_allclose(np.asarray(values[GROUP])[mask], np.asarray(values[1])[mask], atol=2e-5)


def test_rows_sharded_over_eight_devices_give_the_single_device_numbers(saved):
  model = M.from_pretrained(saved["llama3"])
  graphdef, state = nnx.split(model)
  batch = grouped_rows(model.cfg.vocab_size, prompts=8, group=2, seed=2)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  rows = NamedSharding(mesh, PartitionSpec("data"))
  sharded = jax.tree.map(lambda v: jax.device_put(v, rows), batch)
  fn = jax.jit(lambda s, b: masked_loss(nnx.merge(graphdef, s), b, 2)[1][0])
  np.testing.assert_allclose(fn(state, sharded), fn(state, batch), atol=1e-5)
  plain = jax.jit(lambda s, b: masked_loss(nnx.merge(graphdef, s), b, 1)[1][0])(state, batch)
  np.testing.assert_allclose(fn(state, sharded), plain, atol=2e-5)


def test_prompts_shared_needs_whole_groups_of_one_prompt():
  batch = grouped_rows(64)
  assert prompts_shared(batch, GROUP) and prompts_shared(batch, 1)
  assert not prompts_shared(batch, 4)
  broken = batch.replace(input_ids=batch.input_ids.copy())
  broken.input_ids[GROUP + 1, 8] += 1  # the last prompt token
  assert not prompts_shared(broken, GROUP)
  swapped = batch.take([0, 1, GROUP, 2, 4, 5])
  assert not prompts_shared(swapped, GROUP)


def test_balance_order_moves_whole_groups_and_evens_token_counts():
  lengths = np.array([10, 9, 1, 2, 8, 8, 3, 3, 7, 6, 4, 4])
  order = layout.balance_order(lengths, 2, group=2)
  assert sorted(order.tolist()) == list(range(12))
  pairs = order.reshape(-1, 2)
  assert (pairs[:, 0] % 2 == 0).all() and (pairs[:, 1] == pairs[:, 0] + 1).all()
  halves = lengths[order].reshape(2, 6).sum(1)
  assert abs(halves[0] - halves[1]) <= 3


@pytest.mark.slow
def test_group_size_follows_the_config(model_dir, data_dir, tmp_path):
  def group(*extra, dp=1):
    config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), *extra)
    return layout.make_layout(config, 10, dp).group

  assert group() == 2
  assert group("actor_rollout_ref.model.share_prompt_forward=false") == 1
  assert group("actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus") == 1
  assert group(dp=4) == 2
  assert group(dp=8) == 1  # balance_batch cannot deal 4 whole groups evenly to 8 devices
  assert group("trainer.balance_batch=false", dp=8) == 2
  assert layout.pass_group_size(2, 8, 2, 8) == 2 and layout.pass_group_size(2, 8, 8, 8) == 1
  assert layout.pass_group_size(2, 8, 2, 12) == 1  # empty slots among the rows: no shared prompt
  uneven = layout.make_layout(tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path),
                                                  "trainer.balance_batch=false"), 10, 3)
  assert (uneven.row_slots, uneven.forward_group("ref"), uneven.update_group(False)) == (9, 1, 1)


@pytest.mark.slow
def test_trainer_numbers_do_not_depend_on_sharing(model_dir, data_dir, tmp_path):
  def run(flag):
    config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path / flag), "trainer.total_training_steps=1",
                                 "actor_rollout_ref.actor.ppo_epochs=2",
                                 f"actor_rollout_ref.model.share_prompt_forward={flag}",
                                 "actor_rollout_ref.model.use_remove_padding=false")  # packed passes do not share
    trainer = rl.RLTrainer(config, mesh=tiny_run.one_device())
    try:
      trainer.fit()
    finally:
      trainer.close()
    return trainer.run.layout.group, [json.loads(line) for line in open(f"{trainer.run_dir}/metrics.jsonl")][0]

  (shared_group, shared), (plain_group, plain) = run("true"), run("false")
  assert (shared_group, plain_group) == (2, 1)
  # actor/ppo_kl compares two passes of the same weights: float rounding (~1e-6) either way.
  drop = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing_s", "perf/", "actor/ppo_kl"))}  # noqa: E731
  assert drop(shared) == pytest.approx(drop(plain), rel=1e-4, abs=1e-6)
  assert shared["actor/ppo_kl"] == pytest.approx(plain["actor/ppo_kl"], abs=2e-5)


def test_a_token_budget_buys_rows_by_each_devices_share_of_them(model_dir, data_dir, tmp_path):
  # 8 rows of 96 + 8 tokens, a budget of 208 tokens a device: 2 whole rows, or 4 split over 2 Ulysses devices
  config = tiny_run.run_config("grpo", model_dir, data_dir, str(tmp_path), "actor_rollout_ref.actor.use_dynamic_bsz=true",
                               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=208")
  assert layout.make_layout(config, 10, 1).micro_batches == 4
  config.actor_rollout_ref.actor.ulysses_sequence_parallel_size = 2
  assert layout.make_layout(config, 10, 1).micro_batches == 2
