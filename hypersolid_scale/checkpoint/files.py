"""The checkpoint file: where it lives, how it is written (atomically) and read (``weights_only``), pruned
and cleaned up. What a training run puts in it is :mod:`hypersolid_scale.checkpoint.collect`'s business.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import CheckpointError
from hypersolid_scale.safety.run_lock import RunDirLocked, acquire_run_lock, holds_lock

FORMAT_VERSION = 1
_NAME = re.compile(r"^step_(\d{8,})\.(?:pt|dcp)$")  # a file, or a sharded checkpoint's folder (checkpoint/sharded.py)
REQUIRED_KEYS = ("model", "step", "epoch", "config", "config_fingerprint", "format_version")


class CheckpointMissing(CheckpointError, FileNotFoundError):
    """No file at the checkpoint's path (also a ``FileNotFoundError``, for callers that catch that)."""


class BadCheckpoint(CheckpointError, ValueError):
    """Unreadable, foreign, or not resumable by this run (also a ``ValueError``, for callers that catch that)."""


CHECKPOINT_DIR = "checkpoints"  # <run_dir>/checkpoints/step_<8 digits>.pt (docs/design.md §5)


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def run_dir_of(path: str | os.PathLike) -> Path | None:
    """The run directory a checkpoint file sits in, or None for a file outside any run's layout."""
    parent = Path(path).parent
    return parent.parent if parent.name == CHECKPOINT_DIR else None


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:08d}.pt"


# ----------------------------------------------------------------------------------------------------------
# Save
# ----------------------------------------------------------------------------------------------------------


def _free_space(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free / 2**20:.1f} MiB free"
    except OSError:
        return "free space unknown"


# What torch's zip writer raises (a RuntimeError, not an OSError) when a write of the file under it fails part-way,
# e.g. a disk filling up in the middle of a large tensor.
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed", "PytorchStreamWriter failed")


def _tensor_bytes(obj: Any) -> int:
    """Bytes of tensor data in ``obj`` (nested dicts, lists, tuples): about what ``torch.save`` writes of it."""
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _chained_oserror(err: BaseException) -> OSError | None:
    """The OSError a RuntimeError was raised while handling (torch's writer keeps the file's own error there)."""
    seen: set[int] = set()
    cause = err.__cause__ or err.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _write_failure(path: Path, reason: str, full: bool) -> CheckpointError:
    return CheckpointError(
        f"cannot write checkpoint {path}: {reason} ({_free_space(path.parent)} there). "
        + (
            "Free disk space (or lower checkpoint.keep_last), or point run_dir at a larger filesystem, then "
            "rerun: training resumes from the newest checkpoint, which is intact"
            if full
            else "Make run_dir writable, or point run_dir elsewhere, then rerun"
        )
    )


def atomic_save(obj: dict[str, Any], path: str | os.PathLike) -> Path:
    """torch.save through :func:`hypersolid_scale.safety.atomic.atomic_path` (``<path>.<pid>.tmp``, fsync, rename
    over ``path``, fsync the directory).

    A write that fails (a full disk, a quota, a read-only filesystem) raises :class:`CheckpointError` naming
    the path and the free space; the temporary file is removed and existing files are never touched. A
    RuntimeError of torch's is such a failure only when it is its writer's (see ``_TORCH_WRITE_FAILED``) or
    when the data could not have fitted; any other stays the bug it is.
    """
    path = Path(path)
    try:  # the temporary file is removed before the except clauses measure the free space (atomic_path)
        atomic.write_with(path, lambda f: torch.save(obj, f))
    except OSError as err:
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        raise _write_failure(path, str(err.strerror or err), full) from err
    except RuntimeError as err:
        free = _free_bytes(path.parent)
        too_big = free is not None and free < _tensor_bytes(obj)
        if not (too_big or any(words in str(err) for words in _TORCH_WRITE_FAILED)):
            raise
        cause = _chained_oserror(err)
        if cause is not None and cause.errno is not None:
            full = cause.errno in (errno.ENOSPC, errno.EDQUOT)
            reason = str(cause.strerror or cause)
        else:  # torch writing through C (no Python file): say what the numbers say
            full = True
            reason = (
                os.strerror(errno.ENOSPC)
                if too_big
                else "the write stopped part-way (a full disk or an exceeded quota)"
            )
        raise _write_failure(path, reason, full) from err
    return path


def _step_files(d: Path) -> list[tuple[int, Path]]:
    """(step, path) of the ``step_*.pt`` and ``step_*.dcp`` names in folder ``d`` (none when it is no folder)."""
    if not d.is_dir():
        return []
    return [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]


