"""Evaluation metrics against known answers and against scikit-learn."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.cluster import DBSCAN
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.preprocessing import StandardScaler

from hypersolid_scale.eval import geometry as G
from hypersolid_scale.eval.clustering import (
    cluster_scores,
    cosine_radius_graph,
    dbscan_from_graph,
    dbscan_sweep,
    hdbscan_cluster,
    kmeans,
)
from hypersolid_scale.eval.config import EvalConfig
from hypersolid_scale.eval.cosine_search import as_unit_float32
from hypersolid_scale.eval.knn import knn_accuracy, knn_predict
from hypersolid_scale.eval.linear import linear_probe
from hypersolid_scale.eval.neighborhood import interpolation_profile
from hypersolid_scale.eval.skips import NotApplicable, SkipLog, SkippedWarning
from hypersolid_scale.eval.suites import nothing_evaluated, run_suites


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(x))
    tr, te = perm[:1200], perm[1200:]
    return x[tr].astype(np.float32), y[tr], x[te].astype(np.float32), y[te]


def blobs(n_per: int = 150, d: int = 16, noise: float = 0.02, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two tight clusters around orthogonal directions (cosine distance between them ~1)."""
    rng = np.random.default_rng(seed)
    centers = np.eye(d)[:2]
    x = np.concatenate([c + noise * rng.standard_normal((n_per, d)) for c in centers]).astype(np.float32)
    return x, np.repeat([0, 1], n_per)


# ---------------------------------------------------------------------------------------------- geometry


@pytest.mark.parametrize("n", [2, 7, 32])
def test_orthonormal_vectors(n: int) -> None:
    q, _ = np.linalg.qr(np.random.default_rng(n).standard_normal((64, n)))
    x = (3.0 * q.T).astype(np.float32)  # n orthogonal rows of norm 3: normalisation must not matter
    assert G.anisotropy(x) == pytest.approx(0.0, abs=1e-6)
    assert G.mean_pairwise_angle(x) == pytest.approx(90.0, abs=1e-3)
    assert G.effective_rank(G.as_unit_float32(x)) == pytest.approx(n, rel=1e-5)
    assert G.center_vector_norm(x) == pytest.approx(1 / np.sqrt(n), rel=1e-5)


def test_identical_vectors() -> None:
    x = np.tile(np.random.default_rng(1).standard_normal(16), (10, 1)).astype(np.float32)
    assert G.anisotropy(x) == pytest.approx(1.0, abs=1e-6)
    assert G.effective_rank(x) == pytest.approx(1.0, abs=1e-6)
    assert G.mean_pairwise_angle(x) == pytest.approx(0.0, abs=0.1)
    assert G.center_vector_norm(x) == pytest.approx(1.0, abs=1e-6)


def test_effective_rank_matches_definition() -> None:
    m = np.random.default_rng(2).standard_normal((40, 12))
    s = np.linalg.svd(m, compute_uv=False)
    p = s / s.sum()
    assert G.effective_rank(m) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-5)
    assert G.effective_rank(m.T) == pytest.approx(G.effective_rank(m), rel=1e-5)


def test_anisotropy_sampled_angle_close_to_exact() -> None:
    x = np.random.default_rng(3).standard_normal((3000, 8)) + 0.5
    exact = G.mean_pairwise_angle(x, max_pairs=10**7)
    assert G.mean_pairwise_angle(x, max_pairs=200_000, seed=1) == pytest.approx(exact, abs=0.5)
    u = as_unit_float32(x).astype(np.float64)
    g = u @ u.T
    assert G.anisotropy(x) == pytest.approx((g.sum() - np.trace(g)) / (3000 * 2999), abs=1e-6)


