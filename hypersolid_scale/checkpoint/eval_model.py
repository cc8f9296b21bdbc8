"""A model built from a checkpoint for evaluation (``build_model_from_checkpoint``), and the checkpoint of a
run's initial weights (``random_init_checkpoint``), the floor a trained network must beat.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from hypersolid_scale.checkpoint.layout import migrate_layout, split_method_state
from hypersolid_scale.checkpoint.reading import load_checkpoint
from hypersolid_scale.checkpoint.resume import load_weights
from hypersolid_scale.config.schema import Config, from_dict
from hypersolid_scale.methods import build_method_model, get_method, method_names
from hypersolid_scale.models import BackboneWithProjector, build_backbone


def initial_weights(cfg: Config) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(model, method)``: the initial weights of a run of ``cfg`` in a checkpoint's layout (the backbone's, and
    the method's heads and state), drawn as the trainer draws them: the same seed, the same construction."""
    torch.manual_seed(cfg.seed)  # the trainer seeds exactly like this before building the model
    return split_method_state(build_method_model(cfg.model, cfg.method).state_dict())


def _backbone_and_head(cfg: Config) -> tuple[nn.Module, int, nn.Module | None, str]:
    """The backbone, its feature dimension, and the method's projection head with its attribute name (the prefix
    of its weights in a checkpoint's ``method`` state); a method not installed here contributes no head."""
    if cfg.method.name not in method_names():
        backbone, feature_dim = build_backbone(cfg.model)
        return backbone, feature_dim, None, ""
    trained = build_method_model(cfg.model, cfg.method)  # the shapes; the weights come from the checkpoint
    return trained.backbone, trained.feature_dim, trained.projector, get_method(cfg.method.name).projection_head


def build_model_from_checkpoint(ckpt: dict[str, Any] | str | os.PathLike) -> tuple[BackboneWithProjector, Config]:
    """``(BackboneWithProjector with the checkpoint's weights, in eval mode; its Config)``, for evaluation.

    The backbone's weights, and the method's projection head (``Method.projection_head``) from the checkpoint's
    ``method`` state: what projector features read. A checkpoint without a method state (a backbone alone) or
    of a method without a head gets no projector (``projector`` None). A tensor that does not fit is named as
    the file names it (``backbone.*``; the head's under its attribute, e.g. ``projector.*``).
    """
    if not isinstance(ckpt, dict):
        ckpt = {**load_checkpoint(ckpt), "path": str(ckpt)}
    ckpt = migrate_layout(ckpt)
    cfg = from_dict(ckpt["config"])
    backbone, feature_dim, head, head_name = _backbone_and_head(cfg)
    model = BackboneWithProjector(backbone, feature_dim, None)
    own = {k: v for k, v in ckpt["model"].items() if k.startswith("backbone.")}
    load_weights(model.load_state_dict, {**ckpt, "model": own, "method": None})
    method_state = ckpt.get("method") or {}
    if head is not None and method_state:
        holder = nn.Module()
        holder.add_module(head_name, head)
        own = {k: v for k, v in method_state.items() if k.startswith(f"{head_name}.")}
        load_weights(holder.load_state_dict, {**ckpt, "model": own, "method": None})
        model.projector = head
    model.eval()
    return model, cfg


def random_init_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``ckpt`` whose weights are the run's *initial* weights (same seed, same code path).

    Evaluating it the same way as the trained checkpoint gives the randomly-initialised baseline that a
    self-supervised run must beat.
    """
    model, method = initial_weights(from_dict(ckpt["config"]))
    return {**ckpt, "model": model, "method": method, "optimizer": None, "step": 0, "epoch": 0, "loader": None}
