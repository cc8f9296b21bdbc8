"""Top-k inner-product search for the ``neighbors`` backend: torch on the device, or FAISS.

* :func:`topk_inner_product`: exact, blockwise matmul + top-k in torch, on whatever device the inputs live
  (what a flat GPU index does, with no extra package); nothing leaves the device.
* :func:`faiss_search`: FAISS ``flat`` / ``ivf`` / ``hnsw`` on host (NumPy) arrays; :class:`ReusedIVF`: the
  ``ivf`` one with its coarse quantizer kept across searches.
* :func:`faiss_gpu_ivf_search`: FAISS GPU IVF on CUDA tensors through ``faiss.contrib.torch_utils`` (no
  host copy; FAISS runs on torch's current stream), when faiss-gpu is installed.

FAISS is imported on first use, so the torch path needs no FAISS at all.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def topk_inner_product(
    queries: torch.Tensor, base: torch.Tensor, k: int, *, tile: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of ``queries @ base.T`` per row, one (tile × tile) block of similarities at a time.

    Shape:
        queries: (m, D), base: (n, D), same device and dtype; 1 <= k <= n.
        Returns ``(scores, ids)``, both (m, k): scores in the input dtype sorted descending, ids int64 into
        ``base``. Ties are broken arbitrarily (as by any index).

    Memory is O(tile · (tile + k)); the running top-k of each row block is merged with each column block's.
    """
    m, n = queries.shape[0], base.shape[0]
    if queries.dim() != 2 or base.dim() != 2 or queries.shape[1] != base.shape[1]:
        raise ValueError(
            f"queries (m, D) and base (n, D) must share D; got {tuple(queries.shape)} and {tuple(base.shape)}"
        )
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the number of base vectors ({n})")
    if tile < 1:
        raise ValueError(f"tile={tile} must be a positive integer")
    scores = torch.empty((m, k), dtype=queries.dtype, device=queries.device)
    ids = torch.empty((m, k), dtype=torch.long, device=queries.device)
    for r0 in range(0, m, tile):
        q = queries[r0 : r0 + tile]
        best_s: torch.Tensor | None = None
        best_i: torch.Tensor | None = None
        for c0 in range(0, n, tile):
            sim = q @ base[c0 : c0 + tile].T  # (rows, D) @ (D, cols) -> (rows, cols)
            s, i = sim.topk(min(k, sim.shape[1]), dim=1)
            i = i + c0
            if best_s is None or best_i is None:
                best_s, best_i = s, i
                continue
            cat_s, cat_i = torch.cat([best_s, s], dim=1), torch.cat([best_i, i], dim=1)
            best_s, pos = cat_s.topk(min(k, cat_s.shape[1]), dim=1)
            best_i = cat_i.gather(1, pos)
        assert best_s is not None and best_i is not None  # n >= 1 column
        scores[r0 : r0 + tile], ids[r0 : r0 + tile] = best_s, best_i
    return scores, ids


# ---------------------------------------------------------------------------------------------------- FAISS
def _faiss() -> Any:
    import faiss

    return faiss


def faiss_gpu_available() -> bool:
    """True when the installed FAISS has GPU support and sees a GPU."""
    try:
        faiss = _faiss()
    except ImportError:
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


_GPU_RESOURCES: list[Any] = []  # FAISS GPU resources, made once per process


def _gpu_resources() -> Any:
    """FAISS GPU resources, one per process (cached)."""
    if not _GPU_RESOURCES:
        _GPU_RESOURCES.append(_faiss().StandardGpuResources())
    return _GPU_RESOURCES[0]


