"""A tiny Llama train step (the trainer's gradient and optimizer cores) shared by the sharding tests and the
multi-host worker."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rljax import config as config_lib
from rljax import sharding
from rljax.models import CausalLM, ModelConfig
from rljax.training import updates as steps

TINY = ModelConfig(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                   num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8, rope_theta=10000.0)
BATCH, LENGTH = 16, 12


def mesh_config(fsdp, tensor):
  config = config_lib.get_base_config()
  config_lib.apply_overrides(config, [
      "trainer.n_gpus_per_node=auto", f"actor_rollout_ref.actor.tensor_model_parallel_size={tensor}",
      f"actor_rollout_ref.actor.fsdp_config.fsdp_size={fsdp}"])
  return config


def batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(0, TINY.vocab_size, size=(BATCH, LENGTH), dtype=np.int32)
  mask = np.ones((BATCH, LENGTH), np.int32)
  mask[::3, :4] = 0  # some left padding
  return {"input_ids": ids, "attention_mask": mask}


def loss_fn(graphdef):
  def loss(params, batch):
    model = nnx.merge(graphdef, params)
    logits = model(batch["input_ids"], batch["attention_mask"])[:, :-1]
    targets = batch["input_ids"][:, 1:]
    mask = batch["attention_mask"][:, 1:].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return jnp.sum(nll * mask) / jnp.sum(mask), {"tokens": jnp.sum(mask)}
  return loss


def run_step(mesh, local_batch=None):
  """One AdamW step on `mesh`; returns (loss, params as numpy, params, opt_state)."""
  rules = sharding.rules_from_config(config_lib.get_base_config())
  graphdef, params = nnx.split(CausalLM(TINY, nnx.Rngs(0)), nnx.Param)
  param_sh = sharding.param_shardings(params, mesh, rules)
  params = sharding.shard_like(params, param_sh)
  optimizer = optax.adamw(1e-2, weight_decay=0.01)
  opt_state, opt_sh = sharding.init_optimizer(optimizer, params, param_sh, mesh)
  batch_sh = sharding.batch_sharding(mesh, rules)
  full = batch()
  local = full if local_batch is None else local_batch(full)
  placed = sharding.global_batch(local, batch_sh)
  step = steps.make_train_step(loss_fn(graphdef), optimizer, mesh, rules, param_sh, opt_sh, batch_sh)
  params, opt_state, loss, _ = step(params, opt_state, placed)
  host = jax.tree.map(lambda x: np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True)), params)
  return float(loss), host, params, opt_state
