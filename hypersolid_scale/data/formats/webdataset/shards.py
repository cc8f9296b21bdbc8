"""WebDataset shards: the conversion manifest, and reading one shard through the `webdataset` library's tar
reader while accounting for what it lacks. Shard URLs, and opening them: urls.py.

Integrity (what a shard is checked against when it has been read to its end):
- the manifest written by `python -m hypersolid_scale.data.convert` (next to local shards, or given with
  data.webdataset.manifest): its sample count, and with `verify` its sha256, computed on the bytes as they
  stream by;
- the tar end-of-archive marker: a shard whose bytes stop before it was cut (at a member boundary or in a
  header), which the tar reader itself takes for a normal end.
A shard that breaks in the middle of a member yields the samples before the break. Each finding is an
event `{"kind", "url", "lost", "message"}` (kinds: EVENT_COUNTER, and "verified" for a matching sha256,
which says nothing); the loaders count and warn. A shard
that cannot be opened or is not a tar archive raises a `DataError` naming it and saying how to fix it
(the user's data, not a bug: the entry points report it in one line with exit code 2).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from webdataset.tariterators import group_by_keys, tar_file_expander

from hypersolid_scale.data.formats.webdataset.urls import is_local, local_path, open_url, shard_key
from hypersolid_scale.data.loading.common import find_manifest
from hypersolid_scale.safety.errors import DataError

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
Sample = dict[str, Any]
Event = dict[str, Any]
# Event kind -> the loader counter it increments (a shard event's "lost" also adds to lost_samples; a
# corrupt sample only counts as skipped).
EVENT_COUNTER = {
    "corrupt": "corrupt_skipped",
    "short": "short_shards",
    "truncated": "truncated_shards",
    "checksum": "checksum_mismatches",
    "stale": "stale_manifest_entries",
}
COUNTERS = (
    "corrupt_skipped",
    "lost_samples",
    "short_shards",
    "truncated_shards",
    "checksum_mismatches",
    "stale_manifest_entries",
)
# The fix offered for a shard that is no tar archive, or a damaged one.
RECREATE = (
    "re-create damaged shards from the source images with `python -m hypersolid_scale.data.convert`, or "
    "leave them out of data.path"
)


class Manifest:
    """Per-shard sample counts and sha256 of a conversion manifest, looked up by (split, shard name)."""

    def __init__(self, data: dict, source: str) -> None:
        self.data, self.source = data, source
        self.entries = {
            (split, sh["name"]): sh for split, e in data.get("splits", {}).items() for sh in e.get("shards", [])
        }

    @classmethod
    def load(cls, url: str) -> Manifest:
        try:
            with open_url(url) as f:
                return cls(json.loads(f.read()), url)
        except (OSError, ValueError, RuntimeError) as e:
            raise DataError(
                f"cannot read the manifest {url!r} (data.webdataset.manifest): {type(e).__name__}: {e}; point "
                "data.webdataset.manifest at the manifest.json the converter wrote"
            ) from e

    @classmethod
    def locate(cls, shards: list[str], explicit: str | None) -> Manifest | None:
        """data.webdataset.manifest when set, else the manifest.json next to (or above) the first local shard."""
        if explicit:
            return cls.load(explicit)
        local = next((s for s in shards if is_local(s)), None)
        data = find_manifest(str(Path(local_path(local)).parent)) if local else None
        return cls(data, f"manifest.json above {local}") if data else None

    def entry(self, url: str) -> dict | None:
        key = shard_key(url)
        return self.entries.get(key) if key else None

    def total(self, shards: list[str]) -> int | None:
        """Samples in `shards`, if the manifest lists every one of them."""
        entries = [self.entry(s) for s in shards]
        return None if any(e is None for e in entries) else sum(int(e["count"]) for e in entries if e is not None)


def has_image(sample: Sample) -> bool:
    return any(e in sample for e in IMAGE_EXTS)


def _share(lo: int, hi: int, share: tuple[int, int] | None) -> int:
    """How many positions in [lo, hi) a stream keeps: all, or those i with i % streams == stream."""
    if share is None:
        return max(0, hi - lo)
    stream, streams = share
    return len(range(lo + (stream - lo) % streams, hi, streams))


class _Tracked(io.RawIOBase):
    """Hands a shard's bytes to the tar reader, remembering its first block, whether the end of the stream
    was reached (the reader stops there silently when the end-of-archive marker is missing) and,
    optionally, their sha256."""

    def __init__(self, raw: IO[bytes], sha: bool) -> None:
        super().__init__()
        self.raw, self.head, self.eof = raw, b"", False
        self.sha = hashlib.sha256() if sha else None

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        if not data:
            self.eof = True
        if len(self.head) < 512:
            self.head += data[: 512 - len(self.head)]
        if self.sha is not None:
            self.sha.update(data)
        return data

    def is_tar(self) -> bool:
        return self.head[257:262] == b"ustar"

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self.close_error: Exception | None = None
        try:
            self.raw.close()
        except Exception as e:  # noqa: BLE001 - a command stopped early (SIGPIPE) reports a failure on close
            self.close_error = e  # kept: it tells why a command produced nothing
        super().close()


class ShardReader:
    """Samples of one shard at a time through the library's tar reader; findings go to `events`."""

    def __init__(
        self, manifest: Manifest | None = None, verify: bool = False, verified: frozenset[str] = frozenset()
    ) -> None:
        self.manifest, self.verify = manifest, verify
        self.events: list[Event] = []
        self._verified = set(verified)  # shards whose sha256 matched: not hashed again

    @property
    def verified(self) -> frozenset[str]:
        """The shards whose sha256 matched the manifest so far (given or found by this reader)."""
        return frozenset(self._verified)

    def samples(self, url: str, share: tuple[int, int] | None = None) -> Iterator[Sample]:
        """The shard's samples in file order; with `share=(s, S)` only those at positions i % S == s.

        Accounting happens only when the shard was read to its end (not when the consumer stops early).
        """
        entry = self.manifest.entry(url) if self.manifest else None
        want_sha = bool(self.verify and entry and entry.get("sha256") and url not in self._verified)
        errors: list[Exception] = []

        def stop(exn: Exception) -> bool:
            errors.append(exn)
            return False  # end this shard; the samples before the break have been yielded

        try:
            stream = _Tracked(open_url(url), want_sha)
        except Exception as e:  # any failure to open is "cannot read", named
            raise unreadable(url, e) from e
        got = position = 0
        try:
            files = tar_file_expander([{"url": url, "stream": stream}], handler=stop)
            for sample in group_by_keys(files, handler=stop):
                i, position = position, position + 1
                got += has_image(sample)
                if share is None or i % share[1] == share[0]:
                    yield sample
            no_marker = stream.eof and stream.is_tar()
            if want_sha and not errors:
                stream.drain()
        finally:
            stream.close()
        if errors and stream.close_error is not None and position == 0:
            errors[0] = OSError(f"{_describe(errors[0])}; {stream.close_error}")
        sha = stream.sha.hexdigest() if want_sha and not errors and stream.sha else None
        self.account(
            url,
            got,
            entry,
            error=errors[0] if errors else None,
            readable=position > 0 or stream.is_tar(),
            no_marker=no_marker,
            sha=sha,
            share=share,
        )

    def account(
        self,
        url: str,
        got: int,
        entry: dict | None,
        *,
        error: Exception | None,
        readable: bool,
        no_marker: bool,
        sha: str | None,
        share: tuple[int, int] | None = None,
    ) -> None:
        """Compare what a shard delivered with what it should hold; a `DataError` if it is no tar at all."""
        if error is not None and not readable:
            raise unreadable(url, error)
        expected = int(entry["count"]) if entry else None
        lost = _share(got, expected, share) if expected is not None else 0
        missing = (
            f"{expected - got} of its {expected} samples (manifest) are lost"
            if expected is not None
            else "how many samples are lost is unknown (the shard has no manifest entry)"
        )
        if error is not None:
            self._event(
                "truncated",
                url,
                lost,
                f"shard {url!r} breaks after {got} samples ({_describe(error)}): {missing}; going on without them",
            )
        elif expected is not None and got < expected:
            self._event(
                "short",
                url,
                lost,
                f"shard {url!r} holds {got} samples, the manifest lists {expected}: "
                f"{missing} (truncated at a member boundary?); going on without them",
            )
        elif no_marker:
            self._event(
                "short",
                url,
                0,
                f"shard {url!r} ends without the tar end-of-archive marker after {got} samples (truncated?): {missing}",
            )
        if expected is not None and got > expected:
            self._event(
                "stale",
                url,
                0,
                f"shard {url!r} holds {got} samples but the manifest lists {expected}: "
                "is the manifest from another conversion?",
            )
        if sha is not None:
            if sha != entry["sha256"]:  # type: ignore[index]
                self._event(
                    "checksum",
                    url,
                    0,
                    f"shard {url!r} has sha256 {sha}, the manifest lists "
                    f"{entry['sha256']}: it changed after conversion",  # type: ignore[index]
                )
            else:
                self._verified.add(url)
                self._event("verified", url, 0, "")

    def _event(self, kind: str, url: str, lost: int, message: str) -> None:
        self.events.append({"kind": kind, "url": url, "lost": float(lost), "message": message})


