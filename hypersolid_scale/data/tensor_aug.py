"""Batched torch implementation of the preset's augmentations, with the same semantics as the PIL path.

Used in two places: (1) the FFCV loader, after FFCV has decoded, cropped and flipped each view, runs
`BatchPhotometric` on the training device; (2) the in-memory builtin datasets run `TensorMultiCrop`
(crop + flip + photometric) on whole batches, which is what makes the CPU quickstart fast.

Every random decision is drawn per sample, with the preset's probability, from a seeded generator,
in the order of lightly's DINOViewTransform: crop -> flip -> color jitter (p, random order of the four
jitters) -> grayscale -> blur (per view type) -> solarize (global_1 only) -> normalize.
Pass ``record={}`` to get the per-sample decisions back (used by the parity tests).
"""

from __future__ import annotations

import math
from typing import Optional

import kornia
import torch
import torch.nn.functional as F

from hypersolid_scale.data.presets import MultiCropPreset

_GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2, as torchvision/PIL "L"


def _rand(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(n, generator=gen, device=gen.device).to(device)


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return lo + (hi - lo) * _rand(n, gen, device)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, 1, H, W) luminance; one channel stays as is."""
    if x.shape[1] == 1:
        return x
    w = torch.tensor(_GRAY_WEIGHTS, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * w).sum(dim=1, keepdim=True)


def sample_crop_boxes(
    n: int, height: int, width: int, scale: tuple[float, float], gen: torch.Generator,
    ratio: tuple[float, float] = (3 / 4, 4 / 3), attempts: int = 10,
) -> torch.Tensor:
    """torchvision's RandomResizedCrop.get_params, vectorised: (n, 4) float boxes (x0, y0, w, h) in pixels.

    Same algorithm: up to 10 tries of (area ~ U(scale) * H * W, log-aspect ~ U(log ratio)), the first
    that fits wins; otherwise a center crop with the aspect ratio clamped to `ratio`.
    """
    area = float(height * width)
    target = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(n, attempts, generator=gen, device=gen.device))
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * torch.rand(
        n, attempts, generator=gen, device=gen.device)
    aspect = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (h > 0) & (w <= width) & (h <= height)
    first = torch.where(ok.any(dim=1), ok.float().argmax(dim=1), torch.full((n,), -1, device=gen.device))
    u = torch.rand(n, 2, generator=gen, device=gen.device)
    boxes = torch.empty(n, 4, device=gen.device)
    idx = first.clamp(min=0)
    cw = w.gather(1, idx[:, None]).squeeze(1)
    ch = h.gather(1, idx[:, None]).squeeze(1)
    # torch.randint(0, H - h + 1) equivalent.
    boxes[:, 0] = torch.floor(u[:, 0] * (width - cw + 1))
    boxes[:, 1] = torch.floor(u[:, 1] * (height - ch + 1))
    boxes[:, 2] = cw
    boxes[:, 3] = ch
    fallback = first < 0
    if fallback.any():
        in_ratio = width / height
        if in_ratio < ratio[0]:
            fw, fh = width, int(round(width / ratio[0]))
        elif in_ratio > ratio[1]:
            fw, fh = int(round(height * ratio[1])), height
        else:
            fw, fh = width, height
        boxes[fallback] = torch.tensor(
            [(width - fw) // 2, (height - fh) // 2, fw, fh], dtype=boxes.dtype, device=boxes.device)
    return boxes


def crop_resize_flip(
    images: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, size: int, mode: str = "bilinear"
) -> torch.Tensor:
    """Crop each image to its box, resize to size x size and mirror where `flips`, in one grid_sample.

    Shape:
        images: (B, C, H, W) float in [0, 1]; boxes: (B, 4) pixels (x0, y0, w, h); flips: (B,) bool.
        Returns (B, C, size, size) float in [0, 1].
    """
    b, _, height, width = images.shape
    boxes = boxes.to(images.device, images.dtype)
    # Pixel edges -> normalised [-1, 1] coordinates (align_corners=False convention).
    x0 = 2 * boxes[:, 0] / width - 1
    x1 = 2 * (boxes[:, 0] + boxes[:, 2]) / width - 1
    y0 = 2 * boxes[:, 1] / height - 1
    y1 = 2 * (boxes[:, 1] + boxes[:, 3]) / height - 1
    sx = (x1 - x0) / 2 * torch.where(flips.to(images.device), -1.0, 1.0).to(images.dtype)
    theta = torch.zeros(b, 2, 3, device=images.device, dtype=images.dtype)
    theta[:, 0, 0] = sx
    theta[:, 0, 2] = (x0 + x1) / 2
    theta[:, 1, 1] = (y1 - y0) / 2
    theta[:, 1, 2] = (y0 + y1) / 2
    grid = F.affine_grid(theta, [b, images.shape[1], size, size], align_corners=False)
    out = F.grid_sample(images, grid, mode=mode, padding_mode="border", align_corners=False)
    return out.clamp_(0.0, 1.0)


class BatchPhotometric:
    """Color jitter, grayscale, blur, solarization and normalisation of a batch of views, per sample."""

    def __init__(self, preset: MultiCropPreset, device: torch.device, seed: int = 0) -> None:
        self.preset = preset
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)
        self.mean = torch.tensor(preset.mean, device=self.device).view(1, -1, 1, 1)
        self.std = torch.tensor(preset.std, device=self.device).view(1, -1, 1, 1)

    def reseed(self, seed: int) -> None:
        self.gen.manual_seed(seed)

    def _jitter(self, x: torch.Tensor) -> torch.Tensor:
        """torchvision ColorJitter semantics: the four jitters in a random order, drawn per sample."""
        n = x.shape[0]
        bri, con, sat, hue = self.preset.jitter_ranges()
        fb = _uniform(n, max(0.0, 1 - bri), 1 + bri, self.gen, x.device).view(n, 1, 1, 1)
        fc = _uniform(n, max(0.0, 1 - con), 1 + con, self.gen, x.device).view(n, 1, 1, 1)
        fs = _uniform(n, max(0.0, 1 - sat), 1 + sat, self.gen, x.device).view(n, 1, 1, 1)
        fh = _uniform(n, -hue, hue, self.gen, x.device)
        order = torch.argsort(torch.rand(n, 4, generator=self.gen, device=self.gen.device), dim=1).to(x.device)
        rgb = x.shape[1] == 3
        for stage in range(4):
            op = order[:, stage]
            for k in range(4):
                m = op == k
                if not bool(m.any()) or (k >= 2 and not rgb):  # saturation/hue: no-ops on one channel
                    continue
                xm = x[m]
                if k == 0:
                    y = xm * fb[m]
                elif k == 1:
                    mean = _gray(xm).mean(dim=(1, 2, 3), keepdim=True)
                    y = fc[m] * xm + (1 - fc[m]) * mean
                elif k == 2:
                    y = fs[m] * xm + (1 - fs[m]) * _gray(xm)
                else:
                    y = kornia.enhance.adjust_hue(xm, fh[m] * 2 * math.pi)
                x[m] = y.clamp(0.0, 1.0)
        return x

    def _blur(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        lo, hi = self.preset.blur_sigmas
        sigma = _uniform(n, lo, hi, self.gen, x.device)
        # PIL's GaussianBlur(radius=sigma) has std sigma; 3 sigma each side covers it. Reflect padding
        # needs the kernel to stay smaller than the image.
        k = min(2 * math.ceil(3 * hi) + 1, (min(h, w) - 1) | 1)
        return kornia.filters.gaussian_blur2d(x, (k, k), sigma[:, None].repeat(1, 2))

    def view(self, x: torch.Tensor, index: int, record: Optional[dict] = None) -> torch.Tensor:
        """Augment and normalise view number `index` ((B, C, H, W) float in [0, 1] or uint8)."""
        if x.dtype == torch.uint8:
            x = x.to(self.device, non_blocking=True).float().div_(255.0)
        else:
            x = x.to(self.device).float().clone()
        n = x.shape[0]
        p = self.preset
        jit = _rand(n, self.gen, x.device) < p.cj_prob
        if jit.any():
            x[jit] = self._jitter(x[jit])
        gray = _rand(n, self.gen, x.device) < p.gray_prob
        if gray.any():
            x[gray] = _gray(x[gray]).expand(-1, x.shape[1], -1, -1)
        blur = _rand(n, self.gen, x.device) < p.view_blur_probs()[index]
        if blur.any():
            x[blur] = self._blur(x[blur])
        sol = _rand(n, self.gen, x.device) < p.view_solarize_probs()[index]
        if sol.any():
            xs = x[sol]
            # PIL ImageOps.solarize(threshold=128) inverts pixels >= 128 (of 255).
            x[sol] = torch.where(xs >= 128 / 255, 1.0 - xs, xs)
        if record is not None:
            record.setdefault("jitter", []).append(jit.cpu())
            record.setdefault("gray", []).append(gray.cpu())
            record.setdefault("blur", []).append(blur.cpu())
            record.setdefault("solarize", []).append(sol.cpu())
        return (x - self.mean) / self.std

    def __call__(self, views: list[torch.Tensor], record: Optional[dict] = None) -> list[torch.Tensor]:
        return [self.view(v, i, record) for i, v in enumerate(views)]


class TensorMultiCrop:
    """Whole-batch multi-crop for in-memory images: crop + flip + `BatchPhotometric`, per sample."""

    def __init__(self, preset: MultiCropPreset, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.preset = preset
        self.device = torch.device(device)
        self.photometric = BatchPhotometric(preset, self.device, seed=seed + 1)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)

    def reseed(self, seed: int) -> None:
        self.gen.manual_seed(seed)
        self.photometric.reseed(seed + 1)

    def __call__(self, images: torch.Tensor, record: Optional[dict] = None) -> list[torch.Tensor]:
        """images: (B, C, H, W) uint8 -> list of normalised float views [global_0, global_1, local_0, ...]."""
        x = images.to(self.device).float().div_(255.0)
        b, _, h, w = x.shape
        out = []
        for i, (size, scale) in enumerate(zip(self.preset.view_sizes(), self.preset.view_scales())):
            boxes = sample_crop_boxes(b, h, w, scale, self.gen)
            flips = torch.rand(b, generator=self.gen, device=self.gen.device) < self.preset.hflip_prob
            view = crop_resize_flip(x, boxes, flips, size)
            if record is not None:
                record.setdefault("area", []).append((boxes[:, 2] * boxes[:, 3] / (h * w)).cpu())
                record.setdefault("flip", []).append(flips.cpu())
            out.append(self.photometric.view(view, i, record))
        return out
