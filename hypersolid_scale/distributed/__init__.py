"""Everything that touches ``torch.distributed`` lives in this package.

Model, loss and data code call these helpers and never import ``torch.distributed`` themselves;
every helper works without a process group (world size 1).
"""

from hypersolid_scale.distributed.batchnorm import GlobalBatchNorm, convert_global_batchnorm
from hypersolid_scale.distributed.gather import (
    all_gather_detached,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    get_rank,
    get_world_size,
    is_distributed,
)

__all__ = [
    "GlobalBatchNorm",
    "all_gather_detached",
    "all_reduce_max",
    "all_reduce_sum",
    "barrier",
    "convert_global_batchnorm",
    "get_rank",
    "get_world_size",
    "is_distributed",
]
