"""A Gaussian blur with one standard deviation per sample, as two batched matrix products (docs/design.md §3e).

The blur is separable: each image's blur is ``My @ x @ Mx^T``, where ``M`` is the banded matrix of the sample's
1-D Gaussian, with the reflect padding folded into its first and last rows. The matrices are built for the whole
batch from the per-sample sigmas (on the device, nothing read back) and applied with two batched products over
the whole view batch: a fixed number of calls whatever the batch, and no padded copy of the images.

Hand-written: kornia's ``gaussian_blur2d`` with per-sample sigmas runs a grouped convolution with one group per
image and channel (on a GPU about 0.6 ms per call for 128 views of 224 px, against a few hundredths of a
millisecond for the products). The values are kornia's (its kernel, its reflect padding, the horizontal pass
first) within float rounding; `tests/test_device_stage.py` holds the two together.
"""

from __future__ import annotations

import math

import torch


def kernel_size(height: int, width: int, sigma_max: float) -> int:
    """The taps of the blur of the preset's largest sigma on an image of height x width: 3 sigma each side
    (PIL's GaussianBlur(radius=sigma) has std sigma), an odd size smaller than the image (reflect padding)."""
    return min(2 * math.ceil(3 * sigma_max) + 1, (min(height, width) - 1) | 1)


def blur_matrices(sigma: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """(B, n, n) float32: row ``i`` of sample ``b`` weighs the ``k`` pixels around ``i`` with the Gaussian of
    std ``sigma[b]`` (normalised to sum 1, as kornia's kernel), reflected at the edges (``k <= n``)."""
    r = k // 2
    taps = torch.arange(k, device=sigma.device) - r  # (k,)
    t = taps.to(torch.float32)
    g = torch.exp(-(t * t)[None, :] / (2.0 * sigma.to(torch.float32)[:, None] ** 2))  # (B, k)
    g = g / g.sum(dim=1, keepdim=True)
    src = (torch.arange(n, device=sigma.device)[:, None] + taps[None, :]).abs()  # (n, k): reflect at 0 ...
    src = torch.where(src > n - 1, 2 * (n - 1) - src, src)  # ... and at n - 1 (one bounce: r <= n - 1)
    b = sigma.shape[0]
    out = torch.zeros((b, n, n), device=sigma.device, dtype=torch.float32)
    return out.scatter_add_(2, src[None].expand(b, n, k), g[:, None, :].expand(b, n, k))


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, k: int) -> torch.Tensor:
    """(B, C, H, W) float32 blurred per sample with std ``sigma`` (B,) over ``k`` taps, reflect padding:
    the horizontal pass, then the vertical one (kornia's separable order)."""
    _, _, h, w = x.shape
    mx = blur_matrices(sigma, w, k)  # (B, W, W)
    my = mx if h == w else blur_matrices(sigma, h, k)
    x = torch.matmul(x, mx.transpose(1, 2)[:, None])
    return torch.matmul(my[:, None], x)
