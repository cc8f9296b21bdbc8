"""What a run trains: :class:`MethodModel`, the backbone and the method in one module; and
:func:`build_method_model`, its seeded construction, the one order of initialisation the trainer, the random-init
checkpoint and evaluation share (the backbone's weights first, then the method's heads).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hypersolid_scale.methods.base import Method
from hypersolid_scale.methods.registry import build_method, get_method
from hypersolid_scale.models import ModelConfig, build_backbone


class MethodModel(nn.Module):
    """What a run trains: ``backbone`` (the weights evaluation reads) and ``method`` (its heads, loss, momentum
    teacher, DINO's center, SwaV's queue, the step count) in ONE module, so that the BatchNorm conversion and
    DDP cover the heads too and the checkpoint's model state holds them. ``forward(views) -> (loss, stats)``."""

    def __init__(self, backbone: nn.Module, feature_dim: int, method: Method) -> None:
        super().__init__()
        self.backbone, self.feature_dim, self.method = backbone, feature_dim, method

    def forward(self, views: list[torch.Tensor], *, embed: bool = False, replay: bool = False) -> Any:
        """``(loss, stats)``; with ``embed``, only the method's :meth:`~Method.embed` outputs (an accumulated
        step's passes, docs/design.md §3d), which go through the engine's wrapper all the same."""
        if embed:
            return self.method.embed(views, self.backbone, replay=replay)
        return self.method(views, self.backbone)

    @property
    def projector(self) -> nn.Module | None:
        """The method's projection head (``Method.projection_head``): projector features
        (``eval.features=projector``) read it. None for a method without one."""
        return projection_head(self.method)


def projection_head(method: Method) -> nn.Module | None:
    """``method``'s projection head (its ``projection_head`` attribute), None when it declares none."""
    name = type(method).projection_head
    return getattr(method, name) if name else None


def build_method_model(model_cfg: ModelConfig, method_cfg: Any, *, steps_per_epoch: int = 1) -> MethodModel:
    """The backbone of ``model_cfg`` and the method ``method_cfg.name`` (``method_cfg``: the run's ``method``
    section), drawn from torch's generator in this order: seed it first for a run's initial weights."""
    get_method(method_cfg.name)  # a ConfigError naming the installed methods before any weight is drawn
    backbone, feature_dim = build_backbone(model_cfg)
    method = build_method(method_cfg, backbone, feature_dim, steps_per_epoch=steps_per_epoch)
    return MethodModel(backbone, feature_dim, method)
