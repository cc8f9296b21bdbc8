"""Metrics that cannot run on the data at hand: raised as ``NotApplicable``, recorded by ``SkipLog``.

A metric may be impossible for reasons that say nothing about the user's command: a nearly collapsed
(e.g. randomly initialised) network puts every pair inside a DBSCAN radius, a small test split holds
fewer points than HDBSCAN's minimum cluster size, a split with one class has nothing for a linear probe
to separate. Such conditions raise ``NotApplicable``; the evaluation records the metric as skipped with
the reason, warns once, and computes everything else. Errors of the user's own making (a missing
checkpoint, a bad config key) stay ordinary exceptions and stop the evaluation.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class NotApplicable(ValueError):
    """This metric or setting cannot run on this data; the rest of the evaluation can.

    A ``ValueError`` subclass, so direct callers of a metric function still see a ``ValueError``.
    """


class SkippedWarning(UserWarning):
    """Issued once for each metric (or group of settings) that an evaluation skipped."""


class SkipLog:
    """``{name: reason}`` of the skipped metrics of one evaluation, one warning per ``add``."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}

    def add(self, entries: dict[str, str]) -> None:
        """Record ``entries`` (name -> reason) and issue ONE warning naming all of them."""
        self._record(entries, stacklevel=3)  # the warning points at the caller of add

    def _record(self, entries: dict[str, str], stacklevel: int) -> None:
        if not entries:
            return
        self.reasons.update(entries)
        reasons = set(entries.values())
        if len(reasons) == 1:
            text = f"{', '.join(entries)} skipped: {reasons.pop()}"
        else:
            text = "skipped: " + "; ".join(f"{name}: {why}" for name, why in entries.items())
        warnings.warn(text, SkippedWarning, stacklevel=stacklevel)

    @contextmanager
    def guard(self, name: str) -> Iterator[None]:
        """Run the block; a ``NotApplicable`` inside it records ``name`` as skipped instead of propagating."""
        try:
            yield
        except NotApplicable as err:
            # _record <- guard <- contextlib's __exit__ <- the caller's with statement
            self._record({name: str(err)}, stacklevel=4)


def require_class_labels(labels: np.ndarray, what: str, min_classes: int = 2) -> int:
    """Number of classes in ``labels``; ``NotApplicable`` when they are unlabelled (< 0) or too few."""
    if labels.size and labels.min() < 0:
        raise NotApplicable(f"{what} needs class labels, and this split holds unlabelled samples (label < 0)")
    n_cls = len(np.unique(labels))
    if n_cls < min_classes:
        raise NotApplicable(f"{what} needs at least {min_classes} classes, this split has {n_cls}")
    return n_cls
