"""SimCLR (Chen et al., 2020): NT-Xent over the two global views, negatives from the whole global batch."""

from __future__ import annotations

import torch
from lightly.loss import NTXentLoss
from lightly.models.modules import SimCLRProjectionHead
from torch import nn

from hypersolid_scale.methods.base import Method, encode, project
from hypersolid_scale.methods.config import SimCLRConfig


class SimCLR(Method):
    """Both views go through backbone and head in one call each (the official implementation concatenates
    them). ``gather_distributed=True``: every rank's rows are contrasted against all ranks' rows, and lightly's
    differentiable gather returns each rank its share of the gradient, so DDP's average is the gradient of
    the global-batch loss."""

    def __init__(self, feature_dim: int, cfg: SimCLRConfig, steps_per_epoch: int = 1) -> None:
        super().__init__(steps_per_epoch)
        self.head = SimCLRProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim, cfg.num_layers)
        self.criterion = NTXentLoss(temperature=cfg.temperature, gather_distributed=True)

    def forward(self, views: list[torch.Tensor], backbone: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        views, _ = self.select_views(views)
        z0, z1 = project(self.head, encode(backbone, views, separate=False), separate=False)
        loss = self.criterion(z0, z1)
        return loss, {"loss": loss.detach()}
