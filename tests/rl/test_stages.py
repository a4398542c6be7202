"""A step's rows go to device once: the forward passes, the packer and the updates gather from one placement."""

import collections

import pytest

from rljax.rl import experience
from tests.rl import tiny_run


@pytest.mark.slow
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_step_places_each_field_once_and_keeps_the_passes_outputs_on_device(packed, model_dir, data_dir,
                                                                              tmp_path, monkeypatch):
  """PPO with a reference pass, off-policy (two mini-batches): every field the passes and updates read goes to
  device at most once a step, and the log-probs and values the forward passes computed never do (they stay
  where the passes left them)."""
  placed = collections.Counter()
  place = experience.place

  def counted(rows, abstract):
    placed.update(abstract.present())
    return place(rows, abstract)

  monkeypatch.setattr(experience, "place", counted)
  padding = [] if packed else ["actor_rollout_ref.model.use_remove_padding=false",
                               "critic.model.use_remove_padding=false"]
  config = tiny_run.run_config("ppo", model_dir, data_dir, str(tmp_path / "run"), "trainer.total_training_steps=1",
                               "trainer.save_freq=-1", "actor_rollout_ref.actor.use_kl_loss=true", *padding)
  metrics = tiny_run.fit_metrics(config)
  assert len(metrics) == 1 and "critic/vf_loss" in metrics[0] and "actor/kl_loss" in metrics[0]
  assert max(placed.values()) == 1, placed
  assert {"input_ids", "positions", "advantages", "returns"} <= set(placed), placed
  assert not {"old_log_probs", "ref_log_prob", "values"} & set(placed), placed
