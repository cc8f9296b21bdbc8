"""``tiled``: exact, one (tile_size × tile_size) block at a time, gradient rows accumulated without autograd.

Memory O(tile_size² + m · D), never an (M × M) matrix. Reads nothing on the host (on CUDA). With ``screen=bf16`` the
rows are all-gathered in bfloat16 and screened, the rows bf16 cannot rule out gathered again in full precision
(:mod:`hypersolid_scale.losses.screening`; host reads: the row counts and the needed rows' sizes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypersolid_scale.losses.config import LossConfig
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats

import torch

from hypersolid_scale.losses.backends import Backend, register_backend
from hypersolid_scale.losses.repulsion import tiled_repulsion
from hypersolid_scale.losses.screening import SCREEN_STATS, screen_stats, screened_exchange


@register_backend
class TiledBackend(Backend):
    name = "tiled"
    order = 1
    screens = True

    def __init__(self, cfg: LossConfig, saturation_k: int | None = None) -> None:
        """``saturation_k``: also count the rows with at least k active pairs (``auto`` runs tiled so)."""
        super().__init__(cfg)
        self.saturation_k = saturation_k
        self.stat_names = SCREEN_STATS if cfg.screen == "bf16" else ()

    def exchange(
        self, x_rows: torch.Tensor, views: int, repel: str, alpha: float, *, same_rows_per_rank: bool
    ) -> tuple[torch.Tensor, RepulsionStats, int]:
        if self.cfg.screen != "bf16":  # the plain all_gather of the rows (Backend.exchange)
            return super().exchange(x_rows, views, repel, alpha, same_rows_per_rank=same_rows_per_rank)
        tile = self.cfg.tile_size
        return screened_exchange(x_rows, views, repel, alpha, tile, route="gather", same_size=same_rows_per_rank)

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return screen_stats(sums, rows) if self.stat_names else {}

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        return tiled_repulsion(x_rows, x_all, layout, alpha, self.cfg.tile_size, saturation_k=self.saturation_k)
