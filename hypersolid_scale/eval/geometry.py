"""Latent-space geometry of embeddings (the paper's "Geometric Properties" and "Pairwise Similarities").

Conventions: ``feats`` is (n, d), ``labels`` is (n,) class indices. Directional metrics (anisotropy, angle,
center vector norm, effective rank, d') are computed on L2-normalised rows x̂_i = x_i / ||x_i||, so every
sample weighs the same; activation metrics (sparsity, feature correlation, dimension selectivity) are
computed on the raw features, where a zero is a unit that did not fire. Sums over all pairs are exact
when cheap (anisotropy needs only ||Σ x̂_i||²); metrics that need each pair (angle, d') use every
distinct pair when there are at most ``max_pairs`` of them and otherwise a seeded random sample.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import torch

from hypersolid_scale.eval.cosine_search import as_unit_float32, chunks
from hypersolid_scale.eval.skips import NotApplicable


def _np(x: torch.Tensor | np.ndarray, dtype: type = np.float32) -> np.ndarray:
    return (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).astype(dtype)


def anisotropy(feats: torch.Tensor | np.ndarray) -> float:
    """Anisotropy: mean cosine similarity over distinct pairs, (||Σ_i x̂_i||² − n) / (n(n−1)).

    0 for orthonormal sets, 1 for identical vectors; exact in O(n d), no pair sampling needed.
    """
    x = as_unit_float32(feats).astype(np.float64)
    n = x.shape[0]
    if n < 2:
        raise NotApplicable("anisotropy needs at least two embeddings")
    s = x.sum(0)
    return float((s @ s - (x * x).sum()) / (n * (n - 1)))


def center_vector_norm(feats: torch.Tensor | np.ndarray) -> float:
    """Norm of the mean of the L2-normalised embeddings, ||(1/n) Σ_i x̂_i|| in [0, 1] (0: centred, 1: collapsed)."""
    return float(np.linalg.norm(as_unit_float32(feats).astype(np.float64).mean(0)))


def subset_size(max_pairs: int) -> int:
    """Largest m with m(m-1)/2 <= max_pairs: a subset of m samples holds at most ``max_pairs`` distinct pairs."""
    return int((1 + math.isqrt(1 + 8 * max_pairs)) // 2)


def _subset(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(n) if n <= m else np.sort(rng.choice(n, size=m, replace=False))


def _upper_cos(x: np.ndarray) -> np.ndarray:
    """Cosines of all distinct pairs (i < j) of unit rows x (m, d), via one (m, m) matmul."""
    g = x @ x.T  # (m, d) @ (d, m)
    return np.clip(g[np.triu_indices(x.shape[0], k=1)].astype(np.float64), -1.0, 1.0)


def mean_pairwise_angle(feats: torch.Tensor | np.ndarray, *, max_pairs: int = 2_000_000, seed: int = 0) -> float:
    """Mean angle in degrees, arccos(x̂_i · x̂_j), over distinct pairs. 90 for orthonormal sets.

    Exact when there are at most ``max_pairs`` pairs; otherwise over all pairs of a seeded random subset
    of ``subset_size(max_pairs)`` samples (an unbiased estimate of the same mean).
    """
    x = as_unit_float32(feats)
    if x.shape[0] < 2:
        raise NotApplicable("a pairwise angle needs at least two embeddings")
    sub = _subset(x.shape[0], subset_size(max_pairs), np.random.default_rng(seed))
    return float(np.degrees(np.arccos(_upper_cos(x[sub]))).mean())


def _gram(x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """X^T X (d, d) accumulated in float64 from float32 row blocks (bounded memory, fast BLAS)."""
    g = np.zeros((x.shape[1], x.shape[1]), np.float64)
    for sl in chunks(x.shape[0], chunk):
        block = np.ascontiguousarray(x[sl], dtype=np.float32)
        g += block.T @ block  # (d, c) @ (c, d)
    return g


def effective_rank(matrix: torch.Tensor | np.ndarray) -> float:
    """Entropy effective rank (Roy & Vetterli, 2007): exp(−Σ_k p_k log p_k), p_k = σ_k / Σ_j σ_j.

    σ are the singular values of the matrix, from the eigenvalues of its smaller Gram matrix. No
    centring, no normalisation here (callers pass L2-normalised rows). n orthonormal rows give n;
    identical rows give 1.
    """
    m = _np(matrix)
    if m.ndim != 2 or min(m.shape) == 0:
        raise ValueError(f"effective_rank needs a non-empty 2-D matrix, got shape {m.shape}")
    g = _gram(m) if m.shape[0] >= m.shape[1] else _gram(m.T)
    sigma = np.sqrt(np.clip(np.linalg.eigvalsh(g), 0.0, None))
    sigma = sigma[sigma > sigma.max() * 1e-7] if sigma.max() > 0 else sigma[:0]
    if sigma.size == 0:
        return 0.0
    p = sigma / sigma.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def _class_sums(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class row sums via a sparse one-hot (C, n) @ (n, d) product: (classes, sums (C, d), counts (C,))."""
    classes, inv = np.unique(y, return_inverse=True)
    one_hot = sp.csr_matrix((np.ones(len(y)), (inv, np.arange(len(y)))), shape=(len(classes), len(y)))
    return classes, np.asarray(one_hot @ x), np.bincount(inv, minlength=len(classes)).astype(np.float64)


