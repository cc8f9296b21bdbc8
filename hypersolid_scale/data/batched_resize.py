"""PIL's antialiased bicubic resize of one crop box per image, for a whole batch of images in a few calls.

`data.views_on=device` cuts every view of a batch from one decode per image (docs/design.md §3e). The PIL path
crops each image to its box and resizes it with PIL's bicubic filter, antialiased: when a box shrinks by a
factor ``f > 1``, the filter widens by ``f``. That resize is separable, so each image's crop-resize-mirror is
``Wy @ box @ Wx^T`` with two small weight matrices. Here those matrices are built for the whole batch at once
(each row from the sample's box and flip, zero outside the box) and applied with two batched matrix products,
one horizontal then one vertical, each rounded to 8-bit levels as PIL's two passes are. The number of calls
is fixed per view whatever the batch size, nothing is read back to the host, and the result is PIL's within
float rounding (a level at most, on rare ties).

Hand-written: ``F.interpolate`` takes one size and one scale per call (one call per crop), and
``torchvision.ops.roi_align`` and kornia's ``crop_and_resize`` sample bilinearly (an average, not PIL's
bicubic filter with its negative lobes), so their views would differ from the PIL path's by several levels.

Cost: the products run over each view's window (the largest box of the batch for that view), about
``B x C x box_h x box_w x size`` multiply-adds per view; on a GPU a few milliseconds for 128 ImageNet-sized
images and the paper's 2 x 224 + 6 x 96 views, on the CPU about as long as one small kernel call per crop.
"""

from __future__ import annotations

import torch

# PIL's bicubic filter (Resample.c: a = -0.5) spans 2 input pixels either side at scale 1.
_SUPPORT = 2.0
_A = -0.5


def _bicubic(x: torch.Tensor) -> torch.Tensor:
    """PIL's bicubic kernel (Keys, a = -0.5) at the points `x`."""
    x = x.abs()
    near = ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * _A
    return torch.where(x < 1.0, near, torch.where(x < _SUPPORT, far, torch.zeros_like(x)))


def resize_weights(length: torch.Tensor, size: int, window: int, flip: torch.Tensor | None = None) -> torch.Tensor:
    """(B, size, window) float32: row ``i`` of sample ``b`` weighs the pixels ``0 .. window - 1`` of its box
    (the box holds ``length[b]`` of them; the rest weigh 0) into output pixel ``i`` (mirrored where ``flip``).

    PIL's ``precompute_coeffs``: scale = length / size, the filter widened by max(scale, 1), centred on
    ``(i + 0.5) * scale``, its taps cut at the box's edges and normalised to sum 1.
    """
    length = length.to(torch.float32)
    scale = (length / size)[:, None, None]  # (B, 1, 1)
    widen = scale.clamp(min=1.0)
    out = torch.arange(size, device=length.device, dtype=torch.float32)[None, :, None]  # (1, size, 1)
    if flip is not None:
        out = torch.where(flip.to(length.device)[:, None, None], size - 1 - out, out)
    center = (out + 0.5) * scale  # (B, size, 1)
    x = torch.arange(window, device=length.device, dtype=torch.float32)[None, None, :]  # (1, 1, window)
    w = _bicubic((x + 0.5 - center) / widen)
    w = torch.where(x < length[:, None, None], w, torch.zeros_like(w))
    return w / w.sum(dim=2, keepdim=True)


def pad_images(images: list[torch.Tensor]) -> torch.Tensor:
    """Images (C, H_i, W_i) of one dtype -> (B, C, max H, max W), zero-padded at the bottom and right.

    One copy per image: the batch's only per-image calls after the decode (the crops themselves are batched).
    """
    c = images[0].shape[0]
    height = max(int(im.shape[1]) for im in images)
    width = max(int(im.shape[2]) for im in images)
    out = images[0].new_zeros((len(images), c, height, width))
    for b, im in enumerate(images):
        out[b, :, : im.shape[1], : im.shape[2]].copy_(im, non_blocking=True)
    return out


def crop_resize(
    images: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: int,
    window: tuple[int, int],
) -> torch.Tensor:
    """Each image's box resized to size x size with PIL's antialiased bicubic filter and mirrored where `flips`.

    Shape:
        images: (B, C, H, W) uint8 (zero-padded, `pad_images`); boxes: (B, 4) (top, left, height, width) in
        pixels, on the images' device; flips: (B,) bool; window: (h, w), at least the largest box's height and
        width (host ints, so nothing is read back from the device). Returns (B, C, size, size) float32 in
        [0, 255], whole levels (PIL's 8-bit output).
    """
    b, c, height, width = images.shape
    wh, ww = min(window[0], height), min(window[1], width)
    boxes = boxes.to(images.device)
    top, left = boxes[:, 0].long(), boxes[:, 1].long()
    # The window of each box: rows top .. top + wh - 1 and columns left .. left + ww - 1 (clamped inside the
    # image; pixels past the box get zero weight). Expanded indices: two gathers, no index tensor per pixel.
    rows = (top[:, None] + torch.arange(wh, device=images.device)).clamp_(max=height - 1)
    cols = (left[:, None] + torch.arange(ww, device=images.device)).clamp_(max=width - 1)
    x = images.gather(2, rows[:, None, :, None].expand(b, c, wh, width))
    x = x.gather(3, cols[:, None, None, :].expand(b, c, wh, ww)).float()
    wx = resize_weights(boxes[:, 3], size, ww, flips)  # (B, size, ww)
    wy = resize_weights(boxes[:, 2], size, wh)  # (B, size, wh)
    # Horizontal pass first, rounded to 8-bit levels (PIL's intermediate image), then the vertical pass.
    x = torch.matmul(x, wx.transpose(1, 2)[:, None]).round_().clamp_(0.0, 255.0)  # (B, C, wh, size)
    return torch.matmul(wy[:, None], x).round_().clamp_(0.0, 255.0)  # (B, C, size, size)
