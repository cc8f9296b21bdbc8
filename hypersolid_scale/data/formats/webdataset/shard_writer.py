"""Writing WebDataset shards: one tar file of samples, each sample `<key>.<ext>` members (`.png`/`.jpg` image,
`.cls` ASCII label), written under a temporary name and renamed when complete, so that a shard on disk is
always whole. What `python -m hypersolid_scale.data.convert` writes and `shards.py` reads."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from hypersolid_scale.data.loading.common import sha256
from hypersolid_scale.safety import atomic


class ShardWriter:
    """Appends samples to `<path>.tmp`; `close()` renames it to `path` and returns its manifest entry.

    Members are streamed to disk as they are added: memory holds one sample, never the shard.
    Member metadata is fixed (mtime 0, mode 0o644), so the same samples always give the same bytes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tmp = atomic.temp_path(self.path)
        self.count = 0
        self._tar: tarfile.TarFile | None = tarfile.open(self.tmp, "w")

    def add(self, key: str, members: dict[str, bytes]) -> None:
        """One sample: `members` maps an extension ("png", "cls", ...) to the member's bytes."""
        if "." in key:
            raise ValueError(f"sample key {key!r} contains a dot: WebDataset splits '<key>.<ext>' at the first dot")
        assert self._tar is not None, "the shard is closed"
        for ext, data in members.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            self._tar.addfile(info, io.BytesIO(data))
        self.count += 1

    def close(self) -> dict:
        """Finish the archive, rename it into place; {"name", "count", "sha256"}."""
        assert self._tar is not None, "the shard is closed"
        self._tar.close()
        self._tar = None
        atomic.commit(self.tmp, self.path)
        return {"name": self.path.name, "count": self.count, "sha256": sha256(self.path)}

    def abort(self) -> None:
        """Drop an unfinished shard: it is never renamed into place."""
        if self._tar is not None:
            self._tar.close()
            self._tar = None
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if self._tar is not None:
            self.close() if exc_type is None else self.abort()
