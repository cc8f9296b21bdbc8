"""The Hypersolid objective as a method: the existing projector and HypersolidLoss, over every view."""

from __future__ import annotations

import torch
from torch import nn

from hypersolid_scale.losses import HypersolidLoss, LossConfig
from hypersolid_scale.methods.base import Method, encode, project
from hypersolid_scale.models import ModelConfig, Projector


class Hypersolid(Method):
    """Same computation as :class:`~hypersolid_scale.models.HypersolidModel` + :class:`HypersolidLoss`: one
    backbone call per resolution, one projector call over all views, the loss on (B, V, D). The loss already
    returns P x the gradient of the global loss on each rank (docs/design.md §3). ``stats`` are the loss's
    packed statistics (0-dim device tensors, reduced over ranks)."""

    uses_local_views = True

    def __init__(self, feature_dim: int, model_cfg: ModelConfig, loss_cfg: LossConfig, steps_per_epoch: int = 1,
                 *, check_finite: bool = False, same_rows_per_rank: bool = True) -> None:
        super().__init__(steps_per_epoch)
        self.projector = Projector(feature_dim, model_cfg.proj_hidden_dim, model_cfg.proj_dim, model_cfg.proj_layers)
        self.criterion = HypersolidLoss.from_config(loss_cfg, check_finite=check_finite,
                                                    same_rows_per_rank=same_rows_per_rank)

    def forward(self, views: list[torch.Tensor], backbone: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        views, _ = self.select_views(views)
        z = project(self.projector, encode(backbone, views, separate=False), separate=False)
        loss = self.criterion(torch.stack(z, dim=1))  # (B, V, D)
        packed = self.criterion.packed_stats
        return loss, {name: packed.values[i] for i, name in enumerate(packed.names)}
