"""``small_cnn``: a small CNN for CPU runs on 28-32 px data (the default backbone)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hypersolid_scale.models.backbones import ExportLayout, register_backbone

if TYPE_CHECKING:
    from hypersolid_scale.models.config import ModelConfig


class SmallCNN(nn.Module):
    """Four 3x3 conv blocks (Conv-BN-ReLU), max-pool after the first three, global average pool.

    Sized for 28-32 px grayscale/RGB data on a CPU: width 32 gives ~240k parameters and ~9M multiply-adds per
    28 px image. ``ceil_mode`` pooling keeps tiny local crops (down to 1 px) from shrinking to zero size.

    Shape:
        (N, in_channels, H, W) -> (N, 4 * width)
    """

    def __init__(self, in_channels: int, width: int = 32) -> None:
        super().__init__()
        widths = (width, 2 * width, 4 * width, 4 * width)
        layers: list[nn.Module] = []
        prev = in_channels
        for i, w in enumerate(widths):
            # bias=False: the following BatchNorm's shift makes a conv bias redundant.
            layers += [
                nn.Conv2d(prev, w, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
            ]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(kernel_size=2, ceil_mode=True))
            prev = w
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.feature_dim = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(x)).flatten(1)


@dataclass
class SmallCNNOptions:
    """The section ``model.small_cnn`` (``model.<arch>`` of a copy of this file)."""

    width: int = 32  # channels of the first block; later blocks use 2x, 4x, 4x this width


def describe_small_cnn(model: Mapping[str, Any]) -> dict[str, Any]:
    """export.json's fields of the SmallCNN: no library has it; its width and this package's constructor."""
    channels, width = int(model["in_channels"]), int(model[model["arch"]]["width"])
    return {
        "small_cnn_width": width,
        "constructor": f"hypersolid_scale.models.SmallCNN(in_channels={channels}, width={width})",
        "library_note": (
            "small_cnn is this package's own CNN with no torchvision or timm counterpart: its state dict is "
            "exported as it is, and load_backbone rebuilds it as hypersolid_scale.models.SmallCNN"
        ),
    }


def build_exported_small_cnn(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    net = SmallCNN(int(meta["in_channels"]), int(meta["small_cnn_width"]))
    return net, net.feature_dim


@register_backbone(  # the default, listed first; keeps resolution already: no small_stem
    "small_cnn",
    order=0,
    export=ExportLayout(None, "small_cnn", describe_small_cnn, build_exported_small_cnn),
    options=SmallCNNOptions,
)
def build_small_cnn(cfg: ModelConfig) -> tuple[nn.Module, int]:
    """SmallCNN of ``cfg.in_channels`` and its section's ``width``."""
    net = SmallCNN(cfg.in_channels, cfg.section().width)
    return net, net.feature_dim
