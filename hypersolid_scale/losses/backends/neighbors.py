"""``neighbors``: the repulsion over the candidate pairs of a k-nearest-neighbour search, exact with an exact
index (``flat`` or ``torch``); see :mod:`hypersolid_scale.losses.neighbor_search`.

Its one host read is which rows saturated (it sizes the exact fallback); a FAISS search on the host copies
the embeddings too. Extra statistics (:data:`SEARCH_STATS`): candidates, saturated_rows, saturated_fraction,
recall, recall_measured (ranks that measured recall this call; recall is 1 when there was nothing to find).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypersolid_scale.losses.config import LossConfig
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats

import torch

from hypersolid_scale.losses.backends import SECTION, Backend, register_backend
from hypersolid_scale.losses.neighbor_search import INDEXES, NeighborRepulsion

SEARCH_STATS = ("candidates", "saturated_rows", "saturated_fraction", "recall", "recall_measured")


def search_stats(sums: Mapping[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """The values of :data:`SEARCH_STATS` from the RepulsionStats sums over ranks and M_g (``rows``)."""
    hits, total = sums["recall_hits"], sums["recall_total"]
    return dict(
        candidates=sums["candidates"],
        saturated_rows=sums["saturated_rows"],
        saturated_fraction=sums["saturated_rows"] / rows,
        # global recall: found / truly active over every measuring rank's sample
        recall=torch.where(total > 0, hits / total.clamp(min=1.0), torch.ones_like(total)),
        recall_measured=sums["recall_measured"],
    )


# The IVF quantizer's life in calls: kept for 100 calls, a search on 24,576 rows took 0.57x the time of one
# that trains it, its recall 0.919 against 0.937 (benchmarks/ivf_reuse.py, docs/design.md §2 neighbors).
IVF_RETRAIN_EVERY = 100


@dataclass
class NeighborsOptions:
    """The section ``method.hypersolid.neighbors``: the candidate search (``auto``'s neighbors side reads it too)."""

    index: str = "flat"  # flat | torch (exact) | ivf | hnsw (approximate): neighbor_search.INDEXES
    k: int = 64  # candidates searched per row
    nprobe: int = 16  # ivf: inverted lists visited per query
    ef_search: int = 64  # hnsw: search breadth
    recall_every: int = 100  # measure recall against exact search every N calls (0: never)
    # ivf on the host: train the coarse quantizer every N calls and keep it between them (1: every call)
    ivf_retrain_every: int = IVF_RETRAIN_EVERY

    def validate(self, key: str = f"{SECTION}.neighbors") -> None:
        """Raise ValueError naming the first bad key (``key``: the section, as the config names it)."""
        if self.index not in INDEXES:
            raise ValueError(f"{key}.index={self.index!r} is not valid; choose one of {', '.join(INDEXES)}")
        for name in ("k", "nprobe", "ef_search", "ivf_retrain_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{key}.{name} must be a positive integer, got {getattr(self, name)}")
        if self.recall_every < 0:
            raise ValueError(f"{key}.recall_every must be >= 0 (0 disables), got {self.recall_every}")


@register_backend
class NeighborsBackend(Backend):
    name = "neighbors"
    order = 2
    options = NeighborsOptions
    stat_names = SEARCH_STATS
    compile_refusal = (
        "the candidate search reads which rows saturated on the host and its pair lists have data-dependent "
        "sizes (a FAISS index searches on the host): graph breaks and recompilations every step"
    )

    def __init__(self, cfg: LossConfig) -> None:
        super().__init__(cfg)
        c = getattr(cfg, self.name)  # its own section: method.hypersolid.<name>
        self.neighbors = NeighborRepulsion(
            index=c.index,
            k=c.k,
            nprobe=c.nprobe,
            ef_search=c.ef_search,
            recall_every=c.recall_every,
            tile_size=cfg.tile_size,
            ivf_retrain_every=c.ivf_retrain_every,
        )

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        return self.neighbors(x_rows, x_all, layout, alpha)

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return search_stats(sums, rows)
