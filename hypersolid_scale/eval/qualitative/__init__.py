"""Qualitative analyses of a trained model (the paper's "Qualitative Analysis" figures and its appendices):
hypercolumn PCA, Grad-CAM, feature inversion and, for ViTs, CLS attention and patch-token PCA.

Entry point::

    render_qualitative(
        model: nn.Module,                      # BackboneWithProjector (e.g. checkpoint.build_model_from_checkpoint)
        images: torch.Tensor,                  # (N, C, H, W) normalised evaluation images, a handful
        labels: Sequence[int] | None,          # one per image, used as row labels (None: no labels)
        out_dir: str | Path,                   # created if missing
        *,
        mean: Sequence[float] | None = None,   # dataset preset's mean/std: undo the normalisation for display
        std: Sequence[float] | None = None,    #   (None: each image is min-max scaled)
        class_names: Sequence[str] | None = None,
        seed: int = 0,                         # seeds the inversion's start and jitter
        inversion_steps: int = 4000,           # Adam steps per scale (the paper's 4000)
        inversion_size: int | None = None,     # final inversion canvas side (None: the images' size)
        device: str | torch.device = "cpu",    # the model is moved there
        analyses: Sequence[str] | None = None, # subset of ANALYSES (None: all)
        skips: SkipLog | None = None,          # records analyses that do not apply to this model
    ) -> dict[str, Path]                       # {analysis name: PNG path}, only the analyses that ran

writes ``out_dir/<name>.png`` for each name in ``ANALYSES`` = ("hypercolumns", "gradcam", "inversion",
"attention"). An analysis that does not apply to the architecture (attention on a CNN; hypercolumns and
Grad-CAM on a ViT) raises ``NotApplicable`` inside, is recorded in ``skips`` (one ``SkippedWarning``) and is
missing from the returned dict.

The functions behind each figure return arrays for other uses: ``hypercolumn_pca``, ``gradcam``,
``invert_features``, ``vit_attention``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hypersolid_scale.eval.qualitative._common import stretch_display, to_display
from hypersolid_scale.eval.qualitative.attention import AttentionMaps, vit_attention
from hypersolid_scale.eval.qualitative.gradcam import gradcam
from hypersolid_scale.eval.qualitative.grids import Panel, save_grid
from hypersolid_scale.eval.qualitative.hypercolumns import hypercolumn_pca, hypercolumns
from hypersolid_scale.eval.qualitative.inversion import (
    PAPER_SCALES,
    PAPER_STEPS_PER_SCALE,
    Inversion,
    invert_features,
)
from hypersolid_scale.eval.skips import SkipLog

ANALYSES: tuple[str, ...] = ("hypercolumns", "gradcam", "inversion", "attention")

__all__ = [
    "ANALYSES",
    "PAPER_SCALES",
    "PAPER_STEPS_PER_SCALE",
    "AttentionMaps",
    "Inversion",
    "gradcam",
    "hypercolumn_pca",
    "hypercolumns",
    "invert_features",
    "render_qualitative",
    "vit_attention",
]


def _upsample(maps: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(N, h, w) patch-grid maps -> (N, H, W), nearest, so every patch stays one flat block."""
    return F.interpolate(maps[:, None].float(), size=size, mode="nearest")[:, 0].cpu().numpy()


def _minmax(x: np.ndarray) -> np.ndarray:
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)


def _render(
    name: str,
    model: nn.Module,
    images: torch.Tensor,
    shown: np.ndarray,
    out: Path,
    row_labels: list[str] | None,
    seed: int,
    inversion_steps: int,
    inversion_size: int | None,
) -> Path:
    inputs = [Panel(img) for img in shown]
    size = (images.shape[-2], images.shape[-1])
    if name == "hypercolumns":
        rgb = hypercolumn_pca(model, images).cpu().numpy()
        joint = hypercolumn_pca(model, images, joint=True).cpu().numpy()
        cols = {
            "input": inputs,
            "hypercolumn PCA": [Panel(x) for x in rgb],
            "PCA over all images": [Panel(x) for x in joint],
        }
    elif name == "gradcam":
        last = gradcam(model, images, stages="last").cpu().numpy()
        every = gradcam(model, images, stages="all").cpu().numpy()
        cols = {
            "input": inputs,
            "Grad-CAM last stage": [Panel(s, heat=h) for s, h in zip(shown, last)],
            "Grad-CAM all stages": [Panel(s, heat=h) for s, h in zip(shown, every)],
        }
    elif name == "inversion":
        inv = invert_features(model, images, size=inversion_size, steps_per_scale=inversion_steps, seed=seed)
        # Contrast stretched per image: an inversion is faint (low contrast around the mean colour) and
        # would be near-uniform grey with the dataset's own scaling; its structure is what the figure shows.
        cols = {"input": inputs, "feature inversion": [Panel(x) for x in stretch_display(inv.images)]}
    elif name == "attention":
        maps = vit_attention(model, images)
        att = maps.cls_attention
        cols = {"input": inputs}
        for head in range(att.shape[1]):
            cols[f"head {head}"] = [Panel(_minmax(a)) for a in _upsample(att[:, head], size)]
        mean_att = [_minmax(a) for a in _upsample(att.mean(dim=1), size)]
        cols["mean over heads"] = [Panel(s, heat=a) for s, a in zip(shown, mean_att)]
        pca = F.interpolate(maps.patch_pca.permute(0, 3, 1, 2), size=size, mode="nearest")
        cols["patch-token PCA"] = [Panel(x) for x in pca.permute(0, 2, 3, 1).cpu().numpy()]
    else:  # render_qualitative checks names first
        raise AssertionError(name)
    return save_grid(cols, out / f"{name}.png", row_labels=row_labels, title=name)


def render_qualitative(
    model: nn.Module,
    images: torch.Tensor,
    labels: Sequence[int] | None,
    out_dir: str | Path,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    class_names: Sequence[str] | None = None,
    seed: int = 0,
    inversion_steps: int = PAPER_STEPS_PER_SCALE,
    inversion_size: int | None = None,
    device: str | torch.device = "cpu",
    analyses: Sequence[str] | None = None,
    skips: SkipLog | None = None,
) -> dict[str, Path]:
    """Write one PNG grid per analysis to ``out_dir``; see the module docstring for the arguments."""
    chosen = list(ANALYSES if analyses is None else analyses)
    unknown = [a for a in chosen if a not in ANALYSES]
    if unknown:
        raise ValueError(f"unknown qualitative analyses {unknown}; choose from {list(ANALYSES)}")
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError("render_qualitative expects images as one (N, C, H, W) tensor of normalised images")
    if labels is not None and len(labels) != images.shape[0]:
        raise ValueError(f"{len(labels)} labels for {images.shape[0]} images; pass one label per image or None")
    row_labels = None
    if labels is not None:
        row_labels = [class_names[int(y)] if class_names is not None else f"class {int(y)}" for y in labels]
    model = model.to(device)
    images = images.to(device)
    shown = to_display(images, mean, std)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    skips = SkipLog() if skips is None else skips
    written: dict[str, Path] = {}
    for name in chosen:
        with skips.guard(name):
            written[name] = _render(name, model, images, shown, out, row_labels, seed, inversion_steps, inversion_size)
    return written
