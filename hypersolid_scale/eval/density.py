"""DBSCAN over many eps and HDBSCAN from a ``NeighbourGraph``, with the dense algorithms' labels.

Both are read off a minimum spanning forest of *mutual-reachability* weights
``w(a, b) = max(d(a, b), core(a), core(b))``, where ``core(a)`` is a's distance to its m-th neighbour:

* DBSCAN (scikit-learn's convention, ``min_samples`` counts the point itself): a is a core point at eps
  iff ``core(a) = d_(min_samples - 1)(a) <= eps``, and two core points are directly density-connected iff
  ``d <= eps``; so the core points' clusters at eps are the components of the edges with ``w <= eps``,
  which a minimum spanning forest preserves at every threshold. One forest serves the whole sweep; per
  eps only O(n) work remains: cut the forest, number clusters by their smallest core member, give each
  border point the lowest-numbered cluster among its core neighbours (scikit-learn's expansion order;
  a non-core point has fewer than ``min_samples`` neighbours within eps, all among its kNN list).
* HDBSCAN (the ``hdbscan`` package's convention, ``core(a) = d_min_samples(a)``, the point itself not
  counted): its single-linkage tree is the minimum spanning tree of w over *all* pairs. Every pair with
  ``w <= radius`` has ``d <= radius`` and is in the graph, so the forest of those edges is exact up to
  ``radius``; its components K_1..K_r are exactly the single-linkage clusters at that height. Above it the
  tree is the minimum spanning tree of the K's under ``min w`` between them, computed exactly over all
  cross pairs (``pairs.component_minima``), and any member can stand for its K because every K is
  connected below every cross edge. The package's own condensed-tree code then selects the clusters.

Why not the kNN graph alone (k >= m): for a pair outside it, b is not among a's k nearest nor a among
b's, so ``d(a, b) >= max(d_k(a), d_k(b)) >= max(core(a), core(b))`` and ``w(a, b) = d(a, b)``. The MST of
the kNN graph is a minimum spanning tree of all pairs iff, for every pair outside the graph, the path
between its ends in that tree has no edge heavier than ``d(a, b)`` (the cycle optimality condition). That
requires the kNN graph to be connected, which fails for any group of more than k points whose k nearest
neighbours all lie inside it (well-separated classes: exactly the embeddings the paper is about), and it
fails as well when a path inside the graph climbs through a sparse region above a direct pair outside it.
Ties aside, nothing else makes the two trees equal, so the exact construction above is used; only when r
is too large for the r x r minima (an edge budget far below the data's density) are the kNN edges added,
their components connected exactly, and the tree flagged inexact above ``radius``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hdbscan._hdbscan_linkage import label as single_linkage_tree
from hdbscan.hdbscan_ import _tree_to_labels
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

from hypersolid_scale.eval.cosine_search import as_unit_float32
from hypersolid_scale.eval.pairs import NeighbourGraph, closest_pair, component_minima
from hypersolid_scale.eval.skips import NotApplicable

# scikit-learn's DBSCAN requires eps > 0: eps = 0 of a sweep runs at this value (exact duplicates only).
EPS_FLOOR = 1e-6
# Zero weights (exact duplicates) would read as missing edges in a sparse matrix; the forest uses this instead.
_TINY = np.finfo(np.float64).tiny


def spanning_forest(
    n: int, a: np.ndarray, b: np.ndarray, w: np.ndarray, *, dedupe: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges (a, b, w) of a minimum spanning forest of the undirected weighted graph on ``n`` nodes.

    A sparse matrix sums repeated entries: with ``dedupe`` a pair listed more than once (in either
    direction, always with the same weight) is kept once.
    """
    if a.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64)
    w = np.asarray(w, np.float64)
    if dedupe:
        lo, hi = np.minimum(a, b).astype(np.int64), np.maximum(a, b).astype(np.int64)
        _, first = np.unique(lo * n + hi, return_index=True)
        a, b, w = lo[first], hi[first], w[first]
    g = sp.csr_matrix((np.maximum(w, _TINY), (a, b)), shape=(n, n))
    t = minimum_spanning_tree(g).tocoo()
    return t.row.astype(np.int64), t.col.astype(np.int64), np.where(t.data <= _TINY, 0.0, t.data)


