"""DINO (Caron et al., 2021): self-distillation with a momentum teacher, centering and multi-crop.

The student sees every view (global and local); the teacher only the global views. lightly's DINOLoss
centers the teacher's outputs and sharpens them with a temperature warmed up over the first epochs; its
center is an EMA of the teacher outputs' mean over ALL ranks (lightly all-reduces it), so it is the same
buffer on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lightly.loss import DINOLoss
from lightly.models.modules import DINOProjectionHead
from torch import nn

from hypersolid_scale.methods.base import EMAMethod, Outputs, encode, make_teacher, project
from hypersolid_scale.methods.registry import register


@dataclass
class DINOConfig:
    hidden_dim: int = 2048  # DINO paper: 3-layer MLP of width 2048; lightly default
    bottleneck_dim: int = 256  # DINO paper; lightly default
    out_dim: int = 65536  # DINO paper K; lightly default (solo-learn's CIFAR configs use 4096)
    batch_norm: bool = False  # DINO paper: no BN in the head (lightly default)
    norm_last_layer: bool = True  # DINO paper: weight-normalised last layer with fixed norm; lightly default
    freeze_last_layer_epochs: int = 1  # DINO paper: last layer frozen during the first epoch
    warmup_teacher_temp: float = 0.04  # DINO paper; lightly default
    teacher_temp: float = 0.04  # DINO paper (0.07 for long runs); lightly default
    warmup_teacher_temp_epochs: int = 30  # DINO paper; lightly default
    student_temp: float = 0.1  # DINO paper; lightly default
    center_momentum: float = 0.9  # DINO paper m; lightly default
    momentum_base: float = 0.996  # DINO paper: teacher EMA from 0.996 to 1 with a cosine schedule
    momentum_end: float = 1.0  # DINO paper

    KINDS = {
        "hidden_dim": "pos_int",
        "bottleneck_dim": "pos_int",
        "out_dim": "pos_int",
        "batch_norm": "bool",
        "norm_last_layer": "bool",
        "freeze_last_layer_epochs": "nonneg_int",
        "warmup_teacher_temp": "pos_float",
        "teacher_temp": "pos_float",
        "warmup_teacher_temp_epochs": "nonneg_int",
        "student_temp": "pos_float",
        "center_momentum": "unit",
        "momentum_base": "unit",
        "momentum_end": "unit",
    }


@register
class DINO(EMAMethod):
    """Teacher temperature and the frozen last layer follow the papers' epoch schedules: the epoch is
    ``step // steps_per_epoch`` with ``step`` the optimizer steps completed (``after_step`` counts them)."""

    name, Config, order = "dino", DINOConfig, 50
    display_name = "DINO"
    projection_head = "head"

    uses_local_views = True
    tells_views_by_size = True
    target_keys = ("teacher",)

    @classmethod
    def compile_refusal(cls, section: Any) -> str:
        return (
            "method.name=dino: "
            "its loss takes the epoch as a Python number (lightly's DINOLoss, the teacher temperature's warm-up): "
            "a recompilation every epoch, and eager once torch's recompile limit is reached"
        )

    @classmethod
    def build(cls, section: DINOConfig, *, backbone: nn.Module, feature_dim: int, steps_per_epoch: int) -> DINO:
        return cls(feature_dim, section, backbone, steps_per_epoch)

    @classmethod
    def frozen_by_schedule(cls, section: DINOConfig) -> tuple[str, int] | None:
        epochs = section.freeze_last_layer_epochs
        return ("freeze_last_layer_epochs", epochs) if epochs > 0 else None

    def __init__(self, feature_dim: int, cfg: DINOConfig, backbone: nn.Module, steps_per_epoch: int = 1) -> None:
        super().__init__(backbone, cfg.momentum_base, cfg.momentum_end, steps_per_epoch)

        def new_head() -> DINOProjectionHead:
            return DINOProjectionHead(
                feature_dim,
                cfg.hidden_dim,
                cfg.bottleneck_dim,
                cfg.out_dim,
                batch_norm=cfg.batch_norm,
                freeze_last_layer=cfg.freeze_last_layer_epochs,
                norm_last_layer=cfg.norm_last_layer,
            )

        self.head = new_head()
        self.teacher_head = make_teacher(self.head, new_head())  # weight_norm'd heads cannot be deep-copied
        self.criterion = DINOLoss(
            output_dim=cfg.out_dim,
            warmup_teacher_temp=cfg.warmup_teacher_temp,
            teacher_temp=cfg.teacher_temp,
            warmup_teacher_temp_epochs=cfg.warmup_teacher_temp_epochs,
            student_temp=cfg.student_temp,
            center_momentum=cfg.center_momentum,
        )
        self.warmup_teacher_temp = cfg.warmup_teacher_temp  # the schedule's start, for float64 runs (``loss``)

    def student_teacher_pairs(self, backbone: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
        return [(backbone, self.teacher_backbone), (self.head, self.teacher_head)]

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        views, n_global = self.select_views(views)
        out = {"student": project(self.head, encode(backbone, views, separate=False), separate=False)}
        if not replay:
            with torch.no_grad():
                out["teacher"] = project(
                    self.teacher_head, encode(self.teacher_backbone, views[:n_global], separate=False), separate=False
                )
        return out

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # Updates the center from the teacher outputs (after using the previous center).
        if out["teacher"][0].dtype != torch.float64:
            loss = self.criterion(out["teacher"], out["student"], epoch=self.epoch)
        else:  # dist.precision=fp64: lightly makes its temperature a float32 tensor (torch's default dtype)
            c, first = self.criterion, self.warmup_teacher_temp
            steps = c.warmup_teacher_temp_epochs
            warm = self.epoch < steps
            temp = (
                float(torch.linspace(first, c.teacher_temp, steps, dtype=torch.float64)[self.epoch])
                if warm
                else c.teacher_temp
            )
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.float64)
            try:
                loss = c(out["teacher"], out["student"], teacher_temp=temp)
            finally:
                torch.set_default_dtype(previous)
        return loss, {"loss": loss.detach()}

    def before_optimizer_step(self) -> None:
        # The DINO paper freezes the last layer during the first epoch(s); lightly's head drops its gradients.
        self.head.cancel_last_layer_gradients(self.epoch)