def _remove(path: Path) -> None:
    """A checkpoint file, or a sharded checkpoint's folder, gone (already gone is fine)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``step_*.pt`` files and ``step_*.dcp`` folders of a run, oldest first (by step number, not by mtime)."""
    return [p for _, p in sorted(_step_files(checkpoint_dir(run_dir)))]


def prune_checkpoints(run_dir: str | os.PathLike, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (0 keeps all); returns what was deleted."""
    if keep_last <= 0:
        return []
    old = list_checkpoints(run_dir)[:-keep_last]
    for p in old:
        _remove(p)
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


def _why_unreadable(path: Path, err: Exception) -> str:
    """What is wrong with a file torch cannot load, in our words: torch's own message is about its
    unpickler's settings and suggests loosening them, which is never the fix for a damaged checkpoint."""
    if path.stat().st_size == 0:
        return "the file is empty"
    with open(path, "rb") as f:
        magic = f.read(4)
    if not zipfile.is_zipfile(path):
        if magic == b"PK\x03\x04":
            return "the file is cut short (its end is missing: an interrupted copy or save)"
        return "the file is not a PyTorch checkpoint at all (random bytes, text, or another format)"
    if isinstance(err, pickle.UnpicklingError):
        return (
            "the file holds Python objects other than tensors and plain values, which no checkpoint of this "
            "trainer does"
        )
    return f"the archive is damaged ({type(err).__name__})"


def _is_a_directory(path: Path) -> str:
    """What to say when a checkpoint's path is a directory: which file in it was probably meant."""
    found: list[tuple[int, Path]] = []
    for d in (path, checkpoint_dir(path)):
        try:
            found += [(step, p) for step, p in _step_files(d) if p.is_file()]
        except OSError:  # a folder we may not list: nothing to suggest from it
            pass
    if found:
        newest = max(found)[1]
        return (
            f"checkpoint {str(path)!r} is a directory, not a checkpoint file; pass one of the step_*.pt files "
            f"in it, e.g. its newest, {str(newest)!r}"
        )
    return (
        f"checkpoint {str(path)!r} is a directory, not a checkpoint file, and holds no step_*.pt (nor does "
        f"its {CHECKPOINT_DIR}/ folder); pass a step_*.pt file written by launch/train.py"
    )


def load_file(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", *, required: tuple[str, ...] = REQUIRED_KEYS
) -> dict[str, Any]:
    """Load and sanity-check a checkpoint file (``weights_only=True``); ``required``: the keys it must have.
    (``checkpoint.reading.load_checkpoint`` reads a file or a sharded checkpoint's folder.)

    Raises:
        CheckpointMissing: no such file, or a directory (a ``FileNotFoundError`` too).
        BadCheckpoint: the file is truncated / corrupt / not a Hypersolid checkpoint / a newer format (a
            ``ValueError`` too).
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointMissing(_is_a_directory(path))
    if not path.is_file():
        raise CheckpointMissing(f"checkpoint {str(path)!r} does not exist; list {path.parent}/ for the saved steps")
    # torch's warnings about a file it cannot read ask to file an issue with torch; they are shown only if
    # the file loads, else our error explains what is wrong with it.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError... when damaged
            failure: Exception | None = err
        else:
            failure = None
    if failure is not None:
        raise BadCheckpoint(
            f"checkpoint {str(path)!r} is corrupt or truncated and cannot be read: "
            f"{_why_unreadable(path, failure)}. Use another checkpoint of the run (the previous "
            "step_*.pt), or copy the file again"
        ) from None
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in required):
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise BadCheckpoint(
            f"{str(path)!r} is not a Hypersolid checkpoint (needs keys {list(required)}, has "
            f"{keys}); use a step_*.pt file written by launch/train.py"
        )
    if ckpt["format_version"] > FORMAT_VERSION:
        raise BadCheckpoint(
            f"checkpoint {str(path)!r} has format {ckpt['format_version']}, newer than this code "
            f"({FORMAT_VERSION}); upgrade hypersolid_scale to read it"
        )
    return ckpt


def delete_stale_tmp(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the ``*.tmp`` files that saves killed mid-write left behind; returns what was deleted.

    Only while holding the run directory's lock: a ``*.tmp`` in a run directory that another live process
    holds may be the checkpoint it is writing right now. A caller without the lock (a tool, a test) takes it
    for the duration of the cleanup, and deletes nothing if a live trainer holds it.
    """
    if holds_lock(run_dir):
        stale = list(checkpoint_dir(run_dir).glob("*.tmp"))
        for p in stale:  # files, and the folders of sharded saves that never finished
            _remove(p)
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
