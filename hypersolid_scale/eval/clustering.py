"""Clustering of embeddings against the ground-truth classes: K-Means, DBSCAN (eps sweep) and HDBSCAN.

Every method reports NMI and ARI against the labels (scikit-learn's definitions), the number of
clusters found and the noise fraction. DBSCAN/HDBSCAN noise (label -1) is scored as one more cluster,
i.e. exactly what ``normalized_mutual_info_score(labels, pred)`` gives on the raw predictions.

All three work on L2-normalised embeddings, where cosine distance ``1 - cos`` is the paper's metric
(K-Means runs spherical; DBSCAN and HDBSCAN use the cosine distance itself), and all three run on every
point: nothing here holds an (n, n) matrix.

* K-Means: FAISS, k = number of classes (the paper's k = 1000 on ImageNet-1k).
* DBSCAN and HDBSCAN share one exact neighbour graph (``pairs.neighbour_graph``: one blocked pass over
  the upper triangle of X X^T) holding every pair within the sweep's largest eps and every point's k
  nearest neighbours; memory is O(edges + n k), bounded by ``max_edges``. Eps values above what the
  budget allows are skipped, loudly. Labels equal scikit-learn's DBSCAN and the ``hdbscan`` package's
  HDBSCAN on the dense distance matrix (``density`` says how; tests/test_eval_clustering.py checks it).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import faiss
import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import connected_components
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from hypersolid_scale.eval.cosine_search import as_unit_float32
from hypersolid_scale.eval.density import EPS_FLOOR, dbscan_sweep_labels, hdbscan_labels
from hypersolid_scale.eval.pairs import NeighbourGraph, knn_distance_sample, neighbour_graph
from hypersolid_scale.eval.skips import NotApplicable, SkippedWarning

# Queries of the seeded sample that estimates kNN-distance quantiles (adaptive eps, HDBSCAN's radius).
QUANTILE_QUERIES = 2000


def cluster_scores(labels_true: np.ndarray, labels_pred: np.ndarray) -> dict[str, float]:
    """NMI, ARI, number of clusters (noise excluded) and fraction of points labelled noise (-1)."""
    labels_pred = np.asarray(labels_pred)
    return {
        "nmi": float(normalized_mutual_info_score(labels_true, labels_pred)),
        "ari": float(adjusted_rand_score(labels_true, labels_pred)),
        "n_clusters": int(len(np.unique(labels_pred[labels_pred >= 0]))),
        "noise_fraction": float(np.mean(labels_pred < 0)),
    }


def _labels(labels: torch.Tensor | np.ndarray) -> np.ndarray:
    return (labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)).astype(np.int64)


def kmeans(
    feats: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    *,
    k: int | None = None,
    niter: int = 50,
    seed: int = 0,
    use_gpu: bool | None = None,
) -> dict[str, float]:
    """Spherical K-Means (FAISS) with ``k`` clusters (default: number of classes), scored against labels."""
    x, y = as_unit_float32(feats), _labels(labels)
    k = int(k if k is not None else len(np.unique(y)))
    if not 2 <= k <= x.shape[0]:  # one class, or fewer points than clusters: nothing to partition
        raise NotApplicable(f"K-Means needs 2 <= k <= n; got k={k} for n={x.shape[0]} points")
    return {"k": k, **cluster_scores(y, kmeans_assign(x, k, niter=niter, seed=seed, use_gpu=use_gpu))}


def kmeans_assign(x: np.ndarray, k: int, *, niter: int = 50, seed: int = 0, use_gpu: bool | None = None) -> np.ndarray:
    """Each row's cluster under spherical K-Means (FAISS) of the unit float32 rows ``x`` into ``k`` clusters."""
    gpu = use_gpu if use_gpu is not None else (hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0)
    # FAISS warns below 39 points per centroid; small test sets are still valid inputs. It would also
    # subsample to 256 points per centroid: the paper clusters every point.
    km = faiss.Kmeans(
        x.shape[1],
        k,
        niter=niter,
        seed=seed,
        spherical=True,
        gpu=bool(gpu),
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=max(256, -(-x.shape[0] // k)),
    )
    km.train(x)
    return np.asarray(km.index.search(x, 1)[1][:, 0])


def paper_eps(step: float = 0.005) -> list[float]:
    """The paper's DBSCAN sweep: eps in [0, 0.5] (its figure; the step is not stated, its marks every 20
    rows at 0.1 spacing suggest 0.005)."""
    return [round(step * i, 6) for i in range(int(round(0.5 / step)) + 1)]


def adaptive_eps(
    feats: torch.Tensor | np.ndarray,
    min_samples: int,
    quantiles: Sequence[float],
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> list[float]:
    """Eps values at which the given fractions of points are DBSCAN core points, for any embedding scale.

    A point is core at eps iff its (min_samples - 1)-th nearest other point lies within eps, so the
    q-quantile of that distance (over a seeded sample of ``QUANTILE_QUERIES`` points, exact against all
    points) makes a fraction q of the points core: the sweep spans mostly-noise to one-cluster whatever
    the checkpoint's distances are.
    """
    n = len(feats)
    if n < 2:
        raise NotApplicable(f"an adaptive eps grid needs at least 2 points, got {n}")
    kd = knn_distance_sample(feats, min(max(min_samples - 1, 1), n - 1), QUANTILE_QUERIES, seed=seed, device=device)
    return sorted({round(float(e), 4) for e in np.quantile(kd, list(quantiles))})


def density_graph(
    feats: torch.Tensor | np.ndarray,
    *,
    radius: float,
    k: int,
    max_edges: int | None = 20_000_000,
    device: torch.device | str = "cpu",
) -> NeighbourGraph:
    """The neighbour graph both density clusterings read: pairs within ``radius``, ``k`` nearest neighbours."""
    return neighbour_graph(feats, k=k, radius=radius, max_edges=max_edges, device=device)


def cosine_radius_graph(
    feats: torch.Tensor | np.ndarray, eps_max: float, *, max_edges: int = 20_000_000
) -> tuple[sp.csr_matrix, float]:
    """Symmetric sparse (n, n) cosine distances of all pairs within ``eps_cap`` (self pairs on the diagonal).

    ``eps_cap`` is ``eps_max`` unless the graph would exceed ``max_edges`` entries, in which case it is the
    largest radius that fits. Distances are clipped to >= 1e-9 so that zero is never a missing edge.
    """
    g = neighbour_graph(feats, k=0, radius=eps_max, max_edges=max_edges)
    if g.radius < 0:
        raise NotApplicable(f"the radius graph exceeds max_edges={max_edges} even with self pairs only")
    n = g.n
    rows, cols = np.r_[g.rows, g.cols, np.arange(n)], np.r_[g.cols, g.rows, np.arange(n)]
    data = np.maximum(np.r_[g.dist, g.dist, np.zeros(n, np.float32)], np.float32(1e-9))
    return sp.csr_matrix((data, (rows, cols)), shape=(n, n)), g.radius


def dbscan_from_graph(rows: np.ndarray, cols: np.ndarray, n: int, min_samples: int) -> np.ndarray:
    """DBSCAN labels from the eps-neighbourhood edges (row -> col), identical to scikit-learn's DBSCAN.

    The reference for ``density.dbscan_sweep_labels``: core points (>= ``min_samples`` neighbours, self
    included) form clusters as connected components of the core-core edges, numbered by their smallest
    member; a border point takes the lowest-numbered cluster among its core neighbours (scikit-learn
    expands clusters from core points in index order); the rest is noise (-1).
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


def dbscan_sweep(
    feats: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    *,
    eps: Sequence[float],
    min_samples: int = 5,
    max_edges: int = 20_000_000,
    graph: NeighbourGraph | None = None,
    device: torch.device | str = "cpu",
) -> list[dict[str, float | str | None]]:
    """DBSCAN (cosine distance) for each eps on all points, from one neighbour graph.

    Returns one dict per eps: ``{"eps", "nmi", "ari", "n_clusters", "noise_fraction", "edges"}``; an eps
    above what ``max_edges`` allows has ``"skipped"`` with the reason and None scores (one warning names
    them all). Raises ``NotApplicable`` when not even the smallest eps fits. ``graph`` (built with a
    radius >= max(eps) and k >= min_samples - 1) is reused instead of computing one.
    """
    y = _labels(labels)
    eps = sorted(float(e) for e in eps)
    if not eps:
        raise ValueError("eps must hold at least one value")
    if graph is None:
        graph = density_graph(feats, radius=max(eps), k=min_samples - 1, max_edges=max_edges, device=device)
    fits = [e for e in eps if max(e, EPS_FLOOR) <= graph.radius]
    over = [e for e in eps if e not in fits]
    if over and graph.radius >= graph.requested_radius:
        raise ValueError(
            f"the graph's radius {graph.radius} is below eps {max(over)}; build it with radius >= max(eps)"
        )
    if not fits:  # typical of (nearly) collapsed embeddings, e.g. a randomly initialised network
        raise NotApplicable(
            f"the DBSCAN graph exceeds dbscan_max_edges={max_edges} even at the smallest "
            f"eps of the sweep ({eps[0]}); raise eval.dbscan_max_edges or lower "
            "eval.cluster_max_samples to run it"
        )
    reason = f"its neighbourhood graph exceeds dbscan_max_edges={max_edges}"
    if over:
        warnings.warn(f"DBSCAN eps={', '.join(map(str, over))} skipped: {reason}", SkippedWarning, stacklevel=2)
    preds = iter(dbscan_sweep_labels(graph, min_samples, fits))
    results: list[dict[str, float | str | None]] = []
    for e in eps:
        if e in over:
            results.append(
                {"eps": e, "nmi": None, "ari": None, "n_clusters": None, "noise_fraction": None, "skipped": reason}
            )
        else:
            pred = next(preds)
            results.append({"eps": e, **cluster_scores(y, pred), "edges": graph.directed_edges(max(e, EPS_FLOOR))})
    return results


def hdbscan_cluster(
    feats: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    *,
    min_cluster_size: int = 10,
    min_samples: int | None = None,
    graph: NeighbourGraph | None = None,
    max_edges: int = 20_000_000,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """HDBSCAN (cosine distance, ``hdbscan`` package semantics, EOM selection) on all points.

    ``min_samples`` defaults to ``min_cluster_size`` as in the package. Without a ``graph``, one is built
    with the radius that makes 90 % of the points' core distances fall inside it (seeded sample), within
    ``max_edges``. ``exact_tree`` is False only when the edge budget forced the approximate connection
    above the graph's radius (see ``density``).
    """
    x, y = as_unit_float32(feats), _labels(labels)
    n = x.shape[0]
    if n <= min_cluster_size:
        raise NotApplicable(f"HDBSCAN needs more than min_cluster_size={min_cluster_size} points, got {n}")
    ms = max(1, min(n - 1, min_cluster_size if min_samples is None else min_samples))
    if graph is None:
        radius = float(np.quantile(knn_distance_sample(x, ms, QUANTILE_QUERIES, device=device), 0.9))
        graph = density_graph(x, radius=radius, k=ms, max_edges=max_edges, device=device)
    pred, exact = hdbscan_labels(x, graph, min_cluster_size=min_cluster_size, min_samples=ms, device=str(device))
    return {"min_cluster_size": min_cluster_size, "min_samples": ms, **cluster_scores(y, pred), "exact_tree": exact}
