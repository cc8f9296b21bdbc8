"""Gradient-based feature inversion (the paper's appendix "Feature Inversion").

Synthesise ``x_hat`` whose embedding matches the target ``z_target = f(x)`` of a real image, optimising the
pixels with the model frozen. The defaults are the appendix's settings:

- multi-scale canvas: 0.125, 0.25, 0.5, 0.75, 1.0 of the final size (28 px -> 224 px for ImageNet), upsampled
  bicubically at each transition;
- loss ``L = L_content + lambda * L_TV``: ``L_content`` the cosine distance ``1 - cos(f(x_hat), z_target)``,
  ``L_TV`` the anisotropic total variation ``sum |x[i+1,j] - x[i,j]| + |x[i,j+1] - x[i,j]|``, ``lambda = 2``;
- Adam, lr 0.05, 4000 steps per scale;
- random jitter before each forward pass, up to +-32 px at 224 px;
- every 50 steps a Gaussian blur of the canvas (sigma 0.5, 5 x 5 kernel).

Choices the appendix leaves open, made here:

- TV reduction: the formula sums over pixels, but a SUM of a 224 x 224 x 3 canvas's differences is ~10^4
  times the cosine distance (at most 2), so with lambda = 2 it flattens the canvas to one colour: only a
  per-pixel MEAN makes lambda = 2 a usable balance. ``tv_reduction="mean"`` is the default and ``"sum"``
  the literal formula.
- Jitter: a circular shift (``torch.roll``, as in Lucid/DeepDream) by up to ``jitter`` times the current
  canvas side, ``32 / 224`` by default: +-32 px at 224 px, and proportionally less on smaller canvases
  (+-4 px on the 28 px canvas, where a 32 px shift would exceed the image).
- Start: Gaussian noise with standard deviation ``init_std`` (0.01) in the model's normalised input space,
  i.e. a near-mean-colour canvas; no clamping (the appendix names none); the optimiser's state restarts at
  each scale (the canvas changes shape).
- ViT inputs must be whole patches: each canvas side is rounded to a multiple of the patch size.

Channels follow the images: a 1-channel model (the Fashion-MNIST quickstart) gets a 1-channel canvas,
optimised in its own normalised grey space and shown in grey.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import kornia
import torch
import torch.nn.functional as F
from torch import nn

from hypersolid_scale.eval.qualitative._common import backbone_of, check_images, frozen_eval
from hypersolid_scale.models import ViTBackbone

PAPER_SCALES: tuple[float, ...] = (0.125, 0.25, 0.5, 0.75, 1.0)
PAPER_STEPS_PER_SCALE = 4000


@dataclass
class Inversion:
    """Result of ``invert_features``.

    Attributes:
        images: (N, C, H, W) synthesised images in the model's normalised input space.
        objective: per step, the mean over images of ``L_content + lambda * L_TV`` (jittered forward pass).
        content: per step, the mean cosine distance to the target (same forward pass).
        sizes: (H, W) of the canvas at each scale.
    """

    images: torch.Tensor
    objective: list[float] = field(default_factory=list)
    content: list[float] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)


def total_variation(x: torch.Tensor, reduction: Literal["sum", "mean"] = "sum") -> torch.Tensor:
    """Anisotropic TV of each image of (N, C, H, W): (N,). ``sum`` is the appendix's formula; ``mean``
    divides each direction's sum by its number of differences."""
    dh = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().flatten(1)
    dw = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().flatten(1)
    if reduction == "sum":
        return dh.sum(dim=1) + dw.sum(dim=1)
    # an empty direction (a 1-pixel-wide canvas) contributes 0, not NaN
    return dh.mean(dim=1).nan_to_num() + dw.mean(dim=1).nan_to_num()


def canvas_sizes(size: tuple[int, int], scales: Sequence[float], multiple: int = 1) -> list[tuple[int, int]]:
    """(H, W) of the canvas at each scale: ``scale * side`` rounded (halves up) to a positive multiple of
    ``multiple`` (a ViT's patch size)."""

    def side(s: float, full: int) -> int:
        return max(multiple, math.floor(s * full / multiple + 0.5) * multiple)

    return [(side(s, size[0]), side(s, size[1])) for s in scales]


