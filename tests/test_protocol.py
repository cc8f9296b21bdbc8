"""The ``--protocol paper`` preset on a tiny checkpoint, its diagnostic, its errors, and the study's statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _eval_helpers import ROOT, make_checkpoint

from hypersolid_scale.compare import figures, table
from hypersolid_scale.compare.app import main as compare_main
from hypersolid_scale.compare.app import parse_args as compare_args
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.eval import clustering
from hypersolid_scale.eval.app import cli, main
from hypersolid_scale.eval.protocol import PAPER, centred, clusterings, exclusion_zone, get_protocol, scores
from hypersolid_scale.eval.skips import SkipLog
from benchmarks.replication.stats import holm, paired_differences, paired_t, t_interval
from hypersolid_scale.safety.errors import ConfigError, run_cli

# Fewer pairs than the preset's: the test is about the keys and the wiring, not the estimates.
SMALL = ["eval.max_pairs=20000", "eval.interp_pairs=20"]
SCORES = ("nmi", "ami", "ari", "noise_fraction", "n_clusters")
PAPER_EV = load_config(None, list(PAPER.overrides)).eval


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("protocol")
    path = make_checkpoint(tmp, ["method.hypersolid.alpha=0.8"])
    out = tmp / "report"
    assert (
        main(["--checkpoint", str(path), "--protocol", "paper", "--no-mlflow", "--output-dir", str(out), *SMALL]) == 0
    )
    return json.loads((out / "report.json").read_text())


def test_every_key_of_the_layout_is_present(report: dict) -> None:
    m = report["metrics"]
    assert report["skipped"] == {} and report["meta"]["protocol"] == "paper"
    assert report["meta"]["features"] == "backbone,projector"
    for kind in ("backbone", "projector"):
        for norm in ("raw", "centred"):
            stem = f"protocol.{kind}.{norm}"
            want = [f"{stem}.knn_k{k}_{v}" for k in (5, 20) for v in ("weighted", "majority")]
            want += [f"{stem}.geometry.anisotropy", f"{stem}.geometry.d_prime"]
            want += [f"{stem}.linear_top1"] if norm == "raw" else []
            want += [f"{stem}.kmeans.{s}" for s in SCORES]
            # every HDBSCAN grid value is reported, not only the best
            want += [f"{stem}.hdbscan_mcs{c}.{s}" for c in (5, 10, 25, 50, 100) for s in SCORES]
            want += [f"{stem}.dbscan_q{q:02d}.{s}" for q in range(5, 100, 5) for s in (*SCORES, "eps")]
            missing = [k for k in want if k not in m]
            assert not missing, missing
            assert m[f"{stem}.kmeans.n_clusters"] == 10 and m[f"{stem}.kmeans.noise_fraction"] == 0.0
    assert not any(k.startswith("protocol.backbone.centred.linear") for k in m)  # the probe standardises
    ex = {k.removeprefix("protocol.exclusion."): v for k, v in m.items() if k.startswith("protocol.exclusion.")}
    assert ex["alpha"] == 0.8  # the checkpoint's loss alpha, not the default
    assert 0.0 <= ex["same_class_frac"] <= 1.0 and 0.0 <= ex["diff_class_frac"] <= 1.0
    assert ex["same_class_pairs"] > 0 and ex["diff_class_pairs"] > 0
    # the knn settings of the preset reached the evaluation
    assert report["eval_config"]["knn_k"] == [5, 20] and report["eval_config"]["dbscan_eps_mode"] == "adaptive"


def test_centred_features_differ_from_raw(report: dict) -> None:
    m = report["metrics"]
    for kind in ("backbone", "projector"):
        raw, cen = (m[f"protocol.{kind}.{n}.geometry.anisotropy"] for n in ("raw", "centred"))
        assert abs(cen) < abs(raw) and raw != cen  # a random network's features share a large offset
    train, test = (torch.randn(50, 4) + 3, torch.zeros(50)), (torch.randn(20, 4) + 3, torch.zeros(20))
    (ctr, _), (cte, _) = centred(train, test)
    assert torch.allclose(ctr.mean(0), torch.zeros(4), atol=1e-5)
    assert torch.allclose(test[0] - cte, train[0].mean(0).expand(20, 4), atol=1e-5)  # the *train* mean


def test_kmeans_is_the_suites_kmeans_and_ami_is_chance_corrected() -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (400,), generator=g)
    x = torch.randn(4, 16, generator=g)[y] + 0.5 * torch.randn(400, 16, generator=g)
    found = clusterings(x, y, PAPER_EV, PAPER, SkipLog())
    ref = clustering.kmeans(x, y, niter=PAPER_EV.kmeans_niter, seed=PAPER_EV.seed, use_gpu=False)
    assert found["kmeans.nmi"] == pytest.approx(ref["nmi"]) and found["kmeans.ari"] == pytest.approx(ref["ari"])
    # 50 random clusters of 4 random classes: NMI rewards the many clusters by chance, AMI does not
    rng = np.random.default_rng(0)
    chance = scores(rng.integers(0, 4, 400), rng.integers(0, 50, 400))
    assert chance["nmi"] > 0.05 and abs(chance["ami"]) < 0.02 and chance["n_clusters"] == 50


def test_exclusion_zone_counts_pairs_above_alpha() -> None:
    # class 0: a, b (cos 0.995), c; class 1: d (= c's direction), e
    x = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.0, 1.0], [1.0, -1.0]])
    y = torch.tensor([0, 0, 0, 1, 1])
    out = exclusion_zone(x, y, 0.9, max_pairs=100, seed=0)
    # same class: (a,b) of {(a,b),(a,c),(b,c),(d,e)}; different class: (c,d) of the 6
    assert out == {
        "alpha": 0.9,
        "same_class_frac": 0.25,
        "diff_class_frac": 1 / 6,
        "same_class_pairs": 4,
        "diff_class_pairs": 6,
    }


def _one_error_line(capsys: pytest.CaptureFixture, code: int, *needles: str) -> None:
    """``run_cli``'s contract for bad input: exit 2 and a single ``error:`` line naming what to fix."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), lines[0]


