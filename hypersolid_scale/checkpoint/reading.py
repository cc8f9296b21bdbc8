"""Reading a checkpoint, whichever its format: a ``step_*.pt`` file (``checkpoint/files.py``) or a sharded
checkpoint's ``step_*.dcp`` folder (``checkpoint/sharded.py``); and finding the one a run resumes from.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.checkpoint import sharded
from hypersolid_scale.checkpoint.files import BadCheckpoint, list_checkpoints, load_file


def _is_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and sharded.is_sharded(path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The whole checkpoint (evaluation, export, tools), checked: a file (``weights_only=True``), or a sharded
    checkpoint's folder read in this one process (:func:`~hypersolid_scale.checkpoint.sharded.read_whole`).

    Raises:
        CheckpointMissing: no such file, or a directory that is no checkpoint (a ``FileNotFoundError`` too).
        BadCheckpoint: the file is truncated / corrupt / not a Hypersolid checkpoint / a newer format (a
            ``ValueError`` too).
    """
    return sharded.read_whole(path) if _is_folder(path) else load_file(path, map_location)


def open_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """What a resume reads first: a file whole; of a sharded checkpoint, its ``run.pt`` alone, the tensors left
    for each rank to read its part of (``checkpoint.resume.read_own_part``)."""
    return sharded.open_sharded(path) if _is_folder(path) else load_file(path)


def find_resume_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """Newest readable checkpoint of ``run_dir``; unreadable ones are skipped with a warning."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return path, open_checkpoint(path)
        except BadCheckpoint as err:
            warnings.warn(f"skipping checkpoint: {err}; falling back to the previous one", stacklevel=2)
    return None
