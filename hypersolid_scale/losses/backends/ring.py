"""``ring``: ``tiled``'s exact computation with the rows passed round the ranks instead of all-gathered
(docs/design.md §3f).

Each rank's detached rows travel round the ranks in P − 1 point-to-point hops
(:func:`~hypersolid_scale.distributed.ring_pass`), the next block in flight while the current one is computed;
no rank ever holds more than two other ranks' blocks, so the loss's memory per rank is O(m·D + tile²) whatever P.
The result is ``tiled``'s: the same value, gradient rows and statistics (the §3 contract; nothing crosses ranks
in backward). With ``screen=bf16`` the blocks travel in bfloat16 and are screened, the rows bf16 cannot rule out sent
again in full precision (:mod:`hypersolid_scale.losses.screening`). Host reads: the row counts when the ranks'
sizes are not promised equal; with ``screen=bf16``, the needed rows' sizes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypersolid_scale.losses.config import LossConfig

import torch

from hypersolid_scale.distributed import get_rank, ring_pass, row_counts
from hypersolid_scale.losses.backends import Backend, register_backend
from hypersolid_scale.losses.repulsion import (
    LinearizedRowSum,
    PairLayout,
    RepulsionStats,
    own_block,
    remote_block,
    tiled_repulsion,
)
from hypersolid_scale.losses.screening import SCREEN_STATS, screen_stats, screened_exchange


@register_backend
class RingBackend(Backend):
    name = "ring"
    order = 4
    screens = True
    compile_refusal = (
        "its point-to-point sends (batch_isend_irecv) and the generator that overlaps them with the blocks' "
        "computation are not traced into a graph"
    )

    def __init__(self, cfg: LossConfig) -> None:
        super().__init__(cfg)
        self.stat_names = SCREEN_STATS if cfg.screen == "bf16" else ()

    def exchange(
        self, x_rows: torch.Tensor, views: int, repel: str, alpha: float, *, same_rows_per_rank: bool
    ) -> tuple[torch.Tensor, RepulsionStats, int]:
        tile = self.cfg.tile_size
        if self.cfg.screen == "bf16":
            return screened_exchange(x_rows, views, repel, alpha, tile, route="ring", same_size=same_rows_per_rank)
        xr = x_rows.detach()
        counts = row_counts(xr.shape[0], xr.device, same_size=same_rows_per_rank)
        layout, st = PairLayout(sum(counts[: get_rank()]), views, repel), RepulsionStats.zeros(xr.device)
        value = torch.zeros((), dtype=torch.float64, device=xr.device)
        y = torch.zeros_like(xr)
        with torch.no_grad():
            for src, block in ring_pass(xr, counts):  # this rank's own block first
                if src == get_rank():
                    v_b, y_b = own_block(xr, layout, alpha, tile, st)
                else:
                    v_b, y_b = remote_block(xr, block, layout, alpha, tile, st)
                value += v_b
                y += y_b
        return LinearizedRowSum.apply(x_rows, value, y), st, sum(counts)

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        """Against rows already gathered (a caller of the plain backend interface): ``tiled``'s computation."""
        return tiled_repulsion(x_rows, x_all, layout, alpha, self.cfg.tile_size)

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return screen_stats(sums, rows) if self.stat_names else {}
