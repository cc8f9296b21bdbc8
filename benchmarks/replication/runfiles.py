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
