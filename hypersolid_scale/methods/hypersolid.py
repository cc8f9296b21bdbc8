"""Hypersolid (the paper's objective): a projector over every view and :class:`HypersolidLoss` on (B, V, D).

Its section ``method.hypersolid`` (:class:`HypersolidConfig`) is the loss's
:class:`~hypersolid_scale.losses.LossConfig` and the projector's shape, as every method's section holds its heads'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from hypersolid_scale.losses import HypersolidLoss, LossConfig
from hypersolid_scale.losses.backends import get_backend
from hypersolid_scale.methods.base import Method, Outputs, encode, project
from hypersolid_scale.methods.registry import register
from hypersolid_scale.models import Projector


@dataclass
class HypersolidConfig(LossConfig):  # type: ignore[misc]  # LossConfig is built from the backend registry
    """``method.hypersolid``: the loss's hyperparameters and its projector's shape.

    The paper fixes the projector's OUTPUT dimension (1024, Sec. "Training Protocol"), not its depth or hidden
    width. The default is a 3-layer MLP of width 2048 (Linear-BN-ReLU, Linear-BN-ReLU, Linear), the expander of
    other non-contrastive objectives without a predictor (Barlow Twins, VICReg); the paper's projector-size
    sweep (64..4096, <2% spread) suggests the objective is not sensitive to this choice.

    Attributes:
        num_layers: Linear layers in the projector (1: a single linear map).
        hidden_dim: width of its hidden layers (unused when num_layers == 1).
        out_dim: its output dimension D, the loss's input (paper: 1024).
    """

    num_layers: int = 3
    hidden_dim: int = 2048
    out_dim: int = 1024

    KINDS: ClassVar[dict[str, str]] = {"num_layers": "pos_int", "hidden_dim": "pos_int", "out_dim": "pos_int"}
    TAGS: ClassVar[dict[str, str]] = {"loss_backend": "backend"}  # a run's MLflow tag -> the key it shows


@register
class Hypersolid(Method):
    """One backbone call per resolution, one projector call over all views, the loss on (B, V, D). The loss
    returns P x the gradient of the global loss on each rank (docs/design.md §3), and its statistics are
    already those of the global batch (reduced in the loss's single collective): ``stats_reduced``.

    ``check_finite``/``same_rows_per_rank``: how the loss runs (see :class:`HypersolidLoss`); the trainer's
    values (False, True) need no host synchronisation.
    """

    name, Config, order = "hypersolid", HypersolidConfig, 0
    display_name = "Hypersolid"
    projection_head = "projector"
    uses_local_views = True
    stats_reduced = True
    epoch_terms = (
        ("loss", "loss", ".4f"),
        ("align", "alignment", ".4f"),
        ("repel", "repulsion", ".4f"),
        ("active pairs", "active_pairs", ".0f"),
    )

    def __init__(
        self,
        feature_dim: int,
        cfg: HypersolidConfig,
        steps_per_epoch: int = 1,
        *,
        check_finite: bool = False,
        same_rows_per_rank: bool = True,
    ) -> None:
        super().__init__(steps_per_epoch)
        self.projector = Projector(feature_dim, cfg.hidden_dim, cfg.out_dim, cfg.num_layers)
        self.criterion = HypersolidLoss.from_config(
            cfg, check_finite=check_finite, same_rows_per_rank=same_rows_per_rank
        )

    @classmethod
    def compile_refusal(cls, section: HypersolidConfig) -> str:
        refusal = get_backend(section.backend).compile_refusal  # its repulsion backend's reason, if any
        return f"method.hypersolid.backend={section.backend}: {refusal}" if refusal else ""

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

    def get_extra_state(self) -> dict[str, Any]:
        backend = self.criterion.backend.state()  # e.g. auto's side and thresholds: a resume decides the same
        return {**super().get_extra_state(), **({"backend": backend} if backend else {})}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        super().set_extra_state(state)
        self.criterion.backend.load_state(state.get("backend") or {})
