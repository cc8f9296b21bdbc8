"""The registry of repulsion backends (``method.hypersolid.backend``): how the repulsion's row part is computed.

Every module of this package defines one :class:`Backend` subclass and registers it with
:func:`register_backend`; :func:`get_backend` and :func:`backend_names` import them all on first use
(``python -m hypersolid_scale.losses.backends`` lists them). A new
backend is one new module here (plus its tests): :class:`~hypersolid_scale.losses.HypersolidLoss` and
:class:`~hypersolid_scale.losses.LossConfig` name no backend. A backend defined elsewhere (a test, a user's
module) registers the same way, once its module is imported.

A loss builds its own backend instance from its :class:`~hypersolid_scale.losses.LossConfig`, so state kept
across calls (the neighbors search's call counter, auto's switch) belongs to that loss. Per call the loss
asks its backend for:

1. :meth:`Backend.exchange`: ``(rep_sum, RepulsionStats, M_g)`` for this rank's rows against every rank's. By
   default it all-gathers the detached rows once and calls :meth:`Backend.repulsion` with the gathered global
   batch (the contract of :mod:`hypersolid_scale.losses.repulsion`); a backend that moves the rows itself
   (``ring``'s point-to-point pass, the bf16 screening of ``screen=bf16``) overrides it (docs/design.md §3f);
2. :meth:`Backend.derive`: its extra statistics (named by :attr:`Backend.stat_names`, packed after the
   loss's own) from the sums reduced across ranks;
3. :meth:`Backend.observe`: a look at the packed statistics of the call, e.g. to decide the next one.

State that decides later calls (auto's side and thresholds) travels in checkpoints through
:meth:`Backend.state` and :meth:`Backend.load_state`, so that a resumed run takes the same decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hypersolid_scale.config.registry import DEFAULT_ORDER, Registry

if TYPE_CHECKING:
    import torch

    from hypersolid_scale.losses.config import LossConfig
    from hypersolid_scale.losses.repulsion import PairLayout, RepulsionStats
    from hypersolid_scale.losses.stats import PackedStats


SECTION = "method.hypersolid"  # where the loss's keys live in the run config, as error messages name them


class Backend:
    """How the repulsion is computed. Subclasses set :attr:`name` and implement :meth:`repulsion`."""

    name: str = ""
    # Its own config keys: a dataclass with defaults (and a ``validate(key)`` raising ValueError that names
    # ``key``.<field>), the section ``method.hypersolid.<name>`` of a backend found at import (a module of this
    # package), read as ``getattr(cfg, self.name)`` (so that a copy of the file reads its own). None: it has none.
    options: type | None = None
    order: int = DEFAULT_ORDER  # place in backend_names() (then by name): the built-ins list in their documented order
    stat_names: tuple[str, ...] = ()  # extra statistics, packed after the loss's own, in this order
    # Why dist.compile=true must not compile the loss with this backend (a host read or a data-dependent shape
    # that changes the graph between steps; training/compile_scope.py); empty: it may.
    compile_refusal: str = ""
    # It offers method.hypersolid.screen=bf16 (columns exchanged and screened in bfloat16, docs/design.md §2):
    # its exchange() reads cfg.screen. LossConfig.validate refuses the option for the others.
    screens: bool = False

    def __init__(self, cfg: LossConfig) -> None:
        self.cfg = cfg

    @classmethod
    def check_config(cls, cfg: LossConfig) -> None:
        """Raise ``ValueError`` if ``cfg`` asks for something this backend cannot do (LossConfig.validate calls
        it last, after the checks of every field)."""

    def exchange(
        self, x_rows: torch.Tensor, views: int, repel: str, alpha: float, *, same_rows_per_rank: bool
    ) -> tuple[torch.Tensor, RepulsionStats, int]:
        """The row part L_r of this rank's rows against every rank's, its statistics, and M_g (the global rows).

        Where the rows cross ranks: the default all-gathers the detached rows once (docs/design.md §3) and calls
        :meth:`repulsion` with them. ``views``: V; ``repel``: the repel mode; ``same_rows_per_rank``: every rank
        holds as many rows as this one (no row-count exchange, no host synchronisation).
        """
        from hypersolid_scale.distributed import all_gather_detached
        from hypersolid_scale.losses.repulsion import PairLayout

        x_all, offset = all_gather_detached(x_rows, same_size=same_rows_per_rank)
        rep_sum, st = self.repulsion(x_rows, x_all, PairLayout(offset, views, repel), alpha)
        return rep_sum, st, x_all.shape[0]

    def repulsion(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        """The row part L_r of this rank's rows (differentiable w.r.t. ``x_rows``) and its statistics.

        Shape: x_rows (m, D) normalised, this rank's rows; x_all (M_g, D) normalised, detached, every rank's.
        """
        raise NotImplementedError

    def derive(self, sums: Mapping[str, torch.Tensor], rows: int, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """The values of :attr:`stat_names`, as 0-dim float64 device tensors, from ``sums``: the RepulsionStats
        fields summed over ranks (max_cos excepted). ``rows``: M_g, the global batch's rows; ``loss``: the
        global loss value (float64, a template for constant statistics)."""
        return {}

    def observe(self, packed: PackedStats) -> None:
        """Called with the call's packed statistics (reduced, identical on every rank) once they exist."""

    def state(self) -> dict[str, Any]:
        """What a resumed run needs of this backend to continue as the uninterrupted one (plain Python values,
        stored in the method's extra state of a checkpoint); empty for a backend without such state."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state`'s values (a checkpoint without them leaves the backend as built)."""


BACKENDS: Registry[type[Backend]] = Registry("backend", "method.hypersolid.backend", "hypersolid_scale.losses.backends")


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Register a :class:`Backend` subclass under its ``name`` (usable as a class decorator)."""
    return BACKENDS.register(cls.name, cls)


def unregister_backend(name: str) -> None:
    """Remove a registered backend (tests that register one of their own)."""
    BACKENDS.unregister(name)


def backend_names() -> tuple[str, ...]:
    """The registered backends: the built-ins as documented (dense, tiled, neighbors, auto), then the others."""
    return BACKENDS.names()


def get_backend(name: str) -> type[Backend]:
    """The backend class registered as ``name``; a ConfigError listing the known names otherwise."""
    return BACKENDS.get(name)