@pytest.mark.parametrize("mu_pos,sd_pos,mu_neg,sd_neg", [(1.0, 1.0, 0.0, 1.0), (2.0, 1.0, 0.0, 2.0)])
def test_d_prime_of_known_gaussians(mu_pos: float, sd_pos: float, mu_neg: float, sd_neg: float) -> None:
    rng = np.random.default_rng(4)
    pos, neg = rng.normal(mu_pos, sd_pos, 400_000), rng.normal(mu_neg, sd_neg, 400_000)
    expected = (mu_pos - mu_neg) / np.sqrt((sd_pos**2 + sd_neg**2) / 2)
    assert G.sensitivity_index(pos, neg) == pytest.approx(expected, abs=0.01)


def test_pair_similarities_split_by_label() -> None:
    x, y = blobs()
    pos, neg = G.pair_similarities(x, y, max_pairs=10**6)
    assert len(pos) == 2 * 150 * 149 // 2 and len(neg) == 150 * 150  # every pair, split by label
    assert pos.min() > 0.9 and abs(neg).max() < 0.2
    pos_s, neg_s = G.pair_similarities(x, y, max_pairs=2000, seed=0)
    assert len(pos_s) <= 2000 and len(neg_s) <= 2000 and pos_s.min() > 0.9


def test_sparsity_correlation_selectivity() -> None:
    rng = np.random.default_rng(5)
    y = np.repeat(np.arange(30), 20)
    x = np.zeros((600, 4))
    x[:, 0] = (y == 0) * 5.0 + 0.01 * rng.random(600)  # fires for one class
    x[:, 1] = (y < 10) * 5.0 + 0.01 * rng.random(600)  # fires for ten classes
    x[:, 2] = (y < 25) * 5.0 + 0.01 * rng.random(600)  # well above the mean for none (most classes on)
    # x[:, 3] stays 0: a dead unit
    sel = G.dimension_selectivity(x, y, z=1.0)
    # the paper's bins; then shares of the 30 classes: 1 class is <= 10 %, 10 classes are in (10 %, 50 %]
    paper = {"0": 50.0, "1-5": 25.0, "6-20": 25.0, "21plus": 0.0}
    assert sel == {**paper, "share_le10": 25.0, "share_11-50": 25.0, "share_gt50": 0.0}
    # On 10 classes the paper's "1-5" is half of them; the shares split it: 1 class, 2-5 classes, 6+ classes.
    y10 = np.repeat(np.arange(10), 20)
    x10 = np.stack([(y10 < k) * 5.0 + 0.01 * rng.random(200) for k in (1, 3, 5, 6)], 1)
    sel10 = G.dimension_selectivity(x10, y10, z=0.5)
    assert (sel10["1-5"], sel10["6-20"], sel10["21plus"]) == (75.0, 25.0, 0.0)
    assert (sel10["share_le10"], sel10["share_11-50"], sel10["share_gt50"]) == (25.0, 50.0, 25.0)
    assert G.sparsity(np.array([[0.0, 1.0], [0.0, 0.0]])) == 0.75
    a = rng.standard_normal(500)
    corr = G.feature_correlation(np.stack([a, 2 * a + 1, rng.standard_normal(500), np.zeros(500)], 1))
    # pairs among the 3 live dims: |r|=1 for (0,1), ~0 for the others -> mean ~ 1/3
    assert corr == pytest.approx(1 / 3, abs=0.05)


def test_geometry_metrics_keys_and_ranges(digits: tuple) -> None:
    x_tr, y_tr, _, _ = digits
    m = G.geometry_metrics(x_tr, y_tr, max_pairs=50_000)
    assert 0 < m["anisotropy"] < 1 and 0 < m["mean_pairwise_angle_deg"] < 90
    assert 1 <= m["centroid_rank"] <= 10 and 1 <= m["embedding_rank"] <= 64
    assert m["d_prime"] > 0 and m["pos_cos_mean"] > m["neg_cos_mean"]
    assert sum(m[f"selectivity_{k}"] for k in ("0", "1-5", "6-20", "21plus")) == pytest.approx(100.0)


# ---------------------------------------------------------------------------------------------- clustering


