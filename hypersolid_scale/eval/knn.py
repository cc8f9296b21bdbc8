"""k-nearest-neighbour classification with cosine similarity (the paper's kNN protocol).

One exact FAISS search for the largest K serves every K of the list: the top-k neighbours of a query
are the first k columns of its top-K_max list. Two votes per K:

- majority: the most frequent label among the k neighbours; ties go to the smallest class index
  (the rule scikit-learn's ``KNeighborsClassifier`` uses, so predictions match it exactly);
- weighted: each neighbour votes with ``exp(cos / T)`` (the temperature-weighted vote of
  Wu et al. 2018 / DINO), ties again to the smallest class index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hypersolid_scale.eval.cosine_search import as_unit_float32, chunks, knn_search
from hypersolid_scale.eval.skips import NotApplicable


def _labels_np(labels: torch.Tensor | np.ndarray, n: int, name: str) -> np.ndarray:
    y = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    y = y.astype(np.int64).ravel()
    if y.shape[0] != n:
        raise ValueError(f"{name} has {y.shape[0]} labels for {n} feature rows; they must match")
    if n and y.min() < 0:  # unlabelled data: there is no class to predict
        raise NotApplicable(f"{name} holds negative labels (unlabelled samples); kNN needs class indices 0..C-1")
    return y


def knn_predict(
    train_feats: torch.Tensor | np.ndarray,
    train_labels: torch.Tensor | np.ndarray,
    test_feats: torch.Tensor | np.ndarray,
    *,
    ks: Sequence[int] = (20,),
    temperature: float = 0.07,
    num_classes: int | None = None,
    chunk: int = 4096,
    use_gpu: bool | None = None,
) -> dict[str, np.ndarray]:
    """Predicted labels of every test row for each K and vote.

    Returns ``{"k{K}_majority": (m,) int64, "k{K}_weighted": (m,) int64, ...}``.
    """
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks={list(ks)} must be a non-empty list of integers >= 1")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    base = as_unit_float32(train_feats)
    queries = as_unit_float32(test_feats)
    if base.shape[1] != queries.shape[1]:
        raise ValueError(f"train features have dim {base.shape[1]} but test features {queries.shape[1]}")
    y_train = _labels_np(train_labels, base.shape[0], "train_labels")
    n_cls = int(num_classes if num_classes is not None else y_train.max() + 1)
    k_max = ks[-1]
    if k_max > base.shape[0]:
        raise NotApplicable(
            f"largest K={k_max} exceeds the {base.shape[0]} training samples (the memory bank); lower knn_k"
        )

    sims, idx = knn_search(base, queries, k_max, chunk=chunk, use_gpu=use_gpu)
    out = {f"k{k}_{vote}": np.empty(queries.shape[0], np.int64) for k in ks for vote in ("majority", "weighted")}
    for sl in chunks(queries.shape[0], chunk):
        nb_labels = y_train[idx[sl]]  # (c, K_max)
        c = nb_labels.shape[0]
        # Subtract the row max before exp: same argmax, no overflow for small T.
        w = np.exp((sims[sl] - sims[sl, :1]) / temperature)  # (c, K_max)
        # Votes via one bincount over (row, class) cells: O(c*k) time and O(c*C) memory per K.
        cell = np.arange(c)[:, None] * n_cls + nb_labels  # (c, K_max)
        for k in ks:
            flat = cell[:, :k].ravel()
            counts = np.bincount(flat, minlength=c * n_cls).reshape(c, n_cls)
            weighted = np.bincount(flat, weights=w[:, :k].ravel(), minlength=c * n_cls).reshape(c, n_cls)
            out[f"k{k}_majority"][sl] = counts.argmax(axis=1)
            out[f"k{k}_weighted"][sl] = weighted.argmax(axis=1)
    return out


def knn_accuracy(
    train_feats: torch.Tensor | np.ndarray,
    train_labels: torch.Tensor | np.ndarray,
    test_feats: torch.Tensor | np.ndarray,
    test_labels: torch.Tensor | np.ndarray,
    ks: Sequence[int] = (20,),
    temperature: float = 0.07,
) -> dict[str, float]:
    """Top-1 kNN accuracy in percent for each K, majority and weighted votes.

    Returns ``{"knn_k{K}_majority": acc%, "knn_k{K}_weighted": acc%, ...}``.

    Shape:
        train_feats (n, d), train_labels (n,), test_feats (m, d), test_labels (m,).
    """
    y_test = _labels_np(test_labels, len(test_feats), "test_labels")
    y_train = _labels_np(train_labels, len(train_feats), "train_labels")
    n_cls = int(max(y_train.max(), y_test.max()) + 1)
    preds = knn_predict(train_feats, y_train, test_feats, ks=ks, temperature=temperature, num_classes=n_cls)
    return {f"knn_{name}": float(100.0 * (p == y_test).mean()) for name, p in preds.items()}
