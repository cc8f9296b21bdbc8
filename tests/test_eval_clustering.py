"""Density clustering without an (n, n) matrix: the exact neighbour pass, DBSCAN against scikit-learn point by
point, HDBSCAN against the ``hdbscan`` package (labels and spanning-tree weights), the paper's protocol."""

from __future__ import annotations

import time

import hdbscan
import numpy as np
import pytest
import torch
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score

from hypersolid_scale.eval import clustering as C
from hypersolid_scale.eval import pairs
from hypersolid_scale.eval.config import EvalConfig
from hypersolid_scale.eval.cosine_search import as_unit_float32
from hypersolid_scale.eval.density import dbscan_sweep_labels, hdbscan_labels, reachability_tree
from hypersolid_scale.eval.pairs import knn_distance_sample, neighbour_graph
from hypersolid_scale.eval.suites import run_suites


def mixture(seed: int, n_clusters: int = 8, d: int = 16, noise_points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters of different sizes and spreads plus a uniform background (HDBSCAN/DBSCAN noise)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, d))
    sizes, spreads = rng.integers(80, 300, n_clusters), rng.uniform(0.2, 0.6, n_clusters)
    x = [c + s * rng.standard_normal((m, d)) for c, m, s in zip(centres, sizes, spreads)]
    x.append(1.5 * rng.standard_normal((noise_points, d)))
    y = np.concatenate([np.full(m, i) for i, m in enumerate(sizes)] + [np.full(noise_points, -1)])
    return as_unit_float32(np.concatenate(x)), y


