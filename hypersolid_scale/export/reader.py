"""An exported directory back as a network: ``load_backbone(directory)`` gives the torchvision ResNet / timm
ViT (or this package's small CNN) with the weights loaded strict; it takes images preprocessed as
``export.json``'s ``preprocessing`` says and returns their (N, feature_dim) features."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hypersolid_scale.export.layouts import build_library_module, load_strict
from hypersolid_scale.export.writer import EXPORT_FORMAT, EXPORT_JSON
from hypersolid_scale.safety.errors import CheckpointError

__all__ = ["load_backbone", "load_projector_state", "read_export"]

_MAKE = "make one with python -m hypersolid_scale.export --checkpoint CK --out DIR"


def read_export(directory: str | os.PathLike) -> dict[str, Any]:
    """The ``export.json`` of an exported directory; a ``CheckpointError`` saying what is wrong otherwise."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"{str(d)!r} is not a directory; pass the --out directory of an export ({_MAKE})")
    meta_path = d / EXPORT_JSON
    if not meta_path.is_file():
        raise CheckpointError(f"{str(d)!r} holds no {EXPORT_JSON}, so it is not an export directory; {_MAKE}")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{str(meta_path)!r} cannot be read ({err}); export the checkpoint again") from None
    if not isinstance(meta, dict) or meta.get("format") != "hypersolid_scale.export":
        raise CheckpointError(f"{str(meta_path)!r} is not this package's export description; {_MAKE}")
    if int(meta.get("format_version", 0)) > EXPORT_FORMAT:
        raise CheckpointError(
            f"{str(meta_path)!r} has export format {meta['format_version']}, newer than this code "
            f"({EXPORT_FORMAT}); upgrade hypersolid_scale to read it"
        )
    return meta


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is missing from the export directory; export the checkpoint again")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(
            f"{str(path)!r} is damaged or not a safetensors file ({err}); export the checkpoint again"
        ) from None


def load_backbone(directory: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> nn.Module:
    """The exported encoder as the library's own module (torchvision ResNet without ``fc``, timm ViT with
    ``num_classes=0``; the small CNN as this package's ``SmallCNN``), weights loaded with ``strict=True``, in
    eval mode: images (N, C, H, W) preprocessed as ``export.json``'s ``preprocessing`` -> features (N, F)."""
    meta = read_export(directory)
    net, _ = build_library_module(meta)
    state = _tensors(Path(directory) / meta["files"]["backbone"])
    try:
        load_strict(net, state)
    except RuntimeError as err:
        first = " ".join(str(err).split())[:300]
        raise CheckpointError(
            f"the weights in {str(directory)!r} do not fit the {meta['arch']} its {EXPORT_JSON} describes "
            f"({first}); export the checkpoint again"
        ) from None
    return net.to(map_location).eval()


def load_projector_state(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The exported projection head's state dict (``export.json``'s ``projector`` says which module it is)."""
    meta = read_export(directory)
    name = meta["files"].get("projector")
    if name is None:
        raise CheckpointError(f"the export in {str(directory)!r} has no projector (method {meta.get('method')})")
    return _tensors(Path(directory) / name)