def ivf_lists(n: int) -> int:
    """About 4·sqrt(n) inverted lists, with at least 39 training points per list (FAISS's minimum)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def _trained_ivf(xb: np.ndarray, nlist: int) -> Any:
    """A FAISS IVF-Flat index (inner product) with ``nlist`` lists, its coarse quantizer trained (10 k-means
    iterations) on a fixed sample of ``xb`` (64 points per list), holding no vectors yet."""
    faiss = _faiss()
    n, d = xb.shape
    idx = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    idx.cp.niter = 10
    rng = np.random.default_rng(0)
    idx.train(xb[rng.choice(n, size=min(n, 64 * nlist), replace=False)])
    return idx


def faiss_search(
    xq: np.ndarray, xb: np.ndarray, k: int, index: str, *, nprobe: int = 16, ef_search: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """FAISS on host arrays (float32, C-contiguous). Returns (scores, ids), (m, k); ids == -1: not found."""
    faiss = _faiss()
    n, d = xb.shape
    if index == "hnsw":  # no GPU HNSW in FAISS
        idx = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efSearch = max(ef_search, k)
    elif index == "flat":
        idx = faiss.IndexFlatIP(d)
    elif index == "ivf":
        nlist = ivf_lists(n)
        idx = _trained_ivf(xb, nlist)
        idx.nprobe = min(nprobe, nlist)
    else:
        raise ValueError(f"FAISS index {index!r} is not valid; choose flat, ivf or hnsw")
    idx.add(xb)
    return idx.search(xq, k)


class ReusedIVF:
    """A FAISS IVF-Flat index (inner product, on the host) whose coarse quantizer is trained once and kept for
    ``retrain_every`` searches: a search then only assigns the base vectors to the kept lists (``reset`` +
    ``add``: O(n · nlist · D)) instead of running k-means over a sample of them first (10 iterations over
    64 · nlist points: about 10x that). Embeddings drift slowly between steps, so centroids of a few steps ago
    still split them into lists of similar sizes; the search stays as exact as its nprobe makes it (with
    nprobe = nlist it is exhaustive, whatever the centroids) and its recall is what ``recall_every`` measures.
    ``retrain_every=1`` trains at every search, as :func:`faiss_search` does, with the same sample and result.
    A change of D or of the list count (another number of base vectors) retrains at once."""

    def __init__(self, retrain_every: int) -> None:
        if retrain_every < 1:
            raise ValueError(f"retrain_every={retrain_every} must be >= 1")
        self.retrain_every = int(retrain_every)
        self.index: Any = None
        self.age = 0  # searches since the last training
        self.trainings = 0

    def search(self, xq: np.ndarray, xb: np.ndarray, k: int, *, nprobe: int = 16) -> tuple[np.ndarray, np.ndarray]:
        """Like ``faiss_search(xq, xb, k, "ivf", nprobe=nprobe)``, the quantizer trained only when due."""
        n, d = xb.shape
        nlist = ivf_lists(n)
        stale = self.index is None or self.age >= self.retrain_every
        if stale or self.index.d != d or self.index.nlist != nlist:
            self.index = _trained_ivf(xb, nlist)
            self.age, self.trainings = 0, self.trainings + 1
        else:
            self.index.reset()  # the vectors go; the trained centroids stay
        self.index.nprobe = min(nprobe, nlist)
        self.index.add(xb)
        self.age += 1
        return self.index.search(xq, k)


def faiss_gpu_ivf_search(
    xq: torch.Tensor, xb: torch.Tensor, k: int, *, nprobe: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """FAISS GPU IVF-Flat (inner product) on CUDA tensors; results stay on the device.

    Shape: xq (m, D), xb (n, D) float32 CUDA tensors. Returns (scores, ids), (m, k); ids == -1: not found.
    """
    faiss = _faiss()
    import faiss.contrib.torch_utils  # noqa: F811  (lets FAISS indexes take torch tensors, on torch's stream)

    n, d = xb.shape
    nlist = ivf_lists(n)
    cfg = faiss.GpuIndexIVFFlatConfig()
    cfg.device = xb.device.index if xb.device.index is not None else torch.cuda.current_device()
    index = faiss.GpuIndexIVFFlat(_gpu_resources(), d, nlist, faiss.METRIC_INNER_PRODUCT, cfg)
    if hasattr(index, "cp"):
        index.cp.niter = 10
    # A deterministic spread-out training sample, chosen on the device (no host copy).
    step = max(1, n // (64 * nlist))
    index.train(xb[::step].contiguous())
    index.nprobe = min(nprobe, nlist)
    index.add(xb.contiguous())
    scores, ids = index.search(xq.contiguous(), k)
    return scores, ids.long()