def unreadable(url: str, error: Exception) -> DataError:
    """The error for a shard that yields nothing: one that cannot be opened or fetched (an OSError: the
    file, the address, the command) or whose bytes are no tar archive."""
    if isinstance(error, OSError):
        fix = (
            "check that it exists and is readable (for a URL or a pipe: command, the address, its "
            "credentials and the network), or leave it out of data.path"
        )
    else:
        fix = f"it is not a tar archive, or a damaged one: {RECREATE}"
    return DataError(f"cannot read shard {url!r}: {_describe(error)}; {fix}")


def _describe(exn: Exception) -> str:
    # The library appends " @ <stream object>" to the message; the shard is named by the caller.
    first = str(exn.args[0]).split(" @ ")[0] if exn.args else ""
    return f"{type(exn).__name__}: {first or exn}"


def apply_events(stats: dict[str, float], events: list[Event]) -> float:
    """Add events to loader counters; returns the samples their shards lost (corrupt samples, which are
    skipped and counted on their own, not included)."""
    lost = 0.0
    for ev in events:
        if ev["kind"] not in EVENT_COUNTER:  # "verified": nothing to count
            continue
        stats[EVENT_COUNTER[ev["kind"]]] += 1.0
        if ev["kind"] != "corrupt":
            stats["lost_samples"] += ev["lost"]
            lost += ev["lost"]
    return lost


