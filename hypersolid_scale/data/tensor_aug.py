"""Batched torch implementation of the preset's augmentations, with the same semantics as the PIL path.

Used in two places: (1) the FFCV loader, after FFCV has decoded, cropped and flipped each view, runs
`BatchPhotometric` on the training device; (2) the in-memory builtin datasets run `TensorMultiCrop`
(crop + flip + photometric) on whole batches, which is what makes the CPU quickstart fast.

Every random decision is drawn per sample, with the preset's probabilities, in the order of lightly's
DINOViewTransform: crop -> flip -> color jitter (p, random order of the four jitters) -> grayscale ->
blur (per view type) -> solarize (global_1 only) -> normalize.

Randomness (docs/design.md §3b): a view's decisions for a sample are fixed columns of one row of uniforms that
depends only on (seed, epoch, sample index, view) (`keyed_uniforms`, a counter-based hash), never on a
generator's history. So a sample gets the same view whatever batch, rank, world size or resume position
it is processed in; masked subsets (e.g. the jittered samples) index rows of that matrix.
Pass ``record={}`` to get the per-sample decisions back (used by the parity tests).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import kornia
import torch
import torch.nn.functional as F

from hypersolid_scale.data.color import gray, hue_shift
from hypersolid_scale.data.common import DOMAIN_TENSOR_VIEW, hash32, sample_hash, stream_key
from hypersolid_scale.data.presets import MultiCropPreset

# Column layout of one view's row of uniforms.
CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries
COL_CROP = 0  # 2 * CROP_ATTEMPTS + 2 columns: areas, log-aspects, then (x, y) position
COL_FLIP = COL_CROP + 2 * CROP_ATTEMPTS + 2
COL_JITTER = COL_FLIP + 1  # apply?
COL_JITTER_FACTORS = COL_JITTER + 1  # brightness, contrast, saturation, hue
COL_JITTER_ORDER = COL_JITTER_FACTORS + 4  # 4 keys, argsorted into the order of the jitters
COL_GRAY = COL_JITTER_ORDER + 4
COL_BLUR = COL_GRAY + 1
COL_SIGMA = COL_BLUR + 1
COL_SOLARIZE = COL_SIGMA + 1
NUM_COLUMNS = COL_SOLARIZE + 1


def keyed_uniforms(seed: int, epoch: int, indices: torch.Tensor, view: int, columns: int = NUM_COLUMNS) -> torch.Tensor:
    """(n, columns) float32 uniforms in [0, 1): row i depends only on (seed, epoch, indices[i], view).

    24-bit resolution, like torch.rand's float32; computed on `indices.device`, bit-identical on any device.
    """
    if indices.ndim != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"indices must be a 1-D integer tensor of sample indices, got {indices.dtype} "
            f"of shape {tuple(indices.shape)}"
        )
    key = stream_key(seed, epoch, view, DOMAIN_TENSOR_VIEW)
    rows = sample_hash(key, indices.long())  # (n,)
    cols = hash32(torch.arange(columns, device=indices.device, dtype=torch.int64) + 0x632BE5AB)  # (columns,)
    bits = hash32(rows[:, None] ^ cols[None, :])  # (n, columns) in [0, 2**32)
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))


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


def _lerp(lo: float, hi: float, u: torch.Tensor) -> torch.Tensor:
    return lo + (hi - lo) * u


@dataclass
class Decisions:
    """One view's photometric decisions for a batch, per sample (B rows).

    jitter/gray/blur/solarize: (B,) bool, applied or not; factors: (B, 4) brightness, contrast and
    saturation factors and the hue shift (a fraction of a turn); order: (B, 4) the jitters' order
    (0 brightness, 1 contrast, 2 saturation, 3 hue); sigma: (B,) the blur's standard deviation.
    """

    jitter: torch.Tensor
    factors: torch.Tensor
    order: torch.Tensor
    gray: torch.Tensor
    blur: torch.Tensor
    sigma: torch.Tensor
    solarize: torch.Tensor


class BatchPhotometric:
    """Color jitter, grayscale, blur, solarization and normalisation of a batch of views, per sample.

    Draws come from `keyed_uniforms(seed, epoch, indices, view)`, so they follow the samples (`view`); or
    they are given (`apply`: the device path passes the PIL path's own draws). The decisions are made on the
    CPU and sent to the device with the views.
    """

    def __init__(
        self, preset: MultiCropPreset, device: torch.device | str, seed: int = 0, compile: bool | None = None
    ) -> None:
        """compile: run the chain through ``torch.compile`` (default: on CUDA), which fuses its elementwise
        calls into a few kernels per view; a compiler that fails falls back to the eager chain with a warning."""
        self.preset = preset
        self.device = torch.device(device)
        self.seed = int(seed)
        self.mean = torch.tensor(preset.mean, device=self.device).view(1, -1, 1, 1)
        self.std = torch.tensor(preset.std, device=self.device).view(1, -1, 1, 1)
        if compile is None:
            compile = self.device.type == "cuda"
        self._compiled = torch.compile(self._chain, fullgraph=True, dynamic=False) if compile else None

    def decisions(self, u: torch.Tensor, index: int) -> Decisions:
        """View `index`'s decisions from its uniforms `u` (B, NUM_COLUMNS) (torchvision's ColorJitter ranges)."""
        p = self.preset
        bri, con, sat, hue = p.jitter_ranges()
        f = u[:, COL_JITTER_FACTORS : COL_JITTER_FACTORS + 4]
        factors = torch.stack(
            [
                _lerp(max(0.0, 1 - bri), 1 + bri, f[:, 0]),
                _lerp(max(0.0, 1 - con), 1 + con, f[:, 1]),
                _lerp(max(0.0, 1 - sat), 1 + sat, f[:, 2]),
                _lerp(-hue, hue, f[:, 3]),
            ],
            dim=1,
        )
        return Decisions(
            jitter=u[:, COL_JITTER] < p.cj_prob,
            factors=factors,
            order=torch.argsort(u[:, COL_JITTER_ORDER : COL_JITTER_ORDER + 4], dim=1, stable=True),
            gray=u[:, COL_GRAY] < p.gray_prob,
            blur=u[:, COL_BLUR] < p.view_blur_probs()[index],
            sigma=_lerp(p.blur_sigmas[0], p.blur_sigmas[1], u[:, COL_SIGMA]),
            solarize=u[:, COL_SOLARIZE] < p.view_solarize_probs()[index],
        )

    def _jitter(self, x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
        """torchvision ColorJitter semantics: the four jitters in each sample's order, where `on`.

        Every stage computes each jitter for the whole batch with the sample's factor where the sample takes
        that jitter at that stage, and the neutral factor (1, exactly the identity) elsewhere; the hue, not
        an identity at shift 0 in float, is chosen per sample with `where`. No host reads, a fixed number of
        calls per batch.
        """
        n = x.shape[0]
        rgb = x.shape[1] == 3
        one = torch.ones((), device=x.device, dtype=x.dtype)
        for stage in range(4):
            op = order[:, stage]
            take = [((op == k) & on).view(n, 1, 1, 1) for k in range(4)]
            fb, fc, fs = (torch.where(take[k], factors[:, k].view(n, 1, 1, 1), one) for k in range(3))
            x = (x * fb).clamp(0.0, 1.0)
            x = (fc * x + (1 - fc) * gray(x).mean(dim=(1, 2, 3), keepdim=True)).clamp(0.0, 1.0)
            if rgb:  # saturation and hue: no-ops on one channel
                x = (fs * x + (1 - fs) * gray(x)).clamp(0.0, 1.0)
                x = torch.where(take[3], hue_shift(x, factors[:, 3]).clamp(0.0, 1.0), x)
        return x

    def _blur(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        _, _, h, w = x.shape
        hi = self.preset.blur_sigmas[1]
        # PIL's GaussianBlur(radius=sigma) has std sigma; 3 sigma each side covers it. Reflect padding
        # needs the kernel to stay smaller than the image.
        k = min(2 * math.ceil(3 * hi) + 1, (min(h, w) - 1) | 1)
        return kornia.filters.gaussian_blur2d(x, (k, k), sigma[:, None].repeat(1, 2))

    def view(self, x: torch.Tensor, index: int, u: torch.Tensor, record: dict | None = None) -> torch.Tensor:
        """Augment and normalise view number `index` ((B, C, H, W) float in [0, 1] or uint8).

        `u`: (B, NUM_COLUMNS) uniforms of this view (`keyed_uniforms`, on the CPU: the decisions are made on
        the host and sent with the views, so nothing is read back); the photometric columns are used.
        Always float32, also when called inside an autocast region (the views must not depend on the caller).
        """
        return self.apply(x, self.decisions(u.cpu(), index), record)

    def apply(self, x: torch.Tensor, d: Decisions, record: dict | None = None) -> torch.Tensor:
        """Augment and normalise a batch of views with the decisions `d` (made on the CPU: `_chain` sends them)."""
        if x.dtype == torch.uint8:
            x = x.to(self.device, non_blocking=True).float().div_(255.0)
        else:
            x = x.to(self.device).float()
        blur = d.blur.cpu()
        # A sample left sharp gets any valid sigma (its blurred copy is not taken); on the CPU, where kornia
        # checks it without reading the device.
        sigma = torch.where(blur, d.sigma.cpu(), 1.0)
        masks = [m.to(self.device, non_blocking=True) for m in (d.jitter, d.gray, blur, d.solarize)]
        args = (*masks, d.factors.to(self.device, non_blocking=True), d.order.to(self.device, non_blocking=True))
        with torch.autocast(self.device.type, enabled=False):
            out = self._run_chain(x, sigma, *args)
        if record is not None:
            for name, m in zip(("jitter", "gray", "blur", "solarize"), (d.jitter, d.gray, blur, d.solarize)):
                record.setdefault(name, []).append(m.cpu())
        return out

    def _run_chain(self, x: torch.Tensor, sigma: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        if self._compiled is None:
            return self._chain(x, sigma, *args)
        try:
            # Compiled, the blur's sigma travels with the other inputs (kornia checks it only in eager mode).
            return self._compiled(x, sigma.to(self.device, non_blocking=True), *args)
        except Exception as err:  # noqa: BLE001 - a compiler that cannot run here: the eager chain, once warned
            warnings.warn(
                f"the compiled photometric chain failed ({type(err).__name__}: {err}); running it eagerly", stacklevel=2
            )
            self._compiled = None
            return self._chain(x, sigma, *args)

    def _chain(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        jit: torch.Tensor,
        grays: torch.Tensor,
        blur: torch.Tensor,
        sol: torch.Tensor,
        factors: torch.Tensor,
        order: torch.Tensor,
    ) -> torch.Tensor:
        # Every decision is a per-sample tensor applied with `where` over the whole batch: no boolean-mask
        # indexing and no read of a device value on the host, so the host never waits for the device and the
        # number of calls does not depend on the batch (docs/design.md §3e). Static shapes: compilable.
        n = x.shape[0]
        if self.preset.cj_prob > 0:
            x = self._jitter(x, factors, order, jit)
        x = torch.where(grays.view(n, 1, 1, 1), gray(x).expand_as(x), x)
        if max(self.preset.view_blur_probs()) > 0:  # the preset's setting: no look at the data
            x = torch.where(blur.view(n, 1, 1, 1), self._blur(x, sigma), x)
        # PIL ImageOps.solarize(threshold=128) inverts pixels >= 128 (of 255).
        x = torch.where(sol.view(n, 1, 1, 1) & (x >= 128 / 255), 1.0 - x, x)
        return (x - self.mean) / self.std

    def __call__(
        self, views: list[torch.Tensor], indices: torch.Tensor, epoch: int, record: dict | None = None
    ) -> list[torch.Tensor]:
        """views[i]: (B, C, H, W) of view i; indices: (B,) the samples' dataset indices (on the CPU)."""
        idx = _check_indices(indices, views[0].shape[0]).cpu()
        return [self.view(v, i, keyed_uniforms(self.seed, epoch, idx, i), record) for i, v in enumerate(views)]


def _check_indices(indices: torch.Tensor, n: int) -> torch.Tensor:
    """The batch's dataset indices, checked where they are (the loaders keep them on the CPU: no sync)."""
    if not isinstance(indices, torch.Tensor) or indices.shape != (n,):
        shape = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"indices must be a ({n},) tensor of the batch's dataset indices, got {shape}")
    if bool((indices < 0).any()):
        raise ValueError(f"dataset indices must be >= 0, got {indices.min().item()}")
    return indices


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
        idx = _check_indices(indices, images.shape[0]).cpu()  # the draws on the host: nothing read back
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
