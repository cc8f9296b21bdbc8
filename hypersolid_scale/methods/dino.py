"""DINO (Caron et al., 2021): self-distillation with a momentum teacher, centering and multi-crop.

The student sees every view (global and local); the teacher only the global views. lightly's DINOLoss
centers the teacher's outputs and sharpens them with a temperature warmed up over the first epochs; its
center is an EMA of the teacher outputs' mean over ALL ranks (lightly all-reduces it), so it is the same
buffer on every rank.
"""

from __future__ import annotations

import torch
from lightly.loss import DINOLoss
from lightly.models.modules import DINOProjectionHead
from torch import nn

from hypersolid_scale.methods.base import EMAMethod, encode, make_teacher, project
from hypersolid_scale.methods.config import DINOConfig


class DINO(EMAMethod):
    """Teacher temperature and the frozen last layer follow the papers' epoch schedules: the epoch is
    ``step // steps_per_epoch`` with ``step`` the optimizer steps completed (``after_step`` counts them)."""

    uses_local_views = True

    def __init__(self, feature_dim: int, cfg: DINOConfig, backbone: nn.Module, steps_per_epoch: int = 1) -> None:
        super().__init__(backbone, cfg.momentum_base, cfg.momentum_end, steps_per_epoch)
        def new_head() -> DINOProjectionHead:
            return DINOProjectionHead(feature_dim, cfg.hidden_dim, cfg.bottleneck_dim, cfg.out_dim,
                                      batch_norm=cfg.batch_norm, freeze_last_layer=cfg.freeze_last_layer_epochs,
                                      norm_last_layer=cfg.norm_last_layer)

        self.head = new_head()
        self.teacher_head = make_teacher(self.head, new_head())  # weight_norm'd heads cannot be deep-copied
        self.criterion = DINOLoss(output_dim=cfg.out_dim, warmup_teacher_temp=cfg.warmup_teacher_temp,
                                  teacher_temp=cfg.teacher_temp,
                                  warmup_teacher_temp_epochs=cfg.warmup_teacher_temp_epochs,
                                  student_temp=cfg.student_temp, center_momentum=cfg.center_momentum)

    def student_teacher_pairs(self, backbone: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
        return [(backbone, self.teacher_backbone), (self.head, self.teacher_head)]

    def forward(self, views: list[torch.Tensor], backbone: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        views, n_global = self.select_views(views)
        student = project(self.head, encode(backbone, views, separate=False), separate=False)
        with torch.no_grad():
            teacher = project(self.teacher_head, encode(self.teacher_backbone, views[:n_global], separate=False),
                              separate=False)
        # Updates the center from the teacher outputs (after using the previous center).
        loss = self.criterion(teacher, student, epoch=self.epoch)
        return loss, {"loss": loss.detach()}

    def before_optimizer_step(self) -> None:
        # The DINO paper freezes the last layer during the first epoch(s); lightly's head drops its gradients.
        self.head.cancel_last_layer_gradients(self.epoch)
