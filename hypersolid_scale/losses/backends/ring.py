"""``ring``: ``tiled``'s exact computation with the rows passed round the ranks instead of all-gathered
(docs/design.md §3f).

Each rank's detached rows travel round the ranks in P − 1 point-to-point hops
(:func:`~hypersolid_scale.distributed.ring_pass`), the next block in flight while the current one is computed;
no rank ever holds more than two other ranks' blocks, so the loss's memory per rank is O(m·D + tile²) whatever P.
The result is ``tiled``'s: the same value, gradient rows and statistics (the §3 contract; nothing crosses ranks
in backward). Host reads: the row counts when the ranks' sizes are not promised equal.
"""

from __future__ import annotations

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


@register_backend
class RingBackend(Backend):
    name = "ring"
    order = 4
    compile_refusal = (
        "its point-to-point sends (batch_isend_irecv) and the generator that overlaps them with the blocks' "
        "computation are not traced into a graph"
    )

    def exchange(
        self, x_rows: torch.Tensor, views: int, repel: str, alpha: float, *, same_rows_per_rank: bool
    ) -> tuple[torch.Tensor, RepulsionStats, int]:
        tile, xr = self.cfg.tile_size, x_rows.detach()
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
