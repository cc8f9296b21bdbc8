"""VICReg (Bardes et al., 2022) on the two global views; its official implementation runs each view alone
through backbone and projector."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightly.loss import VICRegLoss
from lightly.models.modules.heads import VICRegProjectionHead
from torch import nn

from hypersolid_scale.methods.base import Method, Outputs, encode, project
from hypersolid_scale.methods.registry import register


@dataclass
class VICRegConfig:
    hidden_dim: int = 8192  # VICReg paper: 3 Linear layers of 8192 units; lightly default
    out_dim: int = 8192  # VICReg paper
    num_layers: int = 3  # VICReg paper
    sim_coeff: float = 25.0  # VICReg paper lambda (invariance); lightly lambda_param
    std_coeff: float = 25.0  # VICReg paper mu (variance); lightly mu_param
    cov_coeff: float = 1.0  # VICReg paper nu (covariance); lightly nu_param
    eps: float = 1e-4  # VICReg paper epsilon inside the standard deviation; lightly default

    KINDS = {
        "hidden_dim": "pos_int",
        "out_dim": "pos_int",
        "num_layers": "layers",
        "sim_coeff": "nonneg_float",
        "std_coeff": "nonneg_float",
        "cov_coeff": "nonneg_float",
        "eps": "pos_float",
    }


@register
class VICReg(Method):
    """VICRegLoss with ``gather_distributed=True``: the variance and covariance terms are computed over the
    global batch (lightly gathers them); the invariance term is a per-row mean, so the local mean is this
    rank's share of it."""

    name, Config, order = "vicreg", VICRegConfig, 20
    display_name = "VICReg"
    projection_head = "head"

    def __init__(self, feature_dim: int, cfg: VICRegConfig, steps_per_epoch: int = 1) -> None:
        super().__init__(steps_per_epoch)
        self.head = VICRegProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim, cfg.num_layers)
        self.criterion = VICRegLoss(
            lambda_param=cfg.sim_coeff,
            mu_param=cfg.std_coeff,
            nu_param=cfg.cov_coeff,
            gather_distributed=True,
            eps=cfg.eps,
        )

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        views, _ = self.select_views(views)
        return {"z": project(self.head, encode(backbone, views, separate=True), separate=True)}

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z_a, z_b = out["z"]
        loss = self.criterion(z_a, z_b)
        return loss, {"loss": loss.detach()}
