"""Portable, atomic checkpoints, the run state they hold, and auto-resume.

A checkpoint is ``<run_dir>/checkpoints/step_<step:08d>.pt``, one file per save, readable with
``torch.load(path, weights_only=True)``: only tensors and plain Python types are stored (RNG states are
converted to tensors / ints), so loading never executes pickled code. ``run_state`` decides what a run's
checkpoint holds and ``restore_run_state`` puts it back. (With ``checkpoint.format=sharded`` the same content is a
folder ``step_<step:08d>.dcp`` of one part per rank: :mod:`hypersolid_scale.checkpoint.sharded`.) The keys::

    model  method (baselines only)  optimizer  step  epoch  rng (one per rank)  loader  config
    config_fingerprint  mlflow_run_id  tracking_uri  world_size  global_batch  format_version

(A run resumes on any world size at the checkpoint's global batch; for checkpoints written before
``global_batch`` was stored it is their world size x ``data.batch_size_per_gpu``, and those written before
``world_size`` was stored resume at any. The ``scheduler`` entry of older checkpoints is ignored: the learning
rate is a function of the step.)

Writes go to a temporary file in the same directory, are fsync'ed, then ``os.replace``d over the final
name: a crash (or SIGKILL, or a full disk) mid-write leaves the previous checkpoints untouched and at worst a
stray ``*.tmp`` file, which is ignored. Resuming scans the checkpoints newest first and skips unreadable ones
with a warning. Stray ``*.tmp`` files are deleted only by the holder of the run directory's lock
(``hypersolid_scale.safety.run_lock``), which the trainer takes before resuming.

Every problem a user can fix (a missing, damaged or foreign file, another architecture, another config or
global batch, a full disk) raises :class:`~hypersolid_scale.safety.errors.CheckpointError` naming the file and the fix.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# What the package exports (__all__), and the module each name lives in, imported on first use (PEP 562): the
# config tree imports this package's ``config`` section without the checkpoint code, which imports the config tree.
_EXPORTS = {
    "BadCheckpoint": "files",
    "CheckpointMissing": "files",
    "FORMAT_VERSION": "files",
    "REQUIRED_KEYS": "files",
    "atomic_save": "files",
    "build_model_from_checkpoint": "eval_model",
    "check_compatible": "resume",
    "checkpoint_dir": "files",
    "checkpoint_path": "files",
    "delete_stale_tmp": "files",
    "find_resume_checkpoint": "reading",
    "initial_weights": "eval_model",
    "list_checkpoints": "files",
    "load_checkpoint": "reading",
    "prune_checkpoints": "files",
    "random_init_checkpoint": "eval_model",
    "resolve_resume": "resume",
    "restore_run_state": "resume",
    "rng_state": "rng",
    "run_dir_of": "files",
    "open_checkpoint": "reading",
    "run_state": "collect",
    "sharded_run_state": "collect",
    "save_checkpoint": "files",
    "saved_global_batch": "resume",
    "set_aside_checkpoints": "resume",
    "set_rng_state": "rng",
}

if TYPE_CHECKING:
    from hypersolid_scale.checkpoint.collect import run_state, sharded_run_state
    from hypersolid_scale.checkpoint.eval_model import (
        build_model_from_checkpoint,
        initial_weights,
        random_init_checkpoint,
    )
    from hypersolid_scale.checkpoint.files import (
        FORMAT_VERSION,
        REQUIRED_KEYS,
        BadCheckpoint,
        CheckpointMissing,
        atomic_save,
        checkpoint_dir,
        checkpoint_path,
        delete_stale_tmp,
        list_checkpoints,
        prune_checkpoints,
        run_dir_of,
        save_checkpoint,
    )
    from hypersolid_scale.checkpoint.reading import find_resume_checkpoint, load_checkpoint, open_checkpoint
    from hypersolid_scale.checkpoint.resume import (
        check_compatible,
        resolve_resume,
        restore_run_state,
        saved_global_batch,
        set_aside_checkpoints,
    )
    from hypersolid_scale.checkpoint.rng import rng_state, set_rng_state


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BadCheckpoint",
    "CheckpointMissing",
    "FORMAT_VERSION",
    "REQUIRED_KEYS",
    "atomic_save",
    "build_model_from_checkpoint",
    "check_compatible",
    "checkpoint_dir",
    "checkpoint_path",
    "delete_stale_tmp",
    "find_resume_checkpoint",
    "initial_weights",
    "list_checkpoints",
    "load_checkpoint",
    "prune_checkpoints",
    "open_checkpoint",
    "random_init_checkpoint",
    "resolve_resume",
    "restore_run_state",
    "rng_state",
    "run_dir_of",
    "run_state",
    "save_checkpoint",
    "saved_global_batch",
    "sharded_run_state",
    "set_aside_checkpoints",
    "set_rng_state",
]
