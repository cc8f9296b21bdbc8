"""Portable, atomic checkpoints and auto-resume.

A checkpoint is ``<run_dir>/checkpoints/step_<step:08d>.pt``, one file per save, readable with
``torch.load(path, weights_only=True)``: only tensors and plain Python types are stored (RNG states are
converted to tensors / ints), so loading never executes pickled code. Keys::

    model  optimizer  scheduler  step  epoch  rng  loader  config  config_fingerprint
    mlflow_run_id  tracking_uri  format_version

Writes go to a temporary file in the same directory, are fsync'ed, then ``os.replace``d over the final
name: a crash (or SIGKILL) mid-write leaves the previous checkpoints untouched and at worst a stray
``*.tmp`` file, which is ignored. Resuming scans the checkpoints newest first and skips unreadable ones
with a warning. Stray ``*.tmp`` files are deleted only by the holder of the run directory's lock
(``hypersolid_scale.run_lock``), which the trainer takes before resuming.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hypersolid_scale.run_lock import RunDirLocked, acquire_run_lock, holds_lock

FORMAT_VERSION = 1
_NAME = re.compile(r"^step_(\d{8,})\.pt$")
REQUIRED_KEYS = ("model", "step", "epoch", "config", "config_fingerprint", "format_version")


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:08d}.pt"


# ----------------------------------------------------------------------------------------------------------
# RNG states as tensors / plain types (weights_only-safe)
# ----------------------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """torch (CPU and every CUDA device), numpy and Python ``random`` states of this process."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"name": str(np_name), "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "python": {"version": int(py_version), "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss": py_gauss},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss"]))


# ----------------------------------------------------------------------------------------------------------
# Save
# ----------------------------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def atomic_save(obj: dict[str, Any], path: str | os.PathLike) -> Path:
    """torch.save to ``<path>.<pid>.tmp``, fsync, rename over ``path``, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return path


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``step_*.pt`` files of a run, oldest first (by step number, not by mtime)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def prune_checkpoints(run_dir: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (0 keeps all); returns what was deleted."""
    if keep_last <= 0:
        return []
    old = list_checkpoints(run_dir)[:-keep_last]
    for p in old:
        p.unlink(missing_ok=True)
    return old


def save_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any], *, keep_last: int = 0) -> Path:
    """Write ``state`` (the keys listed in the module docstring) as the checkpoint of ``state['step']``."""
    missing = [k for k in REQUIRED_KEYS if k not in state and k != "format_version"]
    if missing:
        raise ValueError(f"checkpoint state lacks keys {missing}; every checkpoint needs {list(REQUIRED_KEYS)}")
    state = {**state, "format_version": FORMAT_VERSION}
    path = atomic_save(state, checkpoint_path(run_dir, int(state["step"])))
    prune_checkpoints(run_dir, keep_last)
    return path


