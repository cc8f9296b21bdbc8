"""What the study engine reads of a run's files: its checkpoints (and which it deletes), and why a child failed."""

from __future__ import annotations

import re
from pathlib import Path


def checkpoints(run_dir: Path) -> dict[int, Path]:
    """{step: file} of a run directory's saved checkpoints (the trainer names them step_<8 digits>.pt)."""
    return {int(p.stem.split("_")[1]): p for p in (run_dir / "checkpoints").glob("step_*.pt")}


def prune_checkpoints(run_dir: Path, keep_steps: set[int], newest: int = 2) -> list[int]:
    """Delete the run's checkpoints that are neither at ``keep_steps`` (the ones to be evaluated) nor among the
    ``newest`` (the one a resume reads, and the one before it in case the newest is cut short); the steps deleted.
    A 100-epoch run that checkpoints every 100 steps would otherwise keep ~470 files of 17 MB."""
    ckpts = checkpoints(run_dir)
    kept = set(sorted(ckpts)[-newest:]) | keep_steps
    gone = sorted(step for step in ckpts if step not in kept)
    for step in gone:
        ckpts[step].unlink(missing_ok=True)
    return gone


def last_error(log: Path, start: int = 0) -> str:
    """The line of ``log`` (from byte ``start``) that says why a child failed: its ``error:`` line, else its last."""
    text = log.read_bytes()[start:].decode(errors="replace") if log.exists() else ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"(\[rank \d+\] )?error:", ln)]  # the one-line errors of run_cli
    return (errors or lines or ["(no output)"])[-1][:300]
