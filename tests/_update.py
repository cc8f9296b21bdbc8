"""How far apart two trainings ended, measured on the update: the global-norm distance between their final
states as a share of how far the reference moved from where both started. A relative error of the weights
themselves (|a - b| / |b|) hides an error in the update behind the size of the weights; this does not."""

from __future__ import annotations

import torch


def update_gap(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """|got - ref| / |ref - start| over the floating tensors of ``ref`` (norms over all of them together, in
    float64); ``got`` and ``start`` must hold every one of them."""
    floats = [k for k, r in ref.items() if isinstance(r, torch.Tensor) and r.is_floating_point()]
    assert floats and set(floats) <= set(got) and set(floats) <= set(start), set(floats) ^ set(got)
    diff = sum(float((got[k].double() - ref[k].double()).square().sum()) for k in floats)
    moved = sum(float((ref[k].double() - start[k].double()).square().sum()) for k in floats)
    assert moved > 0, "the reference did not move: an update gap would prove nothing"
    return (diff / moved) ** 0.5


def relative_move(ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """|ref - start| / |start| over the floating tensors of ``ref``: how far training moved them, for the check
    that a comparison on the update can fail (the update must be far larger than its tolerance)."""
    floats = [k for k, r in ref.items() if isinstance(r, torch.Tensor) and r.is_floating_point()]
    moved = sum(float((ref[k].double() - start[k].double()).square().sum()) for k in floats)
    return (moved / sum(float(start[k].double().square().sum()) for k in floats)) ** 0.5
