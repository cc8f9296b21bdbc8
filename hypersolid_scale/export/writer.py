"""A training checkpoint's encoder as library weights: ``export_checkpoint(checkpoint, out)``.

Writes into ``out`` (created with its parents):

* ``backbone.safetensors``: the backbone in its library's key layout (torchvision ResNet keys without ``fc``,
  timm ViT keys; the small CNN's own keys), loadable with ``strict=True`` into the library's constructor;
* ``backbone.pt``: the same tensors as a ``torch.save`` state dict, for tools that read PyTorch files
  (``launch/eval.py --backbone ... --weights``);
* ``projector.safetensors``: the method's projection head (Hypersolid's projector), where it has one;
* ``export.json``: architecture, stem, channels, feature dim, preprocessing, method, step, the config's
  fingerprint and the commit of the exporting code.

Before anything is written the backbone is loaded (strict) into the library's module, so a directory that
exists is one that loads.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.checkpoint import load_checkpoint
from hypersolid_scale.checkpoint.files import BadCheckpoint
from hypersolid_scale.checkpoint.layout import migrate_layout
from hypersolid_scale.export.layouts import (
    BACKBONE_PREFIX,
    build_library_module,
    describe,
    load_strict,
    to_library_state,
)
from hypersolid_scale.methods import get_method, method_names
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import CheckpointError, ConfigError, UserError

__all__ = ["EXPORT_FORMAT", "EXPORT_JSON", "export_checkpoint"]

EXPORT_JSON = "export.json"
EXPORT_FORMAT = 1


def _method_class(name: str) -> Any:
    """The installed method class named ``name``; None for a method this version does not have."""
    return get_method(name) if name in method_names() else None


def _config(ckpt: dict[str, Any], path: Path) -> Any:
    from hypersolid_scale.config.schema import from_dict

    try:
        return from_dict(ckpt["config"])
    except (UserError, ValueError, TypeError, KeyError) as err:
        raise BadCheckpoint(
            f"checkpoint {str(path)!r}: its config is refused by this version ({err}); export it with the "
            "hypersolid_scale version that trained it"
        ) from None


def _preprocessing(cfg: Any) -> dict[str, Any]:
    """What an image goes through before the encoder at evaluation: resize, centre crop, normalise."""
    from hypersolid_scale.data.augment.presets import resolve_preset

    preset = resolve_preset(cfg.data)
    return {
        "resize": preset.eval_resize,
        "interpolation": "bicubic",
        "input_size": preset.global_crop_size,
        "channels": preset.channels,
        "mean": list(preset.mean),
        "std": list(preset.std),
        "preset": preset.name,
    }


def _eval_backbone(meta: dict[str, Any]) -> list[str] | None:
    """``launch/eval.py`` arguments that evaluate ``backbone.pt`` as a published backbone (None: none do)."""
    arch, channels = meta["arch"], meta["in_channels"]
    if meta["library"] == "torchvision":
        if meta["stem"] == "standard" and channels == 3:
            return [f"torchvision:{arch}"]
        return [f"native:{arch}", f"model.small_stem={str(meta['stem'] == 'small').lower()}"]
    if meta["library"] == "timm":
        plain = channels == 3 and meta["img_size"] == 224 and meta["patch_size"] == 16
        return [f"timm:{meta['library_model']}"] if plain else None
    return [f"native:{arch}", f"model.{arch}.width={meta['small_cnn_width']}"]


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path, info: dict[str, str]) -> None:
    """The tensors as a safetensors file, written atomically (no half-written file)."""
    from safetensors.torch import save

    atomic.write_bytes(path, save({k: v.contiguous() for k, v in tensors.items()}, metadata={"format": "pt", **info}))


def _out_dir(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; pass a directory (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"cannot create --out {str(out)!r}: {err.strerror or err}; pass a writable directory"
        ) from None
    return out


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike) -> dict[str, Any]:
    """Export the encoder (and projector) of a training checkpoint into ``out``; returns ``export.json``'s dict.

    Raises:
        CheckpointError: a missing, damaged or foreign file, or weights that do not fit their config.
        ConfigError: ``out`` cannot be a directory.
    """
    from hypersolid_scale import __version__
    from hypersolid_scale.config.schema import to_dict
    from hypersolid_scale.tracking.metadata import git_commit

    path = Path(checkpoint)
    ckpt = migrate_layout({**load_checkpoint(path), "path": str(path)})
    cfg = _config(ckpt, path)
    model = dataclasses.asdict(cfg.model)
    meta = describe(model)
    backbone = {k[len(BACKBONE_PREFIX) :]: v for k, v in ckpt["model"].items() if k.startswith(BACKBONE_PREFIX)}
    if not backbone:
        raise BadCheckpoint(f"checkpoint {str(path)!r} holds no backbone weights (no {BACKBONE_PREFIX}* tensors)")
    state = to_library_state(backbone, meta["arch"])
    net, dim = build_library_module(meta)
    try:
        load_strict(net, state)
    except RuntimeError as err:
        first = " ".join(str(err).split())[:300]
        raise BadCheckpoint(
            f"checkpoint {str(path)!r} holds weights that do not fit model.arch={meta['arch']} as its config "
            f"describes it ({first})"
        ) from None
    method = cfg.method.name
    # The method's projection head inside its ``method`` state (teachers, predictors and prototypes stay out).
    cls = _method_class(method)
    prefix = f"{cls.projection_head}." if cls is not None and cls.projection_head else ""
    projector = {
        k[len(prefix) :]: v
        for k, v in (ckpt.get("method") or {}).items()
        if prefix and k.startswith(prefix) and isinstance(v, torch.Tensor)
    }
    meta.update(
        format="hypersolid_scale.export",
        format_version=EXPORT_FORMAT,
        feature_dim=dim,
        preprocessing=_preprocessing(cfg),
        method=method,
        step=int(ckpt["step"]),
        epoch=int(ckpt["epoch"]),
        config_fingerprint=ckpt["config_fingerprint"],
        model_config=model,
        checkpoint=str(path),
        source_commit=git_commit(),
        package_version=__version__,
        files={"backbone": "backbone.safetensors", "backbone_pt": "backbone.pt"},
    )
    if projector:
        meta["files"]["projector"] = "projector.safetensors"
        meta["projector"] = {
            "module": f"method.{prefix.rstrip('.')}",  # its tensors' names are those of this module
            "tensors": len(projector),
            "settings": to_dict(cfg)["method"].get(method) or {},  # the method's section: its head's shape
        }
    args = _eval_backbone(meta)
    meta["eval"] = None if args is None else ["--backbone", args[0], "--weights", "<out>/backbone.pt", *args[1:]]
    out_dir = _out_dir(Path(out))
    info = {"arch": meta["arch"], "library": str(meta["library"]), "step": str(meta["step"])}
    try:
        _save_safetensors(state, out_dir / "backbone.safetensors", info)
        atomic.write_with(out_dir / "backbone.pt", lambda f: torch.save(state, f))
        if projector:
            _save_safetensors(projector, out_dir / "projector.safetensors", {**info, "method": method})
        else:  # a directory exported before from another run: no stale projector next to this backbone
            (out_dir / "projector.safetensors").unlink(missing_ok=True)
        atomic.write_json(out_dir / EXPORT_JSON, meta, indent=2)
    except OSError as err:
        raise CheckpointError(f"cannot write the export to {str(out_dir)!r}: {err.strerror or err}") from None
    return meta
