"""The converter behind `python -m hypersolid_scale.data.convert` (cli.py holds its command line): streams
a source's splits, one image at a time, to the chosen formats' writers (each format's `ConversionTarget`, in
its own module under data/formats/: WebDataset shards, FFCV `.beton` files, an image folder), resumes where the
recorded parts end (`--resume`), lists the bad images and writes the manifest."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from hypersolid_scale.data.convert.images import ImageTooLarge, encode_image, pixel_limit, prepare_image
from hypersolid_scale.data.convert.sources import Item
from hypersolid_scale.data.formats import ConversionTarget
from hypersolid_scale.data.formats import get as get_format
from hypersolid_scale.data.loading.common import MANIFEST
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import ConfigError, DataError

__all__ = ["Converter", "DEFAULT_MAX_SIDE", "hash_name"]

# The longest side accepted by default. 8192 px keeps every photo of a 48-megapixel camera (8000 x 6000)
# and 8K video frames, and bounds one decoded RGB image at 8192^2 * 3 = 201 MB; larger images are
# usually scans or crafted headers, and a training crop of 224 px gains nothing from them.
DEFAULT_MAX_SIDE = 8192


def hash_name(name: str) -> str:
    """Short stable id of a source name, so keys stay unique when file stems repeat across classes."""
    return hashlib.sha1(name.encode()).hexdigest()[:8]


class Converter:
    # The .beton writer's processes (None: FFCV's default) and whether outputs are hashed into the manifest.
    beton_workers: int | None = None
    hash_outputs = True

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
        self.progress: dict[str, Any] = {}  # split -> the records of its finished parts (shards)
        self._made_out = False  # whether this run created --out (removed again if it stays empty)
        targets = [get_format(f).target for f in formats]
        if None in targets:
            raise ConfigError(f"--formats {formats}: a format that the converter cannot write is among them")
        self.targets: list[ConversionTarget] = [target(self) for target in targets if target is not None]

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

    def rgb(self, it: Item) -> Callable[[], np.ndarray]:
        """The item's RGB pixels, decoded when called (what an FFCV .beton stores)."""
        return lambda: np.asarray(prepare_image(self.open_checked(it), "RGB", self.resize))

    def save_progress(self) -> None:
        atomic.write_json(self.progress_path, self.progress, indent=2, newline=False)

    def _bad(self, split: str, it: Item, err: Exception) -> dict:
        reason = "too_large" if isinstance(err, ImageTooLarge) else "undecodable"
        print(f"bad image skipped: {it.name}: {type(err).__name__}: {err}", file=sys.stderr)
        return {"split": split, "name": it.name, "reason": reason, "error": f"{type(err).__name__}: {err}"}

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

    def convert_split(
        self, split: str, items: Sequence[Item], classes: list[str], labeled: bool, bad: list[dict]
    ) -> dict[str, Any]:
        """Stream every image of `split` once to every target; a target that records its finished parts (the
        shards) says where an interrupted conversion resumes."""
        # Every target is asked (each resets its own split state there); the first that keeps records says.
        records = [r for t in self.targets if (r := t.resume_records(split)) is not None]
        start, earlier_bad = self._resume_point(split, items, records[0] if records else [])
        bad += earlier_bad
        bad_names = {b["name"] for b in earlier_bad}
        good = [k for k in range(start) if items[k].name not in bad_names]
        for target in self.targets:
            target.begin_split(split, classes, [items[k] for k in good])
        pending: list[dict] = []  # bad files since the last recorded part
        try:
            self._stream(split, items, start, good, bad, pending)
        except BaseException:  # interrupted: what each target finished stays, the unfinished part goes
            for target in self.targets:
                target.abort()
            raise
        if not good:
            raise self._nothing_converted(split, items, [b for b in bad if b["split"] == split])
        entry: dict[str, Any] = {"count": len(good), "labeled": labeled}
        if labeled:
            per_class = dict.fromkeys(classes, 0)
            for k in good:
                per_class[classes[items[k].label]] += 1
            entry["per_class"] = per_class
        for target in self.targets:
            entry.update(target.end_split(split, [items[k] for k in good], len(items), pending))
        return entry

    def _stream(
        self, split: str, items: Sequence[Item], start: int, good: list[int], bad: list[dict], pending: list[dict]
    ) -> None:
        """Items `start`.. one at a time: check, encode once (when a target wants the bytes), hand to every
        target."""
        encodes = any(t.encodes for t in self.targets)
        for k in tqdm(range(start, len(items)), desc=f"convert {split}", unit="img", initial=start, total=len(items)):
            it = items[k]
            try:
                data = self.encode(it) if encodes else None
                if data is None:
                    self.open_checked(it)
            except Exception as e:  # noqa: BLE001 - any decoder failure is a bad file to list
                pending.append(self._bad(split, it, e))
                bad.append(pending[-1])
                continue
            good.append(k)
            for target in self.targets:
                target.add(split, k, it, data, pending)

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
        for target in self.targets:
            target.check(dict(splits), unlabeled)
        with pixel_limit(self.max_side):
            for target in self.targets:
                target.prepare(dict(splits))
            for split, items in splits.items():
                manifest["splits"][split] = self.convert_split(
                    split, items, classes, split not in unlabeled, manifest["bad_files"]
                )
        reasons = [b["reason"] for b in manifest["bad_files"]]
        manifest["bad_counts"] = {r: reasons.count(r) for r in ("too_large", "undecodable")}
        atomic.write_json(self.out / MANIFEST, manifest, indent=2, newline=False)
        self.progress_path.unlink(missing_ok=True)
        return manifest
