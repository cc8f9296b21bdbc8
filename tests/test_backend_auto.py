"""``method.hypersolid.backend=auto``: hysteresis on the previous step's saturated-row fraction, exact on both backends."""

from __future__ import annotations

import pytest
import torch

from hypersolid_scale.losses import HypersolidLoss, LossConfig
from hypersolid_scale.losses.backend_switch import BackendSwitch
from hypersolid_scale.losses.neighbor_search import NeighborRepulsion
from hypersolid_scale.losses.repulsion import PairLayout, tiled_repulsion
from loss_reference import make_feats

B, V, D, K = 48, 4, 16, 8


def loss_and_grad(fn, feats):
    f = feats.clone().requires_grad_(True)
    out = fn(f)
    out.backward()
    return out.detach(), f.grad


def rule(mode: str, fraction: float, lo: float = 0.05, hi: float = 0.20) -> str:
    """The documented hysteresis, written out plainly."""
    if mode == "tiled" and fraction < lo:
        return "neighbors"
    if mode == "neighbors" and fraction > hi:
        return "tiled"
    return mode


def test_switch_hysteresis_and_one_step_lag():
    sw = BackendSwitch(0.05, 0.20)
    fractions = [0.9, 0.1, 0.04, 0.1, 0.19, 0.21, 0.06, 0.04, float("nan"), 0.5]
    modes = []
    for f in fractions:
        modes.append(sw.choose())
        sw.observe(torch.tensor(f, dtype=torch.float64))
    # the first call has nothing observed yet; every later call acts on the previous call's fraction
    assert modes == ["tiled", "tiled", "tiled", "neighbors", "neighbors", "neighbors", "tiled", "tiled",
                     "neighbors", "neighbors"]
    assert sw.choose() == "tiled"  # 0.5 > 0.2 (NaN before it changed nothing)


def test_switch_rejects_bad_thresholds():
    with pytest.raises(ValueError, match="to_neighbors < to_tiled"):
        BackendSwitch(0.3, 0.2)


@pytest.mark.parametrize("regime,mix", [("collapsed", 0.0), ("mixed", 0.6), ("mixed", 0.85), ("spread", 1.0)])
def test_tiled_counts_the_rows_a_k_search_calls_saturated(regime, mix):
    """The signal must mean the same on both sides of the switch, or the hysteresis would oscillate."""
    x = interpolate(mix)
    x = torch.nn.functional.normalize(x.reshape(B * V, D), dim=-1)
    layout = PairLayout(0, V)
    _, st_tiled = tiled_repulsion(x, x, layout, 0.9, tile=40, saturation_k=K)
    _, st_search = NeighborRepulsion(index="torch", k=K, tile_size=40)(x, x, layout, 0.9)
    assert float(st_tiled.saturated_rows) == float(st_search.saturated_rows)


def interpolate(t: float) -> torch.Tensor:
    """Embeddings that go from near-collapsed (t=0) to spread (t=1), as during the start of training."""
    return (1 - t) * make_feats(B, V, D, regime="collapsed", seed=0) + t * make_feats(B, V, D, regime="spread", seed=0)


def test_auto_switches_from_collapsed_to_spread_and_back_and_stays_exact():
    fn = HypersolidLoss(backend="auto", k=K, tile_size=40, recall_every=1)
    dense = HypersolidLoss(backend="dense")
    schedule = [i / 9 for i in range(10)] + [1 - i / 9 for i in range(10)]  # collapse -> spread -> collapse
    expected, used, fractions = "tiled", [], []
    for t in schedule:
        feats = interpolate(t)
        got, got_grad = loss_and_grad(fn, feats)
        ref, ref_grad = loss_and_grad(dense, feats)
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got_grad, ref_grad, rtol=1e-10, atol=1e-14)
        stats = fn.stats
        mode = "neighbors" if stats["backend_neighbors"] == 1 else "tiled"
        assert mode == expected, (t, fractions)
        used.append(mode)
        fractions.append(stats["saturated_fraction"])
        expected = rule(mode, stats["saturated_fraction"])
        if mode == "neighbors":
            assert stats["recall"] == 1.0
    assert fractions[0] > 0.9 and min(fractions) < 0.05  # the run really crosses both thresholds
    first_n = used.index("neighbors")
    assert used[:first_n] == ["tiled"] * first_n and "tiled" in used[first_n:]  # switched, then switched back
    assert used[-1] == "tiled"


def test_auto_config_round_trip_and_stat_names():
    cfg = LossConfig(backend="auto", index="torch", auto_to_neighbors=0.1, auto_to_tiled=0.3)
    fn = HypersolidLoss.from_config(cfg)
    assert fn.cfg == cfg and fn.backend.switch.to_neighbors == 0.1 and fn.backend.switch.to_tiled == 0.3
    assert "backend_neighbors" in fn.stat_names and "saturated_fraction" in fn.stat_names
    assert "backend_neighbors" not in HypersolidLoss(backend="neighbors").stat_names
