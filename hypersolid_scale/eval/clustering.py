"""Clustering of embeddings against the ground-truth classes: K-Means, DBSCAN (eps sweep) and HDBSCAN.

Every method reports NMI and ARI against the labels (scikit-learn's definitions), the number of
clusters found and the noise fraction. DBSCAN/HDBSCAN noise (label -1) is scored as one more cluster,
i.e. exactly what ``normalized_mutual_info_score(labels, pred)`` gives on the raw predictions.

All three work on L2-normalised embeddings, where cosine distance ``1 - cos`` is the paper's metric
(K-Means runs spherical; DBSCAN and HDBSCAN use the cosine distance itself).

DBSCAN scales through a sparse graph: one exact FAISS range search at the largest eps keeps only the
pairs within it, and every eps of the sweep filters that graph and labels points with
``dbscan_from_graph`` (connected components of core points; the same labels as scikit-learn's DBSCAN
with ``metric="precomputed"`` on that graph, tested). Memory is O(edges) instead of O(n^2).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import faiss
import hdbscan
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from hypersolid_scale.eval.search import as_unit_float32, chunks, flat_ip_index
from hypersolid_scale.eval.skips import NotApplicable, SkippedWarning

# scikit-learn's DBSCAN requires eps > 0: eps = 0 of the sweep runs at this value (exact duplicates only).
_EPS_FLOOR = 1e-6


def cluster_scores(labels_true: np.ndarray, labels_pred: np.ndarray) -> dict[str, float]:
    """NMI, ARI, number of clusters (noise excluded) and fraction of points labelled noise (-1)."""
    labels_pred = np.asarray(labels_pred)
    return {
        "nmi": float(normalized_mutual_info_score(labels_true, labels_pred)),
        "ari": float(adjusted_rand_score(labels_true, labels_pred)),
        "n_clusters": int(len(np.unique(labels_pred[labels_pred >= 0]))),
        "noise_fraction": float(np.mean(labels_pred < 0)),
    }


def subsample(n: int, max_n: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_n`` of ``n`` rows, drawn without replacement with ``seed``."""
    if n <= max_n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_n, replace=False))


def _labels(labels: torch.Tensor | np.ndarray) -> np.ndarray:
    return (labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)).astype(np.int64)


def kmeans(feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, *, k: int | None = None,
           niter: int = 50, seed: int = 0, use_gpu: bool | None = None) -> dict[str, float]:
    """Spherical K-Means (FAISS) with ``k`` clusters (default: number of classes), scored against labels."""
    x, y = as_unit_float32(feats), _labels(labels)
    k = int(k if k is not None else len(np.unique(y)))
    if not 2 <= k <= x.shape[0]:  # one class, or fewer points than clusters: nothing to partition
        raise NotApplicable(f"K-Means needs 2 <= k <= n; got k={k} for n={x.shape[0]} points")
    gpu = use_gpu if use_gpu is not None else (hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0)
    # FAISS warns below 39 points per centroid; small test sets are still valid inputs.
    km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, spherical=True, gpu=bool(gpu), verbose=False,
                      min_points_per_centroid=1)
    km.train(x)
    _, assign = km.index.search(x, 1)
    return {"k": k, **cluster_scores(y, assign[:, 0])}


