"""The spool: the durable, append-only record log of one MLflow run (a write-ahead log).

``<dir>/spool-<run_id>.jsonl`` holds one JSON record per line, the first a header (``kind: open``) naming
the tracking URI and whether this spool's tracker created the run; ``synced-<run_id>.json`` holds the byte
offset up to which MLflow has it. A record torn by a kill is cut off when the spool is reopened.

While a spool is open its file is ``flock``-ed: the kernel drops the lock when its holder dies, however it
dies, so "not locked" means "no live process is writing this spool", which is how a run that a killed
process left open is told apart from a run that is still training.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import json
import logging
import os
from array import array
from collections import deque
from pathlib import Path

from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.run_lock import close_in_forked_children, forget_fd
from hypersolid_scale.tracking.records import TERMINAL_STATUSES, now_ms

log = logging.getLogger(__name__)

_TAIL_BYTES = 1 << 16


class SpoolBusy(RuntimeError):
    """Another open tracker (in this or another live process) holds the spool."""


def spool_path(directory: Path, run_id: str) -> Path:
    return directory / f"spool-{run_id}.jsonl"


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise SpoolBusy(f"{path} is open in another tracker") from None
        raise
    # closed in forked children (DataLoader workers): a child outliving a killed trainer must never make
    # its spool look alive
    close_in_forked_children(fd)
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None and forget_fd(fd):
        os.close(fd)  # closing the only descriptor of the open file drops its flock


class Spool:
    """The spool of one run, opened for appending; ``pending`` holds the records MLflow does not have yet.

    ``created``: this tracker created the MLflow run (written in the header of a new spool). ``pending``: the
    run is not created yet, ``run_id`` is a local id, and this is what creating it needs (``runs.py``; in the
    header too). ``exclusive``: raise SpoolBusy when another tracker holds the spool; otherwise go on without
    the lock, with a warning.
    """

    def __init__(
        self,
        directory: Path,
        run_id: str,
        uri: str,
        *,
        created: bool = False,
        exclusive: bool = True,
        pending: dict | None = None,
    ):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.path = spool_path(directory, run_id)
        self._mark_path = directory / f"synced-{run_id}.json"
        self.pending: deque[dict] = deque()
        self._lock_fd: int | None = None
        try:
            self._lock_fd = _lock(self.path)
        except SpoolBusy:
            if exclusive:
                raise
            log.warning(
                "%s is held by another open tracker of run %s (a live process, or a tracker of this "
                "process that was never closed); both append to it",
                self.path,
                run_id,
            )
        try:
            self._load(self._read_mark())
            self._file = open(self.path, "ab")
        except BaseException:
            _unlock(self._lock_fd)
            raise
        if self._file.tell() == 0:
            header = {"kind": "open", "uri": uri, "run": run_id, "created": created, "time": now_ms()}
            self._write({**header, **({"pending": pending} if pending else {})})
            self.mark_synced(self._file.tell())

    def _read_mark(self) -> int:
        try:
            return int(json.loads(self._mark_path.read_text())["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0  # no watermark: resend everything; sends are idempotent

    def _load(self, synced: int) -> None:
        size = self.path.stat().st_size
        if synced > size:
            synced = 0  # watermark newer than the file (writes lost in a machine crash): resend everything
        with open(self.path, "rb") as f:
            f.seek(synced)
            data = f.read()  # only what MLflow does not have yet
        end = data.rfind(b"\n") + 1
        if end < len(data):
            # A kill tore the last record while it was written: it was never complete, drop it.
            with open(self.path, "r+b") as f:
                f.truncate(synced + end)
        offset = synced
        for line in data[:end].splitlines(keepends=True):
            offset += len(line)
            try:
                record = json.loads(line)
            except ValueError:
                log.warning("skipping an unreadable record in %s at byte %d", self.path, offset - len(line))
                continue
            if record.get("kind") != "open":
                record["_end"] = offset
                self.pending.append(record)

    def _write(self, record: dict) -> None:
        line = json.dumps({k: v for k, v in record.items() if not k.startswith("_")}) + "\n"
        self._file.write(line.encode())
        # Hand it to the OS now: a killed process then loses nothing; fsync() covers a machine crash.
        self._file.flush()

    def append(self, record: dict) -> None:
        self._write(record)
        record["_end"] = self._file.tell()
        self.pending.append(record)

    def mark_synced(self, offset: int, durable: bool = False) -> None:
        # fsync'ed only when the caller asks (the spool's close): the rename alone survives a killed process.
        atomic.write_json(self._mark_path, {"offset": offset}, indent=None, newline=False, durable=durable)

    def rename(self, run_id: str) -> None:
        """Name the spool and its watermark after ``run_id`` (the run created for its local id). The open file
        and its lock go with it."""
        path, mark = spool_path(self.directory, run_id), self.directory / f"synced-{run_id}.json"
        if self._mark_path.exists():
            os.replace(self._mark_path, mark)
        os.replace(self.path, path)
        self.path, self._mark_path = path, mark

    def fsync(self) -> None:
        """Make the spool durable, and the watermark too when MLflow has everything."""
        if self._file.closed:
            return
        os.fsync(self._file.fileno())
        if not self.pending:
            self.mark_synced(self._file.tell(), durable=True)

    def close(self) -> None:
        self.fsync()
        self._file.close()
        _unlock(self._lock_fd)

    def __del__(self) -> None:
        # A tracker dropped without close() must not keep its spool looking alive for the life of the process.
        try:
            _unlock(getattr(self, "_lock_fd", None))
        except Exception:  # noqa: BLE001 - at interpreter exit module globals may already be gone
            pass


# ---------------------------------------------------------------------------------------------------
# Reading a spool without opening it
# ---------------------------------------------------------------------------------------------------


def read_header(path: Path) -> dict | None:
    """The spool's header record, or None when it has no readable one."""
    try:
        with open(path, "rb") as f:
            first, second = f.readline(), f.readline()
        header = json.loads(first)
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("kind") != "open" or "uri" not in header:
        return None
    if "created" not in header:
        # Spools written before the header said so: a tracker that resumed a run began with a RUNNING status.
        try:
            record = json.loads(second)
        except ValueError:
            record = {}
        header["created"] = not (record.get("kind") == "status" and record.get("status") == "RUNNING")
    return header


