"""``python -m hypersolid_scale.tracking sync RUN_DIR [TRACKING_URI]``: send a run directory's spooled
tracking records that MLflow does not have yet (e.g. after a kill while the server was away), and, when no
training holds the run directory, end the runs a killed process left RUNNING (marked KILLED, as the next
training started there would; one that resumes such a run sets it RUNNING again)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hypersolid_scale.safety.errors import run_cli
from hypersolid_scale.safety.run_lock import RunDirLocked, acquire_run_lock
from hypersolid_scale.tracking.client import TrackingError
from hypersolid_scale.tracking.recovery import close_abandoned_runs, sync_spool


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hypersolid_scale.tracking", description="Send the tracking records spooled in a run directory."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="send what <run_dir>/tracking holds that MLflow does not have")
    sync.add_argument("run_dir")
    sync.add_argument(
        "tracking_uri", nargs="?", default=None, help="send there instead of the URI each spool was written for"
    )
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "tracking").is_dir():
        raise TrackingError(
            f"{args.run_dir} holds no tracking/ directory, so nothing to send: pass the run_dir "
            "of a tracked training run (the directory that holds tracking/ and checkpoints)"
        )
    n_sent, n_left = sync_spool(args.run_dir, args.tracking_uri)
    print(f"sent {n_sent} tracking records; {n_left} still pending")
    try:
        lock = acquire_run_lock(args.run_dir)
    except RunDirLocked as err:
        print(f"a training holds {args.run_dir} ({err.holder or 'see its .lock'}): its runs stay as they are")
    else:
        try:
            closed = close_abandoned_runs(Path(args.run_dir) / "tracking", keep=set())
        finally:
            lock.release()
        for run_id in closed:
            print(f"MLflow run {run_id} was left RUNNING by a process that is gone: marked KILLED")
    return 1 if n_left else 0


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
