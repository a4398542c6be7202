"""Device meshes, logical-axis rules, sharded train steps, multi-host start-up."""

from rljax.sharding.distributed import distributed_args, initialize, is_main_process
from rljax.sharding.mesh import AXES, build_mesh, check_model_fits, job_devices, make_mesh, mesh_shape
from rljax.sharding.rules import (
    batch_sharding, logical_to_spec, param_names, param_shardings, rules_from_config,
)
from rljax.sharding.step import (
    addressable_bytes, global_batch, init_optimizer, local_rows, make_train_step, shard_like,
)

__all__ = [
    "AXES", "addressable_bytes", "batch_sharding", "build_mesh", "check_model_fits",
    "distributed_args", "global_batch", "init_optimizer", "initialize", "is_main_process", "job_devices",
    "local_rows", "logical_to_spec", "make_mesh", "make_train_step", "mesh_shape",
    "param_names", "param_shardings", "rules_from_config", "shard_like",
]
