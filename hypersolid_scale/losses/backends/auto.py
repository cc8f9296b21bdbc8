"""``auto``: ``tiled`` or ``neighbors`` for each call, from the previous call's global saturated-row fraction,
with hysteresis (:class:`~hypersolid_scale.losses.backend_switch.BackendSwitch`, docs/design.md §3c).

Both sides are exact (``auto`` requires an exact index), so the choice changes the cost of a call, never its
loss or gradient. ``tiled`` runs counting the rows with at least k active pairs, so both sides report the
saturated fraction. The decision reads the previous call's fraction, copied to the host without blocking:
on its ``tiled`` side a call reads nothing on the host. Extra statistics: those of ``neighbors``, then
``backend_neighbors`` (1: this call ran ``neighbors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypersolid_scale.losses.config import LossConfig
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats
    from hypersolid_scale.losses.stats import PackedStats

import torch

from hypersolid_scale.losses.backend_switch import BackendSwitch
from hypersolid_scale.losses.backends import Backend, register_backend
from hypersolid_scale.losses.backends.neighbors import SEARCH_STATS, NeighborsBackend, search_stats
from hypersolid_scale.losses.backends.tiled import TiledBackend
from hypersolid_scale.losses.config import EXACT_INDEXES, SECTION


@register_backend
class AutoBackend(Backend):
    name = "auto"
    order = 3
    stat_names = SEARCH_STATS + ("backend_neighbors",)
    compile_refusal = (
        "it picks tiled or neighbors per step from a value read on the host, and neighbors' pair lists have "
        "data-dependent sizes: a graph per side, recompiled as the sizes change"
    )

    def __init__(self, cfg: LossConfig) -> None:
        super().__init__(cfg)
        neighbors = NeighborsBackend(cfg)
        self._sides: dict[str, Backend] = {"tiled": TiledBackend(cfg, saturation_k=cfg.k), "neighbors": neighbors}
        self.neighbors = neighbors.neighbors  # the search, as on the neighbors backend
        self.switch = BackendSwitch(cfg.auto_to_neighbors, cfg.auto_to_tiled)
        self.current = self.switch.mode  # the side the latest call ran

    @classmethod
    def check_config(cls, cfg: LossConfig) -> None:
        if cfg.index not in EXACT_INDEXES:
            raise ValueError(
                f"{SECTION}.backend=auto switches between exact backends, but {SECTION}.index={cfg.index!r} is "
                f"approximate; use {SECTION}.index={' or '.join(EXACT_INDEXES)}, or {SECTION}.backend=neighbors "
                "for an approximate index"
            )

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        self.current = self.switch.choose()
        return self._sides[self.current].repulsion(x_rows, x_all, layout, alpha)

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            **search_stats(sums, rows),
            "backend_neighbors": torch.full_like(loss, float(self.current == "neighbors")),
        }

    def observe(self, packed: PackedStats) -> None:
        self.switch.observe(packed["saturated_fraction"])
