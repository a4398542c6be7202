"""What a rematerialised decoder layer keeps from its forward pass for the backward pass.

With gradient checkpointing (`actor_rollout_ref.model.enable_gradient_checkpointing`)
each layer runs under `jax.checkpoint`, and the policy
(`actor_rollout_ref.model.remat_policy`) says which of its intermediates
are saved rather than recomputed:

* `full`: nothing but the layer's input (least memory; the forward pass runs
  twice).
* `attention`: the attention output of each layer (`attention_out`), so the
  backward pass does not run attention again.
* `dots`: every matmul's output: all of a layer's projections (most
  memory; only the elementwise work and attention are recomputed).
"""

from __future__ import annotations

import jax

POLICIES = ("full", "attention", "dots")


def remat_policy(name: str):
  """The `jax.checkpoint` policy of `name` (one of POLICIES)."""
  if name == "full":
    return None
  if name == "attention":
    return jax.checkpoint_policies.save_only_these_names("attention_out")
  if name == "dots":
    return jax.checkpoint_policies.checkpoint_dots
  raise ValueError(f"remat_policy={name!r}: must be one of {', '.join(POLICIES)}")
