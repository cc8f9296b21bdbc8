"""Grad-CAM of the embedding's agreement with a target embedding (the paper's Figs. "Qualitative Feature
Analysis", column 3).

The paper's target is the image's own embedding, ``z_target = f(x)`` (appendix "Feature Inversion"). The
score explained is ``s(x) = <f(x), z_target / ||z_target||>``, the embedding's length along the target's
direction. Not the cosine: ``cos(f(x), f(x))`` sits at its maximum, where its gradient is exactly zero and
the map would be empty. With a target from another image the same score asks which regions make ``x``
look like that image.

Grad-CAM (Selvaraju et al., 2017) on a stage with activations ``A`` (K channels): channel weights
``alpha_k = mean_{i,j} ds/dA_k[i,j]``, map ``ReLU(sum_k alpha_k A_k)``, upsampled (bilinear) to the input
and divided by its maximum. ``stages="last"`` uses the last conv stage (classic Grad-CAM); ``"all"`` averages
the normalised maps of every stage and renormalises (the paper's "multi-layer Grad-CAM").
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from hypersolid_scale.eval.qualitative._common import (
    backbone_of,
    capture_outputs,
    check_images,
    conv_stages,
    frozen_eval,
)

Stages = Literal["last", "all"]


def _normalise(cam: torch.Tensor) -> torch.Tensor:
    """Divide each (H, W) map of (N, H, W) by its maximum; an all-zero map (no positive evidence) stays 0."""
    peak = cam.flatten(1).amax(dim=1).view(-1, 1, 1)
    return torch.where(peak > 0, cam / peak.clamp_min(1e-12), torch.zeros_like(cam))


@torch.no_grad()
def own_targets(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The paper's target for each image: its own backbone embedding ``f(x)`` (N, F), in eval mode."""
    with frozen_eval(model):
        return backbone_of(model)(images).float()


def gradcam(
    model: nn.Module,
    images: torch.Tensor,
    targets: torch.Tensor | None = None,
    stages: Stages = "last",
) -> torch.Tensor:
    """Grad-CAM maps (N, H, W) in [0, 1] (each map's maximum is 1 unless the map is all zero).

    Args:
        model: a ``BackboneWithProjector`` (or its backbone) with conv stages (ResNet, SmallCNN).
        images: normalised images (N, C, H, W).
        targets: (N, F) target embeddings, one per image; None uses each image's own embedding.
        stages: ``"last"`` (last conv stage) or ``"all"`` (mean over every stage).

    Raises:
        NotApplicable: the backbone has no conv stages (ViT).
    """
    images = check_images(images, "gradcam")
    if stages not in ("last", "all"):
        raise ValueError(f"stages={stages!r} must be 'last' (last conv stage) or 'all' (every stage)")
    all_stages = conv_stages(model)
    chosen = all_stages[-1:] if stages == "last" else all_stages
    if targets is None:
        targets = own_targets(model, images)
    if targets.dim() != 2 or targets.shape[0] != images.shape[0]:
        raise ValueError(
            f"targets of shape {tuple(targets.shape)} do not match {images.shape[0]} images; "
            "pass one (N, F) embedding per image"
        )
    unit = F.normalize(targets.detach().float(), dim=1)
    with frozen_eval(model), torch.enable_grad(), capture_outputs(chosen) as seen:
        z = backbone_of(model)(images).float()
        if z.shape != unit.shape:
            raise ValueError(f"targets have shape {tuple(unit.shape)}, the embeddings {tuple(z.shape)}")
        score = (z * unit).sum()  # images are independent in eval mode: one backward gives every image's map
        acts = [seen[name] for name, _ in chosen]
        grads = torch.autograd.grad(score, acts)
    maps = []
    for act, grad in zip(acts, grads):
        weights = grad.float().mean(dim=(2, 3), keepdim=True)  # (N, K, 1, 1)
        cam = F.relu((weights * act.detach().float()).sum(dim=1, keepdim=True))
        cam = F.interpolate(cam, size=images.shape[-2:], mode="bilinear", align_corners=False).squeeze(1)
        maps.append(_normalise(cam))
    return _normalise(torch.stack(maps).mean(dim=0))
