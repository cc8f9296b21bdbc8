"""Random access into WebDataset shards, for evaluation (kNN monitor, `hypersolid_scale.eval`).

Local shards: one header scan, then seek + read per sample. Remote shards (`pipe:`, http(s), s3/gs, ...):
streamed once through the webdataset library's tar reader into a local spill file per shard, kept (and
reused) for the life of the process and deleted at exit. Both are checked like the training loader's
(manifest count, truncation, end marker, sha256 with `verify`), warn and count in `stats`.

A sample that cannot be used is skipped and counted (`stats["corrupt_skipped"]`), never raised: one without
an image or a readable label is left out of the index; one whose image does not decode when it is fetched
has its slot filled by the next decodable sample in index order, so the length and every other index stay
valid (the count is shared by DataLoader workers).
"""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset

from hypersolid_scale.data.formats.webdataset.shards import (
    COUNTERS,
    IMAGE_EXTS,
    Event,
    Manifest,
    ShardReader,
    apply_events,
    scan_local,
)
from hypersolid_scale.data.formats.webdataset.urls import expand_shards, is_local, local_path
from hypersolid_scale.safety.errors import DataError

Item = tuple[str, int, int, int]  # (file, offset, size, label)
# (url, manifest source, verify) -> (items in the spill file, events of the streamed read): a remote shard
# is downloaded once per process, however often the evaluation datasets are built.
_SPILLED: dict[tuple[str, str, bool], tuple[list[Item], list[Event]]] = {}
_MAX_FILL = 100  # consecutive undecodable samples before giving up


def _remove_spills(pid: int) -> None:
    if os.getpid() != pid:  # a forked DataLoader worker must not delete the parent's files
        return
    for items, _ in _SPILLED.values():
        for path in {it[0] for it in items}:
            try:
                os.unlink(path)
            except OSError:
                pass


atexit.register(_remove_spills, os.getpid())


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _label(data: bytes) -> int:
    return int(data.decode().strip())


def _corrupt(url: str, key: str, why: str) -> Event:
    return {"kind": "corrupt", "url": url, "lost": 1.0, "message": f"skipping sample {key!r} of {url!r}: {why}"}


class ShardIndexDataset(Dataset):
    """(image, label) by index over WebDataset shards; `items` = [(file, offset, size, label)]."""

    def __init__(
        self,
        urls: str,
        mode: str = "RGB",
        transform: Callable | None = None,
        *,
        manifest: str | None = None,
        verify: bool = False,
    ) -> None:
        self.mode, self.transform = mode, transform
        shards = expand_shards(urls)
        reader = ShardReader(Manifest.locate(shards, manifest), verify)
        self.items: list[Item] = []
        events: list[Event] = []
        for url in shards:
            if is_local(url):
                self._index_local(url, reader)
                events += reader.events
                reader.events = []
                continue
            key = (url, reader.manifest.source if reader.manifest else "", verify)
            if key not in _SPILLED:
                _SPILLED[key] = self._spill(url, reader), list(reader.events)
                for ev in reader.events:
                    if ev["message"]:
                        warnings.warn(ev["message"], stacklevel=1)
                reader.events = []
            items, seen = _SPILLED[key]
            self.items += items
            events += [{**ev, "warned": True} for ev in seen]
        for ev in events:
            if ev["message"] and not ev.get("warned"):
                warnings.warn(ev["message"], stacklevel=1)
        self._stats = dict.fromkeys(COUNTERS, 0.0)
        apply_events(self._stats, events)
        # Undecodable images found while fetching: shared memory, so DataLoader workers add to it too.
        self._fetch_corrupt = torch.zeros(1, dtype=torch.float64)
        try:
            self._fetch_corrupt.share_memory_()
        except RuntimeError:  # no shared memory: counts from worker processes are lost, not the samples
            pass

    @property
    def stats(self) -> dict[str, float]:
        return {**self._stats, "corrupt_skipped": self._stats["corrupt_skipped"] + float(self._fetch_corrupt[0])}

    def _index_local(self, url: str, reader: ShardReader) -> None:
        groups, error, no_marker = scan_local(url)
        path, got = local_path(url), 0
        with open(path, "rb") as f:
            for key, parts in groups:
                img = next((parts[e] for e in IMAGE_EXTS if e in parts), None)
                if img is None:
                    continue
                got += 1
                if "cls" not in parts:
                    reader.events.append(_corrupt(url, key, "no .cls label"))
                    continue
                f.seek(parts["cls"].offset_data)
                try:
                    label = _label(f.read(parts["cls"].size))
                except (ValueError, UnicodeDecodeError) as e:
                    reader.events.append(_corrupt(url, key, f"bad .cls label: {e}"))
                    continue
                self.items.append((path, img.offset_data, img.size, label))
        entry = reader.manifest.entry(url) if reader.manifest else None
        sha = _sha256(path) if reader.verify and entry and entry.get("sha256") else None
        reader.account(url, got, entry, error=error, readable=True, no_marker=no_marker, sha=sha)

    @staticmethod
    def _spill(url: str, reader: ShardReader) -> list[Item]:
        items: list[Item] = []
        fd, path = tempfile.mkstemp(prefix="hypersolid-eval-", suffix=".bin")
        with os.fdopen(fd, "wb") as out:
            for sample in reader.samples(url):
                ext = next((e for e in IMAGE_EXTS if e in sample), None)
                if ext is None:
                    continue
                try:
                    label = _label(sample["cls"])
                except (KeyError, ValueError, UnicodeDecodeError) as e:
                    reader.events.append(_corrupt(url, sample["__key__"], f"no readable .cls label: {e!r}"))
                    continue
                items.append((path, out.tell(), len(sample[ext]), label))
                out.write(sample[ext])
        return items

    def __len__(self) -> int:
        return len(self.items)

    def _load(self, i: int) -> tuple[Image.Image, int]:
        path, offset, size, label = self.items[i]
        with open(path, "rb") as f:
            f.seek(offset)
            img = Image.open(io.BytesIO(f.read(size)))
            img.load()
        return img.convert(self.mode), label

    def __getitem__(self, i: int) -> tuple[Any, int]:
        n = len(self.items)
        if not -n <= i < n:  # ends `for x in dataset`, which the fill-in below would otherwise never end
            raise IndexError(f"index {i} out of range for {n} samples")
        i %= n
        for k in range(min(n, _MAX_FILL)):
            j = (i + k) % n
            try:
                img, label = self._load(j)
            except Exception as e:  # noqa: BLE001 - any decoder failure means "skip this sample"
                self._fetch_corrupt += 1
                warnings.warn(
                    f"skipping sample {j} ({self.items[j][0]} at byte {self.items[j][1]}): "
                    f"{type(e).__name__}: {e}; index {i} gets the next decodable sample",
                    stacklevel=1,
                )
                continue
            return (self.transform(img) if self.transform else img), label
        raise DataError(
            f"samples {i}..{i + _MAX_FILL - 1} of the evaluation shards do not decode; re-create the "
            "shards from the source images with `python -m hypersolid_scale.data.convert`"
        )
