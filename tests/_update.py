"""How far apart two trainings ended, measured on the update: the global-norm distance between their final
states as a share of how far the reference moved from where both started. A relative error of the weights
themselves (|a - b| / |b|) hides an error in the update behind the size of the weights; this does not."""

from __future__ import annotations

import torch


def update_gap(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """|got - ref| / |ref - start| over the floating tensors of ``ref`` (norms over all of them together, in
    float64); ``got`` and ``start`` must hold every one of them."""
    floats = _floats(ref)
    assert floats and set(floats) <= set(got) and set(floats) <= set(start), set(floats) ^ set(got)
    diff = _squared_distance(got, ref, floats)
    moved = _squared_distance(ref, start, floats)
    assert moved > 0, "the reference did not move: an update gap would prove nothing"
    return (diff / moved) ** 0.5


def relative_move(ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """|ref - start| / |start| over the floating tensors of ``ref``: how far training moved them, for the check
    that a comparison on the update can fail (the update must be far larger than its tolerance)."""
    floats = _floats(ref)
    moved = _squared_distance(ref, start, floats)
    return (moved / sum(float(start[k].double().square().sum()) for k in floats)) ** 0.5


def _floats(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, t in tensors.items() if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _squared_distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys: list[str]) -> float:
    """sum over ``keys`` of |a[k] - b[k]|^2, in float64."""
    return sum(float((a[k].double() - b[k].double()).square().sum()) for k in keys)
