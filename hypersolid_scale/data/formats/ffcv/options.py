"""The section data.ffcv.* (`FFCVOptions`) and its choices, read by the entry and the loader alike."""

from __future__ import annotations

from dataclasses import dataclass

ORDERS = ("random", "quasi_random", "sequential")


@dataclass
class FFCVOptions:
    """The section data.ffcv.*: how FFCV reads the .beton file."""

    order: str = "quasi_random"  # random | quasi_random (memory-friendly) | sequential
    os_cache: bool = False  # True: memory-map the whole file (dataset fits in RAM)
    batches_ahead: int = 3
