"""The Hypersolid objective and its repulsion backends."""

from hypersolid_scale.losses.config import LossConfig
from hypersolid_scale.losses.hypersolid import HypersolidLoss

__all__ = ["HypersolidLoss", "LossConfig"]
