"""benchmarks.eval: its synthetic clustered embeddings (eval_embeddings.py), and a --quick run of both sections
end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _embeddings() -> ModuleType:
    from benchmarks import eval_embeddings

    return eval_embeddings


def test_cluster_embeddings_are_unit_norm_and_clustered() -> None:
    x, y = _embeddings().cluster_embeddings(4000, 128, classes=20, seed=0)
    assert x.shape == (4000, 128) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert (x >= 0).all() and 0.02 < np.mean(y < 0) < 0.08  # ReLU features; ~5 % background
    a, b = np.random.default_rng(1).integers(0, 4000, (2, 20000))
    keep = (a != b) & (y[a] >= 0) & (y[b] >= 0)
    cos = np.sum(x[a[keep]] * x[b[keep]], axis=1)
    same = y[a[keep]] == y[b[keep]]
    assert cos[same].mean() > cos[~same].mean() + 0.1  # a class is tighter than the whole cloud


@pytest.mark.slow
def test_quick_run_writes_both_sections(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.eval", "--quick", "--dims", "64", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "clustering.json").read_text())
    exact = [r for r in res["rows"] if r["path"] == "exact" and r["n"] == 3000]
    assert len(exact) == 1 and {"kmeans", "neighbour_graph", "dbscan_grid", "hdbscan_tree"} <= set(exact[0]["stages"])
    assert exact[0]["results"]["dbscan_grid"]["n_eps"] == 101  # the paper's grid
    # Each row ran in a process of its own: its peak is at least the data's and the interpreter's.
    assert all(r["peak_rss_mib"] >= r["stages"]["data"]["peak_rss_mib"] > 0 for r in res["rows"])
    (cmp,) = res["compare"]
    assert cmp["dbscan_eps_compared"] == 11 and cmp["dbscan_same_labels"]  # the exact path is scikit-learn's
    assert cmp["hdbscan_ari_exact_vs_dense"] > 0.95  # equal up to the order of tied merges
    parts = json.loads((tmp_path / "eval.json").read_text())["parts"]
    assert {p["part"] for p in parts} >= {"knn (k=5,20,200)", "kmeans (k=10)", "geometry"}
    assert (tmp_path / "clustering.png").stat().st_size > 0 and (tmp_path / "eval.png").stat().st_size > 0
