"""The files a replication run reads and leaves: atomic JSON, its checkpoints, and the machine's facts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypersolid_scale.safety import atomic


def write_json(path: Path, obj: Any) -> None:
    """Atomic: a reader (or a rerun deciding what to skip) never sees half a file."""
    atomic.write_json(path, obj, indent=1)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def checkpoints(run_dir: Path) -> dict[int, Path]:
    """{step: file} of the run's saved checkpoints (the trainer names them step_<8 digits>.pt)."""
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


# A training's seconds over its attempts (<run home>/attempts.json): the finished attempts' and the running one's
# so far, recorded by the driver while it trains.
ATTEMPTS = "attempts.json"


def _spent(home: Path) -> tuple[float, float]:
    got = read_json(home / ATTEMPTS) or {}
    return float(got.get("done_s", 0.0)), float(got.get("current_s", 0.0))


def start_attempt(home: Path) -> None:
    """A new attempt: the last one's seconds join the finished ones."""
    done, current = _spent(home)
    write_json(home / ATTEMPTS, {"done_s": round(done + current, 2), "current_s": 0.0})


def record_attempt(home: Path, current_s: float) -> None:
    write_json(home / ATTEMPTS, {"done_s": round(_spent(home)[0], 2), "current_s": round(current_s, 2)})


def attempts_total(home: Path, last_s: float) -> float:
    """The training's seconds over every attempt, the last one (just finished) taking ``last_s``."""
    return _spent(home)[0] + last_s
