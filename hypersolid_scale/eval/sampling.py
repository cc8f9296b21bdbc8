"""Seeded row subsets: the same rows for the same seed in every suite, the protocol and the image grids."""

from __future__ import annotations

import numpy as np

__all__ = ["subsample"]


def subsample(n: int, max_n: int | None, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_n`` of ``n`` rows (all when ``max_n`` is None), drawn with ``seed``."""
    if max_n is None or n <= max_n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_n, replace=False))
