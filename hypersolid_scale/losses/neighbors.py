"""``neighbors`` backend: the repulsion over candidate pairs found with FAISS.

Only pairs with cosine > α carry loss or gradient, and after the first few hundred steps each embedding has
few such neighbours. So a k-nearest-neighbour search (inner product on unit vectors = cosine) proposes the
candidates, their similarities are recomputed exactly in torch, and the gradient rows
``Y_i = Σ_{j active} x_j`` are accumulated sparsely (O(nnz · D) work, O(m · D) memory).

Exactness (DESIGN §2):
* same-image pairs (V − 1 per row) are known from the layout and always included, without a search;
* a row whose k-th candidate is still above α may have missed neighbours ("saturated"); such rows are
  recomputed with the exact blockwise path, so a ``flat`` (exact) index gives the exact loss and gradient
  in every regime, the near-collapsed one included (where it degrades gracefully to ``tiled``'s cost);
* ``ivf`` and ``hnsw`` are approximate: their recall against exact search is measured on a sample of rows
  every ``recall_every`` calls.
"""

from __future__ import annotations

import math

import faiss
import numpy as np
import torch

from hypersolid_scale.losses.config import INDEXES
from hypersolid_scale.losses.repulsion import LinearizedRowSum, PairLayout, RepulsionStats, blockwise_rows

# FAISS searches in float32; a row counts as saturated when its k-th score is within this margin of alpha,
# so float32 rounding can never hide a neighbour from a float64 recomputation.
_SATURATION_MARGIN = 1e-4
_RECALL_ROWS = 256
_PAIR_CHUNK_ELEMS = 1 << 24  # elements of (pairs × D) materialised at once when recomputing similarities


def _gpu_resources():
    """FAISS GPU resources when faiss-gpu and a GPU are present, else None (one per process, cached)."""
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return None
    if not hasattr(_gpu_resources, "res"):
        _gpu_resources.res = faiss.StandardGpuResources()
    return _gpu_resources.res


