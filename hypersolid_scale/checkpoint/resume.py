"""Putting a run's checkpoint back (``restore_run_state``), checking that it belongs to the run
(``check_compatible``) and choosing which checkpoint a run resumes from (``resolve_resume``).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
import warnings
from typing import Any, cast

from hypersolid_scale.checkpoint.files import (
    BadCheckpoint,
    checkpoint_dir,
    delete_stale_tmp,
    list_checkpoints,
)
from hypersolid_scale.checkpoint.layout import migrate_layout, trained_state
from hypersolid_scale.checkpoint.reading import find_resume_checkpoint, open_checkpoint
from hypersolid_scale.checkpoint.rng import set_rng_state
from hypersolid_scale.checkpoint.sharded import read_part
from hypersolid_scale.config.fingerprint import config_diff, fingerprint
from hypersolid_scale.config.schema import Config, to_dict
from hypersolid_scale.data.loading.protocol import TrainLoader
from hypersolid_scale.distributed import Engine, barrier, broadcast_object, get_rank
from hypersolid_scale.safety.errors import CheckpointError


def load_weights(load: Any, ckpt: dict[str, Any]) -> None:
    """``load(model and method state)``, turning torch's missing-key / shape errors (and a SwaV queue of
    another size) into one that names the file."""
    try:
        load(trained_state(ckpt))
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


def read_own_part(ckpt: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """A sharded checkpoint (``open_checkpoint``'s) with what this rank needs read: the weights whole, of the
    optimizer state the slices its engine holds (``Engine.needed_ranges``). ``bytes_read`` says how much."""
    return read_part(ckpt, engine.needed_ranges())


def restore_run_state(
    ckpt: dict[str, Any],
    *,
    engine: Engine,
    loader: TrainLoader,
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
    if "sharded" in ckpt:  # each rank reads the weights and its own part of the optimizer state
        ckpt = read_own_part(ckpt, engine)
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
        load_weights(engine.load_model_state, ckpt)
        return epoch * steps_per_epoch, epoch
    load_weights(engine.load_model_state, ckpt)
    if ckpt.get("optimizer") is not None:
        try:
            if "pieces" in ckpt["optimizer"]:  # a sharded checkpoint's, by parameter name: any world size
                engine.load_optimizer_pieces(ckpt["optimizer"]["pieces"], ckpt["optimizer"]["plain"])
            else:
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


def _resized_note(
    path: str, saved: int, world: int, batch: int, step: int, loader: TrainLoader, epoch: int, done: int
) -> str:
    """The one line of a resume on another world size: what carries over, and what does not."""
    keyed = loader.world_size_invariant  # False: WebDataset, its streams split by rank
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
        ckpt = open_checkpoint(path)
    except CheckpointError as err:
        if path != cfg.checkpoint.path:
            raise
        raise type(err)(f"checkpoint.path: {err}. Fix checkpoint.path, or drop it to start from scratch") from None
    check_compatible(ckpt, to_dict(cfg), fingerprint(cfg), force=cfg.checkpoint.resume == "force", path=path)
    ckpt["path"] = path
    return ckpt
