"""Plain float64 references for the Hypersolid objective, written for obviousness rather than speed."""

from __future__ import annotations

import math

import torch


def reference_loss(feats: torch.Tensor, alpha=0.9, norm_weight=1e-6, pooling="max", repel="all") -> torch.Tensor:
    """The objective of docs/design.md §1 with explicit loops over pairs (small inputs only)."""
    b, v, d = feats.shape
    norms = feats.norm(dim=-1, keepdim=True)
    x = feats / norms
    pooled = feats.max(dim=1).values if pooling == "max" else feats.mean(dim=1)
    target = (pooled / pooled.norm(dim=-1, keepdim=True)).detach()
    alignment = torch.stack([1 - x[i, j] @ target[i] for i in range(b) for j in range(v)]).mean()

    rows = x.reshape(b * v, d)
    m = b * v
    terms = []
    for i in range(m):
        for j in range(m):
            if i == j:
                continue
            same = i // v == j // v
            if (repel == "negatives" and same) or (repel == "positives" and not same):
                continue
            terms.append(torch.relu(rows[i] @ rows[j] - alpha) / (1 - alpha))
    repulsion = torch.stack(terms).sum() / (m * m) if terms else feats.sum() * 0
    normalization = norm_weight * (norms.mean() - 1) ** 2
    return alignment + repulsion + normalization


def make_feats(b: int, v: int, d: int, regime: str, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Projector-like outputs. ``spread``: few pairs above alpha; ``collapsed``: almost all of them.

    ``spread`` puts each image's views around its own direction (so same-image views can be close, as after
    training) and the images apart; ``collapsed`` puts everything around one direction, as at initialisation.
    """
    g = torch.Generator().manual_seed(seed)
    if regime == "collapsed":
        base = torch.randn(1, 1, d, generator=g, dtype=dtype)
        return 3.0 * base + 0.15 * torch.randn(b, v, d, generator=g, dtype=dtype)
    centers = torch.randn(b, 1, d, generator=g, dtype=dtype)
    return 2.0 * centers + (1.2 / math.sqrt(max(1, d / 16))) * torch.randn(b, v, d, generator=g, dtype=dtype)
