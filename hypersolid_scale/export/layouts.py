"""Where each backbone comes from, and its weights in that library's own key layout.

``resnet18``/``resnet50`` are torchvision's ResNets (the state dict's keys are torchvision's, without ``fc``;
the ``small`` stem is a 3x3 stride-1 ``conv1`` and no max-pool, the ``standard`` stem torchvision's own);
``vit_tiny`` is timm's ``vit_tiny_patch16_224`` (this package keeps it under ``vit.``); ``small_cnn`` has no
library counterpart and is rebuilt as this package's :class:`~hypersolid_scale.models.SmallCNN`. Everything
here works from an export's description (``export.json``), so a directory loads without its checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from hypersolid_scale.safety.errors import CheckpointError

__all__ = ["LAYOUTS", "Layout", "build_library_module", "describe", "load_strict", "to_library_state"]

BACKBONE_PREFIX = "backbone."  # the backbone's tensors in a checkpoint's ``model`` entry
SMALL_CNN_NOTE = (
    "small_cnn is this package's own CNN with no torchvision or timm counterpart: its state dict is exported "
    "as it is, and load_backbone rebuilds it as hypersolid_scale.models.SmallCNN"
)


@dataclass(frozen=True)
class Layout:
    """An architecture of this package as a library model.

    Attributes:
        library: ``torchvision``, ``timm``, or None (this package's own module).
        name: the library's model name (its constructor), or the package's arch for ``library=None``.
        inner: the prefix of the library module inside the package's backbone (``vit.`` for the ViT).
    """

    library: str | None
    name: str
    inner: str = ""


LAYOUTS = {
    "resnet18": Layout("torchvision", "resnet18"),
    "resnet50": Layout("torchvision", "resnet50"),
    "vit_tiny": Layout("timm", "vit_tiny_patch16_224", inner="vit."),
    "small_cnn": Layout(None, "small_cnn"),
}


def layout_of(arch: str) -> Layout:
    if arch not in LAYOUTS:
        raise CheckpointError(
            f"model.arch={arch!r} has no export layout (known: {sorted(LAYOUTS)}); export a checkpoint of one "
            "of those, or save its backbone's state_dict yourself"
        )
    return LAYOUTS[arch]


def describe(model: Mapping[str, Any]) -> dict[str, Any]:
    """The ``export.json`` fields that say how to build the library module, from a config's ``model`` section."""
    arch = str(model["arch"])
    layout = layout_of(arch)
    out: dict[str, Any] = {
        "arch": arch,
        "library": layout.library,
        "library_model": layout.name if layout.library else None,
        "in_channels": int(model["in_channels"]),
    }
    if layout.library == "torchvision":
        out["stem"] = "small" if model.get("small_stem") else "standard"
        out["constructor"] = f"torchvision.models.{layout.name}(weights=None); fc = nn.Identity()" + (
            f"; conv1 = nn.Conv2d({out['in_channels']}, 64, 3, 1, 1, bias=False); maxpool = nn.Identity()"
            if out["stem"] == "small"
            else (
                f"; conv1 = nn.Conv2d({out['in_channels']}, 64, 7, 2, 3, bias=False)" if out["in_channels"] != 3 else ""
            )
        )
    elif layout.library == "timm":
        out["img_size"], out["patch_size"] = int(model["img_size"]), int(model["patch_size"])
        out["constructor"] = (
            f"timm.create_model({layout.name!r}, pretrained=False, num_classes=0, in_chans={out['in_channels']}, "
            f"img_size={out['img_size']}, patch_size={out['patch_size']}, dynamic_img_size=True)"
        )
    else:
        out["small_cnn_width"] = int(model["small_cnn_width"])
        out["constructor"] = (
            f"hypersolid_scale.models.SmallCNN(in_channels={out['in_channels']}, width={out['small_cnn_width']})"
        )
        out["library_note"] = SMALL_CNN_NOTE
    return out


def to_library_state(backbone_state: Mapping[str, torch.Tensor], arch: str) -> dict[str, torch.Tensor]:
    """The package backbone's state dict (keys without ``backbone.``) under the library's own names."""
    inner = layout_of(arch).inner
    if inner and any(not k.startswith(inner) for k in backbone_state):
        odd = next(k for k in backbone_state if not k.startswith(inner))
        raise CheckpointError(f"backbone tensor {odd!r} is not under {inner!r}, as every {arch} tensor is")
    return {k[len(inner) :]: v.contiguous() for k, v in backbone_state.items()}


def _resnet(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    import torchvision

    ctor = {"resnet18": torchvision.models.resnet18, "resnet50": torchvision.models.resnet50}[meta["arch"]]
    net = ctor(weights=None)
    channels = int(meta["in_channels"])
    if meta.get("stem") == "small":
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    elif channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    dim = int(net.fc.in_features)
    net.fc = nn.Identity()
    return net, dim


def _vit(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
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


def _small_cnn(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    from hypersolid_scale.models.backbones.small_cnn import SmallCNN

    net = SmallCNN(int(meta["in_channels"]), int(meta["small_cnn_width"]))
    return net, net.feature_dim


def build_library_module(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    """(the library's module as ``export.json`` describes it, on the meta device, no classifier; feature dim).

    Its tensors have no storage: :func:`load_strict` gives it the weights (building without initialising them
    saves a second or so for a ResNet-50)."""
    arch = str(meta.get("arch"))
    library = layout_of(arch).library
    build = {"torchvision": _resnet, "timm": _vit, None: _small_cnn}[library]
    try:
        with torch.device("meta"):
            return build(meta)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"the {arch} description is incomplete or invalid ({type(err).__name__}: {err})"
        ) from None


def load_strict(net: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """``net.load_state_dict(state, strict=True)`` taking the tensors as they are (``assign``); a RuntimeError
    (torch's, naming the keys) when a tensor is missing, unexpected or of another shape."""
    net.load_state_dict(state, strict=True, assign=True)
    empty = [n for n, t in [*net.named_parameters(), *net.named_buffers()] if t.is_meta]
    if empty:
        raise RuntimeError(f"Missing key(s) in state_dict: {', '.join(repr(n) for n in empty[:3])}")
    return net
