"""Simple references for the batched augmentation: one crop at a time and boolean-mask subsets.

Used by the tests (tests/test_device_stage.py) and by benchmarks/device_stage.py (the "before" rows).

They are what the batched code replaced (`data/device/batched_resize.py`, `BatchPhotometric`): each step written the
plain way, per crop or per masked subset of the batch, with host reads where convenient. The tests hold the
batched code to them.
"""

from __future__ import annotations

import math

import kornia
import torch
import torch.nn.functional as F

from hypersolid_scale.data.augment import view_params as vp
from hypersolid_scale.data.augment.color import gray as _gray
from hypersolid_scale.data.augment.photometric import BatchPhotometric, Decisions
from hypersolid_scale.data.device.batched_resize import crop_resize, pad_images
from hypersolid_scale.data.device.views import DeviceStage, _decisions


def crop_resize_one(img: torch.Tensor, row: list[float], size: int) -> torch.Tensor:
    """One view on the CPU: the box of `row` cut from `img` (C, H, W) uint8, resized by torch's 8-bit
    antialiased bicubic kernel (PIL's algorithm), mirrored; (C, size, size) float in [0, 255]."""
    top, left, h, w = (int(row[k]) for k in (vp.TOP, vp.LEFT, vp.HEIGHT, vp.WIDTH))
    crop = img[None, :, top : top + h, left : left + w].contiguous(memory_format=torch.channels_last)
    out = F.interpolate(crop, size=(size, size), mode="bicubic", antialias=True, align_corners=False)[0].float()
    return out.flip(-1) if row[vp.FLIP] else out


def kornia_blur(x: torch.Tensor, sigma: torch.Tensor, sigma_max: float) -> torch.Tensor:
    """What `data/augment/blur.py` replaced: kornia's per-sample Gaussian blur (a grouped convolution, reflect padding),
    the kernel 3 sigma each side of the preset's largest sigma and smaller than the image."""
    _, _, h, w = x.shape
    k = min(2 * math.ceil(3 * sigma_max) + 1, (min(h, w) - 1) | 1)
    return kornia.filters.gaussian_blur2d(x, (k, k), sigma.to(x.device)[:, None].repeat(1, 2))


def padded_views(stage: DeviceStage, images: list[torch.Tensor], params: torch.Tensor) -> list[torch.Tensor]:
    """`DeviceStage.views_of` as it was before its window groups: the images zero-padded to the batch's
    largest (`pad_images`), every crop of a view read over the view's largest box (`crop_resize`)."""
    padded, host = pad_images(images), params.numpy()
    out = []
    for v, size in enumerate(stage.preset.view_sizes()):
        p = params[:, v].float()
        window = (int(host[:, v, vp.HEIGHT].max()), int(host[:, v, vp.WIDTH].max()))
        x = crop_resize(padded, p[:, : vp.WIDTH + 1], p[:, vp.FLIP] > 0, size, window).div_(255.0)
        out.append(stage.photometric.apply(x, _decisions(p)).contiguous(memory_format=stage.memory_format))
    return out


def masked_photometric(aug: BatchPhotometric, x: torch.Tensor, d: Decisions) -> torch.Tensor:
    """`BatchPhotometric.apply` the plain way: each step on the boolean-mask subset it applies to."""
    x = x.float().clone()
    n = x.shape[0]
    if d.jitter.any():
        x[d.jitter] = _masked_jitter(x[d.jitter], d.factors[d.jitter], d.order[d.jitter])
    if d.gray.any():
        x[d.gray] = _gray(x[d.gray]).expand(-1, x.shape[1], -1, -1)
    if d.blur.any():
        x[d.blur] = kornia_blur(x[d.blur], d.sigma[d.blur], aug.preset.blur_sigmas[1])
    if d.solarize.any():
        xs = x[d.solarize]
        x[d.solarize] = torch.where(xs >= 128 / 255, 1.0 - xs, xs)
    assert x.shape[0] == n
    return (x - aug.mean) / aug.std


def _masked_jitter(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    fb, fc, fs = (factors[:, k].view(n, 1, 1, 1) for k in range(3))
    rgb = x.shape[1] == 3
    for stage in range(4):
        for k in range(4):
            m = order[:, stage] == k
            if not bool(m.any()) or (k >= 2 and not rgb):
                continue
            xm = x[m]
            if k == 0:
                y = xm * fb[m]
            elif k == 1:
                y = fc[m] * xm + (1 - fc[m]) * _gray(xm).mean(dim=(1, 2, 3), keepdim=True)
            elif k == 2:
                y = fs[m] * xm + (1 - fs[m]) * _gray(xm)
            else:
                y = kornia.enhance.adjust_hue(xm, factors[m, 3] * 2 * math.pi)
            x[m] = y.clamp(0.0, 1.0)
    return x
