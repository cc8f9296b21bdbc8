"""``resnet18``, ``resnet50``: torchvision ResNets, with an optional CIFAR-style stem for 32 px inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from hypersolid_scale.models.backbones import ExportLayout, register_backbone

if TYPE_CHECKING:
    from hypersolid_scale.models.config import ModelConfig


def describe_resnet(model: Mapping[str, Any]) -> dict[str, Any]:
    """export.json's fields of a ResNet: its stem and the torchvision constructor that rebuilds it."""
    arch, channels = str(model["arch"]), int(model["in_channels"])
    stem = "small" if model.get("small_stem") else "standard"
    replaced = (
        f"; conv1 = nn.Conv2d({channels}, 64, 3, 1, 1, bias=False); maxpool = nn.Identity()"
        if stem == "small"
        else (f"; conv1 = nn.Conv2d({channels}, 64, 7, 2, 3, bias=False)" if channels != 3 else "")
    )
    return {"stem": stem, "constructor": f"torchvision.models.{arch}(weights=None); fc = nn.Identity(){replaced}"}


def _resnet(arch: str, channels: int, small_stem: bool) -> tuple[nn.Module, int]:
    """torchvision's ``arch`` (fresh weights) with the stem for ``channels`` input channels, without ``fc``."""
    import torchvision

    ctor = {"resnet18": torchvision.models.resnet18, "resnet50": torchvision.models.resnet50}[arch]
    net = ctor(weights=None)
    if small_stem:
        # CIFAR variant (as in SimCLR's CIFAR experiments): a 7x7/2 conv + 3x3/2 max-pool would reduce 32 px to
        # 8 px before layer1, leaving a 1x1 map at layer4.
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    dim = int(net.fc.in_features)
    net.fc = nn.Identity()
    return net, dim


def build_torchvision_resnet(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    """torchvision's ResNet as export.json describes it (stem, channels), without ``fc``."""
    return _resnet(str(meta["arch"]), int(meta["in_channels"]), meta.get("stem") == "small")


def _export(arch: str) -> ExportLayout:
    # torchvision's state dict keys, without fc
    return ExportLayout("torchvision", arch, describe_resnet, build_torchvision_resnet)


@register_backbone("resnet50", small_stem=True, export=_export("resnet50"))
@register_backbone("resnet18", small_stem=True, export=_export("resnet18"))
def build_resnet(cfg: ModelConfig) -> tuple[nn.Module, int]:
    """torchvision's ``cfg.arch`` without its classifier; ``cfg.small_stem`` and ``cfg.in_channels`` set the
    stem."""
    net, feature_dim = _resnet(cfg.arch, cfg.in_channels, cfg.small_stem)
    if isinstance(net.conv1, nn.Conv2d):
        # Same init torchvision applies to its own convs, so a replaced stem is not the odd one out.
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    return net, feature_dim
