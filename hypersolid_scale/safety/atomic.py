"""The one way a result, a checkpoint or an export is written: whole, or not at all.

The data goes to ``<name>.<pid>.tmp`` in the destination's own directory (a rename is atomic only within one
filesystem), is fsync'ed, renamed over the destination with ``os.replace`` and the directory is fsync'ed (so
that the rename itself survives a power cut). A write that raises part-way removes the temporary file and
leaves the previous file untouched. A reader therefore sees the old file or the new one, never half of one;
a process killed mid-write (SIGKILL) leaves at worst a stray ``*.tmp``, which the checkpoint scan ignores and
the run directory's lock holder deletes (docs/design.md §5).

Hand-written rather than a library's (``atomicwrites`` is unmaintained and does not fsync the directory): it
is the few lines below, and every writer in the package uses them.

* :func:`write_text`, :func:`write_bytes`, :func:`write_json`: a whole value at once;
* :func:`write_with`: a callback that writes to an open binary file (``torch.save``, ``fig.savefig``);
* :func:`atomic_path`: a context manager yielding the temporary path, for writers that open the file
  themselves (a tar archive, an FFCV ``.beton``);
* :func:`temp_path` and :func:`commit`: the two halves, for a writer whose open and close are separate calls
  (``ShardWriter``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_path", "commit", "fsync_dir", "temp_path", "write_bytes", "write_json", "write_text", "write_with"]


def temp_path(path: str | os.PathLike) -> Path:
    """``<name>.<pid>.tmp`` beside ``path``: in its directory (same filesystem), one per process."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def fsync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory, so that a rename in it is durable; a no-op where the filesystem cannot."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not support fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def commit(tmp: str | os.PathLike, path: str | os.PathLike, *, durable: bool = True, replace: bool = True) -> Path:
    """fsync the finished ``tmp``, rename it over ``path``, fsync the directory; returns ``path``.

    ``durable=False`` skips both fsyncs: the rename is still atomic for a killed process (a reader sees the old
    file or the new one), not for a power cut; for small, frequent bookkeeping whose loss costs a redo.
    ``replace=False`` never replaces a file: ``tmp`` is hard-linked as ``path`` (atomic, and refused where
    ``path`` exists, whoever made it meanwhile) and then removed; ``FileExistsError`` if ``path`` exists."""
    if durable:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if replace:
        os.replace(tmp, path)
    else:
        try:
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
    if durable:
        fsync_dir(Path(path).parent)
    return Path(path)


@contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = True) -> Iterator[Path]:
    """Yield the temporary path to write ``path`` through; committed when the block ends without an error.

    The destination's directory is created when missing. On an error (or a KeyboardInterrupt) the temporary
    file is removed before the exception goes on, and ``path`` is untouched.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        commit(tmp, path, durable=durable)
    finally:
        tmp.unlink(missing_ok=True)


def write_with(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], *, durable: bool = True) -> Path:
    """Call ``write`` with a binary file open for writing, then commit it as ``path``."""
    with atomic_path(path, durable=durable) as tmp:
        with open(tmp, "wb") as f:
            write(f)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> Path:
    return write_with(path, lambda f: f.write(data), durable=durable)


def write_text(path: str | os.PathLike, text: str, *, durable: bool = True) -> Path:
    """``text`` as UTF-8 (as ``Path.write_text`` on Linux)."""
    return write_bytes(path, text.encode("utf-8"), durable=durable)


def write_json(
    path: str | os.PathLike,
    obj: Any,
    *,
    indent: int | None = 1,
    newline: bool = True,
    durable: bool = True,
    **kw: Any,
) -> Path:
    """``json.dumps(obj, indent=indent, **kw)`` (plus a final newline unless ``newline=False``).

    The text is made before the file is opened, so a value that cannot be serialised raises with nothing
    written."""
    return write_text(path, json.dumps(obj, indent=indent, **kw) + ("\n" if newline else ""), durable=durable)