def test_blobs_cluster_perfectly() -> None:
    x, y = blobs()
    for result in (kmeans(x, y, seed=0), hdbscan_cluster(x, y, min_cluster_size=10)):
        assert (result["nmi"], result["ari"], result["n_clusters"]) == (1.0, 1.0, 2)
    sweep = dbscan_sweep(x, y, eps=[0.05, 0.2, 0.5], min_samples=5)
    for r in sweep:
        assert (r["nmi"], r["ari"], r["n_clusters"], r["noise_fraction"]) == (1.0, 1.0, 2, 0.0)


def test_dbscan_sparse_graph_equals_dense_sklearn() -> None:
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.standard_normal((200, 6)) + 3 * rng.standard_normal(6) for _ in range(3)])
    y = np.repeat([0, 1, 2], 200)
    x[7] = x[3]  # an exact duplicate: distance 0 must still be an edge
    eps = [0.0, 0.01, 0.03, 0.1, 0.3]
    for r in dbscan_sweep(x, y, eps=eps, min_samples=4):
        dense = DBSCAN(eps=max(r["eps"], 1e-6), min_samples=4, metric="cosine").fit_predict(as_unit_float32(x))
        assert {k: r[k] for k in ("nmi", "ari", "n_clusters", "noise_fraction")} == cluster_scores(y, dense)


@pytest.mark.parametrize("min_samples", [3, 8])
def test_dbscan_from_graph_labels_equal_sklearn(min_samples: int) -> None:
    """Same labels, point by point (border points reachable from two clusters included)."""
    x = np.random.default_rng(8).standard_normal((1500, 3))
    graph, _ = cosine_radius_graph(x, 0.05)
    coo = graph.tocoo()
    n_labels = []
    for eps in (0.001, 0.002, 0.01, 0.03):
        m = coo.data <= eps
        ref = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(
            sp.csr_matrix((coo.data[m], (coo.row[m], coo.col[m])), shape=graph.shape)
        )
        ours = dbscan_from_graph(coo.row[m], coo.col[m], len(x), min_samples)
        np.testing.assert_array_equal(ours, ref)
        n_labels.append(len(set(ref)))
    assert max(n_labels) > 5  # the comparison covered many clusters and noise, not one trivial labelling


def test_dbscan_edge_budget_skips_large_eps_loudly() -> None:
    x = np.random.default_rng(7).standard_normal((2000, 4))
    y = np.arange(2000) % 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sweep = dbscan_sweep(x, y, eps=[0.01, 0.05, 0.4, 0.5], min_samples=5, max_edges=100_000)
    assert [str(w.message) for w in caught if w.category is SkippedWarning] == [
        "DBSCAN eps=0.4, 0.5 skipped: its neighbourhood graph exceeds dbscan_max_edges=100000"
    ]  # ONE warning
    assert [r["nmi"] is None for r in sweep] == [False, False, True, True]
    assert "dbscan_max_edges" in sweep[-1]["skipped"] and "skipped" not in sweep[0]
    # the radii that fit give the scores of an unlimited budget
    full = dbscan_sweep(x, y, eps=[0.01, 0.05], min_samples=5)
    assert [r["nmi"] for r in full] == [r["nmi"] for r in sweep[:2]]
    with pytest.raises(NotApplicable, match="dbscan_max_edges=1000 even at the smallest eps"):
        dbscan_sweep(x, y, eps=[0.5], max_edges=1000)


# ---------------------------------------------------------------------------------------------- kNN / linear


def test_knn_majority_matches_sklearn_exactly(digits: tuple) -> None:
    x_tr, y_tr, x_te, y_te = digits
    ours = knn_predict(x_tr, y_tr, x_te, ks=(1, 5, 20, 50), chunk=100)  # small chunks: exercise the loop
    for k in (1, 5, 20, 50):
        ref = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(x_tr, y_tr).predict(x_te)
        np.testing.assert_array_equal(ours[f"k{k}_majority"], ref)


