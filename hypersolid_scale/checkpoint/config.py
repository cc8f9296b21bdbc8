"""The ``checkpoint`` section: when checkpoints are written, how many are kept and what a run resumes from, its
keys' choices and ranges beside it (``checkpoint/files.py`` and ``checkpoint/resume.py`` read them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RESUME_MODES = ("auto", "never", "force")
FORMATS = ("file", "sharded")


@dataclass
class CheckpointConfig:
    every_n_steps: int = 1000  # 0 disables step checkpoints (epoch-end and preemption checkpoints remain)
    every_n_epochs: int = 1  # 0 disables epoch-end checkpoints
    keep_last: int = 3  # older checkpoints (step_*.pt files, step_*.dcp folders) are deleted; 0 keeps all
    resume: str = "auto"  # auto (newest valid checkpoint in run_dir, if any) | never | force (ignore config changes)
    path: str | None = None  # resume from this file instead of run_dir/checkpoints
    # file: one step_*.pt that rank 0 writes, every rank reads whole; sharded: a step_*.dcp folder of
    # torch.distributed.checkpoint parts, each rank writing its share and reading only what it needs (docs/design.md §5)
    format: str = "file"
    async_save: bool = True  # sharded only: training goes on while the parts are written (the last save waits)


CHOICES: dict[str, tuple[Any, ...]] = {"checkpoint.resume": RESUME_MODES, "checkpoint.format": FORMATS}

RANGES: list[tuple[str, Any, str]] = [
    ("checkpoint.every_n_steps", lambda v: v >= 0, "an int >= 0"),
    ("checkpoint.every_n_epochs", lambda v: v >= 0, "an int >= 0"),
    ("checkpoint.keep_last", lambda v: v >= 0, "an int >= 0 (0 keeps every checkpoint)"),
]
