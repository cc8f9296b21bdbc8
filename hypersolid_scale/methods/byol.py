"""BYOL (Grill et al., 2020): an online network predicts the momentum teacher's projection of the other view."""

from __future__ import annotations

import torch
from lightly.loss import NegativeCosineSimilarity
from lightly.models.modules import BYOLPredictionHead, BYOLProjectionHead
from torch import nn

from hypersolid_scale.methods.base import EMAMethod, encode, make_teacher
from hypersolid_scale.methods.config import BYOLConfig


class BYOL(EMAMethod):
    """Symmetric loss ``(ncs(p0, t1) + ncs(p1, t0)) / 2`` (lightly's BYOL example). The loss is a per-row
    mean, so no rank needs another's rows; the teacher's BatchNorm layers see the same views as the
    student's (each view alone, as in the official implementation)."""

    separate_views = True

    def __init__(self, feature_dim: int, cfg: BYOLConfig, backbone: nn.Module, steps_per_epoch: int = 1) -> None:
        super().__init__(backbone, cfg.momentum_base, cfg.momentum_end, steps_per_epoch)
        self.projector = BYOLProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim)
        self.predictor = BYOLPredictionHead(cfg.out_dim, cfg.hidden_dim, cfg.out_dim)
        self.teacher_projector = make_teacher(self.projector)
        self.criterion = NegativeCosineSimilarity()

    def student_teacher_pairs(self, backbone: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
        return [(backbone, self.teacher_backbone), (self.projector, self.teacher_projector)]

    def forward(self, views: list[torch.Tensor], backbone: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        views, _ = self.select_views(views)
        p0, p1 = (self.predictor(self.projector(f)) for f in encode(backbone, views, separate=True))
        with torch.no_grad():
            t0, t1 = (self.teacher_projector(f) for f in encode(self.teacher_backbone, views, separate=True))
        loss = 0.5 * (self.criterion(p0, t1) + self.criterion(p1, t0))
        return loss, {"loss": loss.detach()}
