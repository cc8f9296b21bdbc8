"""``small_cnn``: a small CNN for CPU runs on 28-32 px data (the default backbone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hypersolid_scale.models.backbones import register_backbone

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


@register_backbone("small_cnn", order=0)  # the default, listed first; keeps resolution already: no small_stem
def build_small_cnn(cfg: ModelConfig) -> tuple[nn.Module, int]:
    """SmallCNN of ``cfg.in_channels`` and ``cfg.small_cnn_width``."""
    net = SmallCNN(cfg.in_channels, cfg.small_cnn_width)
    return net, net.feature_dim
