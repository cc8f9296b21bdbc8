"""A training run's state in a checkpoint: what goes in (``run_state``, collected from every rank), how it
comes back (``restore_run_state``), and which checkpoint a run resumes from (``resolve_resume``). The file
itself (atomic writes, ``weights_only`` reads) is :mod:`hypersolid_scale.checkpoint.files`, the RNG states
:mod:`hypersolid_scale.checkpoint.rng`.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
import warnings
from typing import Any, cast

import torch
from torch import nn

from hypersolid_scale.checkpoint.files import (
    BadCheckpoint,
    checkpoint_dir,
    delete_stale_tmp,
    find_resume_checkpoint,
    list_checkpoints,
    load_checkpoint,
)
from hypersolid_scale.checkpoint.rng import rng_state, set_rng_state
from hypersolid_scale.config.fingerprint import config_diff, fingerprint
from hypersolid_scale.config.schema import Config, from_dict, to_dict
from hypersolid_scale.distributed import Engine, barrier, broadcast_object, gather_objects, get_rank
from hypersolid_scale.methods import get_method, method_names
from hypersolid_scale.models import build_model
from hypersolid_scale.safety.errors import CheckpointError, ConfigError

# ----------------------------------------------------------------------------------------------------------
# The run's state: what a checkpoint of a training run holds, and how it is put back
# ----------------------------------------------------------------------------------------------------------


def run_state(
    *,
    cfg: Config,
    engine: Engine,
    loader: Any,
    step: int,
    rank: int,
    world_size: int,
    global_batch: int,
    mlflow_run_id: str | None,
    tracking_uri: str | None,
) -> dict[str, Any] | None:
    """The checkpoint of a run at ``step``. Collective: every rank contributes its RNG state (and its ZeRO
    shard, inside ``optimizer_state``); the dict is returned on rank 0, None elsewhere.

    ``epoch`` is the loader's epoch (in progress, or just finished when its position is at the end);
    ``global_batch`` the images of one optimizer step over all ranks, what steps and the loader count.
    """
    loader_state = loader.state_dict()
    optim_state = engine.optimizer_state()
    rngs = gather_objects(rng_state())
    if rank != 0:
        return None
    model, method = split_method_state(engine.model.state_dict())
    extra = {} if method is None else {"method": method}
    return {
        "model": model,
        **extra,
        "optimizer": optim_state,
        "step": step,
        "epoch": int(loader_state["epoch"]),
        "rng": rngs,  # one state per rank, rank order
        "loader": loader_state,
        "config": to_dict(cfg, stored=True),
        "config_fingerprint": fingerprint(cfg),
        "mlflow_run_id": mlflow_run_id,
        "tracking_uri": tracking_uri,
        "world_size": world_size,
        "global_batch": int(global_batch),
    }


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


def _trained_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The trained module's state dict again: ``model`` plus ``method`` under its prefix."""
    return {**ckpt["model"], **{METHOD_PREFIX + k: v for k, v in (ckpt.get("method") or {}).items()}}


def _load_weights(load: Any, ckpt: dict[str, Any]) -> None:
    """``load(model and method state)``, turning torch's missing-key / shape errors (and a SwaV queue of
    another size) into one that names the file."""
    try:
        load(_trained_state(ckpt))
    except (RuntimeError, ValueError) as err:
        arch = ckpt["config"].get("model", {}).get("arch", "?") if isinstance(ckpt["config"], dict) else "?"
        raise BadCheckpoint(
            f"checkpoint {ckpt.get('path', '')} holds weights of another architecture than its config "
            f"(model.arch={arch}) describes, so they cannot be loaded ({_load_problems(err)}). Use a checkpoint "
            "written by launch/train.py for this model config"
        ) from None


def _load_problems(err: Exception, shown: int = 3) -> str:
    """torch's load_state_dict error (every mismatching tensor, hundreds of names) as counts and the first few
    names of each kind."""
    text = " ".join(str(err).split())
    parts = []
    for kind, label in (("Missing", "missing from the file"), ("Unexpected", "the model does not have")):
        found = re.search(kind + r' key\(s\) in state_dict: ((?:"[^"]+"(?:, )?)+)', text)
        if found:
            keys = re.findall(r'"([^"]+)"', found.group(1))
            more = ", ..." if len(keys) > shown else ""
            parts.append(f"{len(keys)} tensors {label} ({', '.join(keys[:shown])}{more})")
    sizes = re.findall(r"size mismatch for ([^:]+):", text)
    if sizes:
        more = ", ..." if len(sizes) > shown else ""
        parts.append(f"{len(sizes)} of another shape ({', '.join(sizes[:shown])}{more})")
    return "; ".join(parts) or text[:300]


