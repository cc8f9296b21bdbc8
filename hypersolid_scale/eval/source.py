"""What an evaluation evaluates: a training checkpoint of this package, or a published backbone with its weights.

Either becomes a ``Source``: the model (``model.backbone`` gives the features), its config with the user's
overrides applied (only the sections an evaluation may change), and where it comes from (the embedding
cache's key, the MLflow run and tags, the report's meta). Bad input raises a ``UserError`` whose message
says what to fix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.eval.embed import file_fingerprint
from hypersolid_scale.safety.errors import CheckpointError, ConfigError, UserError

__all__ = ["OVERRIDABLE", "Source", "checkpoint_source", "external_source", "load_model"]

# Sections a user may change at evaluation time; the model section must stay what the weights were trained as.
OVERRIDABLE = ("data.", "eval.", "tracking.")


def load_model(path: str | Path, overrides: list[str]) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """(model in eval mode, Config with overrides applied, raw checkpoint dict); a ``UserError`` for bad input."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hypersolid_scale.checkpoint import build_model_from_checkpoint, load_checkpoint
    from hypersolid_scale.config.schema import from_dict, parse_overrides, validate

    for ov in overrides:
        if "=" not in ov or not ov.startswith(OVERRIDABLE):
            raise ConfigError(
                f"override {ov!r} is not allowed here: write section.key=value with a section among "
                f"{[s.rstrip('.') for s in OVERRIDABLE]} (the model must stay the one checkpoint "
                f"{str(path)!r} was trained as; evaluate another checkpoint for another model)"
            )
    ckpt = load_checkpoint(path)
    try:
        model, _ = build_model_from_checkpoint({**ckpt, "path": str(path)})  # "path": named in its errors
    except UserError as err:  # e.g. a config key unknown to this version: say which file holds it
        if str(path) in str(err):
            raise
        raise CheckpointError(f"checkpoint {str(path)!r}: {err}") from None
    given = parse_overrides(overrides)  # its ConfigError names the override that cannot be parsed
    try:
        merged = OmegaConf.merge(OmegaConf.create(ckpt["config"]), given)
        cfg = from_dict(OmegaConf.to_container(merged))  # type: ignore[arg-type]
        validate(cfg)
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad override in {overrides}: {str(err).splitlines()[0]}") from None
    except ValueError as err:  # config's contract: its message names the key and what it accepts
        if overrides:
            raise ConfigError(
                f"the overrides {overrides} do not fit the config of checkpoint {str(path)!r}: "
                f"{err}. Correct or drop the override"
            ) from None
        raise ConfigError(
            f"the config of checkpoint {str(path)!r} is refused by this version: {err}. Evaluate it "
            "with the hypersolid_scale version that trained it"
        ) from None
    return model, cfg, ckpt


@dataclass
class Source:
    """What is evaluated (``model.backbone`` gives the features), with its config and where it comes from."""

    model: torch.nn.Module
    cfg: Any
    path: Path  # the checkpoint or weights file
    home: Path  # the run directory or the weights' folder: default embedding cache and MLflow store
    weights_id: str  # identity of the weights in the embedding cache's key
    meta: dict[str, Any]
    label: str  # what the printed table is about
    kind: str = "offline-eval"  # eval.kind tag of a new MLflow run
    tags: dict[str, Any] = field(default_factory=dict)
    ckpt: dict[str, Any] = field(default_factory=dict)  # a training checkpoint's entries (MLflow run, step)


def checkpoint_source(checkpoint: Path, overrides: list[str]) -> Source:
    """A training checkpoint of this package, evaluated on the data it records (or the overrides')."""
    from hypersolid_scale.checkpoint import run_dir_of
    from hypersolid_scale.data import in_channels

    model, cfg, ckpt = load_model(checkpoint, overrides)
    if in_channels(cfg.data) != cfg.model.in_channels:
        raise ConfigError(
            f"{cfg.data.describe()} has {in_channels(cfg.data)}-channel images but the "
            f"checkpoint's model takes {cfg.model.in_channels}; evaluate it on data like its "
            "training data"
        )
    run_dir = run_dir_of(checkpoint) or checkpoint.parent
    meta = {
        "checkpoint": str(checkpoint),
        "step": int(ckpt["step"]),
        "epoch": int(ckpt["epoch"]),
        "arch": cfg.model.arch,
    }
    return Source(
        model,
        cfg,
        checkpoint,
        run_dir,
        file_fingerprint(checkpoint),
        meta,
        label=f"{checkpoint} (step {ckpt['step']}, {cfg.model.arch}",
        ckpt=ckpt,
        tags={"eval.checkpoint": str(checkpoint.resolve()), "eval.step": int(ckpt["step"])},
    )


def external_source(backbone: str, weights: Path, strip_prefixes: list[str], overrides: list[str]) -> Source:
    """A published backbone (``hypersolid_scale.models.external``) on the data of the defaults + overrides."""
    from hypersolid_scale.config.schema import load_config, to_dict
    from hypersolid_scale.data import in_channels
    from hypersolid_scale.models.external import load_external_backbone, parse_backbone

    source, _ = parse_backbone(backbone)
    allowed = OVERRIDABLE + (("model.",) if source == "native" else ())
    for ov in overrides:
        if "=" not in ov or not ov.startswith(allowed) or ov.startswith("model.arch="):
            raise ConfigError(
                f"override {ov!r} is not allowed with --backbone: write section.key=value with a "
                f"section among {[s.rstrip('.') for s in allowed]} (model.* only for native: "
                "backbones; the architecture is --backbone's)"
            )
    cfg = load_config(None, overrides)
    channels = in_channels(cfg.data)
    if not any(ov.startswith("model.in_channels=") for ov in overrides):
        cfg.model.in_channels = channels  # native: archs take the data's channels unless told otherwise
    net, info = load_external_backbone(
        backbone, weights, data_channels=channels, model_cfg=cfg.model, strip_prefixes=strip_prefixes
    )
    model = torch.nn.ModuleDict({"backbone": net})  # the embedding extraction reads model.backbone
    meta: dict[str, Any] = {
        "backbone": backbone,
        "weights": str(weights),
        "arch": backbone,
        "loaded_tensors": info.loaded,
        "dropped_keys": len(info.dropped),
        "dropped": info.dropped[:100],
        "missing_buffers": info.missing_buffers,
        "strip_prefixes": list(strip_prefixes),
        "backbone_in_channels": info.in_channels,
    }
    if info.in_channels != channels:
        meta["input"] = (
            f"the {channels}-channel images are repeated to the backbone's {info.in_channels} "
            "channels (after the dataset's eval transform and normalisation)"
        )
    ident = {
        "weights": file_fingerprint(weights),
        "backbone": backbone,
        "strip": list(strip_prefixes),
        "model": to_dict(cfg)["model"] if source == "native" else None,
    }
    return Source(
        model,
        cfg,
        weights,
        weights.parent,
        hashlib.sha256(repr(ident).encode()).hexdigest(),
        meta,
        label=f"{weights} ({backbone}",
        kind="external",
        tags={"eval.backbone": backbone, "eval.weights": str(weights.resolve())},
    )
