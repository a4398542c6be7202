"""Device meshes, logical-axis rules, sharded train steps, multi-host start-up."""

from rljax.sharding.distributed import distributed_args, initialize, is_main_process
from rljax.sharding.mesh import (
    AXES, build_mesh, check_model_fits, data_parallel_size, expert_rule_axes, job_devices, make_mesh, mesh_shape,
    resolve_world_size, rollout_device_count, split_devices,
)
from rljax.sharding.placement import (
    addressable_bytes, global_batch, gradient_compiler_options, init_optimizer, local_rows, optimizer_shardings,
    shard_like,
)
from rljax.sharding.rules import (
    activation_sharding, batch_sharding, constrain, decode_rules, logical_to_spec, param_names, param_shardings,
    rules_from_config,
)

__all__ = [
    "AXES", "activation_sharding", "addressable_bytes", "batch_sharding", "build_mesh", "check_model_fits", "data_parallel_size",
    "constrain", "expert_rule_axes", "decode_rules", "distributed_args", "global_batch", "gradient_compiler_options", "init_optimizer",
    "initialize", "is_main_process", "job_devices", "local_rows", "logical_to_spec", "make_mesh", "mesh_shape",
    "optimizer_shardings", "param_names", "param_shardings", "resolve_world_size", "rollout_device_count", "split_devices", "rules_from_config", "shard_like",
]
