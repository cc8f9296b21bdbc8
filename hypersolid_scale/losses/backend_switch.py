"""``method.hypersolid.backend=auto``: ``tiled`` or ``neighbors`` per step, with hysteresis (docs/design.md §3c).

Near collapse (early training) most rows are *saturated* (more than k neighbours inside α): ``neighbors``
would pay its search and then the exact fallback for almost every row, so ``tiled`` is cheaper. Once the
embeddings spread, few rows saturate and ``neighbors`` wins. Both backends are exact (with an exact index),
so the choice changes the cost of a step, never its loss or gradient.

The signal is the previous step's saturated-row fraction of the GLOBAL batch. Both backends report it:
``neighbors`` from its search, ``tiled`` by counting each row's active pairs against k. It arrives in the
loss's packed statistics, which are reduced identically on every rank, so every rank takes the same
decision. Reading it on the host would be a synchronisation, so it is copied to pinned host memory without
blocking (:class:`~hypersolid_scale.losses.stats.HostValue`) and read at the next call: by then the GPU
finished computing it long ago (it precedes the previous step's backward pass), so the host waits for
nothing and the GPU's queue never drains. Decisions lag one step, which the hysteresis absorbs anyway.
"""

from __future__ import annotations

from typing import Any

import torch

from hypersolid_scale.losses.stats import HostValue

MODES = ("tiled", "neighbors")


class BackendSwitch:
    """Hysteresis on a fraction: ``tiled`` -> ``neighbors`` below ``to_neighbors``, back above ``to_tiled``.

    Call :meth:`choose` before a step and :meth:`observe` with that step's global saturated fraction
    (a 0-dim device tensor). Starts in ``tiled``: a fresh network is near-collapsed.
    """

    def __init__(self, to_neighbors: float = 0.05, to_tiled: float = 0.20, start: str = "tiled") -> None:
        if not 0.0 <= to_neighbors < to_tiled <= 1.0:
            raise ValueError(f"auto thresholds need 0 <= to_neighbors < to_tiled <= 1, got {to_neighbors}, {to_tiled}")
        if start not in MODES:
            raise ValueError(f"start={start!r}; choose one of {', '.join(MODES)}")
        self.to_neighbors, self.to_tiled, self.mode = float(to_neighbors), float(to_tiled), start
        self.last_fraction: float | None = None  # the value behind the latest decision (host, for tests/logs)
        self._pending = HostValue()

    def choose(self) -> str:
        """The backend for this step, from the fraction observed at the previous one."""
        if self._pending.ready:
            fraction = float(self._pending.get())
            self.last_fraction = fraction
            # NaN (a diverged step) compares False both ways: keep the current backend.
            if self.mode == "tiled" and fraction < self.to_neighbors:
                self.mode = "neighbors"
            elif self.mode == "neighbors" and fraction > self.to_tiled:
                self.mode = "tiled"
        return self.mode

    def observe(self, fraction: torch.Tensor) -> None:
        """Queue this step's saturated fraction for the next decision (no host synchronisation)."""
        self._pending.put(fraction.detach().reshape(()))

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to take the next decisions as the uninterrupted one: the side and the fraction
        waiting to be read (one host read, at checkpoint time only). The thresholds are the config's."""
        pending = self._pending.peek()
        return {"mode": self.mode, "pending": None if pending is None else float(pending)}

    def load_state(self, state: dict[str, Any]) -> None:
        if state["mode"] not in MODES:
            raise ValueError(f"auto's stored side {state['mode']!r} is not one of {', '.join(MODES)}")
        self.mode = str(state["mode"])
        self._pending = HostValue()
        if state.get("pending") is not None:
            self._pending.put(torch.tensor(float(state["pending"]), dtype=torch.float64))
