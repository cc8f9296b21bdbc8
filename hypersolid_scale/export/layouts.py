"""A backbone's weights in its library's own key layout, from the export layout its backbone module registers.

Each backbone says what library model it is in its own file (``models/backbones/<name>.py``, an
:class:`~hypersolid_scale.models.backbones.ExportLayout`): ``resnet18``/``resnet50`` are torchvision's ResNets
(the state dict's keys are torchvision's, without ``fc``; the ``small`` stem is a 3x3 stride-1 ``conv1`` and no
max-pool, the ``standard`` stem torchvision's own); ``vit_tiny`` is timm's ``vit_tiny_patch16_224`` (this
package keeps it under ``vit.``); ``small_cnn`` has no library counterpart and is rebuilt as this package's
:class:`~hypersolid_scale.models.SmallCNN`. Everything here works from an export's description
(``export.json``), so a directory loads without its checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hypersolid_scale.models.backbones import ExportLayout, backbone_names, get_backbone
from hypersolid_scale.safety.errors import CheckpointError, ConfigError

__all__ = ["build_library_module", "describe", "layout_of", "load_strict", "to_library_state"]

BACKBONE_PREFIX = "backbone."  # the backbone's tensors in a checkpoint's ``model`` entry


def layout_of(arch: str) -> ExportLayout:
    """The export layout the backbone ``arch`` registers; a CheckpointError when it has none."""
    try:
        layout = get_backbone(arch).export
    except ConfigError:
        layout = None
    if layout is None:
        known = [n for n in backbone_names() if get_backbone(n).export is not None]
        raise CheckpointError(
            f"model.arch={arch!r} has no export layout (known: {known}); export a checkpoint of one "
            "of those, or save its backbone's state_dict yourself"
        )
    return layout


def describe(model: Mapping[str, Any]) -> dict[str, Any]:
    """The ``export.json`` fields that say how to build the library module, from a config's ``model`` section."""
    arch = str(model["arch"])
    layout = layout_of(arch)
    return {
        "arch": arch,
        "library": layout.library,
        "library_model": layout.name if layout.library else None,
        "in_channels": int(model["in_channels"]),
        **layout.describe(model),
    }


def to_library_state(backbone_state: Mapping[str, torch.Tensor], arch: str) -> dict[str, torch.Tensor]:
    """The package backbone's state dict (keys without ``backbone.``) under the library's own names."""
    inner = layout_of(arch).inner
    if inner and any(not k.startswith(inner) for k in backbone_state):
        odd = next(k for k in backbone_state if not k.startswith(inner))
        raise CheckpointError(f"backbone tensor {odd!r} is not under {inner!r}, as every {arch} tensor is")
    return {k[len(inner) :]: v.contiguous() for k, v in backbone_state.items()}


def build_library_module(meta: Mapping[str, Any]) -> tuple[nn.Module, int]:
    """(the library's module as ``export.json`` describes it, on the meta device, no classifier; feature dim).

    Its tensors have no storage: :func:`load_strict` gives it the weights (building without initialising them
    saves a second or so for a ResNet-50)."""
    arch = str(meta.get("arch"))
    layout = layout_of(arch)
    try:
        with torch.device("meta"):
            return layout.build(meta)
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