def test_unknown_protocol_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = make_checkpoint(tmp_path)
    _one_error_line(capsys, cli(["--checkpoint", str(path), "--protocol", "papr", "--no-mlflow"]),
                    "unknown protocol 'papr'", "paper")
    with pytest.raises(ConfigError, match="drop --suite"):
        main(["--checkpoint", str(path), "--protocol", "paper", "--suite", "knn", "--no-mlflow"])
    with pytest.raises(KeyError):
        get_protocol("nope")


# ---------------------------------------------------------------------------------------------- compare


def test_compare_tabulates_the_protocol_reports(report: dict, tmp_path: Path) -> None:
    reports = {"hypersolid": [report, report], "simclr": [report]}
    cols = table.PROTOCOL_COLUMNS
    summary = table.summarise(reports, cols)
    knn5 = "protocol.backbone.raw.knn_k5_weighted"
    assert knn5 in cols.main and summary["hypersolid"][knn5].mean == report["metrics"][knn5]
    # every column of the protocol's table is a key the protocol writes
    assert all(key in summary["simclr"] for _label, key, _spec in cols.metrics)
    md = table.markdown(summary, {}, table.skipped_reasons(reports, cols), cols)
    assert "kNN@5 (%)" in md and "HDBSCAN AMI mcs=100" in md and "kNN@20 (%)" in md
    assert figures.plot_bars(summary, tmp_path / "bars.png", "t", cols) is not None
    # without the flag, the quick columns (kNN@20 only) as before
    assert "knn_k5_weighted" not in {k for _label, k, _s in table.QUICK_COLUMNS.metrics}


def test_compare_protocol_flag_and_its_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert compare_args(["--quick", "--protocol", "paper"]).protocol == "paper"
    argv = ["--methods", "simclr", "--protocol", "papr", "--no-mlflow", "--out", str(tmp_path / "c")]
    _one_error_line(capsys, run_cli(lambda a: compare_main(a, ROOT), argv), "unknown protocol 'papr'", "paper")
    assert not (tmp_path / "c" / "runs").exists()  # refused before anything trained


# ---------------------------------------------------------------------------------------------- statistics


