"""The Hypersolid objective and its repulsion backends."""

from hypersolid_scale.losses.config import LossConfig
from hypersolid_scale.losses.hypersolid import HypersolidLoss
from hypersolid_scale.losses.search import topk_inner_product
from hypersolid_scale.losses.stats import PackedStats

__all__ = ["HypersolidLoss", "LossConfig", "PackedStats", "topk_inner_product"]
