"""One writer per run directory: an ``fcntl.flock`` on ``<run_dir>/.lock``, held for the life of a run.

Rank 0 takes the lock before it reads or writes anything else in the run directory (resume scan, stray
``*.tmp`` cleanup, ``config.yaml``, tracking), so a second training started on the same ``run_dir`` cannot
resume the first one's checkpoints, overwrite its ``step_*.pt`` files or log into its MLflow run.

Why ``flock`` and not "create the file if absent": the kernel releases a flock when its holder dies, however
it dies (SIGKILL, OOM killer, node reboot of a local filesystem), so a stale lock never needs to be cleared
by hand and a requeued job simply takes it over. The file itself is never deleted (deleting a lock file
races with a process that has just opened it); its text names the last holder, which is only meaningful
while the lock is actually held. ``flock`` is honoured on local filesystems and on NFSv4 / Lustre / GPFS
mounts that support it; a filesystem without lock support makes acquisition fail loudly (``OSError``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from hypersolid_scale.safety.errors import UserError

LOCK_NAME = ".lock"

# run directories (resolved) whose lock this process holds; the fd is closed in forked children (DataLoader
# workers, see close_in_forked_children) so that a surviving child never keeps a dead trainer's lock alive.
_HELD: dict[Path, int] = {}


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory's lock; ``str(err)`` is the one-line explanation and
    ``holder`` names that process (``host=... pid=... since=...``)."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder


@dataclass
class RunLock:
    run_dir: Path
    path: Path
    fd: int

    def release(self) -> None:
        """Unlock and close; idempotent. Exiting the process releases the lock too."""
        if _HELD.get(self.run_dir) == self.fd:
            del _HELD[self.run_dir]
            forget_fd(self.fd)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)


def lock_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / LOCK_NAME


def holds_lock(run_dir: str | os.PathLike) -> bool:
    """Whether this process holds the lock of ``run_dir``."""
    return Path(run_dir).resolve() in _HELD


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "host=? pid=? since=? (the holder is still starting)"


class RunDirNotADirectory(UserError, NotADirectoryError):
    """The run directory's path, or a folder above it, is a file: nothing can be locked or written there."""


def not_a_directory(run_dir: str | os.PathLike) -> str | None:
    """Why ``run_dir`` can never be a directory ("is a file", or "cannot be created: <file> is a file" when a
    folder above it is one); None when the run directory can be used or made."""
    for p in (Path(run_dir), *Path(run_dir).parents):
        try:
            if p.exists():
                if p.is_dir():
                    return None
                return "is a file" if p == Path(run_dir) else f"cannot be created: {p} is a file"
        except OSError:  # a folder we may not look into: creating or locking run_dir will say what is wrong
            return None
    return None


def acquire_run_lock(run_dir: str | os.PathLike) -> RunLock:
    """Take the exclusive lock of ``run_dir`` (created if missing) without waiting.

    Raises:
        RunDirLocked: another live process holds it; the message names it and what to do.
        RunDirNotADirectory: ``run_dir`` (or a folder above it) is a file.
    """
    why = not_a_directory(run_dir)
    if why is not None:
        raise RunDirNotADirectory(f"run directory {run_dir} {why}, not a directory; choose another directory")
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(run_dir)
    if run_dir in _HELD:
        raise RunDirLocked(
            f"run_dir {run_dir} is already locked by this process (pid {os.getpid()}); "
            "a process trains one run at a time"
        )
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        holder = _read_holder(fd)
        os.close(fd)
        raise RunDirLocked(
            f"run_dir {run_dir} is in use by another training ({holder}); wait for it to finish, stop it "
            "(kill the pid above; a killed holder's lock is released automatically), or pass another "
            "run_dir=...",
            holder,
        ) from None
    since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"host={socket.gethostname()} pid={os.getpid()} since={since}\n".encode(), 0)
    _HELD[run_dir] = fd
    close_in_forked_children(fd)
    return RunLock(run_dir, path, fd)


# Lock fds (this module's and the tracking spool's) closed in forked children: a forked child shares the
# parent's open file description; closing the child's copy leaves the parent's lock in place, and means the
# lock is released as soon as the process that took it dies, whatever its DataLoader workers do.
_CLOSE_IN_CHILD: set[int] = set()


def close_in_forked_children(fd: int) -> None:
    """Have ``fd`` (a descriptor holding a flock) closed in every child this process forks from now on."""
    _CLOSE_IN_CHILD.add(fd)


def forget_fd(fd: int) -> bool:
    """``fd`` is about to be closed by its owner: stop closing it in children. False if it was not registered
    (already forgotten: its owner must not close it twice, the number may belong to another file by now)."""
    if fd not in _CLOSE_IN_CHILD:
        return False
    _CLOSE_IN_CHILD.discard(fd)
    return True


def _close_in_child() -> None:
    for fd in _CLOSE_IN_CHILD:
        try:
            os.close(fd)
        except OSError:
            pass
    _CLOSE_IN_CHILD.clear()
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)
