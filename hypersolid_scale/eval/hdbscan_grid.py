"""HDBSCAN's settings grid as a diagnostic (the ``hdbscan_grid`` evaluation suite; docs/evaluation.md).

One HDBSCAN score says little on its own: merging ten classes into three clusters and labelling half the points
as noise can give the same AMI. For each setting this suite reports what the clustering did, not only how well
it matched the labels: the noise share, the number of clusters and the cluster sizes, beside NMI, AMI and ARI.

Grid (every combination), on class-balanced seeded subsamples of the test split:

* ``min_cluster_size`` in ``eval.hdbscan_grid_sizes`` and ``min_samples`` equal to it or fixed at 5;
* cluster selection: excess of mass (``eom``, the usual one) and ``leaf`` (the finest clusters of the tree);
* metric: ``euclidean`` on the features and ``cosine`` distance (1 − cos, what the protocol's HDBSCAN uses);
* features: raw and centred (minus the train split's mean);
* subsamples of ``eval.hdbscan_grid_per_class`` images per class (e.g. 50: ImageNet-1k's validation split, where
  the paper ran HDBSCAN, has 50 images per class).

scikit-learn's HDBSCAN runs on a precomputed distance matrix per (subsample, metric): one O(n²) matrix shared by
the grid's fits, which keeps subsamples of a few thousand images fast in any feature dimension.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hypersolid_scale.eval.skips import NotApplicable, require_class_labels

SELECTIONS = ("eom", "leaf")
METRICS = ("euclidean", "cosine")
NORMS = ("raw", "centred")
FIXED_MIN_SAMPLES = 5
TOP_SIZES = 10  # the cluster-size table keeps this many largest clusters (and counts the rest)


def balanced_subsample(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Sorted indices of ``per_class`` seeded draws from each class (all of a class that has fewer)."""
    rng = np.random.default_rng(seed)
    picks = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        picks.append(rng.choice(idx, size=min(per_class, idx.size), replace=False))
    return np.sort(np.concatenate(picks))


def _distances(x: np.ndarray, metric: str) -> np.ndarray:
    """The float64 pairwise distance matrix: Euclidean, or cosine distance 1 − cos (clipped at 0)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
    if metric == "cosine":
        u = t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)
        d = (1.0 - u @ u.T).clamp_min(0.0).numpy()
    else:
        d = torch.cdist(t, t).numpy()
    np.fill_diagonal(d, 0.0)
    return d


def _one(d: np.ndarray, y: np.ndarray, mcs: int, ms: int, selection: str) -> dict[str, Any]:
    from sklearn.cluster import HDBSCAN
    from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score

    pred = HDBSCAN(
        min_cluster_size=mcs, min_samples=ms, metric="precomputed", cluster_selection_method=selection, copy=True
    ).fit_predict(d)
    clustered = pred[pred >= 0]
    sizes = np.sort(np.bincount(clustered))[::-1] if clustered.size else np.zeros(0, np.int64)
    return {
        "min_cluster_size": mcs,
        "min_samples": ms,
        "selection": selection,
        "n_clusters": int(sizes.size),
        "noise_fraction": float(np.mean(pred < 0)),
        "largest_fraction": float(sizes[0] / pred.size) if sizes.size else 0.0,
        # noise scored as one more cluster, as the protocol does
        "nmi": float(normalized_mutual_info_score(y, pred)),
        "ami": float(adjusted_mutual_info_score(y, pred)),
        "ari": float(adjusted_rand_score(y, pred)),
        "sizes": [int(s) for s in sizes[:TOP_SIZES]],
        "sizes_rest": int(sizes[TOP_SIZES:].sum()),
    }


def hdbscan_grid(
    x_tr: torch.Tensor,
    x_te: torch.Tensor,
    y_te: torch.Tensor,
    *,
    sizes: Sequence[int],
    per_class: Sequence[int],
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Every setting of the grid (module docstring) on the test features ``x_te`` (``x_tr``: the train split,
    whose mean centres both); one row per fit with its subsample, norm and metric."""
    y = y_te.numpy().astype(np.int64)
    require_class_labels(y, "the HDBSCAN grid")
    mean = x_tr.double().mean(0)
    rows: list[dict[str, Any]] = []
    for n_per in per_class:
        sub = balanced_subsample(y, n_per, seed)
        ys, x = y[sub], x_te[sub].double()
        for norm, metric in itertools.product(NORMS, METRICS):
            d = _distances((x - mean if norm == "centred" else x).numpy(), metric)
            for mcs in sizes:
                if mcs >= len(sub):
                    raise NotApplicable(f"min_cluster_size {mcs} needs more than the {len(sub)} subsampled points")
                for ms, selection in itertools.product(sorted({mcs, FIXED_MIN_SAMPLES}), SELECTIONS):
                    fit = _one(d, ys, mcs, ms, selection)
                    rows.append({"per_class": n_per, "n": int(len(sub)), "norm": norm, "metric": metric, **fit})
    return rows


def grid_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The grid's numbers as flat metric keys, ``hdbscan_grid.pc<per class>.<norm>.<metric>.<selection>.mcs<m>.ms<s>
    .<score>`` (the size table stays in the rows)."""
    out: dict[str, float] = {}
    for r in rows:
        stem = (
            f"hdbscan_grid.pc{r['per_class']}.{r['norm']}.{r['metric']}.{r['selection']}"
            f".mcs{r['min_cluster_size']}.ms{r['min_samples']}"
        )
        for k in ("n_clusters", "noise_fraction", "largest_fraction", "nmi", "ami", "ari"):
            out[f"{stem}.{k}"] = r[k]
    return out
