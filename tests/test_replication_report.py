"""The replication report (benchmarks/replication/report.py, claims.py): the committed Results section is what
the committed run JSON gives, and the verdict rules turn known differences into the verdicts they state."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from replication import claims, report  # noqa: E402

BB = claims.BB


def _run(method: str, seed: int, values: dict[str, float], group: str = "cpu") -> dict:
    final = {"epoch": 1, "step": 468, "protocol": "paper", **values}
    return {
        "run": f"{group}-{method}-s{seed}",
        "method": method,
        "seed": seed,
        "group": group,
        "part": group,
        "epochs": 1,
        "card": "cpu",
        "torch": "x",
        "git_commit": "0" * 40,
        "train_s": 1.0,
        "train_s_total": 1.0,
        "eval_s": 2.0,
        "final_step": 468,
        "per_epoch": [final],
        "final": final,
    }


def _study(shift: dict[str, float], seeds: int = 5, noise: float = 0.01) -> list[dict]:
    """Every headline and geometry metric ~ 0.5 + noise per seed; ``shift[method]`` added to the baselines'
    K-Means AMI (paired noise: the same seed's noise is shared by every method, as a shared init would)."""
    rng = np.random.default_rng(0)
    keys = [k for k, _ in claims.HEADLINE + claims.GEOMETRY]
    base = {s: {k: 0.5 + noise * rng.standard_normal() for k in keys} for s in range(seeds)}
    runs = []
    for method in claims.METHOD_NAMES:
        for s in range(seeds):
            vals = {k: v + 1e-3 * rng.standard_normal() for k, v in base[s].items()}
            vals[f"{BB}kmeans.ami"] += shift.get(method, 0.0)
            runs.append(_run(method, s, vals))
    return runs


def _verdict(runs: list[dict], claim: str) -> str:
    rows = claims.verdicts(claims.compare(runs), [])
    return next(r["verdict"] for r in rows if r["claim"] == claim)


KMEANS = "Hypersolid clusters better: K-Means"


def test_verdicts_follow_known_differences():
    worse = {"simclr": -0.05, "swav": -0.05, "barlowtwins": -0.05}  # every baseline 0.05 below Hypersolid
    assert _verdict(_study(worse), KMEANS) == "holds here"
    assert _verdict(_study({**worse, "swav": 0.05}), KMEANS) == "does not hold here"
    # One baseline indistinguishable: neither rule fires.
    assert _verdict(_study({**worse, "barlowtwins": 0.0}), KMEANS) == "inconclusive here"
    # Parity claim: no baseline significantly ahead on kNN/linear holds, whatever K-Means does...
    parity = "kNN and linear probe competitive: no baseline significantly ahead"
    assert _verdict(_study(worse), parity) == "holds here"
    # ... but only once every baseline has two paired seeds: one seed of SwaV leaves it open.
    partial = [r for r in _study(worse) if r["method"] != "swav" or r["seed"] == 0]
    assert _verdict(partial, parity) == "inconclusive here"
    assert _verdict([r for r in partial if r["seed"] == 0], parity) == "not testable here"


def test_holm_and_direction_of_a_lower_is_better_claim():
    runs = _study({})
    for r in runs:  # Hypersolid's anisotropy 0.1 below everyone's, seed by seed
        if r["method"] == "hypersolid":
            r["final"][f"{BB}geometry.anisotropy"] -= 0.1
    cmp = claims.compare(runs)
    d = cmp.diffs["geometry"]["simclr"][f"{BB}geometry.anisotropy"]
    assert d.diff.mean == pytest.approx(0.1, abs=2e-3) and d.p_holm < 0.05 and d.p_holm >= d.p
    assert _verdict(runs, "Geometry: Hypersolid's anisotropy is lower") == "holds here"
    assert _verdict(runs, "Geometry: Hypersolid's sparsity is higher") == "inconclusive here"


def test_missing_groups_are_not_testable(tmp_path):
    text, files, summary, readme = report.render(tmp_path / "results", tmp_path)
    assert files == {}  # no group ran: no all-metrics table
    assert "The CPU group has not run yet." in readme
    assert "### CPU group: one epoch, each method's defaults\n\nNot run yet." in text
    assert {r["verdict"] for r in summary["verdicts"]} == {"not testable here"}


def test_report_writes_and_checks_a_section(tmp_path):
    results = tmp_path / "results"
    (results / "cpu").mkdir(parents=True)
    for r in _study({"simclr": -0.05, "swav": -0.05, "barlowtwins": -0.05}, seeds=3):
        (results / "cpu" / f"{r['run']}.json").write_text(json.dumps(r))
    doc = tmp_path / "replication.md"
    doc.write_text("# Study\n\nprotocol text\n\n## Results\n\nstale section\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Tool\n\n{report.README_START}stale summary\n{report.README_END}\nafter\n")
    args = ["--results", str(results), "--doc", str(doc), "--readme", str(readme)]
    assert report.main(args) == 0
    text = doc.read_text()
    assert text.startswith("# Study\n\nprotocol text\n\n## Results\n") and "stale section" not in text
    assert "| Hypersolid clusters better: K-Means |" in text and "**holds here**" in text
    summary = readme.read_text()
    assert "stale summary" not in summary and summary.endswith(f"{report.README_END}\nafter\n")
    assert "* **holds here**: Hypersolid clusters better: K-Means" in summary and "| K-Means AMI |" in summary
    assert (results / "report" / "cpu_headline.png").stat().st_size > 10_000
    table = (results / "report" / "cpu_all_metrics.md").read_text()
    assert "| backbone.raw.kmeans.ami | headline |" in table
    assert "| backbone.raw.geometry.sparsity | geometry |" in table
    assert report.main([*args, "--check"]) == 0
    # A changed result makes the committed section stale.
    p = results / "cpu" / "cpu-simclr-s0.json"
    r = json.loads(p.read_text())
    r["final"][f"{BB}linear_top1"] += 1.0
    p.write_text(json.dumps(r))
    assert report.main([*args, "--check"]) == 1


def test_committed_report_matches_committed_results():
    assert report.main(["--check"]) == 0, "run: python benchmarks/replication/report.py"


def test_step_evaluations_stay_out_of_the_comparison(tmp_path):
    results = tmp_path / "results"
    (results / "cpu").mkdir(parents=True)
    runs = _study({}, seeds=2)
    steps = _run("hypersolid", 0, {f"{BB}kmeans.ami": 0.9})
    steps.update(run="cpu-hypersolid-s0-steps", part="steps")
    steps["per_epoch"] = [
        {"epoch": round(s / 468, 3), "step": s, f"{BB}kmeans.ami": 0.1 * i, "protocol.exclusion.same_class_frac": 0.5}
        for i, s in enumerate((100, 200, 468), 1)
    ]
    for r in [*runs, steps]:
        (results / "cpu" / f"{r['run']}.json").write_text(json.dumps(r))
    text, _files, _summary, _readme = report.render(results, tmp_path)
    assert "| 200 | 0.427 | – | – | 0.200 | – | – | 0.500 | – |" in text
    # Its last evaluation against the plain seed-0 run: only K-Means AMI (0.3 vs ~0.5) was given, and differs.
    n = sum(1 for k in runs[0]["final"] if k.startswith("protocol."))
    assert f"equals cpu-hypersolid-s0's (the same seed, trained and evaluated separately) on 0 of {n} metrics" in text
    # Seed 0's K-Means AMI in the comparison is the plain run's (~0.5), not the step run's 0.9.
    plain = [r["final"][f"{BB}kmeans.ami"] for r in runs if r["method"] == "hypersolid"]
    kmeans_row = next(line for line in text.splitlines() if line.startswith("| K-Means AMI | "))
    assert kmeans_row.split("|")[2].strip().startswith(claims.fmt(sum(plain) / 2) + " [")
