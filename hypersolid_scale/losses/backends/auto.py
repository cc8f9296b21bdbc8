"""``auto``: ``tiled`` or ``neighbors`` for each call, from the previous call's global saturated-row fraction,
with hysteresis (:class:`~hypersolid_scale.losses.backend_switch.BackendSwitch`, docs/design.md §3c).

Both sides are exact (``auto`` requires an exact index), so the choice changes the cost of a call, never its
loss or gradient. ``tiled`` runs counting the rows with at least k active pairs, so both sides report the
saturated fraction. The decision reads the previous call's fraction, copied to the host without blocking:
on its ``tiled`` side a call reads nothing on the host. Extra statistics: those of ``neighbors``, then
``backend_neighbors`` (1: this call ran ``neighbors``).

With ``auto.by=time`` the side is chosen by timing instead: both sides, on the call's own rows, at the first call
and every ``auto.time_every`` calls (:meth:`AutoBackend.time_sides`), since where they cost the same depends on
the machine, the batch and the embeddings' spread (benchmarks/auto_break_even.py). The side, the fraction waiting
to be read, the call count and the latest times travel in checkpoints (:meth:`AutoBackend.state`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hypersolid_scale.losses.config import LossConfig
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats
    from hypersolid_scale.losses.stats import PackedStats

import torch

from hypersolid_scale.losses.backend_switch import BackendSwitch
from hypersolid_scale.losses.backends import SECTION, Backend, register_backend
from hypersolid_scale.losses.backends.neighbors import SEARCH_STATS, NeighborsBackend, search_stats
from hypersolid_scale.losses.backends.tiled import TiledBackend
from hypersolid_scale.losses.neighbor_search import EXACT_INDEXES

SIDES = ("tiled", "neighbors")
# auto.by=time: the other side must cost under this share of the current side's to be taken (timing noise)
SWITCH_MARGIN = 0.9


BY = ("fraction", "time")


@dataclass
class AutoOptions:
    """The section ``method.hypersolid.auto`` (its neighbors side reads ``method.hypersolid.neighbors``)."""

    to_neighbors: float = 0.05  # by=fraction: switch tiled -> neighbors when the saturated fraction drops below
    to_tiled: float = 0.20  # by=fraction: switch neighbors -> tiled when the saturated fraction rises above
    # fraction (the saturated fraction against the two thresholds above) | time (the side that costs less, both
    # timed at the first call and every time_every calls; docs/design.md §3c)
    by: str = "fraction"
    time_every: int = 200  # by=time: calls between two timings (each costs four extra repulsions)

    def validate(self, key: str = f"{SECTION}.auto") -> None:
        """Raise ValueError naming the first bad key (``key``: the section, as the config names it)."""
        if self.by not in BY:
            raise ValueError(f"{key}.by={self.by!r} is not valid; choose one of {', '.join(BY)}")
        if int(self.time_every) < 1:
            raise ValueError(f"{key}.time_every must be a positive integer, got {self.time_every}")
        if not 0.0 <= self.to_neighbors < self.to_tiled <= 1.0:
            raise ValueError(
                f"{key}.to_neighbors={self.to_neighbors} and {key}.to_tiled={self.to_tiled} must satisfy "
                "0 <= to_neighbors < to_tiled <= 1 (the gap between them is the hysteresis)"
            )


@register_backend
class AutoBackend(Backend):
    name = "auto"
    order = 3
    options = AutoOptions
    stat_names = SEARCH_STATS + ("backend_neighbors",)
    compile_refusal = (
        "it picks tiled or neighbors per step from a value read on the host, and neighbors' pair lists have "
        "data-dependent sizes: a graph per side, recompiled as the sizes change"
    )

    def __init__(self, cfg: LossConfig) -> None:
        super().__init__(cfg)
        neighbors = NeighborsBackend(cfg)
        tiled = TiledBackend(cfg, saturation_k=cfg.neighbors.k)
        self._sides: dict[str, Backend] = {"tiled": tiled, "neighbors": neighbors}
        self.neighbors = neighbors.neighbors  # the search, as on the neighbors backend
        own = getattr(cfg, self.name)  # its own section: method.hypersolid.<name>
        self.switch = BackendSwitch(own.to_neighbors, own.to_tiled)
        self.current = self.switch.mode  # the side the latest call ran
        self.calls = 0  # calls so far: auto.by=time times both sides at call 1 and every auto.time_every after
        self.timed: dict[str, float] | None = None  # auto.by=time: the latest seconds a call per side

    @classmethod
    def check_config(cls, cfg: LossConfig) -> None:
        cfg.neighbors.validate(f"{SECTION}.neighbors")  # its neighbors side's section
        index = cfg.neighbors.index
        if index not in EXACT_INDEXES:
            key = f"{SECTION}.neighbors.index"
            raise ValueError(
                f"{SECTION}.backend=auto switches between exact backends, but {key}={index!r} is "
                f"approximate; use {key}={' or '.join(EXACT_INDEXES)}, or {SECTION}.backend=neighbors "
                "for an approximate index"
            )

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        self.calls += 1
        own = getattr(self.cfg, self.name)
        if own.by == "time":
            if (self.calls - 1) % own.time_every == 0:
                self.time_sides(x_rows, x_all, layout, alpha)
        else:
            self.current = self.switch.choose()
        return self._sides[self.current].repulsion(x_rows, x_all, layout, alpha)

    def time_sides(self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float) -> None:
        """``auto.by=time``, at the first call and every ``auto.time_every`` calls after: both sides timed on this
        call's rows, and the side set to the cheaper one (the other must cost under ``SWITCH_MARGIN`` times the
        current side's, so that timing noise does not flip it).

        Each side runs forward and backward twice on a detached copy of the rows and the second run is timed
        (the first pays one-off costs: kernels loaded, an index's memory). The times are the slowest rank's,
        through one collective, so that every rank takes the same side. Reads the host (synchronises) at these
        calls only; they cost four extra repulsions each."""
        from hypersolid_scale.distributed import all_reduce_packed, get_rank

        seconds = [side_seconds(self._sides[side], x_rows, x_all, layout, alpha)[0] for side in SIDES]
        _, slowest = all_reduce_packed(
            torch.zeros(0, dtype=torch.float64, device=x_rows.device),
            torch.tensor(seconds, dtype=torch.float64, device=x_rows.device),
        )
        timed = dict(zip(SIDES, slowest.tolist()))
        other = SIDES[1 - SIDES.index(self.current)]
        before, self.timed = self.current, timed
        if timed[other] < SWITCH_MARGIN * timed[self.current]:
            self.current = other
        if get_rank() == 0 and (self.calls == 1 or self.current != before):
            print(
                f"[hypersolid] backend=auto timed at call {self.calls}: tiled {timed['tiled'] * 1e3:.1f} ms, "
                f"neighbors {timed['neighbors'] * 1e3:.1f} ms a call (forward and backward): runs {self.current}",
                flush=True,
            )

    def state(self) -> dict[str, Any]:
        return {"switch": self.switch.state(), "current": self.current, "calls": self.calls, "timed": self.timed}

    def load_state(self, state: dict[str, Any]) -> None:
        if "switch" in state:
            self.switch.load_state(state["switch"])
            self.current = str(state.get("current", self.switch.mode))
            self.calls = int(state.get("calls", 0))
            self.timed = state.get("timed")

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            **search_stats(sums, rows),
            "backend_neighbors": torch.full_like(loss, float(self.current == "neighbors")),
        }

    def observe(self, packed: PackedStats) -> None:
        self.switch.observe(packed["saturated_fraction"])


def side_seconds(
    side: Backend, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float, repeat: int = 1
) -> tuple[float, RepulsionStats]:
    """Seconds of ``side``'s repulsion, forward and backward, on a detached copy of the rows: the median of
    ``repeat`` runs after one (the first pays one-off costs), and the last run's statistics. ``auto.by=time``
    times one run; benchmarks/auto_break_even.py the median of several."""
    times: list[float] = []
    for i in range(repeat + 1):
        leaf = x_rows.detach().requires_grad_(True)
        if x_rows.is_cuda:
            torch.cuda.synchronize(x_rows.device)
        start = time.perf_counter()
        rep, st = side.repulsion(leaf, x_all, layout, alpha)
        if rep.requires_grad:
            torch.autograd.grad(rep, leaf)
        if x_rows.is_cuda:
            torch.cuda.synchronize(x_rows.device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times), st
