"""SimCLR (Chen et al., 2020): NT-Xent over the two global views, negatives from the whole global batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightly.loss import NTXentLoss
from lightly.models.modules import SimCLRProjectionHead
from torch import nn

from hypersolid_scale.methods.base import Method, Outputs, encode, project
from hypersolid_scale.methods.registry import register


@dataclass
class SimCLRConfig:
    hidden_dim: int = 2048  # SimCLR paper (v1): projection MLP as wide as ResNet-50's features; lightly default
    out_dim: int = 128  # SimCLR paper, lightly default
    num_layers: int = 2  # SimCLR v1 (2 Linear layers); v2 uses 3
    temperature: float = 0.5  # SimCLR paper's CIFAR-10 setting, lightly default (its ImageNet runs use 0.1)

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "num_layers": "layers", "temperature": "pos_float"}


@register
class SimCLR(Method):
    """Both views go through backbone and head in one call each (the official implementation concatenates
    them). ``gather_distributed=True``: every rank's rows are contrasted against all ranks' rows, and lightly's
    differentiable gather returns each rank its share of the gradient, so DDP's average is the gradient of
    the global-batch loss."""

    name, Config, order = "simclr", SimCLRConfig, 10
    display_name = "SimCLR"
    projection_head = "head"

    def __init__(self, feature_dim: int, cfg: SimCLRConfig, steps_per_epoch: int = 1) -> None:
        super().__init__(steps_per_epoch)
        self.head = SimCLRProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim, cfg.num_layers)
        self.criterion = NTXentLoss(temperature=cfg.temperature, gather_distributed=True)

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        views, _ = self.select_views(views)
        return {"z": project(self.head, encode(backbone, views, separate=False), separate=False)}

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z0, z1 = out["z"]
        loss = self.criterion(z0, z1)
        return loss, {"loss": loss.detach()}