# ----------------------------------------------------------------------------------------------------------
# Load / resume
# ----------------------------------------------------------------------------------------------------------


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and sanity-check a checkpoint (``weights_only=True``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is truncated / corrupt / not a Hypersolid checkpoint / a newer format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist; list {path.parent}/ for the saved steps")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError... for damaged files
        raise ValueError(f"checkpoint {str(path)!r} is corrupt or truncated and cannot be read "
                         f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED_KEYS):
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{str(path)!r} is not a Hypersolid checkpoint (needs keys {list(REQUIRED_KEYS)}, has {keys})")
    if ckpt["format_version"] > FORMAT_VERSION:
        raise ValueError(f"checkpoint {str(path)!r} has format {ckpt['format_version']}, newer than this code "
                         f"({FORMAT_VERSION}); upgrade hypersolid_scale to read it")
    return ckpt


def find_resume_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """Newest readable checkpoint of ``run_dir``; unreadable ones are skipped with a warning."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return path, load_checkpoint(path)
        except ValueError as err:
            warnings.warn(f"skipping checkpoint: {err}; falling back to the previous one", stacklevel=2)
    return None


def check_compatible(ckpt: dict[str, Any], cfg_dict: dict[str, Any], fingerprint: str, *, force: bool,
                     path: str | os.PathLike = "checkpoint") -> None:
    """Refuse to resume a checkpoint trained with a different model/loss/data/optimizer config."""
    if ckpt["config_fingerprint"] == fingerprint:
        return
    from hypersolid_scale.config import config_diff

    diff = config_diff(ckpt["config"], cfg_dict)
    lines = "\n  ".join(diff) if diff else "(fingerprint differs)"
    if force:
        warnings.warn(f"resuming {path} despite config changes (checkpoint.resume=force):\n  {lines}", stacklevel=2)
        return
    raise ValueError(
        f"cannot resume from {path}: the config differs from the one it was trained with:\n  {lines}\n"
        "Use a new run_dir for a new experiment, pass checkpoint.resume=never to start over in this run_dir "
        "(the old checkpoints are moved aside), or checkpoint.resume=force to continue anyway."
    )


def delete_stale_tmp(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the ``*.tmp`` files that saves killed mid-write left behind; returns what was deleted.

    Only while holding the run directory's lock: a ``*.tmp`` in a run directory that another live process
    holds may be the checkpoint it is writing right now. A caller without the lock (a tool, a test) takes it
    for the duration of the cleanup, and deletes nothing if a live trainer holds it.
    """
    if holds_lock(run_dir):
        stale = list(checkpoint_dir(run_dir).glob("*.tmp"))
        for p in stale:
            p.unlink(missing_ok=True)
        return stale
    if not checkpoint_dir(run_dir).is_dir():
        return []
    try:
        lock = acquire_run_lock(run_dir)
    except RunDirLocked:
        return []
    try:
        return delete_stale_tmp(run_dir)
    finally:
        lock.release()


def resolve_resume(cfg: Any) -> dict[str, Any] | None:
    """The checkpoint a run should resume from, per ``cfg.checkpoint.resume``, or None to start fresh.

    Collective: rank 0 picks the file, every rank loads the same one (run_dir is on a shared filesystem).
    ``never`` moves existing checkpoints aside, so that pruning never deletes the new run's files in favour
    of an old run's higher step numbers.
    """
    from hypersolid_scale.config import fingerprint, to_dict
    from hypersolid_scale.distributed import barrier, get_rank
    from hypersolid_scale.distributed.env import broadcast_object

    if cfg.checkpoint.resume == "never":
        old = checkpoint_dir(cfg.run_dir)
        if get_rank() == 0 and list_checkpoints(cfg.run_dir):
            aside = old.with_name(f"checkpoints.old-{time.strftime('%Y%m%d-%H%M%S')}")
            warnings.warn(f"checkpoint.resume=never: moving the existing checkpoints to {aside}", stacklevel=2)
            shutil.move(str(old), str(aside))
        barrier()
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
    path = broadcast_object(path)  # type: ignore[assignment]
    if path is None:
        return None
    ckpt = load_checkpoint(path)
    check_compatible(ckpt, to_dict(cfg), fingerprint(cfg), force=cfg.checkpoint.resume == "force", path=path)
    ckpt["path"] = path
    return ckpt


def build_model_from_checkpoint(ckpt: dict[str, Any] | str | os.PathLike) -> tuple[nn.Module, Any]:
    """``(HypersolidModel with the checkpoint's weights, in eval mode; its Config)`` — used by evaluation."""
    from hypersolid_scale.config import from_dict
    from hypersolid_scale.models import build_model

    if not isinstance(ckpt, dict):
        ckpt = load_checkpoint(ckpt)
    cfg = from_dict(ckpt["config"])
    model = build_model(cfg.model)
    model.load_state_dict(ckpt["model"])
    model.eval()
    return model, cfg


def random_init_checkpoint(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``ckpt`` whose weights are the run's *initial* weights (same seed, same code path).

    Evaluating it the same way as the trained checkpoint gives the randomly-initialised baseline that a
    self-supervised run must beat.
    """
    from hypersolid_scale.config import from_dict
    from hypersolid_scale.models import build_model

    cfg = from_dict(ckpt["config"])
    torch.manual_seed(cfg.seed)  # the trainer seeds exactly like this before building the model
    model = build_model(cfg.model)
    return {**ckpt, "model": model.state_dict(), "optimizer": None, "step": 0, "epoch": 0, "loader": None}
