"""``method.hypersolid.backend=auto``: hysteresis on the previous step's saturated-row fraction, exact on both backends."""

from __future__ import annotations

import pytest
import torch
from loss_reference import make_feats

from hypersolid_scale.losses import HypersolidLoss
from hypersolid_scale.losses.backend_switch import BackendSwitch
from hypersolid_scale.losses.config import loss_config
from hypersolid_scale.losses.neighbor_search import NeighborRepulsion
from hypersolid_scale.losses.repulsion import PairLayout, tiled_repulsion

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
    cfg = loss_config(backend="auto", neighbors={"index": "torch"}, auto={"to_neighbors": 0.1, "to_tiled": 0.3})
    fn = HypersolidLoss.from_config(cfg)
    assert fn.cfg == cfg and fn.backend.switch.to_neighbors == 0.1 and fn.backend.switch.to_tiled == 0.3
    assert "backend_neighbors" in fn.stat_names and "saturated_fraction" in fn.stat_names
    assert "backend_neighbors" not in HypersolidLoss(backend="neighbors").stat_names


def test_auto_by_time_runs_the_side_that_timed_cheaper_and_stays_exact(monkeypatch, capsys):
    """Both sides timed (the second of two runs each) at call 1 and every auto.time_every calls; the other side
    is taken when it costs under SWITCH_MARGIN of the current one's. Between timings nothing is timed."""
    from hypersolid_scale.losses.backends import auto

    clock, cost = [0.0], {"tiled": 1.0, "neighbors": 1.5}
    monkeypatch.setattr(auto.time, "perf_counter", lambda: clock[0])
    fn = HypersolidLoss(backend="auto", k=K, tile_size=40, auto={"by": "time", "time_every": 3})
    runs = {"tiled": 0, "neighbors": 0}
    for side in auto.SIDES:
        run = fn.backend._sides[side].repulsion

        def timed(*args, run=run, side=side):
            clock[0] += cost[side]
            runs[side] += 1
            return run(*args)

        monkeypatch.setattr(fn.backend._sides[side], "repulsion", timed)
    ref = HypersolidLoss(backend="dense")
    used = []
    for call, neighbors_cost in enumerate([1.5, 0.5, 0.5, 0.95, 0.5, 0.5, 0.5, 2.0, 2.0, 2.0]):
        cost["neighbors"] = neighbors_cost
        feats = interpolate(call / 9)
        got, got_grad = loss_and_grad(fn, feats)
        want, want_grad = loss_and_grad(ref, feats)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-14)
        used.append("neighbors" if fn.stats["backend_neighbors"] == 1 else "tiled")
    # timed at calls 1, 4, 7, 10: 1.5 > 1.0 stays tiled; 0.95 is not under 0.9 x 1.0: stays; 0.5: neighbors;
    # 2.0 against tiled's 1.0: back to tiled
    assert used == ["tiled"] * 6 + ["neighbors"] * 3 + ["tiled"]
    assert runs == {"tiled": 4 * 2 + 7, "neighbors": 4 * 2 + 3}  # two runs per side per timing, one per call
    assert fn.backend.timed == {"tiled": 1.0, "neighbors": 2.0}
    out = capsys.readouterr().out
    assert "timed at call 1: tiled 1000.0 ms, neighbors 1500.0 ms a call (forward and backward): runs tiled" in out
    assert "timed at call 7" in out and "timed at call 10" in out and "timed at call 4" not in out  # changes only


def test_a_resumed_auto_loss_takes_the_uninterrupted_runs_sides_bitwise():
    """The side, the fraction waiting to be read and the thresholds travel in the method's extra state: a
    method loaded from a state saved on the neighbors side continues there, loss for loss."""
    from hypersolid_scale.methods import MethodConfig, build_method, get_method
    from hypersolid_scale.models import ModelConfig, SmallCNNOptions, build_backbone

    def build(seed: int):
        torch.manual_seed(seed)
        backbone, dim = build_backbone(ModelConfig(arch="small_cnn", small_cnn=SmallCNNOptions(width=4), in_channels=3))
        section = get_method("hypersolid").Config(hidden_dim=16, out_dim=8, backend="auto")
        section.neighbors.index, section.neighbors.k, section.auto.to_neighbors, section.auto.to_tiled = "torch", 4, 0.9, 1.0
        cfg = MethodConfig(name="hypersolid", hypersolid=section)
        return backbone, build_method(cfg, backbone, dim, steps_per_epoch=10)

    def steps(backbone, method, seeds):
        out = []
        for s in seeds:
            g = torch.Generator().manual_seed(s)
            loss, stats = method([torch.randn(8, 3, 16, 16, generator=g) for _ in range(4)], backbone)
            out.append((loss.detach(), float(stats["backend_neighbors"]), float(stats["saturated_fraction"])))
        return out

    backbone, method = build(0)
    steps(backbone, method, range(2))
    saved = (backbone.state_dict(), method.state_dict())
    assert method.get_extra_state()["backend"]["current"] == "neighbors"
    straight = steps(backbone, method, range(2, 5))
    backbone2, method2 = build(1)
    backbone2.load_state_dict(saved[0])
    method2.load_state_dict(saved[1])
    resumed = steps(backbone2, method2, range(2, 5))
    assert [s[1] for s in straight] == [s[1] for s in resumed] == [1.0, 1.0, 1.0]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(straight, resumed))
