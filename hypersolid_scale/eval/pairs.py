"""Exact all-pairs cosine neighbourhoods without an (n, n) matrix: one blocked pass over X X^T.

Density clustering needs two views of the same pairwise distances: every pair within a radius
(DBSCAN's eps-neighbourhoods, HDBSCAN's low mutual-reachability edges) and each point's k nearest
neighbours (core distances). FAISS answers them with two exhaustive passes (``range_search`` and
``search``), each computing all n^2 inner products. ``neighbour_graph`` computes the upper triangle of
X X^T once (half the products) in (rows x cols) blocks and feeds both from each block, so memory is
O(block + edges + n k). ``component_minima`` and ``closest_pair`` are the same blocked pass for the
exact edges between clusters that HDBSCAN's spanning tree needs (see ``density``).

Vectors are L2-normalised and the distance is the cosine distance ``1 - <a, b>`` (float32, the matmul's
precision, clipped at 0), the metric of the paper's DBSCAN and HDBSCAN. Blocks run in torch, on the GPU
when ``device`` is a CUDA device (in full fp32: TF32 matmuls, off by default in PyTorch, would round the
distances to 10 bits).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from hypersolid_scale.eval.cosine_search import as_unit_float32

ROWS, COLS = 2048, 8192  # block shape: 64 MiB of float32 distances, large enough for an efficient matmul


@dataclass
class NeighbourGraph:
    """Exact k nearest neighbours of every point and every pair within ``radius``.

    ``knn_dist``/``knn_idx`` (n, k + 1): ascending cosine distances; column 0 is the point itself at
    distance 0, so column j is the j-th nearest *other* point. ``rows``/``cols``/``dist`` (m,): each
    unordered pair {a, b} (a < b) with distance <= ``radius`` once. ``radius`` is below the requested one
    when the edge budget forced it down (-1: no pair kept).
    """

    knn_dist: np.ndarray
    knn_idx: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    dist: np.ndarray
    radius: float
    requested_radius: float

    @property
    def n(self) -> int:
        return self.knn_dist.shape[0]

    def directed_edges(self, eps: float) -> int:
        """Entries of the symmetric eps-neighbourhood matrix, self pairs included (what the budget counts)."""
        return 2 * int(np.count_nonzero(self.dist <= eps)) + self.n


def _blocks(n_rows: int, n_cols: int, symmetric: bool) -> Iterator[tuple[slice, slice]]:
    """Row/column slices covering the upper triangle (``symmetric``) or the whole (rows x cols) matrix."""
    for i0 in range(0, n_rows, ROWS):
        for j0 in range(i0 if symmetric else 0, n_cols, COLS):
            yield slice(i0, min(i0 + ROWS, n_rows)), slice(j0, min(j0 + COLS, n_cols))


def _distance_of(s: torch.Tensor) -> torch.Tensor:
    """Cosine distances from similarities of unit rows, clipped at 0 (rounding can push 1 - cos below)."""
    return torch.clamp_min_(s.neg().add_(1.0), 0.0)


def _distances(xa: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
    """(len(xa), len(xb)) cosine distances of unit rows."""
    return torch.clamp_min_(torch.mm(xa, xb.T).neg_().add_(1.0), 0.0)


def _merge(top_d: np.ndarray, top_i: np.ndarray, a: np.ndarray, b: np.ndarray, v: np.ndarray) -> None:
    """Insert candidates ``b`` at distances ``v`` into the running k-nearest lists of points ``a``.

    Each affected row pools its k current entries with its candidates; a sort by (row, distance) and
    the first k per row give the new list. Current entries come first, so ties keep them.
    """
    if a.size == 0:
        return
    k = top_d.shape[1]
    rows, inv = np.unique(a, return_inverse=True)
    pa = np.concatenate([np.repeat(np.arange(len(rows)), k), inv])
    pb = np.concatenate([top_i[rows].ravel(), b])
    pv = np.concatenate([top_d[rows].ravel(), v])
    order = np.lexsort((pv, pa))
    pa, pb, pv = pa[order], pb[order], pv[order]
    keep = np.arange(len(pa)) - np.searchsorted(pa, np.arange(len(rows)))[pa] < k
    top_d[rows] = pv[keep].reshape(-1, k)
    top_i[rows] = pb[keep].reshape(-1, k)


def _lower_radius(dist: np.ndarray, budget_pairs: int, done_fraction: float) -> float:
    """Largest radius whose pairs, extrapolated from the ``done_fraction`` of pairs seen, fill 90 % of the budget."""
    allowed = int(0.9 * budget_pairs * done_fraction)
    if allowed >= dist.size:
        return float(dist.max())
    if allowed <= 0:
        return float(np.nextafter(dist.min(), np.float32(-1.0))) if dist.size else -1.0
    # Strictly below the allowed-th smallest distance: ties there cannot push the count past `allowed`.
    return float(np.nextafter(np.partition(dist, allowed)[allowed], np.float32(-1.0)))


def neighbour_graph(
    feats: torch.Tensor | np.ndarray,
    *,
    k: int,
    radius: float,
    max_edges: int | None = None,
    device: torch.device | str = "cpu",
) -> NeighbourGraph:
    """Exact ``k`` nearest neighbours and all pairs within ``radius`` (cosine distance) in one pass.

    ``max_edges`` bounds the symmetric neighbourhood matrix (2 per pair + the n self pairs, 12 bytes
    each while stored): when the pairs seen so far project past it, ``radius`` is lowered to the largest
    value that fits and the pairs above it are dropped. Blocks below the diagonal are never computed:
    each block's pairs update both the rows' and the columns' neighbour lists.
    """
    x = torch.from_numpy(as_unit_float32(feats)).to(device)
    n = x.shape[0]
    k = max(0, min(int(k), n - 1))
    budget = (int(max_edges) - n) // 2 if max_edges is not None else None  # unordered pairs allowed
    requested = float(radius)
    radius = requested if budget is None or budget >= 0 else -1.0
    top_d = np.full((n, max(k, 1)), np.inf, np.float32)  # k nearest *other* points, ascending
    top_i = np.full((n, max(k, 1)), -1, np.int64)
    kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n_kept, done, total = 0, 0, max(n * (n - 1) // 2, 1)
    for rs, cs in _blocks(n, n, symmetric=True):
        s = torch.mm(x[rs], x[cs].T)  # similarities: distances are computed for the selected pairs only
        if cs.start < rs.stop:  # block on the diagonal: keep pairs a < b only
            ar = torch.arange(rs.start, rs.stop, device=s.device)[:, None]
            s.masked_fill_(torch.arange(cs.start, cs.stop, device=s.device)[None, :] <= ar, -float("inf"))
        kth_r, kth_c = top_d[rs, -1], top_d[cs, -1]
        update_lists = k > 0
        if not update_lists:
            kth_r, kth_c = np.full(1, -np.inf, np.float32), np.full(1, -np.inf, np.float32)
        elif np.isinf(kth_r).any() or np.isinf(kth_c).any():
            # Lists not yet full (first row strip only): the block's own k nearest per row and column.
            for dim, offset, other in ((1, rs.start, cs.start), (0, cs.start, rs.start)):
                sv, sj = s.topk(min(k, s.shape[dim]), dim=dim, largest=True)
                sv, sj = (sv, sj) if dim == 1 else (sv.T, sj.T)
                a = np.repeat(np.arange(sv.shape[0]) + offset, sv.shape[1])
                v, b = _distance_of(sv).cpu().numpy().ravel(), sj.cpu().numpy().ravel() + other
                fin = np.isfinite(v)
                _merge(top_d, top_i, a[fin], b[fin], v[fin])
            kth_r = kth_c = np.full(1, -np.inf, np.float32)  # the lists have all of this block already
            update_lists = False
        # One scan finds the block's radius pairs and the pairs that enter a row's or column's list; the
        # similarity test is looser than float32 rounding of 1 - s, the exact tests below decide.
        lim_r = 1.0 - np.broadcast_to(np.maximum(kth_r, radius), (s.shape[0],)).astype(np.float64) - 1e-6
        lim_c = 1.0 - np.broadcast_to(np.maximum(kth_c, radius), (s.shape[1],)).astype(np.float64) - 1e-6
        t_r, t_c = (torch.from_numpy(lim.astype(np.float32)).to(s.device) for lim in (lim_r, lim_c))
        sr, sc = torch.nonzero((s >= t_r[:, None]) | (s >= t_c[None, :]), as_tuple=True)
        v = _distance_of(s[sr, sc]).cpu().numpy()
        r, c = sr.cpu().numpy() + rs.start, sc.cpu().numpy() + cs.start
        if update_lists:
            into_r, into_c = v < top_d[r, -1], v < top_d[c, -1]
            _merge(top_d, top_i, r[into_r], c[into_r], v[into_r])
            _merge(top_d, top_i, c[into_c], r[into_c], v[into_c])
        within = v <= radius
        if within.any():
            kept.append((r[within].astype(np.int32), c[within].astype(np.int32), v[within]))
            n_kept += int(within.sum())
        done += int(torch.isfinite(s).sum()) if cs.start < rs.stop else s.numel()
        if budget is not None and radius >= 0 and n_kept > budget:
            radius = _lower_radius(np.concatenate([e[2] for e in kept]), budget, done / total)
            kept = [
                (a_, b_, v_)
                for a_, b_, v_ in ((a_[v_ <= radius], b_[v_ <= radius], v_[v_ <= radius]) for a_, b_, v_ in kept)
                if v_.size
            ]
            n_kept = sum(e[2].size for e in kept)
    rows, cols, dist = (
        np.concatenate([e[i] for e in kept]) if kept else np.empty(0, t)
        for i, t in enumerate((np.int32, np.int32, np.float32))
    )
    self_d, self_i = np.zeros((n, 1), np.float32), np.arange(n, dtype=np.int64)[:, None]
    return NeighbourGraph(
        knn_dist=np.hstack([self_d, top_d[:, :k]]),
        knn_idx=np.hstack([self_i, top_i[:, :k]]),
        rows=rows,
        cols=cols,
        dist=dist,
        radius=radius,
        requested_radius=requested,
    )


def knn_distance_sample(
    feats: torch.Tensor | np.ndarray, k: int, n_queries: int, seed: int = 0, device: torch.device | str = "cpu"
) -> np.ndarray:
    """Exact distance to the k-th nearest other point for ``n_queries`` seeded random points (all if fewer)."""
    x = torch.from_numpy(as_unit_float32(feats)).to(device)
    n = x.shape[0]
    if not 1 <= k < n:
        raise ValueError(f"k={k} must lie in [1, n - 1] for n={n} points")
    q = np.sort(np.random.default_rng(seed).choice(n, size=min(n_queries, n), replace=False))
    top = torch.full((len(q), k), float("inf"), device=x.device)
    for rs, cs in _blocks(len(q), n, symmetric=False):
        qi = torch.from_numpy(q[rs]).to(x.device)
        d = _distances(x[qi], x[cs])
        own = (qi >= cs.start) & (qi < cs.stop)  # each query's own column, if in this block: not a neighbour
        d[torch.nonzero(own).squeeze(1), qi[own] - cs.start] = float("inf")
        both = torch.cat([top[rs], d], dim=1)
        top[rs] = both.topk(k, dim=1, largest=False).values
    return top[:, -1].cpu().numpy()


def component_minima(
    feats: torch.Tensor | np.ndarray,
    core: np.ndarray,
    comp: np.ndarray,
    n_comp: int,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """(n_comp, n_comp) minimum over a in component i, b in component j of ``max(d(a, b), core[a], core[b])``.

    Points are sorted by component so that each block reduces to per-component extrema with two
    ``maximum.reduceat``; blocks inside one component are skipped. The diagonal is +inf. Since cores
    are >= 0, ``max(1 - s, c_a, c_b) = 1 - min(s, 1 - c_a, 1 - c_b)``: two in-place minima on the
    similarities instead of forming distances (values agree up to float32 rounding).
    """
    order = np.argsort(comp, kind="stable")
    x = torch.from_numpy(as_unit_float32(feats)[order]).to(device)
    cs_ = comp[order]
    top = torch.from_numpy((1.0 - core[order]).astype(np.float32)).to(device)  # the most a pair's s can count
    out = np.full((n_comp, n_comp), -np.inf, np.float32)
    for rs, cs in _blocks(len(order), len(order), symmetric=True):
        if cs_[rs.start] == cs_[rs.stop - 1] == cs_[cs.start] == cs_[cs.stop - 1]:
            continue  # one component: no pair between components
        s = torch.mm(x[rs], x[cs].T)
        sim = torch.minimum(torch.minimum(s, top[rs][:, None], out=s), top[cs][None, :], out=s).cpu().numpy()
        r0 = np.flatnonzero(np.r_[True, cs_[rs][1:] != cs_[rs][:-1]])
        c0 = np.flatnonzero(np.r_[True, cs_[cs][1:] != cs_[cs][:-1]])
        m = np.maximum.reduceat(np.maximum.reduceat(sim, c0, axis=1), r0, axis=0)
        ri, ci = cs_[rs][r0], cs_[cs][c0]
        out[np.ix_(ri, ci)] = np.maximum(out[np.ix_(ri, ci)], m)
    out = np.maximum(out, out.T)
    np.subtract(1.0, out, out=out)
    np.maximum(out, 0.0, out=out)
    np.fill_diagonal(out, np.inf)
    return out


def closest_pair(
    feats: np.ndarray, core: np.ndarray, a_idx: np.ndarray, b_idx: np.ndarray, device: torch.device | str = "cpu"
) -> tuple[int, int, float]:
    """(a, b, w): the pair of ``a_idx`` x ``b_idx`` with the smallest ``max(d(a, b), core[a], core[b])``."""
    best = (-1, -1, np.inf)
    xa_all, xb_all = torch.from_numpy(feats[a_idx]).to(device), torch.from_numpy(feats[b_idx]).to(device)
    ca_all = torch.from_numpy(core[a_idx].astype(np.float32)).to(device)
    cb_all = torch.from_numpy(core[b_idx].astype(np.float32)).to(device)
    for rs, cs in _blocks(len(a_idx), len(b_idx), symmetric=False):
        d = torch.maximum(torch.maximum(_distances(xa_all[rs], xb_all[cs]), ca_all[rs][:, None]), cb_all[cs][None, :])
        flat = int(torch.argmin(d))
        w = float(d.view(-1)[flat])
        if w < best[2]:
            i, j = divmod(flat, d.shape[1])
            best = (int(a_idx[rs.start + i]), int(b_idx[cs.start + j]), w)
    return best
