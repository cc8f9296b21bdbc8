"""``tiled``: exact, one (tile_size × tile_size) block at a time, gradient rows accumulated without autograd.

Memory O(tile_size² + m · D), never an (M × M) matrix. Reads nothing on the host (on CUDA).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypersolid_scale.losses.config import LossConfig
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats

import torch

from hypersolid_scale.losses.backends import Backend, register_backend
from hypersolid_scale.losses.repulsion import tiled_repulsion


@register_backend
class TiledBackend(Backend):
    name = "tiled"
    order = 1

    def __init__(self, cfg: LossConfig, saturation_k: int | None = None) -> None:
        """``saturation_k``: also count the rows with at least k active pairs (``auto`` runs tiled so)."""
        super().__init__(cfg)
        self.saturation_k = saturation_k

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        return tiled_repulsion(x_rows, x_all, layout, alpha, self.cfg.tile_size, saturation_k=self.saturation_k)
