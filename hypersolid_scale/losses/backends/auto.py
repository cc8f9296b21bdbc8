"""``auto``: ``tiled`` or ``neighbors`` for each call, from the previous call's global saturated-row fraction,
with hysteresis (:class:`~hypersolid_scale.losses.backend_switch.BackendSwitch`, docs/design.md §3c).

Both sides are exact (``auto`` requires an exact index), so the choice changes the cost of a call, never its
loss or gradient. ``tiled`` runs counting the rows with at least k active pairs, so both sides report the
saturated fraction. The decision reads the previous call's fraction, copied to the host without blocking:
on its ``tiled`` side a call reads nothing on the host. Extra statistics: those of ``neighbors``, then
``backend_neighbors`` (1: this call ran ``neighbors``).

The thresholds are the configured ``auto_to_neighbors`` / ``auto_to_tiled``, or with
``auto_thresholds=measured`` the configured gap placed around the fraction at which the two sides cost the same
on this machine and batch, from both sides timed at the first call (:meth:`AutoBackend.calibrate`). The side,
the fraction waiting to be read and the thresholds travel in checkpoints (:meth:`AutoBackend.state`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

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
        # auto_thresholds=measured: the first call's times and fraction (None until then)
        self.measured: dict[str, float] | None = None

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
        if self.cfg.auto_thresholds == "measured" and self.measured is None:
            return self.calibrate(x_rows, x_all, layout, alpha)
        self.current = self.switch.choose()
        return self._sides[self.current].repulsion(x_rows, x_all, layout, alpha)

    def calibrate(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        """``auto_thresholds=measured``, at the first call: both sides timed on this call's rows, the thresholds
        placed around the saturated fraction at which they cost the same (:func:`break_even`).

        Each side runs forward and backward twice on a detached copy of the rows, and the second run is timed
        (the first pays one-off costs: kernels loaded, an index's memory). The times are the slowest rank's and
        the fraction the global batch's, through one collective, so that every rank sets the same thresholds.
        Reads the host (synchronises) at this call only. The call returns ``tiled``'s result, the side a run
        starts on."""
        from hypersolid_scale.distributed import all_reduce_packed, get_rank

        timed: dict[str, float] = {}
        for side in ("neighbors", "tiled"):
            for _ in range(2):  # forward and backward, on a detached copy of the rows
                leaf = x_rows.detach().requires_grad_(True)
                _sync(x_rows)
                start = time.perf_counter()
                rep, st = self._sides[side].repulsion(leaf, x_all, layout, alpha)
                if rep.requires_grad:
                    torch.autograd.grad(rep, leaf)
                _sync(x_rows)
                timed[side] = time.perf_counter() - start
            if side == "neighbors":
                saturated = st.saturated_rows.detach().double().reshape(1)
        seconds = torch.tensor([timed["tiled"], timed["neighbors"]], dtype=torch.float64, device=x_rows.device)
        total, slowest = all_reduce_packed(saturated, seconds)
        fraction, (t_tiled, t_neighbors) = float(total[0]) / x_all.shape[0], slowest.tolist()
        lo, hi = thresholds_around(
            break_even(t_tiled, t_neighbors, fraction), self.cfg.auto_to_tiled - self.cfg.auto_to_neighbors
        )
        self.switch.retune(lo, hi)
        self.measured = {"tiled_s": t_tiled, "neighbors_s": t_neighbors, "saturated_fraction": fraction}
        if get_rank() == 0:
            print(
                f"[hypersolid] backend=auto measured: tiled {t_tiled * 1e3:.1f} ms, neighbors {t_neighbors * 1e3:.1f} "
                f"ms a call at saturated fraction {fraction:.3f}: neighbors below {lo:.3f}, tiled again above "
                f"{hi:.3f}",
                flush=True,
            )
        self.current = "tiled"
        return self._sides["tiled"].repulsion(x_rows, x_all, layout, alpha)

    def state(self) -> dict[str, Any]:
        return {"switch": self.switch.state(), "measured": self.measured}

    def load_state(self, state: dict[str, Any]) -> None:
        if "switch" in state:
            self.switch.load_state(state["switch"])
            self.current = self.switch.mode
        self.measured = state.get("measured")

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            **search_stats(sums, rows),
            "backend_neighbors": torch.full_like(loss, float(self.current == "neighbors")),
        }

    def observe(self, packed: PackedStats) -> None:
        self.switch.observe(packed["saturated_fraction"])


def _sync(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def break_even(t_tiled: float, t_neighbors: float, fraction: float) -> float:
    """The saturated fraction below which ``neighbors`` costs less than ``tiled``, from one timing of each at
    saturated fraction ``fraction``.

    The model: ``tiled`` costs the same whatever the fraction (every pair, always); ``neighbors`` costs a search
    plus the exact pass over its saturated rows, which is ``tiled``'s work on those rows:
    T_n(s) = A + s · T_t, so A = t_neighbors − fraction · t_tiled and T_n(s) < T_t below s* = 1 − A / T_t.
    A first call of a run is near collapse (fraction ~1), so A is measured as the search's own cost."""
    return 1.0 - (t_neighbors - fraction * t_tiled) / t_tiled


def thresholds_around(s_star: float, gap: float) -> tuple[float, float]:
    """(to_neighbors, to_tiled): ``gap`` (the configured hysteresis) centred on ``s_star``, within [0, 1]; at or
    below 0 ``neighbors`` is never chosen, at or above 1 it is never left."""
    lo = min(max(s_star - gap / 2, 0.0), 1.0)
    return lo, min(max(s_star + gap / 2, lo), 1.0)
