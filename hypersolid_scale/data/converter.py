"""The converter behind `python -m hypersolid_scale.data.convert` (convert.py holds its command line): streams
a source's splits, one image at a time, to WebDataset shards, an image folder and FFCV `.beton` files, records
finished shards for `--resume`, and writes the manifest."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from hypersolid_scale.data.common import MANIFEST
from hypersolid_scale.data.convert_images import ImageTooLarge, encode_image, pixel_limit, prepare_image
from hypersolid_scale.data.sources import Item
from hypersolid_scale.data.webdataset.shard_writer import ShardWriter, sha256
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import ConfigError, DataError

__all__ = ["Converter", "DEFAULT_MAX_SIDE", "folder_class_name", "hash_name"]

# The longest side accepted by default. 8192 px keeps every photo of a 48-megapixel camera (8000 x 6000)
# and 8K video frames, and bounds one decoded RGB image at 8192^2 * 3 = 201 MB; larger images are
# usually scans or crafted headers, and a training crop of 224 px gains nothing from them.
DEFAULT_MAX_SIDE = 8192


def folder_class_name(label: int, classes: list[str]) -> str:
    """Class directory: the label number first, so that sorted directories keep the label order
    (what ImageFolder assumes), and no path separators ("T-shirt/top")."""
    width = len(str(len(classes) - 1))
    return f"{label:0{width}d}_" + "".join(c if c.isalnum() or c in "-_" else "_" for c in classes[label])


def hash_name(name: str) -> str:
    """Short stable id of a source name, so keys stay unique when file stems repeat across classes."""
    return hashlib.sha1(name.encode()).hexdigest()[:8]


def sample_key(name: str) -> str:
    # No dots in keys: WebDataset splits "<key>.<ext>" at the first dot.
    return f"{Path(name).stem.replace('.', '_')}_{hash_name(name)}"


class Converter:
    def __init__(
        self,
        out: str,
        *,
        formats: list[str],
        shard_size: int,
        image_format: str,
        quality: int,
        mode: str,
        resize: int | None,
        resume: bool,
        ffcv_mode: str,
        max_side: int = DEFAULT_MAX_SIDE,
    ) -> None:
        self.out = Path(out)
        self.formats, self.shard_size, self.image_format = formats, shard_size, image_format
        self.quality, self.mode, self.resize, self.resume, self.ffcv_mode = quality, mode, resize, resume, ffcv_mode
        self.max_side = max_side
        self.ext = "jpg" if image_format == "jpg" else "png"
        self.progress_path = self.out / ".progress.json"
        self.progress: dict[str, Any] = {}
        self._writer: ShardWriter | None = None  # the shard being written
        self._made_out = False  # whether this run created --out (removed again if it stays empty)
        self._ffcv_bounds: dict[str, tuple[int, int]] = {}  # split -> (pixels, side) of its largest image

    def check_output(self) -> bool:
        """True when there is nothing to do. Raises SystemExit(2) rather than touch an existing output."""
        if (self.out / MANIFEST).is_file():
            if self.resume:
                print(f"{self.out}/{MANIFEST} exists: conversion already complete, nothing to do")
                return True
            raise SystemExit(
                f"error: {self.out} already holds a complete conversion ({MANIFEST}); choose another --out or delete it"
            )
        if self.out.exists() and any(self.out.iterdir()):
            if not self.resume:
                raise SystemExit(
                    f"error: {self.out} is not empty (an interrupted conversion?); pass --resume "
                    "to continue it or choose another --out"
                )
            if self.progress_path.is_file():
                self.progress = json.loads(self.progress_path.read_text())
        self._made_out = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        return False

    # ------------------------------------------------------------------------------ one image --
    def open_checked(self, it: Item) -> Image.Image:
        """The item's image, decoded, after its header size passed --max-side."""
        try:
            img = it.load()
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:  # PIL's guard (pixel_limit)
            raise ImageTooLarge(
                f"{e} (the limit is --max-side {self.max_side} squared; raise --max-side to keep such images)"
            ) from e
        w, h = img.size
        if max(w, h) > self.max_side:
            img.close()
            raise ImageTooLarge(
                f"its header says {w} x {h} px, over --max-side {self.max_side} (raise --max-side to keep such images)"
            )
        img.load()  # the full decode: a truncated file fails here
        return img

    def encode(self, it: Item) -> bytes:
        return encode_image(prepare_image(self.open_checked(it), self.mode, self.resize), self.ext, self.quality)

    def _bad(self, split: str, it: Item, err: Exception) -> dict:
        reason = "too_large" if isinstance(err, ImageTooLarge) else "undecodable"
        print(f"bad image skipped: {it.name}: {type(err).__name__}: {err}", file=sys.stderr)
        return {"split": split, "name": it.name, "reason": reason, "error": f"{type(err).__name__}: {err}"}

    def _folder_dest(self, split: str, it: Item, classes: list[str]) -> Path:
        return (
            self.out
            / "imagefolder"
            / split
            / folder_class_name(it.label, classes)
            / f"{Path(it.name).stem}_{hash_name(it.name)}.{self.ext}"
        )

    # ------------------------------------------------------------------------------ one split --
    def _resume_point(self, split: str, items: Sequence[Item], done: list[dict]) -> tuple[int, list[dict]]:
        """(source items the finished shards used up, bad files among them). Recorded with each shard; for a
        record without it, the images are checked again until the shards' sample count is reached."""
        if not done:
            return 0, []
        if all("consumed" in d and "bad" in d for d in done):
            return int(done[-1]["consumed"]), [b for d in done for b in d["bad"]]
        need, bad, k = sum(int(d["count"]) for d in done), [], 0
        while need > 0 and k < len(items):
            try:
                self.open_checked(items[k])
                need -= 1
            except Exception as e:  # noqa: BLE001 - any decoder failure is a bad file to list
                bad.append(self._bad(split, items[k], e))
            k += 1
        return k, bad

    def _intact_shards(self, split: str) -> list[dict]:
        """The recorded shards of `split` up to the first missing or changed one (those get rewritten)."""
        d = self.out / split
        done: list[dict] = self.progress.setdefault(split, [])
        intact = 0
        while (
            intact < len(done)
            and (d / done[intact]["name"]).is_file()
            and sha256(d / done[intact]["name"]) == done[intact]["sha256"]
        ):
            intact += 1
        del done[intact:]
        return done

    def convert_split(
        self, split: str, items: Sequence[Item], classes: list[str], labeled: bool, bad: list[dict]
    ) -> dict[str, Any]:
        """Stream every image of `split` once to the shards and the folder; FFCV reads the good ones after."""
        shards = "webdataset" in self.formats
        folder = "imagefolder" in self.formats
        done = self._intact_shards(split) if shards else []
        if shards:
            (self.out / split).mkdir(exist_ok=True)
        start, earlier_bad = self._resume_point(split, items, done)
        bad += earlier_bad
        bad_names = {b["name"] for b in earlier_bad}
        good = [k for k in range(start) if items[k].name not in bad_names]
        if folder:  # images of finished shards: written with them, unless a file went missing
            for k in good:
                dest = self._folder_dest(split, items[k], classes)
                if not dest.is_file():
                    self._write_file(dest, self.encode(items[k]))
        pending: list[dict] = []  # bad files since the last finished shard
        try:
            self._stream(split, items, classes, start, done, good, bad, pending, shards, folder)
        except BaseException:  # interrupted: the unfinished shard goes; finished ones and their record stay
            if self._writer is not None:
                self._writer.abort()
            raise
        if not good:
            raise self._nothing_converted(split, items, [b for b in bad if b["split"] == split])
        if self._writer is not None:
            self._finish_shard(done, len(items), pending)
        entry: dict[str, Any] = {"count": len(good), "labeled": labeled}
        if labeled:
            per_class = dict.fromkeys(classes, 0)
            for k in good:
                per_class[classes[items[k].label]] += 1
            entry["per_class"] = per_class
        if shards:
            entry["shards"] = [{key: d[key] for key in ("name", "count", "sha256")} for d in done]
        if "ffcv" in self.formats:
            entry["beton"] = self.write_beton(split, [items[k] for k in good])
        return entry

    def _stream(
        self,
        split: str,
        items: Sequence[Item],
        classes: list[str],
        start: int,
        done: list[dict],
        good: list[int],
        bad: list[dict],
        pending: list[dict],
        shards: bool,
        folder: bool,
    ) -> None:
        """Items `start`.. one at a time: check, encode once, write to the folder and the current shard
        (`self._writer`, left open at the end when the items do not fill it)."""
        self._writer = None
        for k in tqdm(range(start, len(items)), desc=f"convert {split}", unit="img", initial=start, total=len(items)):
            it = items[k]
            try:
                data = self.encode(it) if shards or folder else None
                if data is None:
                    self.open_checked(it)
            except Exception as e:  # noqa: BLE001 - any decoder failure is a bad file to list
                pending.append(self._bad(split, it, e))
                bad.append(pending[-1])
                continue
            good.append(k)
            if folder and not (dest := self._folder_dest(split, it, classes)).is_file():
                assert data is not None
                self._write_file(dest, data)
            if shards:
                if self._writer is None:
                    self._writer = ShardWriter(self.out / split / f"shard-{len(done):06d}.tar")
                assert data is not None
                self._writer.add(sample_key(it.name), {self.ext: data, "cls": str(it.label).encode()})
                if self._writer.count == self.shard_size:
                    self._finish_shard(done, k + 1, pending)

    def _finish_shard(self, done: list[dict], consumed: int, pending: list[dict]) -> None:
        """Close the current shard and record it, with how far into the items it reached and the bad files
        met since the previous shard (what --resume needs to skip them without decoding)."""
        assert self._writer is not None
        done.append({**self._writer.close(), "consumed": consumed, "bad": list(pending)})
        self._writer = None
        pending.clear()
        atomic.write_json(self.progress_path, self.progress, indent=2, newline=False)

    @staticmethod
    def _write_file(dest: Path, data: bytes) -> None:
        atomic.write_bytes(dest, data)

    def _nothing_converted(self, split: str, items: Sequence[Item], bad: list[dict]) -> DataError:
        """The error for a split without a single good image; empty folders this run made are removed, so
        that what is left is either nothing or the finished shards of earlier splits (kept for --resume)."""
        for d in [*sorted(self.out.rglob("*"), reverse=True), *([self.out] if self._made_out else [])]:
            if d.is_dir() and not any(d.iterdir()):  # reverse order: subfolders before their parents
                d.rmdir()
        if not items:
            return DataError(f"no image of split {split!r} was converted: the source has none for it")
        large = sum(b["reason"] == "too_large" for b in bad)
        first = f"{bad[0]['name']}: {bad[0]['error']}".replace("\n", " ") if bad else ""
        fix = "raise --max-side or " if large else ""
        return DataError(
            f"no image of split {split!r} was converted: all {len(items)} were rejected ({large} over "
            f"--max-side {self.max_side}, {len(bad) - large} undecodable; listed above, e.g. {first}); "
            f"{fix}fix the files, or leave the split out with --split"
        )

    def scan_ffcv_sizes(self, splits: dict[str, Sequence[Item]]) -> None:
        """The largest image of each split, from the headers, before anything is written: the FFCV page size
        depends on it, and an image no page holds is refused now, not after the other outputs."""
        from hypersolid_scale.data.ffcv.beton_writer import largest_image, page_size_for

        for split, items in splits.items():
            bounds = (
                (self.resize**2, self.resize)
                if self.resize
                else largest_image(
                    (it.load for it in tqdm(items, desc=f"image sizes {split}", unit="img")), self.max_side
                )
            )
            page_size_for(*bounds)
            self._ffcv_bounds[split] = bounds

    def write_beton(self, split: str, items: list[Item]) -> dict:
        from hypersolid_scale.data.ffcv.beton_writer import write_beton

        dest = self.out / f"{split}.beton"
        rgb = [lambda it=it: np.asarray(prepare_image(self.open_checked(it), "RGB", self.resize)) for it in items]
        pixels, side = self._ffcv_bounds[split]
        write_beton(
            str(dest),
            rgb,
            [it.label for it in items],
            write_mode=self.ffcv_mode,
            jpeg_quality=self.quality,
            max_pixels=pixels,
            max_side=side,
        )
        return {"name": dest.name, "count": len(items), "sha256": sha256(dest), "bytes": dest.stat().st_size}

    def run(
        self,
        classes: list[str],
        splits: dict[str, Sequence[Item]],
        source: str,
        unlabeled: frozenset[str] | set[str] = frozenset(),
    ) -> dict:
        manifest: dict[str, Any] = {
            "format_version": 1,
            "source": source,
            "classes": classes,
            "num_classes": len(classes),
            "formats": self.formats,
            "splits": {},
            "bad_files": [],
        }
        if "imagefolder" in self.formats and unlabeled & set(splits):
            raise ConfigError(
                f"--formats imagefolder cannot hold the split(s) {sorted(unlabeled & set(splits))}: they "
                "have no labels and an image folder needs a class folder per image; convert them with "
                "--formats webdataset or ffcv"
            )
        with pixel_limit(self.max_side):
            if "ffcv" in self.formats:
                self.scan_ffcv_sizes(dict(splits))
            for split, items in splits.items():
                manifest["splits"][split] = self.convert_split(
                    split, items, classes, split not in unlabeled, manifest["bad_files"]
                )
        reasons = [b["reason"] for b in manifest["bad_files"]]
        manifest["bad_counts"] = {r: reasons.count(r) for r in ("too_large", "undecodable")}
        atomic.write_json(self.out / MANIFEST, manifest, indent=2, newline=False)
        self.progress_path.unlink(missing_ok=True)
        return manifest
