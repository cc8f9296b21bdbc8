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


@dataclass(frozen=True)
class MarginTest:
    """One metric of one method against the reference, judged against an equivalence margin ``delta``: the two
    one-sided tests of TOST on the paired difference d = method − reference. ``p_within``: H0 d ≥ delta rejected
    (the method is not ahead by the margin or more: the reference is non-inferior); ``p_beyond``: H0 d ≤ delta
    rejected (the method is ahead by more than the margin); ``p_equivalent``: TOST's p, both bounds (|d| < delta).
    The ``_holm`` fields are Holm-adjusted over the metrics tested together."""

    diff: Interval
    delta: float
    p_within: float
    p_beyond: float
    p_equivalent: float
    p_within_holm: float = 1.0
    p_beyond_holm: float = 1.0


def _one_sided(d: np.ndarray, shift: float, greater: bool) -> float:
    """p of the one-sided t-test of mean(d) − shift > 0 (``greater``) or < 0, on the paired differences ``d``;
    zero variance gives 0 or 1 by the sign, as paired_t's does."""
    x = d - shift
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if sd == 0.0:
        return 0.0 if (mean > 0 if greater else mean < 0) else 1.0
    t = mean / (sd / math.sqrt(x.size))
    return float(stats.t.sf(t, x.size - 1) if greater else stats.t.cdf(t, x.size - 1))


def margin_tests(
    method: Mapping[str, Mapping[int, float]], reference: Mapping[str, Mapping[int, float]], delta: float
) -> dict[str, MarginTest]:
    """TOST's one-sided tests of every metric of ``method`` − ``reference`` (paired by seed, metrics with at
    least two common seeds) against the margin ±``delta``, Holm-corrected over the metrics for each direction."""
    if delta <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {delta}")
    rows: dict[str, MarginTest] = {}
    for metric, values in method.items():
        seeds = sorted(set(values) & set(reference.get(metric, {})))
        if len(seeds) < 2:
            continue
        d = np.array([values[s] - reference[metric][s] for s in seeds], np.float64)
        within = _one_sided(d, delta, greater=False)  # d < delta
        below = _one_sided(d, -delta, greater=True)  # d > -delta
        rows[metric] = MarginTest(
            t_interval(d.tolist()), delta, within, _one_sided(d, delta, greater=True), max(within, below)
        )
    within_holm = holm({k: r.p_within for k, r in rows.items()})
    beyond_holm = holm({k: r.p_beyond for k, r in rows.items()})
    return {
        k: MarginTest(r.diff, delta, r.p_within, r.p_beyond, r.p_equivalent, within_holm[k], beyond_holm[k])
        for k, r in rows.items()
    }
