"""Everything that touches ``torch.distributed`` lives in this package; import its names from here.

Model, loss and data code call these functions and never import ``torch.distributed`` themselves;
every collective works without a process group (world size 1).

Modules: ``process_group`` (launcher environment, device, transport, the default group), ``collectives``,
``ring`` (the point-to-point ring pass of the ``ring`` repulsion backend),
``batchnorm`` (BatchNorm over the global batch), ``engine`` (the ``Engine`` interface and ``build_engine``),
``engines/`` (the engines: ``ddp``, ``deepspeed``, one module each), ``heartbeat`` (a vanished peer stops the others).
"""

from hypersolid_scale.distributed.batchnorm import (
    SYNC_BN_CHOICES,
    GlobalBatchNorm,
    convert_batchnorm,
    convert_global_batchnorm,
)
from hypersolid_scale.distributed.collectives import (
    all_gather_detached,
    all_reduce_max,
    all_reduce_max_flag,
    all_reduce_packed,
    all_reduce_sum,
    all_reduce_sum_differentiable,
    barrier,
    broadcast_object,
    gather_objects,
    get_rank,
    get_world_size,
    is_distributed,
    row_counts,
)
from hypersolid_scale.distributed.engines import Engine, build_engine, engine_names
from hypersolid_scale.distributed.engines.deepspeed import deepspeed_config
from hypersolid_scale.distributed.heartbeat import EXIT_PEER_LOST, Heartbeat, start_heartbeat
from hypersolid_scale.distributed.process_group import (
    TRANSPORTS,
    WorldInfo,
    cleanup,
    elastic_restart,
    elastic_store,
    ensure_process_group,
    first_host,
    has_process_group,
    init_distributed,
    resolve_device,
    resolve_transport,
    world_info_from_env,
)
from hypersolid_scale.distributed.ring import ring_pass

__all__ = [
    "engine_names",
    "EXIT_PEER_LOST",
    "SYNC_BN_CHOICES",
    "TRANSPORTS",
    "Engine",
    "GlobalBatchNorm",
    "Heartbeat",
    "WorldInfo",
    "all_gather_detached",
    "all_reduce_max",
    "all_reduce_max_flag",
    "all_reduce_packed",
    "all_reduce_sum",
    "all_reduce_sum_differentiable",
    "barrier",
    "broadcast_object",
    "build_engine",
    "cleanup",
    "convert_batchnorm",
    "convert_global_batchnorm",
    "deepspeed_config",
    "elastic_restart",
    "elastic_store",
    "ensure_process_group",
    "first_host",
    "gather_objects",
    "get_rank",
    "get_world_size",
    "has_process_group",
    "init_distributed",
    "is_distributed",
    "resolve_device",
    "resolve_transport",
    "ring_pass",
    "row_counts",
    "start_heartbeat",
    "world_info_from_env",
]
