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

Cost: the products run over a window at least as large as each box, about ``C x box_h x box_w x size``
multiply-adds per crop. `crop_resize` (over a zero-padded batch, `pad_images`, one window for the whole batch)
is the simple form; the device stage uses `crop_resize_packed`: the images packed end to end (`pack_images`,
no padding) and the crops of a view grouped by box size (`window_buckets`), one window per group, so that one
4000 x 3000 photo among small ones costs its own crops, not every image's.
"""

from __future__ import annotations

import math

import numpy as np
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


def pack_images(images: list[torch.Tensor]) -> torch.Tensor:
    """Images (C, H_i, W_i) of one dtype -> (C, sum of H_i x W_i): each image's pixels, row-major, end to end.

    One copy per image, as `pad_images`, but no padding: the batch holds its images' pixels and no more.
    """
    return torch.cat([im.reshape(im.shape[0], -1) for im in images], dim=1)


# Window groups per view: boxes whose longer side is within a factor sqrt(2) share a window (the group's
# largest box); the last group takes every larger box.
NUM_BUCKETS = 8


def window_buckets(heights: np.ndarray, widths: np.ndarray, size: int) -> list[tuple[np.ndarray, int, int]]:
    """The crops of one view grouped by box size, on the host: [(rows, window height, window width), ...],
    non-empty groups only, each group's window its largest box (its rows' boxes fit in it)."""
    side = np.maximum(np.maximum(heights, widths), 1).astype(np.float64)
    group = np.clip(np.floor(2 * np.log2(side / size)), 0, NUM_BUCKETS - 1).astype(np.int64)
    out = []
    for k in range(NUM_BUCKETS):
        rows = np.flatnonzero(group == k)
        if rows.size:
            out.append((rows, int(heights[rows].max()), int(widths[rows].max())))
    return out


def crop_resize_packed(
    packed: torch.Tensor,
    starts: torch.Tensor,
    image_sizes: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: int,
    window: tuple[int, int],
) -> torch.Tensor:
    """`crop_resize` of images packed end to end (`pack_images`): the same pixels, read over a window of the
    given boxes only, not over the batch's largest image.

    Shape:
        packed: (C, N) uint8; starts: (B,) int64, where each row's image starts in `packed`; image_sizes:
        (B, 2) its height and width; boxes: (B, 4) top, left, height, width; flips: (B,) bool, all on the
        packed images' device; window: (h, w) host ints, at least every box's height and width. Returns
        (B, C, size, size) float32 in [0, 255], whole levels.
    """
    dev = packed.device
    wh, ww = window
    top, left = boxes[:, 0].long(), boxes[:, 1].long()
    height, width = image_sizes[:, 0].long(), image_sizes[:, 1].long()
    # The window's pixels of each box, clamped inside its image (pixels past the box get zero weight).
    rows = torch.minimum(top[:, None] + torch.arange(wh, device=dev), (height - 1)[:, None])  # (B, wh)
    cols = torch.minimum(left[:, None] + torch.arange(ww, device=dev), (width - 1)[:, None])  # (B, ww)
    base = starts[:, None] + rows * width[:, None]  # (B, wh): where each window row starts in `packed`
    if ww > BANDED_FROM * size:
        x = _horizontal_banded(packed, base, left, width, boxes[:, 3], size, ww)
        x = torch.where(flips[:, None, None, None], x.flip(-1), x)  # a mirrored row: its outputs reversed
        wy = resize_weights(boxes[:, 2], size, wh)
        return torch.matmul(wy[:, None], x).round_().clamp_(0.0, 255.0)
    x = _gather(packed, base[:, :, None] + cols[:, None, :])  # (B, C, wh, ww)
    return _resize_window(x, boxes, flips, size)


def _gather(packed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """packed (C, N) at index (B, ...) -> (B, C, ...) float32."""
    got = packed.index_select(1, index.flatten()).view(packed.shape[0], *index.shape)
    return got.transpose(0, 1).float()


# Boxes wider than BANDED_FROM x the view: the horizontal pass in strips of _STRIP outputs, each over the
# columns its taps reach (a dense pass over a 3,000-pixel row for 224 outputs multiplies mostly zero weights).
BANDED_FROM = 4
_STRIP = 16


def _horizontal_banded(
    packed: torch.Tensor,
    base: torch.Tensor,
    left: torch.Tensor,
    width: torch.Tensor,
    length: torch.Tensor,
    size: int,
    ww: int,
) -> torch.Tensor:
    """PIL's horizontal pass (unmirrored, rounded) of each box's rows: (B, C, wh, size). Strip ``j`` of each
    row reads ``span`` columns from ``lo_j``, the first its outputs' taps can reach; the weights are the dense
    pass's (`resize_weights`), taken at those columns, so only the order of the sums differs."""
    n, wh = base.shape
    strips = -(-size // _STRIP)
    scale = length.to(torch.float32) / size
    widen = scale.clamp(min=1.0)
    first = (torch.arange(strips, device=base.device) * _STRIP + 0.5)[None, :] * scale[:, None]
    lo = (first - _SUPPORT * widen[:, None] - 0.5).floor_().sub_(1).clamp_(min=0).long()  # (B, strips)
    most = ww / size  # no box of the window is wider: a bound of its scale, on the host
    span = math.ceil((_STRIP - 1) * most + 2 * _SUPPORT * max(most, 1.0)) + 4
    pos = lo[:, :, None] + torch.arange(span, device=base.device)  # (B, strips, span): columns in the box
    dense = resize_weights(length, size, ww)  # (B, size, ww)
    dense = torch.nn.functional.pad(dense, (0, 0, 0, strips * _STRIP - size)).view(n, strips, _STRIP, ww)
    w = dense.gather(3, pos.clamp(max=ww - 1)[:, :, None, :].expand(n, strips, _STRIP, span))
    w = torch.where((pos < ww)[:, :, None, :], w, torch.zeros_like(w))  # (B, strips, _STRIP, span)
    cols = torch.minimum(left[:, None, None] + pos, (width - 1)[:, None, None])  # inside the image
    if packed.shape[1] < 2**31:  # the index built and read in int32: half its memory traffic
        base, cols = base.to(torch.int32), cols.to(torch.int32)
    index = (base[:, None, :, None] + cols[:, :, None, :]).flatten()  # (B, strips, wh, span)
    # One channel at a time (a fixed 1 or 3 calls): each strip's rows come out contiguous for the products.
    y = torch.stack(
        [torch.matmul(ch.index_select(0, index).view(n, strips, wh, span).float(), w.transpose(2, 3)) for ch in packed]
    )  # (C, B, strips, wh, _STRIP)
    y = y.permute(1, 0, 3, 2, 4).reshape(n, packed.shape[0], wh, strips * _STRIP)[..., :size]
    return y.round_().clamp_(0.0, 255.0)


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
    return _resize_window(x, boxes, flips, size)


def _resize_window(x: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor, size: int) -> torch.Tensor:
    """The two passes over each box's window x (B, C, wh, ww) float, its box at the window's top left."""
    wh, ww = x.shape[2], x.shape[3]
    wx = resize_weights(boxes[:, 3], size, ww, flips)  # (B, size, ww)
    wy = resize_weights(boxes[:, 2], size, wh)  # (B, size, wh)
    # Horizontal pass first, rounded to 8-bit levels (PIL's intermediate image), then the vertical pass.
    x = torch.matmul(x, wx.transpose(1, 2)[:, None]).round_().clamp_(0.0, 255.0)  # (B, C, wh, size)
    return torch.matmul(wy[:, None], x).round_().clamp_(0.0, 255.0)  # (B, C, size, size)