def test_t_interval_matches_hand_values() -> None:
    iv = t_interval([1, 2, 3, 4, 5])
    # s = sqrt(2.5), t_{0.975, 4} = 2.7764451051977987: half width = 2.7764451 * sqrt(2.5) / sqrt(5)
    half = 2.7764451051977987 * math.sqrt(0.5)
    assert iv.mean == 3.0 and iv.n == 5
    assert iv.lo == pytest.approx(3 - half, abs=1e-9) and iv.hi == pytest.approx(3 + half, abs=1e-9)
    assert t_interval([7.0]).lo is None


def test_paired_t_matches_hand_values() -> None:
    # d = (1, 2, 3): t = 2 / (1 / sqrt 3); with 2 degrees of freedom p = 1 - t / sqrt(2 + t^2)
    t, p = paired_t([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert t == pytest.approx(2 * math.sqrt(3))
    assert p == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), abs=1e-12)
    assert paired_t([1.0, 2.0], [1.0, 2.0]) == (0.0, 1.0)
    with pytest.raises(ValueError):
        paired_t([1.0, 2.0], [1.0])


def test_holm_matches_a_hand_example() -> None:
    # sorted: d .005 x 4 = .02; a .01 x 3 = .03; c .03 x 2 = .06; b .04 x 1 = .04 -> raised to .06 (monotone)
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert adj == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02})
    assert holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}  # 0.6 x 2 caps at 1; y never below x


def test_paired_differences_pair_by_seed_and_correct_over_metrics() -> None:
    ref = {"knn": {0: 90.0, 1: 91.0, 2: 92.0}, "ami": {0: 0.5, 1: 0.6, 2: 0.7}}
    # seed 3 has no reference: left out; the method's seeds come in another order
    other = {"knn": {2: 95.0, 0: 91.0, 1: 93.0, 3: 0.0}, "ami": {0: 0.5, 1: 0.6}}
    out = paired_differences(other, ref)
    assert out["knn"].diff.mean == pytest.approx(2.0) and out["knn"].diff.n == 3  # (1, 2, 3)
    assert out["knn"].p == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14))
    assert out["knn"].p_holm == pytest.approx(min(1.0, 2 * out["knn"].p))  # the smaller p of two, x 2
    assert out["ami"].p == 1.0 and out["ami"].p_holm == 1.0


def test_a_baselines_projector_half_is_its_own_head_and_a_bare_backbone_says_why_not(tmp_path: Path) -> None:
    """SimCLR's checkpoint: the projector half measures its own head (at the protocol's default alpha for the
    exclusion zone, SimCLR having none). The same checkpoint without its method state (a backbone alone): the
    projector features and the exclusion zone are skipped with the reason, the backbone half is all there."""
    path = make_checkpoint(tmp_path, ["method.name=simclr", "method.simclr.hidden_dim=32", "method.simclr.out_dim=16"])
    args = ["--checkpoint", str(path), "--protocol", "paper", "--no-mlflow", *SMALL, "eval.max_train_samples=400",
            "eval.max_test_samples=300"]
    assert main([*args, "--output-dir", str(tmp_path / "head")]) == 0
    report = json.loads((tmp_path / "head" / "report.json").read_text())
    m = report["metrics"]
    assert not report["skipped"] and m["protocol.exclusion.alpha"] == get_protocol("paper").default_alpha
    assert "protocol.projector.raw.knn_k5_weighted" in m and "protocol.projector.centred.kmeans.ami" in m
    ckpt = torch.load(path, weights_only=True)
    torch.save({**ckpt, "method": None}, path)
    assert main([*args, "--output-dir", str(tmp_path / "bare")]) == 0
    report = json.loads((tmp_path / "bare" / "report.json").read_text())
    assert set(report["skipped"]) == {"protocol.projector", "protocol.exclusion"}
    assert all("projection head" in why for why in report["skipped"].values())
    m = report["metrics"]
    assert "protocol.backbone.centred.knn_k5_weighted" in m and "protocol.backbone.raw.linear_top1" in m
    assert not any(k.startswith(("protocol.projector", "protocol.exclusion")) for k in m)
