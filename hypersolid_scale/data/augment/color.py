"""Colour arithmetic of the photometric augmentations, on batches (B, C, H, W) of floats in [0, 1].

Hand-written hue rotation: kornia's ``adjust_hue`` (RGB -> HSV -> RGB) issues about a hundred calls; the batched
chain (`photometric.BatchPhotometric`) evaluates the hue at each of the four jitter stages for the whole batch,
so the same HSV rotation is written here in about twenty elementwise calls (equal to kornia's within float
rounding: tests/test_device_stage.py).
"""

from __future__ import annotations

import torch

GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2, as torchvision/PIL "L"
_HUE_OFFSETS = (5.0, 3.0, 1.0)  # HSV -> RGB: n for (r, g, b)
_CONSTANTS: dict[tuple[tuple[float, ...], torch.device, torch.dtype], torch.Tensor] = {}


def channel_constant(values: tuple[float, ...], like: torch.Tensor) -> torch.Tensor:
    """`values` as a (1, C, 1, 1) tensor on the device and in the dtype of `like`.

    Eager, each is made once per device and dtype and kept, from one fill per value on the device:
    ``torch.tensor(..., device=cuda)`` copies from pageable host memory and waits for the kernels queued before
    it, a host synchronisation (the device stage must make none, not even on the eager chain's first batch: the
    CUDA test of tests/test_device_stage.py). The fills round each value to the dtype as ``torch.tensor`` does.
    Under ``torch.compile`` it is made in the graph, where it is a constant.
    """
    if torch.compiler.is_compiling():
        return torch.tensor(values, device=like.device, dtype=like.dtype).view(1, -1, 1, 1)
    key = (values, like.device, like.dtype)
    if (t := _CONSTANTS.get(key)) is None:
        filled = [torch.full((), v, device=like.device, dtype=like.dtype) for v in values]
        t = _CONSTANTS[key] = torch.stack(filled).view(1, -1, 1, 1)
    return t


def gray(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, 1, H, W) luminance; one channel stays as is."""
    if x.shape[1] == 1:
        return x
    return (x * channel_constant(GRAY_WEIGHTS, x)).sum(dim=1, keepdim=True)


def hue_shift(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """RGB (B, 3, H, W) in [0, 1] with each image's hue turned by `shift` (B,) turns (torchvision's
    ``adjust_hue`` factor): HSV's hue moves, saturation and value stay.

    HSV -> RGB per channel n in (5, 3, 1) for (r, g, b): ``V - C * clamp(min(k, 4 - k), 0, 1)`` with
    ``k = (n + 6 h) mod 6``, V the largest channel and C the spread (max - min).
    """
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    v = torch.maximum(torch.maximum(r, g), b)
    spread = v - torch.minimum(torch.minimum(r, g), b)
    safe = torch.where(spread > 0, spread, torch.ones_like(spread))
    # The hue in sixths of a turn, from the largest channel (red first, then green, as torchvision breaks ties).
    sixths = torch.where(
        v == r, torch.remainder((g - b) / safe, 6.0), torch.where(v == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0)
    )
    sixths = torch.remainder(sixths + 6.0 * shift.view(-1, 1, 1, 1), 6.0)
    k = torch.remainder(channel_constant(_HUE_OFFSETS, x) + sixths, 6.0)
    return v - spread * torch.minimum(k, 4.0 - k).clamp(0.0, 1.0)
