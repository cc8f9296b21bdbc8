"""BYOL (Grill et al., 2020): an online network predicts the momentum teacher's projection of the other view."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lightly.loss import NegativeCosineSimilarity
from lightly.models.modules import BYOLPredictionHead, BYOLProjectionHead
from torch import nn

from hypersolid_scale.methods.base import EMAMethod, Outputs, encode, make_teacher
from hypersolid_scale.methods.registry import register


@dataclass
class BYOLConfig:
    hidden_dim: int = 4096  # BYOL paper: projector and predictor hidden width; lightly default
    out_dim: int = 256  # BYOL paper
    momentum_base: float = 0.996  # BYOL paper tau_base (solo-learn's CIFAR configs use 0.99)
    momentum_end: float = 1.0  # BYOL paper: tau follows a cosine from tau_base to 1 over training

    KINDS = {"hidden_dim": "pos_int", "out_dim": "pos_int", "momentum_base": "unit", "momentum_end": "unit"}


@register
class BYOL(EMAMethod):
    """Symmetric loss ``(ncs(p0, t1) + ncs(p1, t0)) / 2`` (lightly's BYOL example). The loss is a per-row
    mean, so no rank needs another's rows; the teacher's BatchNorm layers see the same views as the
    student's (each view alone, as in the official implementation)."""

    name, Config, order = "byol", BYOLConfig, 40
    display_name = "BYOL"
    projection_head = "projector"

    target_keys = ("teacher",)

    @classmethod
    def build(cls, section: BYOLConfig, *, backbone: nn.Module, feature_dim: int, steps_per_epoch: int) -> BYOL:
        return cls(feature_dim, section, backbone, steps_per_epoch)

    def __init__(self, feature_dim: int, cfg: BYOLConfig, backbone: nn.Module, steps_per_epoch: int = 1) -> None:
        super().__init__(backbone, cfg.momentum_base, cfg.momentum_end, steps_per_epoch)
        self.projector = BYOLProjectionHead(feature_dim, cfg.hidden_dim, cfg.out_dim)
        self.predictor = BYOLPredictionHead(cfg.out_dim, cfg.hidden_dim, cfg.out_dim)
        self.teacher_projector = make_teacher(self.projector)
        self.criterion = NegativeCosineSimilarity()

    def student_teacher_pairs(self, backbone: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
        return [(backbone, self.teacher_backbone), (self.projector, self.teacher_projector)]

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        views, _ = self.select_views(views)
        out = {"p": [self.predictor(self.projector(f)) for f in encode(backbone, views, separate=True)]}
        if not replay:
            with torch.no_grad():
                teacher = encode(self.teacher_backbone, views, separate=True)
                out["teacher"] = [self.teacher_projector(f) for f in teacher]
        return out

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        (p0, p1), (t0, t1) = out["p"], out["teacher"]
        loss = 0.5 * (self.criterion(p0, t1) + self.criterion(p1, t0))
        return loss, {"loss": loss.detach()}
