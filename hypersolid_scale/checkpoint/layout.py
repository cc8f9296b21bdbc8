"""How a checkpoint lays out the trained module's weights: the backbone in ``model``, the method's heads,
teacher and state in ``method``; and the one migration of that layout (an earlier version's Hypersolid
projector in ``model``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from hypersolid_scale.distributed import get_rank

METHOD_PREFIX = "method."  # the method's heads, loss, teacher and state inside the trained module (MethodModel.method)


def _portable(v: Any) -> Any:
    """fp32 CPU tensors (fp64 ones, a dist.precision=fp64 run's, kept as they are); a module's extra state (a dict
    of host values and tensors, SwaV's queue) likewise."""
    if isinstance(v, torch.Tensor):
        return (v.float() if v.is_floating_point() and v.dtype != torch.float64 else v).cpu()
    if isinstance(v, dict):
        return {k: _portable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_portable(x) for x in v)
    return v


def split_method_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(model, method)``: the checkpoint's ``model`` (the backbone, ``backbone.*``) and ``method`` (everything
    under ``method.``: heads, teacher, the method's extra state; None when there is none)."""
    model = {k: _portable(v) for k, v in state.items() if not k.startswith(METHOD_PREFIX)}
    method = {k[len(METHOD_PREFIX) :]: _portable(v) for k, v in state.items() if k.startswith(METHOD_PREFIX)}
    return model, (method or None)


_said_layout = False


def migrate_layout(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A Hypersolid checkpoint of an earlier version kept its projector in ``model`` (``projector.*``) and had
    no ``method`` entry: the same checkpoint in the present layout (``method.projector.*``, the method's step
    count from the checkpoint's step), said once per process. Other checkpoints are returned as they are."""
    global _said_layout
    model = ckpt.get("model") or {}
    if ckpt.get("method") or not any(k.startswith("projector.") for k in model):
        return ckpt
    if not _said_layout and get_rank() == 0:
        _said_layout = True
        print(
            f"note: checkpoint {ckpt.get('path', '')}: written by an earlier version; its projector.* weights "
            "are read as method.projector.*",
            file=sys.stderr,
            flush=True,
        )
    method = {k: v for k, v in model.items() if k.startswith("projector.")}
    method["_extra_state"] = {"step": int(ckpt.get("step", 0))}
    return {**ckpt, "model": {k: v for k, v in model.items() if not k.startswith("projector.")}, "method": method}


def trained_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The trained module's state dict again: ``model`` plus ``method`` under its prefix."""
    return {**ckpt["model"], **{METHOD_PREFIX + k: v for k, v in (ckpt.get("method") or {}).items()}}