def class_centroids(
    feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Mean L2-normalised embedding of each class present: (classes (C,), centroids (C, d))."""
    x, y = as_unit_float32(feats).astype(np.float64), _np(labels, np.int64)
    classes, sums, counts = _class_sums(x, y)
    return classes, sums / counts[:, None]


def centroid_cosine(feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> np.ndarray:
    """(C, C) cosine similarity between class centroids (the paper's centroid heatmap)."""
    c = as_unit_float32(class_centroids(feats, labels)[1])
    return c @ c.T


def sparsity(feats: torch.Tensor | np.ndarray, atol: float = 0.0) -> float:
    """Fraction of activations with |x| <= atol in the raw features (0 default: units that did not fire after ReLU)."""
    return float(np.mean(np.abs(_np(feats)) <= atol))


def feature_correlation(feats: torch.Tensor | np.ndarray) -> float:
    """Mean absolute Pearson correlation between distinct dimensions of the raw features.

    Dimensions with zero variance (dead units) have no correlation and are left out.
    """
    x = _np(feats)
    x = x - x.mean(0, dtype=np.float64).astype(np.float32)
    cov = _gram(x) / max(x.shape[0] - 1, 1)
    std = np.sqrt(np.diag(cov))
    alive = std > 1e-12
    if alive.sum() < 2:
        return 0.0
    corr = cov[np.ix_(alive, alive)] / np.outer(std[alive], std[alive])
    k = corr.shape[0]
    return float((np.abs(corr).sum() - np.abs(np.diag(corr)).sum()) / (k * (k - 1)))


def pair_similarities(
    feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, *, max_pairs: int = 2_000_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine similarities of same-class (positive) and different-class (negative) distinct pairs.

    Positives: all pairs inside each class when they number at most ``max_pairs`` in total, otherwise all
    pairs among a seeded random subset of q members per class, with the largest q that keeps the total
    within ``max_pairs`` (every class is represented, whatever its frequency). Negatives: all
    different-class pairs among a seeded random subset of ``subset_size(max_pairs)`` samples.
    Returns (pos (p,), neg (q,)) float64.
    """
    x, y = as_unit_float32(feats), _np(labels, np.int64)
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2 or counts.max() < 2:
        raise NotApplicable("pair similarities need >= 2 classes and a class with >= 2 samples")

    def n_pos(q: int) -> int:
        c = np.minimum(counts, q)
        return int((c * (c - 1) // 2).sum())

    lo, hi = 2, int(counts.max())  # largest q with n_pos(q) <= max_pairs (at least 2: one pair per class)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if n_pos(mid) <= max_pairs else (lo, mid - 1)
    pos = [
        _upper_cos(x[members[_subset(len(members), lo, rng)]])
        for members in (np.flatnonzero(y == c) for c in classes)
        if len(members) >= 2
    ]
    sub = _subset(len(y), subset_size(max_pairs), rng)
    iu = np.triu_indices(len(sub), k=1)
    neg = _upper_cos(x[sub])[y[sub][iu[0]] != y[sub][iu[1]]]
    return np.concatenate(pos), neg


def sensitivity_index(pos: np.ndarray, neg: np.ndarray) -> float:
    """Sensitivity index d' = (μ_pos − μ_neg) / sqrt((σ²_pos + σ²_neg) / 2).

    From signal detection theory (Macmillan & Creelman, 2004): separation of the positive-pair (signal)
    and negative-pair (noise) similarity distributions in units of their pooled standard deviation.
    """
    pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
    pooled = math.sqrt((pos.var() + neg.var()) / 2.0)
    if pooled == 0.0:
        raise NotApplicable("d' is undefined when both similarity distributions have zero variance")
    return float((pos.mean() - neg.mean()) / pooled)


SELECTIVITY_BINS: tuple[tuple[str, int, float], ...] = (
    ("0", 0, 0),
    ("1-5", 1, 5),
    ("6-20", 6, 20),
    ("21plus", 21, math.inf),
)
# The same question in shares of the classes, so that it reads the same on 10 classes as on 1,000: the
# paper's absolute bins were made for ImageNet-1k (1-5 of 1,000 classes is class-specific; on Fashion-MNIST's
# 10 it is half of them, and 21+ is always empty). (name, lowest share, highest share), shares of C classes;
# the first bin holds at least one class (on C < 10, 10 % of C is under one class).
SELECTIVITY_SHARE_BINS: tuple[tuple[str, float, float], ...] = (
    ("share_le10", 0.0, 0.10),
    ("share_11-50", 0.10, 0.50),
    ("share_gt50", 0.50, 1.0),
)


def dimension_selectivity(
    feats: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, *, z: float = 1.0
) -> dict[str, float]:
    """Percent of dimensions activated by 0, 1–5, 6–20 and 21+ classes (keys "0", "1-5", "6-20", "21plus",
    the paper's Table 4 bins), and by shares of the C classes (SELECTIVITY_SHARE_BINS: "share_le10" for one
    class up to 10 % of them, "share_11-50" for more than 10 % up to half, "share_gt50" for more than half).

    Activation rule: class c activates dimension k when its class-mean activation is more than ``z``
    standard deviations above the dimension's overall mean, (μ_{c,k} − μ_k) / σ_k > z, on raw features.
    Dead dimensions (σ_k = 0) are activated by no class.
    """
    x, y = _np(feats, np.float64), _np(labels, np.int64)
    _, sums, counts = _class_sums(x, y)
    class_mean = sums / counts[:, None]  # (C, d)
    mu, sd = x.mean(0), x.std(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        active = np.where(sd > 1e-12, (class_mean - mu) / sd, 0.0) > z
    n_classes = active.sum(0)  # (d,)
    out = {name: float(100.0 * np.mean((n_classes >= lo) & (n_classes <= hi))) for name, lo, hi in SELECTIVITY_BINS}
    c = active.shape[0]
    for name, lo, hi in SELECTIVITY_SHARE_BINS:
        # a dimension of n classes is in (lo·C, hi·C], the bounds at least one class (n = 1 is in the first bin)
        low, high = max(1.0, lo * c), max(1.0, hi * c)
        inside = (n_classes >= 1) & (n_classes <= high + 1e-9) & ((n_classes > low + 1e-9) | (lo == 0.0))
        out[name] = float(100.0 * np.mean(inside))
    return out


def embedding_metrics(
    feats: torch.Tensor | np.ndarray, *, max_pairs: int = 2_000_000, seed: int = 0
) -> dict[str, float]:
    """The geometry metrics that need no labels (anisotropy, ranks, sparsity, angles, correlation)."""
    return {
        "anisotropy": anisotropy(feats),
        "feature_correlation": feature_correlation(feats),
        "center_vector_norm": center_vector_norm(feats),
        "embedding_rank": effective_rank(as_unit_float32(feats)),
        "sparsity": sparsity(feats),
        "mean_pairwise_angle_deg": mean_pairwise_angle(feats, max_pairs=max_pairs, seed=seed),
    }


def class_metrics(
    feats: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    *,
    max_pairs: int = 2_000_000,
    seed: int = 0,
    selectivity_z: float = 1.0,
) -> dict[str, float]:
    """The geometry metrics defined by the classes: d', same/different-class cosines, centroid rank,
    dimension selectivity. ``NotApplicable`` when the labels cannot form positive and negative pairs."""
    pos, neg = pair_similarities(feats, labels, max_pairs=max_pairs, seed=seed)
    out = {
        "centroid_rank": effective_rank(class_centroids(feats, labels)[1]),
        "d_prime": sensitivity_index(pos, neg),
        "pos_cos_mean": float(pos.mean()),
        "neg_cos_mean": float(neg.mean()),
    }
    sel = dimension_selectivity(feats, labels, z=selectivity_z)
    out.update({f"selectivity_{k}": v for k, v in sel.items()})
    return out


def geometry_metrics(
    feats: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    *,
    max_pairs: int = 2_000_000,
    seed: int = 0,
    selectivity_z: float = 1.0,
) -> dict[str, float]:
    """Every metric of the paper's geometry table, plus dimension selectivity, as one flat dict."""
    return {
        **embedding_metrics(feats, max_pairs=max_pairs, seed=seed),
        **class_metrics(feats, labels, max_pairs=max_pairs, seed=seed, selectivity_z=selectivity_z),
    }