def saved_global_batch(ckpt: dict[str, Any]) -> int | None:
    """The checkpoint's global batch; for one written before it was stored, its world size x its config's
    ``data.batch_size_per_gpu`` (None when it has no world size either: it resumes at any global batch)."""
    if "global_batch" in ckpt:
        return int(ckpt["global_batch"])
    per_rank = (ckpt.get("config") or {}).get("data", {}).get("batch_size_per_gpu")
    return None if ckpt.get("world_size") is None or per_rank is None else int(ckpt["world_size"]) * int(per_rank)


def restore_run_state(
    ckpt: dict[str, Any],
    *,
    engine: Engine,
    loader: Any,
    rank: int,
    world_size: int,
    global_batch: int,
    steps_per_epoch: int,
    force: bool,
) -> tuple[int, int]:
    """Load weights, optimizer, RNG and loader position; returns ``(step, epoch)`` to continue from.

    Steps, the loader position and the LR schedule count global batches, and global batch t holds the same
    samples whatever the world size (docs/design.md §3b): another world size at the same ``global_batch``
    continues exactly (one line says what does not carry over). Another global batch is refused; with
    ``force`` (``checkpoint.resume=force``) it restarts the checkpoint's epoch with its weights only, and an
    optimizer state of another layout is dropped, each with a warning.
    """
    ckpt = migrate_layout(ckpt)
    path = ckpt.get("path", "")
    saved_world = int(ckpt.get("world_size", world_size))
    saved_batch = saved_global_batch(ckpt) or global_batch
    if saved_batch != global_batch:
        if not force:
            raise BadCheckpoint(
                f"checkpoint {path} was trained with a global batch of {saved_batch} images ({saved_world} "
                f"process(es)), this run's is {global_batch} ({world_size} process(es)): steps, the loader "
                f"position and the learning-rate schedule count global batches. Keep the global batch at "
                f"{saved_batch} (data.global_batch_size), or pass checkpoint.resume=force to "
                "continue from the start of the checkpoint's epoch with the new one"
            )
        epoch = int(ckpt["epoch"])
        warnings.warn(
            f"checkpoint.resume=force: global batch {saved_batch} -> {global_batch}; restarting epoch "
            f"{epoch} at step {epoch * steps_per_epoch}",
            stacklevel=2,
        )
        _load_weights(engine.load_model_state, ckpt)
        return epoch * steps_per_epoch, epoch
    _load_weights(engine.load_model_state, ckpt)
    if ckpt.get("optimizer") is not None:
        try:
            engine.load_optimizer_state(ckpt["optimizer"])
        except ValueError as err:
            if not force:
                raise BadCheckpoint(f"checkpoint {path}: {err}") from None
            warnings.warn("checkpoint.resume=force: optimizer state not restored (layout differs)", stacklevel=2)
    rngs = ckpt.get("rng") or []
    if saved_world == world_size and len(rngs) == world_size:
        set_rng_state(rngs[rank])
    step, epoch = int(ckpt["step"]), int(ckpt["epoch"])
    loader_state = ckpt.get("loader")
    if loader_state is not None:
        loader.load_state_dict(loader_state)
        if int(loader_state.get("batches_done", 0)) >= steps_per_epoch:
            epoch += 1  # saved at the end of an epoch: continue with the next one
    if saved_world != world_size and rank == 0:
        done = int((loader_state or {}).get("batches_done", 0))
        print(_resized_note(path, saved_world, world_size, global_batch, step, loader, epoch, done), file=sys.stderr)
    return step, epoch