def count_samples(shards: list[str]) -> int:
    """Samples (groups with an image) in shards without a manifest: a header scan of local files, one
    streamed pass over remote ones."""
    total = 0
    reader = ShardReader()
    for url in shards:
        if is_local(url):
            total += sum(1 for _, parts in scan_local(url)[0] if any(e in parts for e in IMAGE_EXTS))
        else:
            total += sum(has_image(s) for s in reader.samples(url))
    return total


def scan_local(url: str) -> tuple[list[tuple[str, dict[str, tarfile.TarInfo]]], Exception | None, bool]:
    """(key, {ext: member}) groups of a local shard in file order from its headers (no data read), the
    error that ended the scan early, and whether the end-of-archive marker is missing. Members whose data
    runs past the end of the file are left out."""
    path = local_path(url)
    size = os.path.getsize(path)
    groups: dict[str, dict[str, tarfile.TarInfo]] = {}
    error: Exception | None = None
    try:
        with tarfile.open(path, mode="r:") as tar:
            while True:
                try:
                    m = tar.next()
                except (tarfile.TarError, OSError, EOFError) as e:
                    if not groups:
                        raise
                    error = e
                    break
                if m is None:
                    break
                if not m.isfile():
                    continue
                if m.offset_data + m.size > size:
                    error = tarfile.ReadError(f"member {m.name!r} runs past the end of the file")
                    break
                stem, _, ext = os.path.basename(m.name).partition(".")
                groups.setdefault(os.path.join(os.path.dirname(m.name), stem), {})[ext.lower()] = m
            end = tar.offset
    except (tarfile.TarError, OSError, EOFError) as e:
        raise unreadable(url, e) from e
    with open(path, "rb") as f:
        f.seek(end)
        block = f.read(512)
    no_marker = error is None and (len(block) < 512 or block.count(0) != 512)
    return list(groups.items()), error, no_marker
