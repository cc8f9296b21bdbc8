"""``python -m hypersolid_scale.tracking sync RUN_DIR [TRACKING_URI]``: send a run directory's spooled
tracking records that MLflow does not have yet (e.g. after a kill while the server was away)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from hypersolid_scale.errors import run_cli
from hypersolid_scale.tracking.client import TrackingError
from hypersolid_scale.tracking.recovery import sync_spool


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m hypersolid_scale.tracking",
                                     description="Send the tracking records spooled in a run directory.")
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", help="send what <run_dir>/tracking holds that MLflow does not have")
    sync.add_argument("run_dir")
    sync.add_argument("tracking_uri", nargs="?", default=None,
                      help="send there instead of the URI each spool was written for")
    args = parser.parse_args(argv)
    if not (Path(args.run_dir) / "tracking").is_dir():
        raise TrackingError(f"{args.run_dir} holds no tracking/ directory, so nothing to send: pass the run_dir "
                            "of a tracked training run (the directory that holds tracking/ and checkpoints)")
    n_sent, n_left = sync_spool(args.run_dir, args.tracking_uri)
    print(f"sent {n_sent} tracking records; {n_left} still pending")
    return 1 if n_left else 0


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
