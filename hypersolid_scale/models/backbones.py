"""Backbones: images (N, C, H, W) -> features (N, F).

Every backbone here is randomly initialised (self-supervised training from scratch; no weights are downloaded)
and ends in a global pooling so that any input resolution maps to one F-dimensional vector — needed because
global and local crops have different sizes.
"""

from __future__ import annotations

import torch
from torch import nn

from hypersolid_scale.models.config import ModelConfig


# ---------------------------------------------------------------------------------------------------------------
# Small CNN (CPU quickstart)
# ---------------------------------------------------------------------------------------------------------------

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
            layers += [nn.Conv2d(prev, w, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(w),
                       nn.ReLU(inplace=True)]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(kernel_size=2, ceil_mode=True))
            prev = w
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.feature_dim = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.features(x)).flatten(1)


# ---------------------------------------------------------------------------------------------------------------
# torchvision ResNets
# ---------------------------------------------------------------------------------------------------------------

def _resnet(cfg: ModelConfig) -> tuple[nn.Module, int]:
    import torchvision

    ctor = {"resnet18": torchvision.models.resnet18, "resnet50": torchvision.models.resnet50}[cfg.arch]
    net = ctor(weights=None)
    if cfg.small_stem:
        # CIFAR variant (as in SimCLR's CIFAR experiments): a 7x7/2 conv + 3x3/2 max-pool would reduce 32 px to
        # 8 px before layer1, leaving a 1x1 map at layer4.
        net.conv1 = nn.Conv2d(cfg.in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif cfg.in_channels != 3:
        net.conv1 = nn.Conv2d(cfg.in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if isinstance(net.conv1, nn.Conv2d):
        # Same init torchvision applies to its own convs, so a replaced stem is not the odd one out.
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    feature_dim = net.fc.in_features
    net.fc = nn.Identity()
    return net, feature_dim


# ---------------------------------------------------------------------------------------------------------------
# timm ViT-Tiny
# ---------------------------------------------------------------------------------------------------------------

class ViTBackbone(nn.Module):
    """timm ViT with dynamic image size: the position-embedding grid is interpolated to the input's patch grid,
    so 96 px local crops and 224 px global crops share one model. Output is the final-norm CLS token.

    Shape:
        (N, in_channels, H, W) with H, W multiples of patch_size -> (N, 192) for ViT-Tiny
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        import timm

        self.patch_size = cfg.patch_size
        self.vit = timm.create_model(
            "vit_tiny_patch16_224",
            pretrained=False,
            num_classes=0,  # drop the classifier head; forward returns pooled features
            in_chans=cfg.in_channels,
            img_size=cfg.img_size,
            patch_size=cfg.patch_size,
            dynamic_img_size=True,
        )
        self.feature_dim = int(self.vit.num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(
                f"ViT input of size {h}x{w} is not a multiple of patch_size={self.patch_size}; "
                "choose crop sizes that are multiples of the patch size"
            )
        return self.vit(x)


def build_backbone(cfg: ModelConfig) -> tuple[nn.Module, int]:
    """Return (backbone, feature_dim) for ``cfg.arch``."""
    cfg.validate()
    if cfg.arch == "small_cnn":
        net = SmallCNN(cfg.in_channels, cfg.small_cnn_width)
        return net, net.feature_dim
    if cfg.arch in ("resnet18", "resnet50"):
        return _resnet(cfg)
    if cfg.arch == "vit_tiny":
        vit = ViTBackbone(cfg)
        return vit, vit.feature_dim
    raise AssertionError(f"unhandled arch {cfg.arch!r}")  # validate() rejects unknown archs first