def _check_settings(
    steps_per_scale: int, scales: Sequence[float], lr: float, blur_every: int, blur_kernel: int, tv_reduction: str
) -> None:
    if not isinstance(steps_per_scale, int) or steps_per_scale < 1:
        raise ValueError(f"steps_per_scale={steps_per_scale!r} must be a positive integer (the paper uses 4000)")
    if not scales or any(not 0.0 < s <= 1.0 for s in scales) or list(scales) != sorted(scales):
        raise ValueError(f"scales={list(scales)} must be increasing fractions in (0, 1] of the final size")
    if lr <= 0:
        raise ValueError(f"lr={lr} must be positive (the paper uses 0.05)")
    if blur_every < 0:
        raise ValueError(f"blur_every={blur_every} must be >= 0 (0 turns the periodic blur off)")
    if blur_kernel < 1 or blur_kernel % 2 == 0:
        raise ValueError(f"blur_kernel={blur_kernel} must be a positive odd size (the paper uses 5)")
    if tv_reduction not in ("sum", "mean"):
        raise ValueError(f"tv_reduction={tv_reduction!r} must be 'mean' or 'sum'")


def invert_features(
    model: nn.Module,
    images: torch.Tensor,
    *,
    size: int | tuple[int, int] | None = None,
    steps_per_scale: int = PAPER_STEPS_PER_SCALE,
    scales: Sequence[float] = PAPER_SCALES,
    lr: float = 0.05,
    tv_weight: float = 2.0,
    tv_reduction: Literal["sum", "mean"] = "mean",
    jitter: float = 32 / 224,
    blur_every: int = 50,
    blur_sigma: float = 0.5,
    blur_kernel: int = 5,
    init_std: float = 0.01,
    seed: int = 0,
) -> Inversion:
    """Invert each image's backbone embedding (see the module docstring for the method and its defaults).

    Args:
        model: a ``BackboneWithProjector`` (or its backbone); any architecture.
        images: normalised images (N, C, H, W) whose embeddings are the targets.
        size: final canvas side (or (H, W)); None uses the images' size.
        steps_per_scale: Adam steps at each scale (paper: 4000).
        seed: seeds the starting noise and the jitter; equal seeds give identical results on one machine.
    """
    images = check_images(images, "invert_features")
    _check_settings(steps_per_scale, scales, lr, blur_every, blur_kernel, tv_reduction)
    final = tuple(images.shape[-2:]) if size is None else ((size, size) if isinstance(size, int) else tuple(size))
    net = backbone_of(model)
    multiple = net.patch_size if isinstance(net, ViTBackbone) else 1
    sizes = canvas_sizes(final, scales, multiple)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed)
    device = images.device
    result = Inversion(images=images, sizes=sizes)
    with frozen_eval(model):
        with torch.no_grad():
            target = F.normalize(net(images).float(), dim=1)
        canvas = torch.randn((images.shape[0], images.shape[1], *sizes[0]), generator=gen) * init_std
        canvas = canvas.to(device)
        for k, hw in enumerate(sizes):
            if k > 0:
                canvas = kornia.geometry.transform.resize(canvas, hw, interpolation="bicubic", align_corners=False)
            canvas = canvas.detach().requires_grad_(True)
            opt = torch.optim.Adam([canvas], lr=lr)
            max_shift = int(round(jitter * max(hw)))
            for step in range(steps_per_scale):
                shift = torch.randint(-max_shift, max_shift + 1, (2,), generator=gen).tolist()
                x = torch.roll(canvas, shifts=shift, dims=(2, 3)) if max_shift else canvas
                content = 1.0 - (F.normalize(net(x).float(), dim=1) * target).sum(dim=1)  # (N,)
                objective = content + tv_weight * total_variation(canvas, tv_reduction)
                (grad,) = torch.autograd.grad(objective.sum(), canvas)  # images are independent in eval mode
                canvas.grad = grad
                opt.step()
                if blur_every and (step + 1) % blur_every == 0:
                    with torch.no_grad():
                        canvas.copy_(
                            kornia.filters.gaussian_blur2d(canvas, (blur_kernel, blur_kernel), (blur_sigma, blur_sigma))
                        )
                result.objective.append(float(objective.detach().mean()))
                result.content.append(float(content.detach().mean()))
    result.images = canvas.detach()
    return result
