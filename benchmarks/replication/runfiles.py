"""The replication study's JSON files (its results, _skipped.json): written atomically, read as None when absent or
torn."""

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
