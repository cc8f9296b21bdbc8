"""``vit_tiny``: timm's ViT-Tiny with a dynamic input size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from hypersolid_scale.models.backbones import ExportLayout, register_backbone
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.safety.extras import require_module

if TYPE_CHECKING:
    from hypersolid_scale.models.config import ModelConfig


class ViTBackbone(nn.Module):
    """timm ViT with dynamic image size: the position-embedding grid is interpolated to the input's patch grid,
    so 96 px local crops and 224 px global crops share one model. Output is the final-norm CLS token.

    Shape:
        (N, in_channels, H, W) with H, W multiples of patch_size -> (N, 192) for ViT-Tiny
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        require_module("timm", "eval", "model.arch=vit_tiny (timm's ViT)")
        import timm

        opts = cfg.section()
        self.patch_size, self.key = opts.patch_size, f"model.{cfg.arch}.patch_size"
        self.vit = timm.create_model(
            TIMM_NAME,
            pretrained=False,
            num_classes=0,  # drop the classifier head; forward returns pooled features
            in_chans=cfg.in_channels,
            img_size=opts.img_size,
            patch_size=opts.patch_size,
            dynamic_img_size=True,
        )
        self.feature_dim = int(cast(int, self.vit.num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if h % self.patch_size or w % self.patch_size:
            # Reachable from input (an image size the config's validation did not see, e.g. another dataset's
            # evaluation images): the user's to fix, not an internal error.
            raise ConfigError(
                f"ViT input of size {h}x{w} is not a multiple of {self.key}={self.patch_size}; choose crop "
                f"sizes (data.global_crop_size, data.local_crop_size) that are multiples of {self.patch_size}, or a "
                f"{self.key} that divides them"
            )
        return self.vit(x)


@dataclass
class ViTOptions:
    """The section ``model.vit_tiny``."""

    img_size: int = 224  # nominal input size: sizes the position-embedding grid (other sizes interpolate it)
    patch_size: int = 16  # input sides must be multiples of it


def check_vit(cfg: ModelConfig) -> None:
    """``img_size`` (which sizes the position-embedding grid) must be whole patches."""
    opts, key = cfg.section(), f"model.{cfg.arch}"
    if opts.img_size % opts.patch_size != 0:
        raise ValueError(
            f"{key}.img_size={opts.img_size} must be a multiple of {key}.patch_size={opts.patch_size} "
            "(the ViT splits the image into whole patches)"
        )


TIMM_NAME = "vit_tiny_patch16_224"


def describe_vit(model: Mapping[str, Any]) -> dict[str, Any]:
    """export.json's fields of the ViT: its sizes and the timm constructor that rebuilds it."""
    opts, channels = model[model["arch"]], int(model["in_channels"])
    img, patch = int(opts["img_size"]), int(opts["patch_size"])
    return {
        "img_size": img,
        "patch_size": patch,
        "constructor": (
            f"timm.create_model({TIMM_NAME!r}, pretrained=False, num_classes=0, in_chans={channels}, "
            f"img_size={img}, patch_size={patch}, dynamic_img_size=True)"
        ),
    }


def build_timm_vit(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    """timm's ViT as export.json describes it, without a classifier."""
    require_module("timm", "eval", "an exported timm ViT")
    import timm

    net = timm.create_model(
        str(meta["library_model"]),
        pretrained=False,
        num_classes=0,
        in_chans=int(meta["in_channels"]),
        img_size=int(meta["img_size"]),
        patch_size=int(meta["patch_size"]),
        dynamic_img_size=True,
    )
    return net, int(cast(int, net.num_features))


@register_backbone(
    "vit_tiny",
    check=check_vit,
    input_multiple=lambda cfg: (
        cfg.section().patch_size,
        f"model.{cfg.arch}.patch_size",
        {f"model.{cfg.arch}.img_size": cfg.section().img_size},
    ),
    export=ExportLayout("timm", TIMM_NAME, describe_vit, build_timm_vit, inner="vit."),  # kept under vit.
    options=ViTOptions,
)  # patches, no stem: no small_stem
def build_vit_tiny(cfg: ModelConfig) -> tuple[nn.Module, int]:
    """ViTBackbone of ``cfg.in_channels`` and its section's ``img_size`` and ``patch_size``."""
    vit = ViTBackbone(cfg)
    return vit, vit.feature_dim
