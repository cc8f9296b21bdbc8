"""The hdbscan_grid evaluation suite (eval/hdbscan_grid.py): each fit equals scikit-learn's HDBSCAN on the features
themselves, the grid reports what the clustering did (clusters, noise, sizes), and it runs through the suites."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.cluster import HDBSCAN

from hypersolid_scale.eval import hdbscan_grid as grid
from hypersolid_scale.eval.config import EvalConfig
from hypersolid_scale.eval.suites import run_suites
from hypersolid_scale.safety.errors import ConfigError


def _blobs(n_per: int = 60, classes: int = 10, dim: int = 16, merged: int = 0, seed: int = 0):
    """Gaussian blobs around random unit centres; the last ``merged`` classes share the first class's centre."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for c in range(classes - merged, classes):
        centres[c] = centres[0]
    y = np.repeat(np.arange(classes), n_per)
    x = centres[y] * 5.0 + 0.3 * rng.standard_normal((len(y), dim)) + 2.0  # an offset: centring matters
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_a_fit_on_the_precomputed_matrix_is_sklearns_on_the_features(metric):
    x, y = _blobs(n_per=20)
    d = grid._distances(x.double().numpy(), metric)
    for mcs, selection in ((5, "eom"), (10, "leaf")):
        row = grid._one(d, y.numpy(), mcs, 5, selection)
        ref = HDBSCAN(min_cluster_size=mcs, min_samples=5, metric=metric, cluster_selection_method=selection, copy=True)
        pred = ref.fit_predict(x.double().numpy())
        assert row["n_clusters"] == len(set(pred) - {-1}) and row["noise_fraction"] == pytest.approx(np.mean(pred < 0))
        assert sum(row["sizes"]) + row["sizes_rest"] == int(np.sum(pred >= 0))


def test_the_grid_counts_merged_classes_and_every_setting():
    x, y = _blobs(merged=7)  # classes 3-9 at class 0's centre: 10 classes in 3 places, 8 of them in one
    rows = grid.hdbscan_grid(x, x, y, sizes=[5, 25], per_class=[20, 50], seed=0)
    # 2 subsamples x 2 norms x 2 metrics x (mcs 5: ms 5; mcs 25: ms 5 and 25) x 2 selections
    assert len(rows) == 2 * 2 * 2 * 3 * 2
    assert {r["n"] for r in rows} == {200, 500}
    eom = [r for r in rows if r["selection"] == "eom" and r["min_cluster_size"] == 25 and r["min_samples"] == 25]
    assert all(r["n_clusters"] <= 3 for r in eom)
    big = next(r for r in eom if r["n"] == 500 and r["metric"] == "euclidean" and r["norm"] == "raw")
    assert big["n_clusters"] == 3 and big["sizes"] == [400, 50, 50] and big["largest_fraction"] == 0.8
    # With 20 images per class, min_cluster_size 25 leaves the two lone classes as noise on raw features.
    small = next(r for r in eom if r["n"] == 200 and r["metric"] == "euclidean" and r["norm"] == "raw")
    assert small["noise_fraction"] > 0
    metrics = grid.grid_metrics(rows)
    assert metrics["hdbscan_grid.pc50.raw.euclidean.eom.mcs25.ms25.n_clusters"] == big["n_clusters"]
    # Subsamples are class-balanced and seeded.
    sub = grid.balanced_subsample(y.numpy(), 7, seed=3)
    assert np.bincount(y.numpy()[sub]).tolist() == [7] * 10
    assert np.array_equal(sub, grid.balanced_subsample(y.numpy(), 7, seed=3))


def test_the_suite_runs_by_name_and_its_settings_are_checked(tmp_path):
    x, y = _blobs(n_per=12, classes=4)
    ev = EvalConfig(suites=["hdbscan_grid"], hdbscan_grid_sizes=[5], hdbscan_grid_per_class=[12])
    report = run_suites((x, y), (x, y), ev, tmp_path)
    assert len(report["hdbscan_grid"]) == 2 * 2 * 2  # one (mcs, ms) pair, 2 norms, 2 metrics, 2 selections
    assert "hdbscan_grid.pc12.centred.cosine.leaf.mcs5.ms5.ami" in report["metrics"]
    assert "hdbscan_grid" not in EvalConfig().suites  # a diagnostic: only when named
    too_big = run_suites((x, y), (x, y), EvalConfig(suites=["hdbscan_grid"], hdbscan_grid_sizes=[60]), tmp_path)
    assert "more than the 48 subsampled points" in too_big["skipped"]["hdbscan_grid"]
    with pytest.raises(ConfigError, match="hdbscan_grid_sizes"):
        EvalConfig(hdbscan_grid_sizes=[1])
