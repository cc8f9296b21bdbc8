"""A Gaussian blur with one standard deviation per sample, as a fixed sum over the kernel's taps (docs/design.md §3e).

The blur is separable: a horizontal pass, then a vertical one (kornia's order), each a weighted sum of the
``k`` reflect-padded neighbours of every pixel, the weights being the sample's 1-D Gaussian. The weights are
made for the whole batch from the per-sample sigmas (on the device, nothing read back), and each pass is ``k``
multiply-adds over the whole view batch: a number of calls that does not depend on the batch (the compiled
chain fuses them into one kernel per pass), no grouped convolution, and every output is the same sum in the
same order whatever else is in the batch, so a sample's blur does not depend on the batch it is in (N ranks =
1 process, bit for bit: tests/test_data_invariance.py; a batched matrix product is not: a batch of one takes
another kernel).

Hand-written: kornia's ``gaussian_blur2d`` with per-sample sigmas runs a grouped convolution with one group per
image and channel (on a GPU about 0.6 ms per call for 128 views of 224 px). The values are kornia's (its
kernel, its reflect padding, the horizontal pass first) within float rounding; `tests/test_device_stage.py`
holds the two together.
"""

from __future__ import annotations

import math

import torch


def kernel_size(height: int, width: int, sigma_max: float) -> int:
    """The taps of the blur of the preset's largest sigma on an image of height x width: 3 sigma each side
    (PIL's GaussianBlur(radius=sigma) has std sigma), an odd size smaller than the image (reflect padding)."""
    return min(2 * math.ceil(3 * sigma_max) + 1, (min(height, width) - 1) | 1)


def gaussian_weights(sigma: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) float32: the ``k`` taps of the Gaussian of std ``sigma[b]``, normalised to sum 1 (kornia's kernel)."""
    t = (torch.arange(k, device=sigma.device) - k // 2).to(torch.float32)
    g = torch.exp(-(t * t)[None, :] / (2.0 * sigma.to(torch.float32)[:, None] ** 2))
    return g / g.sum(dim=1, keepdim=True)


def _pass(x: torch.Tensor, g: torch.Tensor, dim: int) -> torch.Tensor:
    """One separable pass along ``dim`` (3: width, 2: height) of (B, C, H, W) ``x`` with the taps ``g`` (B, k)."""
    k, r = g.shape[1], g.shape[1] // 2
    pad = (r, r, 0, 0) if dim == 3 else (0, 0, r, r)
    xp = torch.nn.functional.pad(x, pad, mode="reflect")
    n = x.shape[dim]
    out = g[:, 0, None, None, None] * xp.narrow(dim, 0, n)
    for t in range(1, k):  # the taps in one fixed order
        out = out + g[:, t, None, None, None] * xp.narrow(dim, t, n)
    return out


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, k: int) -> torch.Tensor:
    """(B, C, H, W) float32 blurred per sample with std ``sigma`` (B,) over ``k`` taps (odd, smaller than each
    side), reflect padding: the horizontal pass, then the vertical one (kornia's separable order)."""
    g = gaussian_weights(sigma, k)
    return _pass(_pass(x, g, 3), g, 2)