def test_knn_weighted_vote_and_accuracy_dict(digits: tuple) -> None:
    x_tr, y_tr, x_te, y_te = digits
    acc = knn_accuracy(torch.from_numpy(x_tr), torch.from_numpy(y_tr), x_te, y_te, ks=(20,), temperature=0.07)
    assert set(acc) == {"knn_k20_majority", "knn_k20_weighted"}
    assert acc["knn_k20_weighted"] > 90.0
    # brute-force reference of the weighted vote: sum of exp(cos / T) per class over the top 20
    u_tr, u_te = as_unit_float32(x_tr).astype(np.float64), as_unit_float32(x_te).astype(np.float64)
    cos = u_te @ u_tr.T
    top = np.argsort(-cos, axis=1, kind="stable")[:, :20]
    votes = np.zeros((len(x_te), 10))
    for i in range(len(x_te)):
        np.add.at(votes[i], y_tr[top[i]], np.exp(cos[i, top[i]] / 0.07))
    p = knn_predict(x_tr, y_tr, x_te, ks=(20,), temperature=0.07)
    np.testing.assert_array_equal(p["k20_weighted"], votes.argmax(1))
    assert acc["knn_k20_weighted"] == pytest.approx(100 * np.mean(votes.argmax(1) == y_te))
    with pytest.raises(NotApplicable, match="exceeds"):
        knn_predict(x_tr[:10], y_tr[:10], x_te, ks=(20,))


def test_linear_probe_within_one_point_of_sklearn(digits: tuple) -> None:
    x_tr, y_tr, x_te, y_te = digits
    scaler = StandardScaler().fit(x_tr)
    ref = 100 * LogisticRegression(C=1.0, max_iter=5000).fit(scaler.transform(x_tr), y_tr).score(
        scaler.transform(x_te), y_te
    )
    same_objective = linear_probe(x_tr, y_tr, x_te, y_te, weight_decays=[1.0 / len(x_tr)], device="cpu")
    assert abs(same_objective["linear_top1"] - ref) <= 1.0
    selected = linear_probe(x_tr, y_tr, x_te, y_te, weight_decays=[1e-4, 1e-3, 1e-2], device="cpu")
    assert abs(selected["linear_top1"] - ref) <= 1.5 and selected["linear_weight_decay"] in (1e-4, 1e-3, 1e-2)
    adam = linear_probe(x_tr, y_tr, x_te, y_te, weight_decays=[1e-3], optimizer="adam", max_iter=30, device="cpu")
    assert adam["linear_top1"] > 90.0


# ---------------------------------------------------------------------------------------------- misc


def test_interpolation_profile_shape_and_gap() -> None:
    x, y = blobs(n_per=100)
    prof = interpolation_profile(x, y, n_pairs=20, n_steps=11, seed=0)
    assert len(prof["t"]) == 11 and prof["pos_mean"][0] == pytest.approx(0.0, abs=1e-5)
    # between the orthogonal blobs the midpoint is ~45 degrees from every real embedding
    assert max(prof["neg_mean"]) > 0.2 > 0.01 > max(prof["pos_mean"])


