"""Exact cosine search with FAISS, shared by kNN, DBSCAN's neighbourhood graph and the interpolation profile.

Vectors are L2-normalised, so inner product = cosine similarity and an exact ``IndexFlatIP`` gives the
same neighbours as a brute-force cosine search. The index lives on the GPU when faiss was built with GPU
support and CUDA is present (``faiss-gpu``); otherwise on the CPU. Queries run in chunks so that the
(chunk, k) result blocks, not an (n_query, n_base) similarity matrix, bound memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import faiss
import numpy as np
import torch


def as_unit_float32(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, as a C-contiguous float32 numpy array (what FAISS wants).

    Zero rows stay zero (they have no direction); their cosine with everything is 0.
    """
    a = x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float32)
    if a.ndim != 2:
        raise ValueError(f"expected a 2-D (n, dim) feature matrix, got shape {a.shape}")
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return np.ascontiguousarray(a / np.maximum(norms, 1e-12), dtype=np.float32)


def gpu_available() -> bool:
    """True when this faiss build has GPU indexes and a CUDA device is visible."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def flat_ip_index(base: np.ndarray, use_gpu: bool | None = None) -> faiss.Index:
    """Exact inner-product index over ``base`` (n, d), on the GPU when available (or requested)."""
    index: faiss.Index = faiss.IndexFlatIP(base.shape[1])
    if use_gpu is None:
        use_gpu = gpu_available()
    if use_gpu:
        if not gpu_available():
            raise ValueError(
                "a GPU FAISS index was requested but faiss-gpu or CUDA is missing; "
                "install faiss-gpu (see pyproject extra 'gpu') or pass use_gpu=False"
            )
        index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
    index.add(base)
    return index


def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def knn_search(
    base: np.ndarray, queries: np.ndarray, k: int, *, chunk: int = 4096, use_gpu: bool | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` cosine neighbours of each query among ``base`` rows (both already unit-norm).

    Shape:
        base (n, d), queries (m, d) -> similarities (m, k) float32 descending, indices (m, k) int64.
    """
    if k > base.shape[0]:
        raise ValueError(f"k={k} is larger than the {base.shape[0]} base vectors; lower k")
    index = flat_ip_index(base, use_gpu)
    sims = np.empty((queries.shape[0], k), np.float32)
    idx = np.empty((queries.shape[0], k), np.int64)
    for sl in chunks(queries.shape[0], chunk):
        sims[sl], idx[sl] = index.search(queries[sl], k)
    return sims, idx
