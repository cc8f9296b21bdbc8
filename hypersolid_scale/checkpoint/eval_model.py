"""A model built from a checkpoint for evaluation (``build_model_from_checkpoint``), and the checkpoint of a
run's initial weights (``random_init_checkpoint``), the floor a trained network must beat.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from hypersolid_scale.checkpoint.files import load_checkpoint
from hypersolid_scale.checkpoint.layout import migrate_layout, split_method_state
from hypersolid_scale.checkpoint.resume import load_weights
from hypersolid_scale.config.schema import Config, from_dict
from hypersolid_scale.methods import get_method, method_names
from hypersolid_scale.models import build_model
from hypersolid_scale.safety.errors import ConfigError


class NoProjector(nn.Module):
    """Stands in for Hypersolid's projector in a model built from a baseline's checkpoint, which trained
    its own heads: asking for projector features is an error that says what to use instead."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ConfigError(
            f"this checkpoint was trained with method.name={self.method}, which has no Hypersolid "
            "projector; evaluate its backbone features (eval.features=backbone)"
        )


def _trains_projector(method: str) -> bool:
    """Whether ``method`` trains Hypersolid's projector (``projector_features``); a method that is not installed
    trains none that this version knows of."""
    return method in method_names() and get_method(method).projector_features


def build_model_from_checkpoint(ckpt: dict[str, Any] | str | os.PathLike) -> tuple[nn.Module, Config]:
    """``(BackboneWithProjector with the checkpoint's weights, in eval mode; its Config)`` — used by evaluation.

    The backbone's weights, and Hypersolid's projector when the checkpoint's method trains it
    (``projector_features``); any other method's checkpoint gets a :class:`NoProjector` in its place.
    """
    if not isinstance(ckpt, dict):
        ckpt = {**load_checkpoint(ckpt), "path": str(ckpt)}
    ckpt = migrate_layout(ckpt)
    cfg = from_dict(ckpt["config"])
    model = build_model(cfg.model)
    projector = "projector."
    trains_projector = _trains_projector(cfg.method.name)
    # Only what embeds images: the backbone, and Hypersolid's projector (not the method's step count).
    weights = {
        **ckpt,
        "model": {
            **ckpt["model"],
            **{k: v for k, v in (ckpt.get("method") or {}).items() if trains_projector and k.startswith(projector)},
        },
        "method": None,
    }
    if trains_projector:
        load_weights(model.load_state_dict, weights)
    else:
        prefix = "backbone."
        weights["model"] = {k[len(prefix) :]: v for k, v in weights["model"].items() if k.startswith(prefix)}
        load_weights(model.backbone.load_state_dict, weights)
        model.projector = NoProjector(cfg.method.name)
    model.eval()
    return model, cfg


def random_init_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``ckpt`` whose weights are the run's *initial* weights (same seed, same code path).

    Evaluating it the same way as the trained checkpoint gives the randomly-initialised baseline that a
    self-supervised run must beat.
    """
    cfg = from_dict(ckpt["config"])
    torch.manual_seed(cfg.seed)  # the trainer seeds exactly like this before building the model
    model, method = split_method_state(build_model(cfg.model).state_dict())
    if _trains_projector(cfg.method.name):  # the projector's initial weights, in the trainer's layout
        method = {k: v for k, v in model.items() if k.startswith("projector.")}
        model = {k: v for k, v in model.items() if not k.startswith("projector.")}
    else:  # a baseline's: its backbone is what evaluation reads
        model, method = {k: v for k, v in model.items() if k.startswith("backbone.")}, None
    return {**ckpt, "model": model, "method": method, "optimizer": None, "step": 0, "epoch": 0, "loader": None}
