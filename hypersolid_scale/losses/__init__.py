"""The Hypersolid objective and its repulsion backends (one module each in :mod:`.backends`)."""

from hypersolid_scale.losses.backends import Backend, backend_names, register_backend
from hypersolid_scale.losses.candidates import topk_inner_product
from hypersolid_scale.losses.config import LossConfig
from hypersolid_scale.losses.hypersolid import HypersolidLoss
from hypersolid_scale.losses.stats import PackedStats

__all__ = [
    "Backend",
    "HypersolidLoss",
    "LossConfig",
    "PackedStats",
    "backend_names",
    "register_backend",
    "topk_inner_product",
]
