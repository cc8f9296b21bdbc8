"""``screen=bf16``: the rounding bound δ(D) of a bf16 dot product holds, is nearly attained, and decides exactly.

The worst case is built, not hoped for: unit vectors whose every component sits just below a bf16 rounding
midpoint (2^e·(1 + 2^-8 − 2^-14), rounded down to 2^e, a relative error of nearly u = 2^-8), so every product
loses nearly 2u and ŝ falls short of s by nearly 2u·s. The screen must still flag a pair of such vectors placed
just above α, and must never flag a pair below α − 2δ. Equality of the losses on real ranks:
``tests/test_ring.py``.
"""

from __future__ import annotations

import pytest
import torch

from hypersolid_scale.losses import HypersolidLoss
from hypersolid_scale.losses.screening import (
    screen_columns,
    screen_threshold,
    screened_similarity,
    screening_bound,
)


def worst_case_units(n: int, d: int, seed: int) -> torch.Tensor:
    """(n, d) float64 unit vectors, all positive, every component but the last rounding down by ~u in bf16.

    Greedy: each component takes the largest 2^e·(1 + 2^-8 − 2^-14) within its share of the squared norm left
    (e lowered at random by 0 or 1, so rows differ); the last component takes the rest, exactly (not a power of two).
    """
    g = torch.Generator().manual_seed(seed)
    c = 1 + 2.0**-8 - 2.0**-14
    v = torch.zeros(n, d, dtype=torch.float64)
    left = torch.ones(n, dtype=torch.float64)
    for k in range(d - 1):
        e = torch.floor(torch.log2((left / (d - k)).sqrt() / c)) - torch.randint(0, 2, (n,), generator=g)
        v[:, k] = 2.0**e * c
        left = left - v[:, k].square()
    v[:, -1] = left.sqrt()
    return v


def errors(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(ŝ − s̃, s̃) over every pair of the rows of ``x`` (s̃: the product computed in ``dtype``, as tiled does)."""
    xd = x.to(dtype)
    low = xd.to(torch.bfloat16)
    s = (xd @ xd.T).double()
    return screened_similarity(low, low).double() - s, s


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("dim", [16, 256, 1024])
def test_the_bound_holds_and_the_worst_case_nearly_reaches_it(dim, dtype):
    delta = screening_bound(dim, dtype)
    assert 2 * 2.0**-8 < delta < 2 * 2.0**-8 * 1.02  # 2u, plus the fp32 accumulation's share (≤ 1% at D = 1024)
    g = torch.Generator().manual_seed(dim)
    rand = torch.nn.functional.normalize(torch.randn(64, dim, generator=g, dtype=torch.float64), dim=1)
    worst = worst_case_units(64, dim, seed=dim)
    for x in (rand, worst):
        err, _ = errors(x, dtype)
        assert err.abs().max() <= delta
    err, s = errors(worst, dtype)
    # every product but the last rounded down: ŝ ≈ s·(1 − u)², the bound attained to within 15 % (at D = 16 the
    # last, exact-norm component is large; at D ≥ 256 within 6 %)
    assert (err < 0).all()
    assert (-err).max() >= (0.85 if dim < 256 else 0.94) * delta


@pytest.mark.parametrize("dim", [16, 1024])
def test_pairs_just_above_alpha_are_always_flagged_and_pairs_far_below_never(dim):
    dtype = torch.float32
    delta = screening_bound(dim, dtype)
    x = worst_case_units(48, dim, seed=7).to(dtype)
    low = x.to(torch.bfloat16)
    err, s = errors(x.double(), dtype)
    off = ~torch.eye(48, dtype=torch.bool)
    rows, cols = torch.nonzero(off, as_tuple=True)
    for i, j in zip(rows[:200].tolist(), cols[:200].tolist()):
        for t, must in ((1e-6, True), (1.0, True), (0.5, True), (-1.0, None), (-2.0 - 1e-6, False)):
            alpha = float(s[i, j]) - t * delta  # the pair at α + t·δ
            threshold = screen_threshold(torch.tensor(1.0, dtype=torch.float64), alpha, delta)
            flagged = bool(screen_columns(low[i : i + 1], low[j : j + 1], threshold, tile=4)[0])
            if must is not None:
                assert flagged == must, (i, j, t, float(err[i, j]) / delta)
    # the worst case sits where a bound of 0.8 δ would miss an active pair: the bound is not loose
    assert float((-err[off]).max()) > 0.8 * delta


def test_the_threshold_is_rounded_down_to_float32():
    t = screen_threshold(torch.tensor(0.95, dtype=torch.float64), 0.9, 1e-3)
    assert t.dtype == torch.float32 and float(t) <= 0.9 - 1e-3 and float(t) > 0.9 - 1e-3 - 1e-7
    assert float(screen_threshold(torch.tensor(0.5, dtype=torch.float64), 0.9, 1e-3)) <= 0.5 - 1e-3  # min(α, c)


def test_a_bad_screen_value_and_a_backend_without_screening_are_refused():
    with pytest.raises(ValueError, match=r"method\.hypersolid\.screen='fp8' is not valid; choose one of off, bf16"):
        HypersolidLoss(backend="tiled", screen="fp8")
    with pytest.raises(ValueError, match=r"screen='bf16' needs a backend that screens its columns \(tiled, ring\)"):
        HypersolidLoss(backend="dense", screen="bf16")
    fn = HypersolidLoss(backend="ring", screen="bf16")
    assert fn.stat_names[-1] == "exact_fraction" and "exact_fraction" not in HypersolidLoss(backend="ring").stat_names
