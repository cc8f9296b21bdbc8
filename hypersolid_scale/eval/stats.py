"""The replication study's statistics (docs/replication.md, "Statistics"): per method and metric the mean over
seeds with its 95 % t-interval, and per method against Hypersolid the paired difference (seed by seed), its
t-interval and paired t-test, the p-values corrected with Holm's step-down over the metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided t confidence interval (``lo``/``hi`` None for a single value)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean and ``confidence`` Student-t interval, mean ± t_{(1+c)/2, n-1} · s / sqrt(n) (s: sample std)."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        raise ValueError("a t-interval needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return Interval(mean, None, None, 1)
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, int(x.size))


def paired_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Paired t-test of ``a - b`` (the same seeds, in the same order): (t statistic, two-sided p).

    Identical pairs (zero variance of the differences) give t = 0, p = 1 when every difference is 0, and
    t = ±inf, p = 0 otherwise, instead of scipy's NaN.
    """
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if d.size != len(b) or d.size < 2:
        raise ValueError(f"a paired t-test needs two equally long samples of >= 2 values, got {len(a)} and {len(b)}")
    if float(d.std(ddof=1)) == 0.0:
        return (0.0, 1.0) if float(d.mean()) == 0.0 else (math.copysign(math.inf, float(d.mean())), 0.0)
    res = stats.ttest_rel(a, b)
    return float(res.statistic), float(res.pvalue)


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values: with p_(1) <= ... <= p_(m), adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).

    Rejecting where adj <= level controls the family-wise error rate over the m tests at that level.
    """
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for j, key in enumerate(order):
        running = max(running, min(1.0, (m - j) * pvalues[key]))
        out[key] = running
    return out


@dataclass(frozen=True)
class PairedDifference:
    """One metric of one method against the reference, over the seeds both have."""

    diff: Interval  # of method - reference
    t: float
    p: float
    p_holm: float


def paired_differences(
    method: Mapping[str, Mapping[int, float]], reference: Mapping[str, Mapping[int, float]], confidence: float = 0.95
) -> dict[str, PairedDifference]:
    """``{metric: {seed: value}}`` of a method and of the reference (Hypersolid) -> ``{metric: PairedDifference}``
    on the seeds both hold; Holm's correction runs over the metrics compared. A metric with fewer than two
    common seeds is left out (no test)."""
    rows: dict[str, tuple[Interval, float, float]] = {}
    for metric, values in method.items():
        seeds = sorted(set(values) & set(reference.get(metric, {})))
        if len(seeds) < 2:
            continue
        a, b = [values[s] for s in seeds], [reference[metric][s] for s in seeds]
        t, p = paired_t(a, b)
        rows[metric] = (t_interval([x - y for x, y in zip(a, b)], confidence), t, p)
    adjusted = holm({k: p for k, (_i, _t, p) in rows.items()})
    return {k: PairedDifference(i, t, p, adjusted[k]) for k, (i, t, p) in rows.items()}
