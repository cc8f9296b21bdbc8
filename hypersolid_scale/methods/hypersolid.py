"""Hypersolid (the paper's objective): a projector over every view and :class:`HypersolidLoss` on (B, V, D).

Its section ``method.hypersolid`` is the loss's :class:`~hypersolid_scale.losses.LossConfig`; the projector's
shape is ``model.proj_*``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hypersolid_scale.losses import HypersolidLoss, LossConfig
from hypersolid_scale.losses.backends import get_backend
from hypersolid_scale.methods.base import Method, Outputs, encode, project
from hypersolid_scale.methods.registry import register
from hypersolid_scale.models import ModelConfig, Projector


@register
class Hypersolid(Method):
    """One backbone call per resolution, one projector call over all views, the loss on (B, V, D). The loss
    returns P x the gradient of the global loss on each rank (docs/design.md §3), and its statistics are
    already those of the global batch (reduced in the loss's single collective): ``stats_reduced``.

    ``check_finite``/``same_rows_per_rank``: how the loss runs (see :class:`HypersolidLoss`); the trainer's
    values (False, True) need no host synchronisation.
    """

    name, Config, order = "hypersolid", LossConfig, 0
    display_name = "Hypersolid"
    projection_head = "projector"
    uses_local_views = True
    stats_reduced = True
    projector_features = True

    def __init__(
        self,
        feature_dim: int,
        model_cfg: ModelConfig,
        loss_cfg: LossConfig,
        steps_per_epoch: int = 1,
        *,
        check_finite: bool = False,
        same_rows_per_rank: bool = True,
    ) -> None:
        super().__init__(steps_per_epoch)
        self.projector = Projector(feature_dim, model_cfg.proj_hidden_dim, model_cfg.proj_dim, model_cfg.proj_layers)
        self.criterion = HypersolidLoss.from_config(
            loss_cfg, check_finite=check_finite, same_rows_per_rank=same_rows_per_rank
        )

    @classmethod
    def build(
        cls,
        section: LossConfig,
        *,
        backbone: nn.Module,
        feature_dim: int,
        steps_per_epoch: int,
        model_cfg: ModelConfig | None = None,
    ) -> Hypersolid:
        return cls(feature_dim, model_cfg if model_cfg is not None else ModelConfig(), section, steps_per_epoch)

    @classmethod
    def whole_step_compile_refusal(cls, section: LossConfig) -> str:
        refusal = get_backend(section.backend).compile_refusal
        return f"method.hypersolid.backend={section.backend}: {refusal}" if refusal else ""

    @classmethod
    def run_tags(cls, section: LossConfig) -> dict[str, Any]:
        return {"loss_backend": section.backend}

    def embed_views(self, views: list[torch.Tensor], backbone: nn.Module) -> torch.Tensor:
        """Projector outputs (B, V, D) of every view, the loss's input."""
        views, _ = self.select_views(views)
        return torch.stack(project(self.projector, encode(backbone, views, separate=False), separate=False), dim=1)

    def embed(self, views: list[torch.Tensor], backbone: nn.Module, *, replay: bool = False) -> Outputs:
        return {"z": [self.embed_views(views, backbone)]}

    def loss(self, out: Outputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = self.criterion(out["z"][0])  # the loss computes in fp32 under autocast
        packed = self.criterion.packed_stats
        return loss, dict(zip(packed.names, packed.values.unbind()))

    def epoch_terms(self, mean: dict[str, float]) -> str:
        return (
            f"loss {mean['loss']:.4f} | align {mean['alignment']:.4f} | repel {mean['repulsion']:.4f} | "
            f"active pairs {mean['active_pairs']:.0f}"
        )
