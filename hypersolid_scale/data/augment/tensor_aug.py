"""Batched torch multi-crop for in-memory images, with the same semantics as the PIL path: `TensorMultiCrop`
(crop + flip + `photometric.BatchPhotometric`) on whole batches, which is what makes the CPU quickstart fast.

Every random decision is drawn per sample, with the preset's probabilities, in the order of lightly's
DINOViewTransform: crop -> flip -> color jitter (p, random order of the four jitters) -> grayscale ->
blur (per view type) -> solarize (global_1 only) -> normalize.

Randomness (docs/design.md §3b): a view's decisions for a sample are fixed columns of one row of uniforms that
depends only on (seed, epoch, sample index, view) (`keyed_uniforms`, a counter-based hash), never on a
generator's history. So a sample gets the same view whatever batch, rank, world size or resume position
it is processed in (`keyed_draws.py`). Pass ``record={}`` to get the per-sample decisions back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hypersolid_scale.data.augment.keyed_draws import (
    COL_CROP,
    COL_FLIP,
    CROP_ATTEMPTS,
    NUM_COLUMNS,
    check_indices,
    keyed_uniforms,
)
from hypersolid_scale.data.augment.photometric import BatchPhotometric
from hypersolid_scale.data.augment.presets import MultiCropPreset

__all__ = ["NUM_COLUMNS", "TensorMultiCrop", "crop_resize_flip", "keyed_uniforms", "sample_crop_boxes"]


def sample_crop_boxes(
    u: torch.Tensor,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    attempts: int = CROP_ATTEMPTS,
) -> torch.Tensor:
    """torchvision's RandomResizedCrop.get_params, vectorised: (n, 4) float boxes (x0, y0, w, h) in pixels.

    `u`: (n, 2 * attempts + 2) uniforms in [0, 1): the attempts' areas, their log-aspects, then the
    position. Same algorithm: up to `attempts` tries of (area ~ U(scale) * H * W, log-aspect ~
    U(log ratio)), the first that fits wins; otherwise a center crop with the aspect ratio clamped to `ratio`.
    """
    n = u.shape[0]
    if u.ndim != 2 or u.shape[1] < 2 * attempts + 2:
        raise ValueError(f"need (n, {2 * attempts + 2}) uniforms for {attempts} crop attempts, got {tuple(u.shape)}")
    area = float(height * width)
    target = area * (scale[0] + (scale[1] - scale[0]) * u[:, :attempts])
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, attempts : 2 * attempts]
    aspect = torch.exp(log_r)
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    ok = (w > 0) & (h > 0) & (w <= width) & (h <= height)
    first = torch.where(ok.any(dim=1), ok.float().argmax(dim=1), torch.full((n,), -1, device=u.device))
    pos = u[:, 2 * attempts : 2 * attempts + 2]
    boxes = torch.empty(n, 4, device=u.device)
    idx = first.clamp(min=0)
    cw = w.gather(1, idx[:, None]).squeeze(1)
    ch = h.gather(1, idx[:, None]).squeeze(1)
    # torch.randint(0, H - h + 1) equivalent.
    boxes[:, 0] = torch.floor(pos[:, 0] * (width - cw + 1))
    boxes[:, 1] = torch.floor(pos[:, 1] * (height - ch + 1))
    boxes[:, 2] = cw
    boxes[:, 3] = ch
    # torchvision's fallback, a centred box with the aspect clamped to `ratio`, where no attempt fit; chosen per
    # row with `where` (no read of the device's mask on the host).
    in_ratio = width / height
    if in_ratio < ratio[0]:
        fw, fh = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        fw, fh = int(round(height * ratio[1])), height
    else:
        fw, fh = width, height
    fallback_box = torch.tensor([(width - fw) // 2, (height - fh) // 2, fw, fh], dtype=boxes.dtype, device=u.device)
    boxes = torch.where((first < 0)[:, None], fallback_box, boxes)
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


class TensorMultiCrop:
    """Whole-batch multi-crop for in-memory images: crop + flip + `BatchPhotometric`, per sample."""

    def __init__(self, preset: MultiCropPreset, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.preset = preset
        self.device = torch.device(device)
        self.seed = int(seed)
        self.photometric = BatchPhotometric(preset, self.device, seed=seed)

    def __call__(
        self, images: torch.Tensor, indices: torch.Tensor, epoch: int, record: dict | None = None
    ) -> list[torch.Tensor]:
        """images: (B, C, H, W) uint8 of the samples `indices` (B,) -> list of normalised float views
        [global_0, global_1, local_0, ...]."""
        with torch.autocast(self.device.type, enabled=False):  # float32 views whatever the caller's autocast
            return self._crops(images, indices, epoch, record)

    def _crops(
        self, images: torch.Tensor, indices: torch.Tensor, epoch: int, record: dict | None
    ) -> list[torch.Tensor]:
        idx = check_indices(indices, images.shape[0]).cpu()  # the draws on the host: nothing read back
        x = images.to(self.device).float().div_(255.0)
        _, _, h, w = x.shape
        out = []
        for i, (size, scale) in enumerate(zip(self.preset.view_sizes(), self.preset.view_scales())):
            u = keyed_uniforms(self.seed, epoch, idx, i)
            boxes = sample_crop_boxes(u[:, COL_CROP:COL_FLIP], h, w, scale)
            flips = u[:, COL_FLIP] < self.preset.hflip_prob
            view = crop_resize_flip(x, boxes, flips, size)
            if record is not None:
                record.setdefault("area", []).append((boxes[:, 2] * boxes[:, 3] / (h * w)).cpu())
                record.setdefault("flip", []).append(flips.cpu())
            out.append(self.photometric.view(view, i, u, record))
        return out