def cosine_radius_graph(feats: torch.Tensor | np.ndarray, eps_max: float, *, max_edges: int = 20_000_000,
                        eps_grid: Sequence[float] = (), chunk: int = 2048) -> tuple[sp.csr_matrix, float]:
    """Sparse (n, n) matrix of cosine distances for all pairs with ``1 - cos <= eps_cap`` (self pairs included).

    ``eps_cap`` starts at ``eps_max``; if the graph would exceed ``max_edges`` it is lowered to the largest
    value of ``eps_grid`` whose projected edge count fits, and the caller must skip larger eps values.
    Stored distances are clipped to >= 1e-9 so that a zero distance is never confused with a missing edge.
    """
    x = as_unit_float32(feats)
    n = x.shape[0]
    index = flat_ip_index(x, use_gpu=False)  # FAISS range search is CPU-only
    eps_cap = float(eps_max)
    rows, cols, dists = [], [], []
    total, done = 0, 0
    for sl in chunks(n, chunk):
        # Range search keeps IP > threshold; the 1e-6 margin keeps pairs at exactly eps_cap.
        lims, sims, idx = index.range_search(x[sl], 1.0 - eps_cap - 1e-6)
        d = np.maximum(1.0 - sims, 1e-9).astype(np.float32)
        r = np.repeat(np.arange(sl.start, sl.stop), np.diff(lims.astype(np.int64)))
        keep = d <= eps_cap
        rows.append(r[keep]), cols.append(idx[keep]), dists.append(d[keep])
        total += int(keep.sum())
        done = sl.stop
        if total > max_edges:
            all_d = np.concatenate(dists)
            fits = [e for e in sorted(eps_grid, reverse=True)
                    if e < eps_cap and (all_d <= e).sum() * n / done <= max_edges]
            if not fits:  # typical of (nearly) collapsed embeddings, e.g. a randomly initialised network
                raise NotApplicable(f"the DBSCAN graph exceeds dbscan_max_edges={max_edges} even at the smallest "
                                    f"eps of the sweep ({min(eps_grid, default=eps_max)}); raise "
                                    "eval.dbscan_max_edges or lower eval.cluster_max_samples to run it")
            eps_cap = fits[0]
            for i in range(len(dists)):
                m = dists[i] <= eps_cap
                rows[i], cols[i], dists[i] = rows[i][m], cols[i][m], dists[i][m]
            total = sum(len(d) for d in dists)
    graph = sp.csr_matrix((np.concatenate(dists), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return graph, eps_cap


def dbscan_from_graph(rows: np.ndarray, cols: np.ndarray, n: int, min_samples: int) -> np.ndarray:
    """DBSCAN labels from the eps-neighbourhood edges (row -> col), identical to scikit-learn's DBSCAN.

    scikit-learn expands clusters from core points in index order and gives a border point the label of
    the first cluster that reaches it. Equivalently: core points (>= ``min_samples`` neighbours, self
    included) form clusters as connected components of the core-core edges, numbered by their smallest
    member; a border point takes the lowest-numbered cluster among its core neighbours; the rest is
    noise (-1). Connected components run in C (scipy), O(edges), with no per-point Python lists.
    """
    off = rows != cols  # the self pair is counted once below, present in the graph or not
    rows, cols = rows[off], cols[off]
    core = np.bincount(rows, minlength=n) + 1 >= min_samples
    labels = np.full(n, -1, np.int64)
    core_idx = np.flatnonzero(core)
    if core_idx.size == 0:
        return labels
    cc = core[rows] & core[cols]
    graph = sp.csr_matrix((np.ones(int(cc.sum()), np.int8), (rows[cc], cols[cc])), shape=(n, n))
    _, comp = connected_components(graph, directed=True, connection="weak")
    # Number clusters by their smallest core member (np.unique's first index, as core_idx is ascending).
    comps, first = np.unique(comp[core_idx], return_index=True)
    rank = np.empty(comp.max() + 1, np.int64)
    rank[comps[np.argsort(core_idx[first])]] = np.arange(len(comps))
    labels[core_idx] = rank[comp[core_idx]]
    border = ~core[rows] & core[cols]
    best = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(best, rows[border], rank[comp[cols[border]]])
    hit = best < np.iinfo(np.int64).max
    labels[hit] = best[hit]
    return labels


def dbscan_sweep(feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, *,
                 eps: Sequence[float], min_samples: int = 5,
                 max_edges: int = 20_000_000) -> list[dict[str, float | str | None]]:
    """DBSCAN (cosine distance) for each eps, from one sparse neighbourhood graph.

    Returns one dict per eps: ``{"eps", "nmi", "ari", "n_clusters", "noise_fraction", "edges"}``; an eps
    above what ``max_edges`` allows has ``"skipped"`` with the reason and None scores (one warning names
    them all). Raises ``NotApplicable`` when not even the smallest eps fits.
    """
    y = _labels(labels)
    eps = sorted(float(e) for e in eps)
    if not eps:
        raise ValueError("eps must hold at least one value")
    graph, eps_cap = cosine_radius_graph(feats, max(eps), max_edges=max_edges, eps_grid=eps)
    coo = graph.tocoo()
    results: list[dict[str, float | str | None]] = []
    reason = f"its neighbourhood graph exceeds dbscan_max_edges={max_edges}"
    over = [e for e in eps if e > eps_cap]
    if over:
        warnings.warn(f"DBSCAN eps={', '.join(map(str, over))} skipped: {reason}", SkippedWarning, stacklevel=2)
    for e in eps:
        if e > eps_cap:
            results.append({"eps": e, "nmi": None, "ari": None, "n_clusters": None, "noise_fraction": None,
                            "skipped": reason})
            continue
        m = coo.data <= max(e, _EPS_FLOOR)
        pred = dbscan_from_graph(coo.row[m], coo.col[m], graph.shape[0], min_samples)
        results.append({"eps": e, **cluster_scores(y, pred), "edges": int(m.sum())})
    return results


def hdbscan_cluster(feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, *,
                    min_cluster_size: int = 10, min_samples: int | None = None) -> dict[str, float]:
    """HDBSCAN with cosine distance, from a dense precomputed (n, n) distance matrix.

    The hdbscan package's tree-based algorithms degrade to far worse than brute force in hundreds of
    dimensions (43 s for 5k x 512 against 5 s here); a precomputed matrix costs one (n, d) @ (d, n) matmul
    and 8 n^2 bytes, so callers cap n (``EvalConfig.hdbscan_max_samples``).
    """
    x, y = as_unit_float32(feats), _labels(labels)
    if x.shape[0] <= min_cluster_size:
        raise NotApplicable(f"HDBSCAN needs more than min_cluster_size={min_cluster_size} points, got {x.shape[0]}")
    dist = (1.0 - x @ x.T).astype(np.float64)  # (n, d) @ (d, n)
    np.clip(dist, 0.0, 2.0, out=dist)
    np.fill_diagonal(dist, 0.0)
    pred = hdbscan.HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples,
                           metric="precomputed").fit_predict(dist)
    return {"min_cluster_size": min_cluster_size, **cluster_scores(y, pred)}
