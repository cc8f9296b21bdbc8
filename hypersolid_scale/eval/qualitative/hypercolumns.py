"""Hypercolumn PCA (the paper's Figs. "Qualitative Feature Analysis", column 2).

A pixel's hypercolumn is the vector of every backbone stage's activations at that location: each stage's map
is upsampled (bilinear) to the input size and the maps are concatenated along channels. The first three
principal components of the hypercolumns, each min-max scaled, are shown as R, G and B: pixels the network
describes alike get alike colours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hypersolid_scale.eval.qualitative._common import (
    backbone_of,
    capture_outputs,
    check_images,
    conv_stages,
    frozen_eval,
    pca_rgb,
)


@torch.no_grad()
def hypercolumns(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Stage activations upsampled to the input size and concatenated: (N, C, H, W) -> (N, sum C_s, H, W).

    Each stage is divided by its root-mean-square activation first. Deep stages have more channels and
    larger activations; unscaled they would fill the leading principal components on their own, and the
    "multi-layer" picture would show the last stage only. After the scaling each stage holds the same
    energy per pixel.
    """
    images = check_images(images, "hypercolumns")
    stages = conv_stages(model)  # NotApplicable for backbones without conv stages
    size = images.shape[-2:]
    with frozen_eval(model), capture_outputs(stages) as seen:
        backbone_of(model)(images)
        maps = []
        for name, _ in stages:
            act = seen[name].float()
            rms = act.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt().clamp_min(1e-12)
            maps.append(F.interpolate(act / rms, size=size, mode="bilinear", align_corners=False))
    return torch.cat(maps, dim=1)


def hypercolumn_pca(model: nn.Module, images: torch.Tensor, joint: bool = False) -> torch.Tensor:
    """Hypercolumn PCA as RGB: (N, C, H, W) images -> (N, H, W, 3) floats in [0, 1].

    Args:
        model: a ``BackboneWithProjector`` (or its backbone) with conv stages (ResNet, SmallCNN).
        images: normalised images, as the model was trained on.
        joint: False (the paper's figure) fits one PCA per image, so each image uses its own three leading
            directions. True fits one PCA on the pixels of all images: a colour then means the same feature
            direction in every image (comparable across images, less contrast within each).

    Raises:
        NotApplicable: the backbone has no conv stages (ViT).
    """
    cols = hypercolumns(model, images)  # (N, D, H, W)
    n, d, h, w = cols.shape
    pixels = cols.permute(0, 2, 3, 1).reshape(n, h * w, d)
    if joint:
        rgb = pca_rgb(pixels.reshape(n * h * w, d), groups=n)
    else:
        rgb = torch.cat([pca_rgb(p) for p in pixels])
    return rgb.view(n, h, w, 3)