def _resized_note(path: str, saved: int, world: int, batch: int, step: int, loader: Any, epoch: int, done: int) -> str:
    """The one line of a resume on another world size: what carries over, and what does not."""
    keyed = getattr(loader, "world_size_invariant", True)  # False: WebDataset, its streams split by rank
    stream = (
        ""
        if keyed or done <= 0 or done >= len(loader)
        else f" and the per-rank WebDataset stream position (its shards are split by rank): the rest of epoch {epoch} "
        f"is drawn from the {world}-process streams, so some of its samples repeat and others are skipped"
    )
    return (
        f"note: resuming {path}, written by {saved} process(es), on {world} at the same global batch of {batch}: "
        f"the step ({step}), the loader position and the optimizer state carry over; not carried over: the "
        f"per-rank RNG states ({'the keyed augmentations do not' if keyed else 'WebDataset augmentations'} draw "
        f"from them; the generators keep this start's seeding){stream}"
    )


# ----------------------------------------------------------------------------------------------------------
# Resume
# ----------------------------------------------------------------------------------------------------------


def check_compatible(
    ckpt: dict[str, Any],
    cfg_dict: dict[str, Any],
    fingerprint: str,
    *,
    force: bool,
    path: str | os.PathLike = "checkpoint",
) -> None:
    """Refuse to resume a checkpoint trained with a different model/loss/data/optimizer config."""
    if ckpt["config_fingerprint"] == fingerprint:
        return
    diff = config_diff(ckpt["config"], cfg_dict)
    if not diff:
        # Written by an older version whose config had fewer keys or other names: the same training.
        return
    lines = "\n  ".join(diff)
    if force:
        warnings.warn(f"resuming {path} despite config changes (checkpoint.resume=force):\n  {lines}", stacklevel=2)
        return
    raise BadCheckpoint(
        f"cannot resume from {path}: the config differs from the one it was trained with:\n  {lines}\n"
        "Use a new run_dir for a new experiment, pass checkpoint.resume=never to start over in this run_dir "
        "(the old checkpoints are moved aside), or checkpoint.resume=force to continue anyway."
    )


def set_aside_checkpoints(run_dir: str | os.PathLike) -> None:
    """``checkpoint.resume=never``: move existing checkpoints aside (collective), so that pruning never
    deletes the new run's files in favour of an old run's higher step numbers."""
    old = checkpoint_dir(run_dir)
    if get_rank() == 0 and list_checkpoints(run_dir):
        aside = old.with_name(f"checkpoints.old-{time.strftime('%Y%m%d-%H%M%S')}")
        warnings.warn(f"checkpoint.resume=never: moving the existing checkpoints to {aside}", stacklevel=2)
        shutil.move(str(old), str(aside))
    barrier()


def resolve_resume(cfg: Config) -> dict[str, Any] | None:
    """The checkpoint a run should resume from, per ``cfg.checkpoint.resume``, or None to start fresh.

    Collective: rank 0 picks the file, every rank loads the same one (run_dir is on a shared filesystem).
    Reads only, apart from stray ``*.tmp`` files: with ``never`` it returns None and the caller moves the
    old checkpoints aside with :func:`set_aside_checkpoints` once the run has started.
    """
    if cfg.checkpoint.resume == "never":
        return None
    path: str | None = None
    if get_rank() == 0:
        delete_stale_tmp(cfg.run_dir)
        found = find_resume_checkpoint(cfg.run_dir)
        # The run's own checkpoints win over checkpoint.path: after a requeue, the run must continue from
        # its newest step, not restart from the file it was first initialised from.
        if found:
            path = str(found[0])
        elif cfg.checkpoint.path:
            path = cfg.checkpoint.path
    path = cast("str | None", broadcast_object(path))
    if path is None:
        return None
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as err:
        if path != cfg.checkpoint.path:
            raise
        raise type(err)(f"checkpoint.path: {err}. Fix checkpoint.path, or drop it to start from scratch") from None
    check_compatible(ckpt, to_dict(cfg), fingerprint(cfg), force=cfg.checkpoint.resume == "force", path=path)
    ckpt["path"] = path
    return ckpt


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
        _load_weights(model.load_state_dict, weights)
    else:
        prefix = "backbone."
        weights["model"] = {k[len(prefix) :]: v for k, v in weights["model"].items() if k.startswith(prefix)}
        _load_weights(model.backbone.load_state_dict, weights)
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