class NeighborRepulsion:
    """Callable backend with the contract of :func:`~hypersolid_scale.losses.repulsion.tiled_repulsion`."""

    def __init__(
        self,
        index: str = "flat",
        k: int = 64,
        nprobe: int = 16,
        ef_search: int = 64,
        recall_every: int = 100,
        tile_size: int = 4096,
    ) -> None:
        if index not in INDEXES:
            raise ValueError(f"neighbors index {index!r} is not valid; choose one of {', '.join(INDEXES)}")
        if k < 1:
            raise ValueError(f"neighbors k must be >= 1, got {k}")
        self.index_kind, self.k, self.nprobe, self.ef_search = index, int(k), int(nprobe), int(ef_search)
        self.recall_every, self.tile_size = int(recall_every), int(tile_size)
        self.calls = 0

    # ------------------------------------------------------------------ search
    def _build_index(self, xb: np.ndarray, on_gpu: bool) -> faiss.Index:
        n, d = xb.shape
        if self.index_kind == "hnsw":  # no GPU HNSW in FAISS: always on the CPU
            index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = max(self.ef_search, self.k + 1)
            index.add(xb)
            return index
        if self.index_kind == "flat":
            index = faiss.IndexFlatIP(d)
        else:  # ivf: about 4·sqrt(n) lists, with enough points per list to train them
            nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.niter = 10
            rng = np.random.default_rng(0)
            sample = xb[rng.choice(n, size=min(n, 64 * nlist), replace=False)]
            index.train(sample)
            index.nprobe = min(self.nprobe, nlist)
        res = _gpu_resources() if on_gpu else None
        if res is not None:
            index = faiss.index_cpu_to_gpu(res, torch.cuda.current_device(), index)
        index.add(xb)
        return index

    def search(self, x_rows: torch.Tensor, x_all: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k by inner product. Returns (scores, ids), both (m, k'), ids == -1 where nothing was found."""
        xb = np.ascontiguousarray(x_all.detach().float().cpu().numpy())
        xq = np.ascontiguousarray(x_rows.detach().float().cpu().numpy())
        k = min(self.k + 1, xb.shape[0])  # +1: the query itself is in the index
        index = self._build_index(xb, on_gpu=x_rows.is_cuda)
        scores, ids = index.search(xq, k)
        return torch.from_numpy(scores).to(x_rows.device), torch.from_numpy(ids).to(x_rows.device)

    # ------------------------------------------------------------------ loss
    def __call__(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        self.calls += 1
        st = RepulsionStats()
        xr, dev = x_rows.detach(), x_rows.device
        m, n, v = xr.shape[0], x_all.shape[0], layout.views
        row_ids = torch.arange(layout.offset, layout.offset + m, device=dev)
        scores, ids = self.search(xr, x_all)
        st.candidates = float((ids >= 0).sum())

        # Rows whose weakest returned candidate is still inside the exclusion zone may have more neighbours
        # than k: recompute them exactly. When k' == n every column was searched, so nothing can be missing.
        full = (ids >= 0).all(dim=1)
        saturated = full & (scores[:, -1] > alpha - _SATURATION_MARGIN) & (ids.shape[1] < n)
        st.saturated_rows = float(saturated.sum())
        keep = ~saturated

        value = torch.zeros((), dtype=torch.float64, device=dev)
        y = torch.zeros_like(xr)

        # Positives from the layout: a rank owns whole images, so they are its own rows, (B_r, V, V) apart.
        xr3 = xr.reshape(m // v, v, -1)
        xc3 = x_all[layout.offset : layout.offset + m].reshape(m // v, v, -1)  # the same rows, as columns
        pos_sim = xr3 @ xc3.transpose(1, 2)  # (B_r, V, D) @ (B_r, D, V) -> (B_r, V, V)
        off_diag = ~torch.eye(v, dtype=torch.bool, device=dev)
        pos_act = (pos_sim > alpha) & off_diag & keep.reshape(-1, v, 1)
        st.active_pos = float(pos_act.sum())
        pos_max = pos_sim.masked_fill(~off_diag, -2.0).amax(dim=2).reshape(m)  # (m,)
        if layout.mode != "negatives" and st.active_pos:
            w = pos_act.to(xr.dtype)
            value += ((pos_sim - alpha) * w).sum(dtype=torch.float64)
            y += (w @ xc3).reshape(m, -1)  # (B_r, V, V) @ (B_r, V, D)

        # Negatives from the search: only candidates FAISS scores near or inside the zone are recomputed
        # exactly (float32 scores are within the margin of the exact cosine), plus each row's best negative
        # so that the reported max cosine is exact.
        img = row_ids // v
        neg = (ids >= 0) & (ids // v != img[:, None]) & keep[:, None]
        near = neg & (scores > alpha - _SATURATION_MARGIN)
        r_idx, c_pos = near.nonzero(as_tuple=True)
        c_idx = ids[r_idx, c_pos].long()
        best = torch.where(neg, scores, torch.full_like(scores, -3.0)).argmax(dim=1)  # (m,)
        has_neg = neg.gather(1, best[:, None]).squeeze(1)
        best_ids = ids.gather(1, best[:, None]).squeeze(1).long().clamp(min=0)
        best_sim = torch.where(has_neg, (xr * x_all[best_ids]).sum(dim=1), torch.full_like(pos_max, -2.0))
        row_max = torch.maximum(pos_max, best_sim)[keep]
        if row_max.numel():
            st.max_cos = float(row_max.max())
        chunk = max(1, _PAIR_CHUNK_ELEMS // max(1, xr.shape[1]))
        for p0 in range(0, r_idx.numel(), chunk):
            r, c = r_idx[p0 : p0 + chunk], c_idx[p0 : p0 + chunk]
            sim = (xr[r] * x_all[c]).sum(dim=1)  # (pairs,) exact cosines in the input precision
            active = sim > alpha
            st.active_neg += float(active.sum())
            if layout.mode != "positives":
                value += (sim[active] - alpha).sum(dtype=torch.float64)
                y.index_add_(0, r[active], x_all[c[active]])

        if saturated.any():
            sat = saturated.nonzero(as_tuple=True)[0]
            v_sat, y_sat = blockwise_rows(xr[sat], row_ids[sat], x_all, layout, alpha, self.tile_size, st)
            value += v_sat
            y[sat] += y_sat

        if self.recall_every and (self.calls - 1) % self.recall_every == 0:
            st.recall = self._recall(xr, x_all, row_ids, layout, alpha, ids, saturated)
        return LinearizedRowSum.apply(x_rows, value, y), st

    @torch.no_grad()
    def _recall(self, xr, x_all, row_ids, layout, alpha, ids, saturated) -> float:
        """Fraction of truly active (allowed) pairs that the search found, on a fixed-size row sample.

        Positives count as found (they come from the layout), and so do saturated rows (computed exactly).
        """
        m, n, v = xr.shape[0], x_all.shape[0], layout.views
        g = torch.Generator().manual_seed(self.calls)
        sample = torch.randperm(m, generator=g)[: min(m, _RECALL_ROWS)].to(xr.device)
        sim = xr[sample] @ x_all.T  # (s, D) @ (D, M_g)
        cols = torch.arange(n, device=xr.device)
        rows = row_ids[sample]
        not_self = rows[:, None] != cols[None, :]
        same = rows[:, None] // v == cols[None, :] // v
        allowed = {"all": not_self, "negatives": ~same, "positives": same & not_self}[layout.mode]
        truth = (sim > alpha) & allowed
        found = torch.zeros((truth.shape[0], n + 1), dtype=torch.bool, device=xr.device)  # last: discard slot
        s_ids = ids[sample].long()
        found.scatter_(1, torch.where(s_ids >= 0, s_ids, torch.full_like(s_ids, n)), True)
        found = found[:, :n] | same | saturated[sample][:, None]
        n_true = int(truth.sum())
        return 1.0 if n_true == 0 else float((truth & found).sum()) / n_true