def _components(n: int, a: np.ndarray, b: np.ndarray) -> tuple[int, np.ndarray]:
    g = sp.csr_matrix((np.ones(a.size, np.int8), (a, b)), shape=(n, n))
    return connected_components(g, directed=False)


def _check_k(graph: NeighbourGraph, need: int, what: str) -> None:
    k = graph.knn_dist.shape[1] - 1
    if need > k and k < graph.n - 1:
        raise ValueError(
            f"{what} needs the {need} nearest neighbours of every point; the graph holds k={k}. "
            f"Build it with neighbour_graph(..., k={need})"
        )


def dbscan_sweep_labels(graph: NeighbourGraph, min_samples: int, eps: list[float]) -> list[np.ndarray]:
    """scikit-learn's DBSCAN labels (cosine distance) for each eps, all of which must be <= ``graph.radius``."""
    if min_samples < 1:
        raise ValueError(f"min_samples={min_samples} must be >= 1")
    if any(max(e, EPS_FLOOR) > graph.radius for e in eps):
        raise ValueError(f"eps {max(eps)} exceeds the graph's radius {graph.radius}; build it with a larger radius")
    _check_k(graph, min_samples - 1, f"DBSCAN with min_samples={min_samples}")
    n = graph.n
    m = min(min_samples - 1, graph.knn_dist.shape[1] - 1)
    # Fewer than min_samples points in all: nobody is core, whatever eps.
    core_d = graph.knn_dist[:, m] if min_samples <= n else np.full(n, np.inf, np.float32)
    w = np.maximum(graph.dist, np.maximum(core_d[graph.rows], core_d[graph.cols]))
    fa, fb, fw = spanning_forest(n, graph.rows, graph.cols, w)
    nbr_i, nbr_d = graph.knn_idx[:, 1 : m + 1], graph.knn_dist[:, 1 : m + 1]
    out = []
    for eps_i in eps:
        e = np.float32(max(eps_i, EPS_FLOOR))
        core = core_d <= e
        labels = np.full(n, -1, np.int64)
        core_idx = np.flatnonzero(core)
        if core_idx.size:
            keep = fw <= e
            _, comp = _components(n, fa[keep], fb[keep])
            # Number clusters by their smallest core member (np.unique's first index; core_idx ascends).
            comps, first = np.unique(comp[core_idx], return_index=True)
            rank = np.empty(comp.max() + 1, np.int64)
            rank[comps[np.argsort(core_idx[first])]] = np.arange(len(comps))
            labels[core_idx] = rank[comp[core_idx]]
            border = np.flatnonzero(~core)
            cand = nbr_i[border]
            valid = (nbr_d[border] <= e) & core[cand]
            best = np.where(valid, labels[cand], np.iinfo(np.int64).max).min(axis=1, initial=np.iinfo(np.int64).max)
            hit = best < np.iinfo(np.int64).max
            labels[border[hit]] = best[hit]
        out.append(labels)
    return out


