"""Barlow Twins (Zbontar et al., 2021) on the two global views; its official implementation runs each view
alone through backbone and projector."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightly.loss import BarlowTwinsLoss
from lightly.models.modules.heads import BarlowTwinsProjectionHead
from lightly.utils import dist as lightly_dist
from torch import nn

from hypersolid_scale.methods.base import Method, Outputs, encode, project
from hypersolid_scale.methods.registry import register


@dataclass
class BarlowTwinsConfig:
    hidden_dim: int = 8192  # Barlow Twins paper: 3 Linear layers of 8192 units; lightly default
    out_dim: int = 8192  # Barlow Twins paper
    lambda_param: float = 0.005  # Barlow Twins paper lambda (off-diagonal weight); lightly default

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "lambda_param": "nonneg_float"}


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """All ranks' rows, concatenated in rank order, differentiable (lightly's gather: its backward sums the
    gradient over ranks, so each rank gets P x the gradient of its rows, as DDP's averaging expects)."""
    if lightly_dist.world_size() == 1:
        return x
    return torch.cat(lightly_dist.gather(x.contiguous()), dim=0)


@register
class BarlowTwins(Method):
    """Barlow Twins over the GLOBAL batch.

    lightly's ``BarlowTwinsLoss(gather_distributed=True)`` standardises each feature over the LOCAL batch
    and then averages the ranks' cross-correlation matrices, which is not the cross-correlation of the global
    batch (the official implementation standardises with a synchronised BatchNorm). So the projections are
    gathered first (differentiably) and lightly's loss runs on the whole batch, identical on every rank; the
    gather's backward hands each rank P x the gradient of its rows, which DDP's average turns into the
    single-process gradient. The price is the D x D correlation computed on every rank.
    """

    name, Config, order = "barlowtwins", BarlowTwinsConfig, 30
    display_name = "Barlow Twins"
    projection_head = "head"

    def __init__(self, feature_dim: int, cfg: BarlowTwinsConfig, steps_per_epoch: int = 1) -> None:
        super().__init__(steps_per_epoch)
        self.head = BarlowTwinsProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim)
        self.criterion = BarlowTwinsLoss(lambda_param=cfg.lambda_param, gather_distributed=False)

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        views, _ = self.select_views(views)
        return {"z": project(self.head, encode(backbone, views, separate=True), separate=True)}

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z_a, z_b = out["z"]
        loss = self.criterion(gather_rows(z_a), gather_rows(z_b))
        return loss, {"loss": loss.detach()}