def test_eval_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="eval.suites"):
        EvalConfig(suites=["knn", "umap"])
    with pytest.raises(ValueError, match="eval.features"):
        EvalConfig(features="head")
    with pytest.raises(ValueError, match="eval.dbscan_eps"):
        EvalConfig(dbscan_eps=[0.1, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EvalConfig().knn_k == [5, 20]


# ---------------------------------------------------------------------------------------------- skipped metrics


def test_metrics_raise_not_applicable_on_data_they_cannot_use(digits: tuple) -> None:
    x_tr, y_tr, x_te, y_te = digits
    one = np.zeros(len(x_tr), np.int64)  # a single class
    with pytest.raises(NotApplicable, match="at least 2 classes, this split has 1"):
        linear_probe(x_tr, one, x_te, y_te, weight_decays=[1e-3], device="cpu")
    with pytest.raises(NotApplicable, match="unlabelled"):
        linear_probe(x_tr, y_tr - 1, x_te, y_te, weight_decays=[1e-3], device="cpu")
    with pytest.raises(NotApplicable, match="2 <= k <= n"):
        kmeans(x_tr, one)
    with pytest.raises(NotApplicable, match="2 <= k <= n"):
        kmeans(x_tr[:5], y_tr[:5], k=10)
    with pytest.raises(NotApplicable, match="more than min_cluster_size=10 points, got 10"):
        hdbscan_cluster(x_tr[:10], y_tr[:10], min_cluster_size=10)
    with pytest.raises(NotApplicable, match="different-class pairs"):
        interpolation_profile(x_tr, one, n_pairs=5)
    with pytest.raises(NotApplicable, match=">= 2 classes"):
        G.class_metrics(x_tr, one)
    with pytest.raises(NotApplicable, match="negative labels"):
        knn_accuracy(x_tr, y_tr, x_te, y_te - 1)
    assert issubclass(NotApplicable, ValueError)  # callers that catch ValueError (the online monitor) still do


def test_skip_log_records_and_warns_once_per_entry_group() -> None:
    log = SkipLog()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with log.guard("a"):
            raise NotApplicable("reason a")
        with log.guard("b"):
            pass  # nothing to skip
        log.add({"c1": "same", "c2": "same"})
        log.add({})
        with pytest.raises(ValueError, match="a real error"), log.guard("d"):
            raise ValueError("a real error")  # not NotApplicable: propagates, nothing recorded
    assert log.reasons == {"a": "reason a", "c1": "same", "c2": "same"}
    assert [str(w.message) for w in caught] == ["a skipped: reason a", "c1, c2 skipped: same"]
    assert all(w.category is SkippedWarning and w.filename == __file__ for w in caught)


def test_run_suites_on_single_class_data_keeps_what_can_be_computed(tmp_path, digits: tuple) -> None:
    from hypersolid_scale.eval.report import write_report

    x_tr, _, x_te, _ = digits
    one_tr, one_te = torch.zeros(len(x_tr), dtype=torch.long), torch.zeros(len(x_te), dtype=torch.long)
    ev = EvalConfig(knn_k=[5], linear_weight_decays=[1e-3], dbscan_eps=[0.05], max_pairs=20_000, interp_pairs=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_suites((torch.from_numpy(x_tr), one_tr), (torch.from_numpy(x_te), one_te), ev, tmp_path)
    skipped = set(report["skipped"])
    assert skipped == {
        "linear",
        "kmeans",
        "geometry_classes",
        "interpolation",
        "plot_similarity_density",
        "plot_interpolation_profile",
    }
    assert len([w for w in caught if w.category is SkippedWarning]) == len(skipped)  # one warning each
    m = report["metrics"]
    assert m["knn_k5_majority"] == 100.0  # one class: every vote is right
    assert m["anisotropy"] == pytest.approx(G.anisotropy(x_te)) and "embedding_rank" in m
    assert "d_prime" not in m and "linear_top1" not in m and "kmeans_nmi" not in m
    assert "dbscan_best_nmi" in m and "hdbscan_nmi" in m  # clustering scores need no second class
    assert {p.split("/")[-1] for p in report["plots"]} == {"centroid_cosine.png", "dbscan_eps.png"}
    assert not nothing_evaluated(report)
    json_path, md_path = write_report(report, tmp_path)
    assert json.loads(json_path.read_text())["skipped"]["linear"].startswith("the linear probe")
    assert "| kmeans | K-Means needs" in md_path.read_text()


def test_nothing_evaluated_only_when_no_metric_and_no_plot(tmp_path) -> None:
    x = torch.randn(8, 4)
    ev = EvalConfig(suites=["knn", "linear"], knn_k=[20], linear_weight_decays=[1e-3])
    with pytest.warns(SkippedWarning):
        report = run_suites((x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long)), ev, tmp_path)
    assert report["metrics"] == {} and set(report["skipped"]) == {"knn_k20", "linear"}
    assert nothing_evaluated(report)
    assert not nothing_evaluated({"metrics": {}, "plots": ["a.png"]})