def _prim(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimum spanning tree of the complete graph with weights min(m[i, j], m[j, i]) (Prim, O(r^2))."""
    r = m.shape[0]
    best = np.minimum(m[0], m[:, 0]).astype(np.float64)
    src = np.zeros(r, np.int64)
    done = np.zeros(r, bool)
    done[0], best[0] = True, np.inf
    ea, eb, ew = np.empty(r - 1, np.int64), np.empty(r - 1, np.int64), np.empty(r - 1, np.float64)
    for t in range(r - 1):
        j = int(np.argmin(np.where(done, np.inf, best)))
        ea[t], eb[t], ew[t] = src[j], j, best[j]
        done[j] = True
        row = np.minimum(m[j], m[:, j])
        upd = (row < best) & ~done
        best[upd], src[upd] = row[upd], j
    return ea, eb, ew


def reachability_tree(
    feats: np.ndarray, graph: NeighbourGraph, min_samples: int, *, max_components: int = 8192, device: str = "cpu"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Minimum spanning tree (a, b, w) of the mutual-reachability distances over all pairs, and whether it is exact.

    ``feats`` are the points the graph was built from, ``min_samples`` the package's (clamped) value.
    ``max_components`` bounds the r x r float32 minima between the exact clusters at ``graph.radius``
    (256 MiB at the default).
    """
    n, ms = graph.n, min_samples
    _check_k(graph, ms, f"HDBSCAN with min_samples={ms}")
    core = graph.knn_dist[:, ms].astype(np.float64)
    w = np.maximum(graph.dist, np.maximum(core[graph.rows], core[graph.cols]))
    low = w <= graph.radius
    fa, fb, fw = spanning_forest(n, graph.rows[low], graph.cols[low], w[low])
    n_comp, comp = _components(n, fa, fb)
    exact = n_comp <= max_components
    if not exact:  # add the kNN edges: fewer, larger components (at least k + 1 points each)
        ka = np.repeat(np.arange(n), graph.knn_idx.shape[1] - 1)
        kb = graph.knn_idx[:, 1:].ravel()
        kw = np.maximum(graph.knn_dist[:, 1:].ravel(), np.maximum(core[ka], core[kb]))
        fa, fb, fw = spanning_forest(
            n, np.r_[graph.rows[low], ka], np.r_[graph.cols[low], kb], np.r_[w[low], kw], dedupe=True
        )
        n_comp, comp = _components(n, fa, fb)
        if n_comp > max_components:
            raise NotApplicable(
                f"HDBSCAN: the neighbourhood graph splits into {n_comp} components, more than "
                f"max_components={max_components} can connect; raise eval.dbscan_max_edges"
            )
    if n_comp > 1:
        x = as_unit_float32(feats)
        ca, cb, cw = _prim(component_minima(x, core, comp, n_comp, device=device))
        if exact:  # every component is connected below every edge between components: any member will do
            rep = np.unique(comp, return_index=True)[1]  # each component's smallest member
            ea, eb, ew = rep[ca], rep[cb], cw
        else:  # a component's inner tree may rise above the edge: join the pair that realises the minimum
            members = np.split(np.argsort(comp, kind="stable"), np.cumsum(np.bincount(comp, minlength=n_comp))[:-1])
            pairs = [closest_pair(x, core, members[i], members[j], device=device)[:2] for i, j in zip(ca, cb)]
            ea, eb = np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)
            ew = cw  # the weights Prim chose by (a recomputation may differ in the last bit)
        fa, fb, fw = np.r_[fa, ea], np.r_[fb, eb], np.r_[fw, ew]
    return fa, fb, fw, exact


def hdbscan_labels(
    feats: np.ndarray,
    graph: NeighbourGraph,
    *,
    min_cluster_size: int,
    min_samples: int | None = None,
    max_components: int = 8192,
    device: str = "cpu",
) -> tuple[np.ndarray, bool]:
    """Labels of ``hdbscan.HDBSCAN(metric="precomputed")`` on the cosine distances, and whether the tree is exact.

    Mutual-reachability distances tie often (w = core(a) for every neighbour b of a closer than that),
    and the order in which the package's dense Prim meets tied edges decides some merges; so the labels
    equal the package's up to that order (it is not invariant to a permutation of its own input either).
    """
    ms = max(1, min(graph.n - 1, min_cluster_size if min_samples is None else min_samples))  # the package's clamp
    a, b, w, exact = reachability_tree(feats, graph, ms, max_components=max_components, device=device)
    return labels_from_tree(a, b, w, min_cluster_size), exact


def labels_from_tree(a: np.ndarray, b: np.ndarray, w: np.ndarray, min_cluster_size: int) -> np.ndarray:
    """HDBSCAN labels (excess-of-mass selection, the package's code) from a spanning tree's edges."""
    order = np.argsort(w, kind="stable")
    tree = single_linkage_tree(np.column_stack([a[order], b[order], w[order]]).astype(np.float64))
    labels = _tree_to_labels(None, tree, min_cluster_size=min_cluster_size, cluster_selection_method="eom")[0]
    return np.asarray(labels, np.int64)