def orthogonal_blobs(n_per: int = 60, k: int = 6, d: int = 32, spread: float = 0.05, seed: int = 0):
    """Tight clusters around orthogonal axes: no kNN edge, and no pair within a small radius, between them."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.eye(d)[i] + spread * rng.standard_normal((n_per, d)) for i in range(k)])
    return as_unit_float32(x), np.repeat(np.arange(k), n_per)


def dense_distances(x: np.ndarray) -> np.ndarray:
    """The (n, n) cosine distances the graph holds, as float64 (the hdbscan package's precomputed input)."""
    g = neighbour_graph(x, k=0, radius=3.0)
    dist = np.zeros((g.n, g.n))
    dist[g.rows, g.cols] = g.dist
    dist[g.cols, g.rows] = g.dist
    return dist


def safe_eps(dist: np.ndarray, targets: list[float]) -> list[float]:
    """Each target moved to the middle of the widest gap between nearby pair distances: no pair sits on the
    boundary, so float rounding in another implementation cannot flip a neighbourhood."""
    d = np.unique(dist[np.triu_indices(len(dist), 1)])
    out = []
    for t in targets:
        i = np.searchsorted(d, t)
        lo, hi = max(i - 200, 0), min(i + 200, len(d) - 1)
        j = lo + int(np.argmax(np.diff(d[lo:hi + 1])))
        out.append(float((d[j] + d[j + 1]) / 2))
    return out


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal labels up to renaming the clusters, noise (-1) staying noise."""
    if not np.array_equal(a < 0, b < 0):
        return False
    pairs_ = set(zip(a[a >= 0].tolist(), b[b >= 0].tolist()))
    return len(pairs_) == len({p[0] for p in pairs_}) == len({p[1] for p in pairs_})


# ---------------------------------------------------------------------------------------------- the exact pass


@pytest.mark.parametrize("n", [1, 2, 9, 700])
def test_neighbour_graph_equals_brute_force_across_blocks(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pairs, "ROWS", 64)
    monkeypatch.setattr(pairs, "COLS", 96)  # many blocks, diagonal blocks split across column blocks
    x = as_unit_float32(np.random.default_rng(n).standard_normal((n, 5)))
    x[n // 2] = x[0]  # an exact duplicate: distance 0 is still a neighbour
    ref = np.clip(1.0 - x.astype(np.float64) @ x.T.astype(np.float64), 0, None)
    np.fill_diagonal(ref, 0.0)
    g = neighbour_graph(x, k=7, radius=0.1)
    k = min(7, n - 1)
    assert g.knn_dist.shape == (n, k + 1) and np.all(g.knn_idx[:, 0] == np.arange(n))
    np.testing.assert_allclose(g.knn_dist, np.sort(ref, axis=1)[:, :k + 1], atol=1e-6)
    np.testing.assert_allclose(np.take_along_axis(ref, g.knn_idx, 1), g.knn_dist, atol=1e-6)
    iu = np.triu_indices(n, 1)
    # Pairs further than 1e-6 from the radius are decided the same way in float32 and float64.
    within, clear = ref[iu] <= 0.1, np.abs(ref[iu] - 0.1) > 1e-6
    got = np.zeros((n, n), bool)
    got[g.rows, g.cols] = True
    assert np.all(g.rows < g.cols) and np.array_equal(got[iu][clear], within[clear])
    if n > 100:
        assert within.sum() > 1000  # the comparison covered many pairs


def test_edge_budget_lowers_the_radius_and_keeps_every_pair_below_it() -> None:
    x = as_unit_float32(np.random.default_rng(3).standard_normal((1500, 4)))
    full = neighbour_graph(x, k=3, radius=0.5)
    g = neighbour_graph(x, k=3, radius=0.5, max_edges=40_000)
    assert 0 < g.radius < 0.5 and g.requested_radius == 0.5
    assert g.directed_edges(g.radius) <= 40_000
    assert np.count_nonzero(full.dist <= g.radius) == g.dist.size  # complete below the lowered radius
    np.testing.assert_array_equal(g.knn_dist, full.knn_dist)  # the kNN lists do not depend on the budget
    assert neighbour_graph(x, k=3, radius=0.5, max_edges=100).radius < 0  # not even the self pairs fit


def test_knn_distance_sample_is_exact() -> None:
    x = as_unit_float32(np.random.default_rng(4).standard_normal((900, 6)))
    ref = np.clip(1.0 - x @ x.T, 0, None)
    np.fill_diagonal(ref, np.inf)
    np.testing.assert_allclose(knn_distance_sample(x, 4, 5000), np.sort(ref, axis=1)[:, 3], atol=1e-6)


# ---------------------------------------------------------------------------------------------- DBSCAN


@pytest.mark.parametrize("data", ["mixture", "uniform", "duplicates"])
@pytest.mark.parametrize("min_samples", [1, 4, 10])
def test_dbscan_labels_equal_sklearn_point_by_point(data: str, min_samples: int) -> None:
    if data == "mixture":
        x, _ = mixture(0)
    else:
        x = as_unit_float32(np.random.default_rng(5).standard_normal((1500, 3)))
        if data == "duplicates":
            x[100:140] = x[0]  # a core point made of copies, plus copies of a border point
            x[200:203] = x[1]
    dist = dense_distances(x)
    eps = [0.0, *safe_eps(dist, [0.001, 0.004, 0.02, 0.06, 0.15])]
    g = neighbour_graph(x, k=max(min_samples - 1, 1), radius=max(eps))
    ours = dbscan_sweep_labels(g, min_samples, eps)
    border = noise = 0
    for e, lab in zip(eps, ours):
        e = max(e, 1e-6)
        ref = DBSCAN(eps=e, min_samples=min_samples, metric="precomputed").fit(dist.astype(np.float32))
        np.testing.assert_array_equal(lab, ref.labels_)  # identical numbering, not only the partition
        cosine = DBSCAN(eps=e, min_samples=min_samples, metric="cosine").fit_predict(x)
        np.testing.assert_array_equal(lab, cosine)
        core = np.zeros(len(x), bool)
        core[ref.core_sample_indices_] = True
        border += int(np.sum(~core & (lab >= 0)))
        noise += int(np.sum(lab < 0))
    if min_samples > 1:  # the comparison covered border points and noise, not only core points
        assert border > 0 and noise > 0


def test_dbscan_sweep_scores_match_the_reference_graph_implementation() -> None:
    x, y = mixture(1)
    eps = [0.0, 0.01, 0.05, 0.1]
    csr, cap = C.cosine_radius_graph(x, max(eps))
    coo = csr.tocoo()
    sweep = C.dbscan_sweep(x, y, eps=eps, min_samples=6)
    for r in sweep:
        m = coo.data <= max(r["eps"], 1e-6)
        ref = C.dbscan_from_graph(coo.row[m], coo.col[m], len(x), 6)
        assert {k: r[k] for k in ("nmi", "ari", "n_clusters", "noise_fraction")} == C.cluster_scores(y, ref)
        assert r["edges"] == int(m.sum())
    assert cap == max(eps) and max(r["n_clusters"] for r in sweep) > 3


# ---------------------------------------------------------------------------------------------- HDBSCAN


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_cluster_size", [5, 15])
def test_hdbscan_matches_the_hdbscan_package_on_blobs(seed: int, min_cluster_size: int) -> None:
    x, _ = mixture(seed, n_clusters=12)
    ref = hdbscan.HDBSCAN(min_cluster_size=min_cluster_size, metric="precomputed").fit_predict(dense_distances(x))
    for radius in (0.0, 0.1):  # all levels from the exact connection, or most from the radius graph
        lab, exact = hdbscan_labels(x, neighbour_graph(x, k=min_cluster_size, radius=radius),
                                    min_cluster_size=min_cluster_size)
        # Tied mutual-reachability weights let the package's own order decide some merges (see density.py).
        assert exact and adjusted_rand_score(ref, lab) >= 0.99
        assert abs(len(set(lab)) - len(set(ref))) <= 1 and len(set(ref)) >= 10


@pytest.mark.parametrize("radius,max_components", [(0.0, 8192), (0.02, 8192), (0.3, 8192), (0.0, 3)])
def test_spanning_tree_weights_equal_the_dense_mutual_reachability_tree(radius: float, max_components: int) -> None:
    """The multiset of MST weights is the same for every minimum spanning tree: ties cannot hide a difference."""
    x = np.concatenate([mixture(7, n_clusters=4, noise_points=60)[0], orthogonal_blobs(n_per=40, k=3, d=16)[0]])
    dist = dense_distances(x)
    ref = hdbscan.HDBSCAN(min_cluster_size=8, metric="precomputed").fit(dist)
    ref_w = np.sort(ref.single_linkage_tree_.to_numpy()[:, 2])  # the merge heights: the MST's weights
    a, b, w, exact = reachability_tree(x, neighbour_graph(x, k=8, radius=radius), 8, max_components=max_components)
    assert len(w) == len(x) - 1 and exact == (max_components > 3)
    assert C.connected_components(C.sp.csr_matrix((np.ones(len(a)), (a, b)), shape=(len(x),) * 2))[0] == 1
    if exact:
        np.testing.assert_allclose(np.sort(w), ref_w, rtol=0, atol=1e-6)
    else:  # kNN edges above the radius: a spanning tree, never lighter than the minimum one
        assert w.sum() >= ref_w.sum() - 1e-6


def test_disconnected_knn_graph_is_connected_exactly() -> None:
    x, y = orthogonal_blobs()
    g = neighbour_graph(x, k=10, radius=0.02)
    knn_edges = C.sp.csr_matrix((np.ones(g.n * 10), (np.repeat(np.arange(g.n), 10), g.knn_idx[:, 1:].ravel())),
                                shape=(g.n, g.n))
    assert C.connected_components(knn_edges, directed=False)[0] == 6  # one kNN component per blob
    ref = hdbscan.HDBSCAN(min_cluster_size=10, metric="precomputed").fit(dense_distances(x))
    # Exact connection of the clusters at the radius (mostly single points here), or, when those are more
    # than max_components, of the six kNN components (the kNN edges inside them: flagged inexact).
    for max_components in (8192, 6):
        lab, exact = hdbscan_labels(x, g, min_cluster_size=10, max_components=max_components)
        assert same_partition(lab, ref.labels_) and same_partition(lab, y)
        assert exact == (max_components > 6)
    with pytest.raises(C.NotApplicable, match="splits into 6 components, more than max_components=5"):
        hdbscan_labels(x, g, min_cluster_size=10, max_components=5)
    w = reachability_tree(x, g, 10)[2]
    np.testing.assert_allclose(np.sort(w), np.sort(ref.single_linkage_tree_.to_numpy()[:, 2]), atol=1e-6)


def test_hdbscan_cluster_builds_its_own_graph_and_reports_exactness() -> None:
    x, y = orthogonal_blobs(n_per=80, k=5)
    out = C.hdbscan_cluster(x, y, min_cluster_size=10)
    assert (out["nmi"], out["ari"], out["n_clusters"], out["noise_fraction"]) == (1.0, 1.0, 5, 0.0)
    assert out["exact_tree"] is True and out["min_samples"] == 10
    with pytest.raises(C.NotApplicable, match="more than min_cluster_size=500 points, got 400"):
        C.hdbscan_cluster(x, y, min_cluster_size=500)


def test_moderate_size_run_is_fast() -> None:
    """20k points: the sweep over the paper's 101 eps values and HDBSCAN with an exact tree, in seconds."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((100, 64))
    y = rng.integers(0, 100, 20_000)
    x = as_unit_float32(centres[y] + 0.35 * rng.standard_normal((20_000, 64)))
    t0 = time.perf_counter()
    g = C.density_graph(x, radius=0.5, k=10)
    sweep = C.dbscan_sweep(x, y, eps=C.paper_eps(), min_samples=5, graph=g)
    hd = C.hdbscan_cluster(x, y, min_cluster_size=10, graph=g)
    elapsed = time.perf_counter() - t0
    assert len(sweep) == 101 and max(r["nmi"] for r in sweep if r["nmi"] is not None) > 0.9
    assert hd["nmi"] > 0.9 and hd["exact_tree"]
    assert elapsed < 90, f"20k points took {elapsed:.0f} s"


# ---------------------------------------------------------------------------------------------- protocol


def test_adaptive_eps_makes_the_requested_fractions_core_points() -> None:
    x, _ = mixture(2)
    qs = [0.1, 0.5, 0.9]
    eps = C.adaptive_eps(x, 5, qs)
    assert eps == sorted(eps) and len(eps) == 3
    core_d = neighbour_graph(x, k=4, radius=0.0).knn_dist[:, 4]  # the distance at which a point is core
    # a sample of 2000 of the points (all of them here) gives the quantiles up to the 4-decimal rounding
    np.testing.assert_allclose([np.mean(core_d <= e) for e in eps], qs, atol=0.01)


def test_paper_protocol_is_the_default_and_adaptive_is_a_switch(tmp_path) -> None:
    ev = EvalConfig()
    assert ev.cluster_max_samples is None and ev.hdbscan_max_samples is None and ev.kmeans_k is None
    assert ev.dbscan_eps == C.paper_eps() and ev.dbscan_eps[0] == 0.0 and ev.dbscan_eps[-1] == 0.5
    x, y = orthogonal_blobs(n_per=150, k=6, spread=0.15)
    split = (torch.from_numpy(x), torch.from_numpy(y))
    for mode in ("fixed", "adaptive"):
        ev = EvalConfig(suites=["cluster"], dbscan_eps_mode=mode)
        report = run_suites(split, split, ev, tmp_path)
        m = report["metrics"]
        assert m["kmeans_k"] == 6 and m["hdbscan_n_samples"] == len(x) and m["hdbscan_exact_tree"]
        assert m["hdbscan_nmi"] > 0.9 and m["dbscan_best_nmi"] > 0.9 and not report["skipped"]
        eps = [r["eps"] for r in report["dbscan"]]
        assert eps == (C.paper_eps() if mode == "fixed" else C.adaptive_eps(x, 5, ev.dbscan_eps_quantiles))


@pytest.mark.parametrize("bad,match", [({"dbscan_eps_mode": "auto"}, "dbscan_eps_mode"),
                                       ({"dbscan_eps_quantiles": [0.5, 1.0]}, "dbscan_eps_quantiles"),
                                       ({"dbscan_eps": []}, "dbscan_eps"),
                                       ({"hdbscan_min_samples": 0}, "hdbscan_min_samples"),
                                       ({"cluster_max_samples": 0}, "cluster_max_samples")])
def test_bad_clustering_settings_are_clear_errors(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EvalConfig(**bad)


@pytest.mark.cuda
def test_neighbour_graph_on_cuda_equals_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x, _ = mixture(3)
    cpu, gpu = neighbour_graph(x, k=8, radius=0.05), neighbour_graph(x, k=8, radius=0.05, device="cuda")
    np.testing.assert_allclose(gpu.knn_dist, cpu.knn_dist, atol=1e-5)
    assert abs(gpu.dist.size - cpu.dist.size) <= 0.001 * cpu.dist.size  # pairs on the radius may round apart
    lab_c, _ = hdbscan_labels(x, cpu, min_cluster_size=8)
    lab_g, _ = hdbscan_labels(x, gpu, min_cluster_size=8, device="cuda")
    assert adjusted_rand_score(lab_c, lab_g) > 0.99
