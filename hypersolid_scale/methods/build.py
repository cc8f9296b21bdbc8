"""Build the configured method from the backbone and its feature width."""

from __future__ import annotations

from torch import nn

from hypersolid_scale.losses import LossConfig
from hypersolid_scale.methods.base import Method
from hypersolid_scale.methods.byol import BYOL
from hypersolid_scale.methods.config import MethodConfig
from hypersolid_scale.methods.dino import DINO
from hypersolid_scale.methods.hypersolid import Hypersolid
from hypersolid_scale.methods.redundancy import BarlowTwins, VICReg
from hypersolid_scale.methods.simclr import SimCLR
from hypersolid_scale.methods.swav import SwaV
from hypersolid_scale.models import ModelConfig


def build_method(cfg: MethodConfig, backbone: nn.Module, feature_dim: int, *, steps_per_epoch: int,
                 model_cfg: ModelConfig | None = None, loss_cfg: LossConfig | None = None) -> Method:
    """The method ``cfg.name`` with heads on ``feature_dim`` backbone features.

    ``backbone`` is only copied (the momentum teachers of BYOL and DINO start as copies of it); build the
    method before the backbone is trained. ``model_cfg``/``loss_cfg`` configure ``hypersolid`` (its projector
    and loss; defaults when None). Raises ConfigError for a bad ``cfg``.
    """
    cfg.validate()
    name, spe = cfg.name, steps_per_epoch
    if name == "hypersolid":
        loss_cfg = loss_cfg if loss_cfg is not None else LossConfig()
        loss_cfg.validate()
        return Hypersolid(feature_dim, model_cfg if model_cfg is not None else ModelConfig(), loss_cfg, spe)
    if name == "simclr":
        return SimCLR(feature_dim, cfg.simclr, spe)
    if name == "vicreg":
        return VICReg(feature_dim, cfg.vicreg, spe)
    if name == "barlowtwins":
        return BarlowTwins(feature_dim, cfg.barlowtwins, spe)
    if name == "byol":
        return BYOL(feature_dim, cfg.byol, backbone, spe)
    if name == "dino":
        return DINO(feature_dim, cfg.dino, backbone, spe)
    return SwaV(feature_dim, cfg.swav, spe)