def last_status(path: Path) -> str | None:
    """The status set by the spool's last complete record when that record is a status change, else None.

    ``close()`` appends a terminal status and nothing after it, so a spool whose last record is not one
    belongs to a tracker that was never closed.
    """
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail[: tail.rfind(b"\n") + 1].splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a partial first line of the tail, or a damaged record: look further back
        return record.get("status") if record.get("kind") == "status" else None
    return None


def is_closed(path: Path) -> bool:
    return last_status(path) in TERMINAL_STATUSES


class LoggedSteps:
    """The steps at which each metric key appears in a spool, to log a (key, step) once per run.

    Steps are kept per key in a sorted ``array('q')`` (8 bytes a step), not a set of Python ints, since a
    long run's spool holds millions of them.
    """

    def __init__(self, steps: dict[str, array]):
        self._steps = steps
        self._max = {key: s[-1] for key, s in steps.items() if len(s)}

    @classmethod
    def scan(cls, path: Path) -> LoggedSteps:
        steps: dict[str, array] = {}
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return cls({})
        with f:
            for line in f:
                if b'"kind": "metrics"' not in line:
                    continue  # most lines are metrics; this only skips parsing the others
                try:
                    record = json.loads(line)
                    step, values = int(record["step"]), record["values"]
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last record: it was never sent, and is cut off when the spool opens
                for key in values:
                    steps.setdefault(key, array("q")).append(step)
        for key, s in steps.items():
            if any(s[i] > s[i + 1] for i in range(len(s) - 1)):
                steps[key] = array("q", sorted(set(s)))
        return cls(steps)

    def __contains__(self, item: tuple[str, int]) -> bool:
        key, step = item
        if step > self._max.get(key, step - 1):
            return False  # the common case: a step beyond all the earlier ones
        s = self._steps[key]
        i = bisect.bisect_left(s, step)
        return i < len(s) and s[i] == step

    def __len__(self) -> int:
        return sum(len(s) for s in self._steps.values())
