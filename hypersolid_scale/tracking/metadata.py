"""What identifies a tracked run besides its id: its name and the code's commit."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from datetime import datetime, timezone
from pathlib import Path

# Names the commit of a copied tree whose .git is missing or stale (a GPU machine's copy of the working
# tree): set it to `git rev-parse HEAD` of the tree that was sent, and it wins over what git says there.
COMMIT_ENV = "HYPERSOLID_GIT_COMMIT"


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """The commit checked out at ``path`` (default: this package's checkout), or None outside git;
    ``$HYPERSOLID_GIT_COMMIT`` instead where it is set."""
    named = os.environ.get(COMMIT_ENV, "")
    if named:
        if not re.fullmatch(r"[0-9a-f]{7,64}", named):
            raise ValueError(
                f"{COMMIT_ENV}={named!r} is not a commit id (7 to 64 lowercase hex digits): "
                "set it to the output of `git rev-parse HEAD`, or unset it"
            )
        return named
    cwd = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if re.fullmatch(r"[0-9a-f]{40,64}", sha) else None


def git_dirty(path: str | os.PathLike) -> bool:
    """Whether the checkout at ``path`` has uncommitted changes to tracked files (False outside git)."""
    status = ["git", "status", "--porcelain", "--untracked-files=no"]
    return bool(subprocess.run(status, cwd=path, capture_output=True, text=True).stdout.strip())


def default_run_name(run_dir: Path) -> str:
    """``<run_dir name>-<UTC yyyymmdd-hhmmss>-<4 hex>``: readable, and distinct for every run.

    MLflow's own default name is drawn from Python's ``random``, which training seeds, so every run of a
    seed would get the same name. The suffix comes from ``uuid4`` (the OS's entropy), so two runs started
    in the same second from same-named directories still differ.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{run_dir.name or 'run'}-{stamp}-{uuid.uuid4().hex[:4]}"
