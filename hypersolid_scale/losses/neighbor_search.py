"""The neighbour search behind the ``neighbors`` backend (losses/backends/neighbors.py): the repulsion over the
candidate pairs of a k-nearest-neighbour search.

Only pairs with cosine > α carry loss or gradient, and after the first few hundred steps each embedding has
few such neighbours. So a search (inner product on unit vectors = cosine) proposes k candidates per row,
their similarities are recomputed exactly in torch, and the gradient rows ``Y_i = Σ_{j active} x_j`` are
accumulated from the candidates only (O(m · k · D) work, O(m · D) memory).

Where the search runs (``index``, see :mod:`hypersolid_scale.losses.candidates`):
* ``flat``: exact. On CUDA the torch blockwise top-k, on the device; on the CPU FAISS ``IndexFlatIP``.
* ``torch``: the torch blockwise top-k on any device (exact).
* ``ivf``: approximate. FAISS GPU IVF on CUDA tensors when faiss-gpu is installed, else FAISS on the host,
  whose coarse quantizer is trained every ``ivf_retrain_every`` calls and kept between them (candidates.ReusedIVF;
  the GPU index is trained at every call).
* ``hnsw``: approximate, FAISS on the host (FAISS has no GPU HNSW).

Exactness (docs/design.md §2):
* same-image pairs (V − 1 per row) are known from the layout and always included, without a search;
* a row whose k-th candidate is still above α may have missed neighbours ("saturated"); such rows are
  recomputed with the exact blockwise path, so an exact index gives the exact loss and gradient in every
  regime, the near-collapsed one included (where it degrades gracefully to ``tiled``'s cost);
* ``ivf`` and ``hnsw`` are approximate: their recall against exact search is measured on a sample of rows
  every ``recall_every`` calls.

Host synchronisation: the candidate work has fixed shapes (m × k), so the only device value read on the host
is the set of saturated rows (``nonzero``), which sizes the exact fallback; a host-side search (FAISS on the
CPU) copies the embeddings to the host as well. On the CPU, where a host read costs nothing, the candidates
are recomputed only in the row chunks that hold a candidate near alpha or the batch's largest cosine.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from hypersolid_scale.losses.candidates import (
    ReusedIVF,
    faiss_gpu_available,
    faiss_gpu_ivf_search,
    faiss_search,
    topk_inner_product,
)
from hypersolid_scale.losses.repulsion import LinearizedRowSum, PairLayout, RepulsionStats, blockwise_rows

# FAISS searches in float32; a row counts as saturated when its k-th score is within this margin of alpha,
# so float32 rounding can never hide a neighbour from a float64 recomputation.
_SATURATION_MARGIN = 1e-4
_RECALL_ROWS = 256

# flat: exact (FAISS IndexFlatIP on CPU, the torch blockwise top-k on CUDA); torch: the torch top-k on any device;
# ivf / hnsw: approximate FAISS indexes (ivf runs on the GPU when faiss-gpu is installed).
INDEXES = ("flat", "ivf", "hnsw", "torch")
EXACT_INDEXES = ("flat", "torch")


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
        ivf_retrain_every: int = 1,
    ) -> None:
        if index not in INDEXES:
            raise ValueError(f"neighbors index {index!r} is not valid; choose one of {', '.join(INDEXES)}")
        if k < 1:
            raise ValueError(f"neighbors k must be >= 1, got {k}")
        self.index_kind, self.k, self.nprobe, self.ef_search = index, int(k), int(nprobe), int(ef_search)
        self.recall_every, self.tile_size = int(recall_every), int(tile_size)
        self.calls = 0
        self._warned = False
        self.ivf = ReusedIVF(ivf_retrain_every)  # index=ivf on the host: its quantizer, kept between calls

    # ------------------------------------------------------------------ search
    def where(self, device: torch.device) -> str:
        """Which search runs for inputs on ``device``: "torch", "faiss-gpu" or "faiss-cpu"."""
        if self.index_kind == "torch" or (self.index_kind == "flat" and device.type == "cuda"):
            return "torch"
        if self.index_kind == "ivf" and device.type == "cuda" and faiss_gpu_available():
            return "faiss-gpu"
        return "faiss-cpu"

    def search(self, x_rows: torch.Tensor, x_all: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-(k+1) by inner product (the row itself is among the columns).

        Returns (scores, ids), both (m, k'), on the input's device; ids == -1 where nothing was found.
        """
        k = min(self.k + 1, x_all.shape[0])
        where = self.where(x_rows.device)
        if where == "torch":
            return topk_inner_product(x_rows, x_all, k, tile=self.tile_size)
        # FAISS: float32, and NaN/inf (a diverged step, caught by the trainer's check) must not reach it.
        xq, xb = (torch.nan_to_num(t.detach().float(), nan=0.0, posinf=0.0, neginf=0.0) for t in (x_rows, x_all))
        if where == "faiss-gpu":
            return faiss_gpu_ivf_search(xq, xb, k, nprobe=self.nprobe)
        if x_rows.is_cuda and not self._warned:
            self._warned = True
            warnings.warn(
                f"method.hypersolid.neighbors.index={self.index_kind} searches on the CPU (faiss-gpu "
                f"{'has no HNSW' if self.index_kind == 'hnsw' else 'is not installed'}): the embeddings "
                "are copied to the host every step. Use method.hypersolid.neighbors.index=flat for an exact search "
                "on the GPU.",
                stacklevel=3,
            )
        hq, hb = (np.ascontiguousarray(t.cpu().numpy()) for t in (xq, xb))
        if self.index_kind == "ivf":
            scores, ids = self.ivf.search(hq, hb, k, nprobe=self.nprobe)
        else:
            scores, ids = faiss_search(hq, hb, k, self.index_kind, nprobe=self.nprobe, ef_search=self.ef_search)
        return torch.from_numpy(scores).to(x_rows.device), torch.from_numpy(ids).to(x_rows.device)

    # ------------------------------------------------------------------ loss
    def __call__(
        self, x_rows: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, RepulsionStats]:
        self.calls += 1
        with torch.no_grad():
            value, y, st = self._value_and_rows(x_rows.detach(), x_all, layout, alpha)
        return LinearizedRowSum.apply(x_rows, value, y), st

    def _value_and_rows(
        self, xr: torch.Tensor, x_all: torch.Tensor, layout: PairLayout, alpha: float
    ) -> tuple[torch.Tensor, torch.Tensor, RepulsionStats]:
        dev = xr.device
        st = RepulsionStats.zeros(dev)
        m, n, v = xr.shape[0], x_all.shape[0], layout.views
        row_ids = torch.arange(layout.offset, layout.offset + m, device=dev)
        scores, ids = self.search(xr, x_all)
        k = ids.shape[1]
        found = ids >= 0
        st.candidates = found.sum().to(torch.float64)

        # Rows whose weakest returned candidate is still inside the exclusion zone may have more neighbours
        # than k: recompute them exactly. When k == n every column was searched, so nothing can be missing.
        saturated = found.all(dim=1) & (scores[:, -1] > alpha - _SATURATION_MARGIN)
        if k >= n:
            saturated = torch.zeros_like(saturated)
        st.saturated_rows = saturated.sum().to(torch.float64)
        keep = ~saturated

        value = torch.zeros((), dtype=torch.float64, device=dev)
        y = torch.zeros_like(xr)

        # Positives from the layout: a rank owns whole images, so they are its own rows, (B_r, V, V) apart.
        xr3 = xr.reshape(m // v, v, -1)
        xc3 = x_all[layout.offset : layout.offset + m].reshape(m // v, v, -1)  # the same rows, as columns
        pos_sim = xr3 @ xc3.transpose(1, 2)  # (B_r, V, D) @ (B_r, D, V) -> (B_r, V, V)
        off_diag = ~torch.eye(v, dtype=torch.bool, device=dev)
        pos_act = (pos_sim > alpha) & off_diag & keep.reshape(-1, v, 1)
        st.active_pos = pos_act.sum().to(torch.float64)
        pos_max = pos_sim.masked_fill(~off_diag, -2.0).amax(dim=2).reshape(m)  # (m,)
        if layout.mode != "negatives":
            w = pos_act.to(xr.dtype)
            value += ((pos_sim - alpha) * w).sum(dtype=torch.float64)
            y += (w @ xc3).reshape(m, -1)  # (B_r, V, V) @ (B_r, V, D)

        # Negatives from the search: every candidate's similarity recomputed exactly, in fixed-shape chunks
        # of rows (no data-dependent shapes, so no host synchronisation); on the CPU only the chunks that
        # can change a result (see _chunk_starts).
        neg = found & (ids // v != (row_ids // v)[:, None]) & keep[:, None]  # (m, k)
        cand = ids.clamp(min=0)
        neg_max = torch.full((m,), -2.0, dtype=xr.dtype, device=dev)
        active_neg = torch.zeros((), dtype=torch.float64, device=dev)
        # Candidates gathered at once: (rows × k × D) <= tile², the scratch bound of the tiled backend too.
        chunk = max(1, self.tile_size * self.tile_size // max(1, k * xr.shape[1]))
        for r0 in self._chunk_starts(xr, x_all, scores, neg, alpha, chunk):
            r1 = min(r0 + chunk, m)
            xc = x_all[cand[r0:r1]]  # (rows, k, D)
            sim = (xc @ xr[r0:r1, :, None]).squeeze(2)  # (rows, k, D) @ (rows, D, 1) -> (rows, k)
            nmask = neg[r0:r1]
            act = (sim > alpha) & nmask
            active_neg += act.sum()
            neg_max[r0:r1] = sim.masked_fill(~nmask, -2.0).amax(dim=1)
            if layout.mode != "positives":
                w = act.to(xr.dtype)
                value += ((sim - alpha) * w).sum(dtype=torch.float64)
                y[r0:r1] += (w[:, None, :] @ xc).squeeze(1)  # (rows, 1, k) @ (rows, k, D)
        st.active_neg = active_neg
        row_max = torch.maximum(pos_max, neg_max).masked_fill(saturated, -2.0)
        if m:
            st.max_cos = torch.maximum(st.max_cos, row_max.max().to(torch.float64))

        sat = saturated.nonzero().squeeze(1)  # the one host read of this backend: it sizes the fallback
        if sat.numel() == m:  # every row (near collapse): the contiguous rows take tiled's fast blocks
            v_sat, y_sat = blockwise_rows(
                xr, row_ids, x_all, layout, alpha, self.tile_size, st, first_row=layout.offset
            )
            value += v_sat
            y += y_sat
        elif sat.numel():
            v_sat, y_sat = blockwise_rows(xr[sat], row_ids[sat], x_all, layout, alpha, self.tile_size, st)
            value += v_sat
            y.index_add_(0, sat, y_sat)

        if self.recall_every and (self.calls - 1) % self.recall_every == 0:
            self._recall(xr, x_all, row_ids, layout, alpha, ids, saturated, st)
        return value, y, st

    @staticmethod
    def _chunk_starts(
        xr: torch.Tensor, x_all: torch.Tensor, scores: torch.Tensor, neg: torch.Tensor, alpha: float, chunk: int
    ) -> list[int] | range:
        """First rows of the candidate chunks whose exact recomputation can change a result.

        On CUDA: every chunk (a data-dependent choice would be a host read). On the CPU reading a value costs
        nothing, and gathering every row's k candidates (m · k · D floats) is what dominates this backend's time
        when few pairs are active (the spread regime: none at all among the negatives), so a chunk is
        recomputed only if one of its rows has a negative candidate that (a) the search scores above
        ``alpha - margin`` (any active pair: the search's score is within the margin of the exact cosine,
        the same bound the saturation test relies on), or (b) could hold the batch's largest negative
        cosine (its best score within two margins of the best one; ``max_cos``). A skipped chunk has no
        active pair, so it would add exact zeros to the value and the rows, and only negatives below the
        batch maximum to ``max_cos``: the results are those of computing every chunk, bit for bit. A
        non-finite input (whose zeros would be NaN) takes every chunk.
        """
        m = xr.shape[0]
        every = range(0, m, chunk)
        if xr.device.type != "cpu" or not m:
            return every
        # CPU tensors only from here: their values are read through NumPy views of host memory (no device to
        # wait for, unlike the CUDA path above, which reads nothing).
        if not torch.isfinite(x_all).all().numpy():
            return every
        if not neg.any().numpy():
            return []
        best = torch.where(neg, scores, torch.full_like(scores, -3.0)).amax(dim=1)  # best negative score per row
        near = (neg & (scores > alpha - _SATURATION_MARGIN)).any(dim=1)
        rows = near | (best >= best.max() - 2 * _SATURATION_MARGIN)
        hit = torch.zeros(len(every), dtype=torch.bool)
        hit.index_fill_(0, rows.nonzero().squeeze(1) // chunk, True)
        return (hit.nonzero().squeeze(1) * chunk).numpy().tolist()

    def _recall(
        self,
        xr: torch.Tensor,
        x_all: torch.Tensor,
        row_ids: torch.Tensor,
        layout: PairLayout,
        alpha: float,
        ids: torch.Tensor,
        saturated: torch.Tensor,
        st: RepulsionStats,
    ) -> None:
        """Found vs truly active (allowed) pairs on a strided sample of rows, into ``st`` (device tensors).

        Positives count as found (they come from the layout), and so do saturated rows (computed exactly).
        """
        m, n, v = xr.shape[0], x_all.shape[0], layout.views
        stride = max(1, -(-m // _RECALL_ROWS))
        sample = torch.arange((self.calls - 1) % stride, m, stride, device=xr.device)  # varies between calls
        sim = xr[sample] @ x_all.T  # (s, D) @ (D, M_g)
        cols = torch.arange(n, device=xr.device)
        rows = row_ids[sample]
        not_self = rows[:, None] != cols[None, :]
        same = rows[:, None] // v == cols[None, :] // v
        allowed = {"all": not_self, "negatives": ~same, "positives": same & not_self}[layout.mode]
        truth = (sim > alpha) & allowed
        hit = torch.zeros((truth.shape[0], n + 1), dtype=torch.bool, device=xr.device)  # last: discard slot
        s_ids = ids[sample].long()
        hit.scatter_(1, torch.where(s_ids >= 0, s_ids, torch.full_like(s_ids, n)), True)
        hit = hit[:, :n] | same | saturated[sample][:, None]
        st.recall_hits = (truth & hit).sum().to(torch.float64)
        st.recall_total = truth.sum().to(torch.float64)
        st.recall_measured = torch.ones((), dtype=torch.float64, device=xr.device)
