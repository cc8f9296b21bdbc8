"""Interpolation profile (the paper's "Neighborhood Properties"): how empty is the space between two embeddings?

For random pairs (A, B) of real embeddings, points z(t) = (1 − t) x̂_A + t x̂_B for t in [0, 1] are
projected back to the sphere and their cosine distance to the nearest real embedding, 1 − max_i cos(z(t), x̂_i),
is measured. The ends are real embeddings (distance 0); a bump in the middle is a low-density gap.
Intra-class (positive) paths should stay in dense regions, inter-class (negative) paths should cross gaps.
"""

from __future__ import annotations

import numpy as np
import torch

from hypersolid_scale.eval.cosine_search import as_unit_float32, knn_search
from hypersolid_scale.eval.skips import NotApplicable


def _pairs(y: np.ndarray, n_pairs: int, same: bool, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n_pairs`` seeded pairs of distinct indices with equal (same=True) or different labels."""
    a_out, b_out = np.empty(0, np.int64), np.empty(0, np.int64)
    for _ in range(1000):  # rejection sampling; stops early as soon as enough pairs are found
        a, b = rng.integers(0, len(y), 4 * n_pairs), rng.integers(0, len(y), 4 * n_pairs)
        keep = (a != b) & ((y[a] == y[b]) if same else (y[a] != y[b]))
        a_out, b_out = np.concatenate([a_out, a[keep]]), np.concatenate([b_out, b[keep]])
        if len(a_out) >= n_pairs:
            return a_out[:n_pairs], b_out[:n_pairs]
    kind = "same-class" if same else "different-class"
    raise NotApplicable(f"could not draw {n_pairs} {kind} pairs; the labels need >= 2 classes with >= 2 samples")


def interpolation_profile(
    feats: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    *,
    n_pairs: int = 200,
    n_steps: int = 21,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Mean and std over pairs of the distance to the nearest real embedding along A→B paths.

    Returns ``{"t": (n_steps,), "pos_mean", "pos_std", "neg_mean", "neg_std"}`` as lists of floats;
    ``pos`` are same-class pairs, ``neg`` different-class pairs.
    """
    x = as_unit_float32(feats)
    y = (labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)).astype(np.int64)
    if len(y) != x.shape[0]:
        raise ValueError(f"{len(y)} labels for {x.shape[0]} embeddings; they must match")
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, n_steps, dtype=np.float32)
    out: dict[str, list[float]] = {"t": t.tolist()}
    for name, same in (("pos", True), ("neg", False)):
        a, b = _pairs(y, n_pairs, same, rng)
        z = (1.0 - t)[None, :, None] * x[a][:, None] + t[None, :, None] * x[b][:, None]  # (P, T, d)
        sims, _ = knn_search(x, as_unit_float32(z.reshape(-1, x.shape[1])), 1)
        dist = np.clip(1.0 - sims[:, 0], 0.0, 2.0).reshape(n_pairs, n_steps)
        out[f"{name}_mean"] = dist.mean(0).tolist()
        out[f"{name}_std"] = dist.std(0).tolist()
    return out


def profile_summary(profile: dict[str, list[float]]) -> dict[str, float]:
    """Peak of the mean distance along positive and negative paths, their gap (neg − pos) and their ratio
    (neg / pos; scale-free: the gap grows with the overall spread of the embeddings, the ratio does not)."""
    pos, neg = max(profile["pos_mean"]), max(profile["neg_mean"])
    ratio = float(neg / pos) if pos > 0 else float("nan")
    return {
        "interp_pos_peak": float(pos),
        "interp_neg_peak": float(neg),
        "interp_gap": float(neg - pos),
        "interp_ratio": ratio,
    }
