"""Sending what a dead process left in a spool: by hand (``sync_spool``), and when a new tracker starts in
the same directory (``close_abandoned_runs``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hypersolid_scale.tracking.client import TrackingError
from hypersolid_scale.tracking.outbox import Outbox
from hypersolid_scale.tracking.runs import pending_spec
from hypersolid_scale.tracking.spool import Spool, SpoolBusy, is_closed, read_header

log = logging.getLogger(__name__)


def _spools(directory: Path) -> list[tuple[str, Path]]:
    return [(p.stem[len("spool-") :], p) for p in sorted(directory.glob("spool-*.jsonl"))]


def sync_spool(run_dir: str | os.PathLike, tracking_uri: str | None = None) -> tuple[int, int]:
    """Send every record still pending in ``<run_dir>/tracking`` (to the URI each spool was written for,
    unless ``tracking_uri`` is given). Returns (sent, pending).

    Raises TrackingError when a tracker of a live process has one of the spools open: that process sends
    its records itself, and two senders would interleave them.
    """
    sent = left = 0
    for run_id, path in _spools(Path(run_dir) / "tracking"):
        header = read_header(path)
        if header is None:
            log.warning("skipping %s: no readable header line naming its tracking URI", path)
            continue
        uri = tracking_uri or header["uri"]
        try:
            spool = Spool(path.parent, run_id, uri)
        except SpoolBusy:
            raise TrackingError(
                f"{path} is open in a running tracker (MLflow run {run_id}); it sends its own "
                "records: sync after that process has ended"
            ) from None
        before = len(spool.pending)
        to_create = pending_spec(path, header)
        if before or to_create is not None:
            Outbox(None, uri, run_id, spool, 0.0, to_create).sync(force=True)
        sent, left = sent + before - len(spool.pending), left + len(spool.pending)
        spool.close()
    return sent, left


def close_abandoned_runs(directory: Path, keep: set[str]) -> list[str]:
    """End the runs whose tracker died without closing them (a kill before the first checkpoint): send
    their pending records and mark them KILLED, so that none stays RUNNING forever. Returns their ids.

    A spool is abandoned when its tracker created the run (a tracker that only resumed a run started
    elsewhere, like an offline evaluation's, is not its owner), its last record is not a terminal status,
    no live process holds it, and its run is not in ``keep`` (the run being resumed). The run is not
    resumed instead: without a checkpoint training starts again from step 0, a new run, and steps logged
    twice into one run would mix two trainings. Never raises: an unreachable server leaves the records,
    the KILLED status included, in the spool for later (``python -m hypersolid_scale.tracking sync``).
    """
    closed: list[str] = []
    for run_id, path in _spools(directory):
        if run_id in keep:
            continue
        header = read_header(path)
        if header is None or not header["created"] or is_closed(path):
            continue
        died_ms = int(path.stat().st_mtime * 1000)  # the last write is about when its process died
        try:
            spool = Spool(directory, run_id, header["uri"])
        except (SpoolBusy, OSError):
            continue  # its tracker is alive (or the file is unreadable): not ours to end
        try:
            if is_closed(path):  # closed between the first look and taking the lock
                continue
            spool.append({"kind": "status", "status": "KILLED", "time": died_ms})
            # Never raises: a store that cannot be used, even a bad old URI, leaves the records in the spool.
            outbox = Outbox(None, header["uri"], run_id, spool, 0.0, pending_spec(path, header))
            done = outbox.sync(force=True)
            run_id = outbox.run_id  # the run's id if it was created only now
            closed.append(run_id)
            log.warning(
                "MLflow run %s was left RUNNING by a process that ended without closing it (killed "
                "before its first checkpoint?): it is marked KILLED%s",
                run_id,
                ""
                if done
                else f"; {len(spool.pending)} records wait in {spool.path} for `python -m "
                f"hypersolid_scale.tracking sync {directory.parent}`",
            )
        finally:
            spool.close()
    return closed
