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


# the name of each layer's input (`layer_input`): with activation offload it is what a layer keeps, in host memory
LAYER_INPUT = "layer_input"


def remat_policy(name: str, offload: bool = False):
  """The `jax.checkpoint` policy of `name` (one of POLICIES); with `offload` (verl's
  `model.enable_activation_offload`, for `full`), each layer's input (`LAYER_INPUT`) is kept in host memory
  between the forward and the backward pass instead of in device memory."""
  if offload:
    if name != "full":
      raise ValueError(f"remat_policy={name!r}: activation offload keeps each layer's input alone (remat_policy=full)")
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(), names_which_can_be_offloaded=(LAYER_INPUT,), offload_src="device",
        offload_dst="pinned_host")
  if name == "full":
    return None
  if name == "attention":
    return jax.checkpoint_policies.save_only_these_names("attention_out")
  if name == "dots":
    return jax.checkpoint_policies.checkpoint_dots
  raise ValueError(f"remat_policy={name!r}: must be one of {', '.join(POLICIES)}")
