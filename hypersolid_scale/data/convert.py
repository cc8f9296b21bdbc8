"""Convert images to WebDataset shards, an FFCV .beton and/or an image folder, with a manifest.

    python -m hypersolid_scale.data.convert --folder PHOTOS/ --out data/photos --formats webdataset,ffcv
    python -m hypersolid_scale.data.convert --builtin fashion_mnist --out data/fmnist
    python -m hypersolid_scale.data.convert --torchvision CIFAR10 --root ~/cifar --out data/cifar10

Output: OUT/<split>/shard-000000.tar ..., OUT/<split>.beton, OUT/folder/<split>/<class>/*.png,
OUT/manifest.json (classes, counts per class, shards with sha256, bad files). Every file is written to
a temporary name and renamed when complete; OUT/.progress.json records finished shards so that
`--resume` continues an interrupted run. An existing complete output is never touched: the command
refuses (exit 2) unless --resume (then it checks and does nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image
from tqdm import tqdm

from hypersolid_scale.data.builtin import BUILTIN_DATASETS, load_builtin
from hypersolid_scale.data.common import MANIFEST

FORMATS = ("webdataset", "ffcv", "folder")
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


@dataclass
class Item:
    """One source image: `load()` -> PIL image (may raise for a corrupt file)."""

    name: str
    label: int
    load: Callable[[], Image.Image]


def _open_file(path: str) -> Callable[[], Image.Image]:
    def load() -> Image.Image:
        img = Image.open(path)
        img.load()  # force the full decode: a truncated file fails here
        return img
    return load


def _folder_items(root: Path, classes: list[str]) -> list[Item]:
    items = []
    for label, cls in enumerate(classes):
        for f in sorted((root / cls).rglob("*")):
            if f.suffix.lower() in _IMAGE_SUFFIXES:
                items.append(Item(str(f.relative_to(root)), label, _open_file(str(f))))
    return items


def folder_source(path: str) -> tuple[list[str], dict[str, list[Item]]]:
    """root/<class>/* (one split, "train") or root/{train,test}/<class>/*."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"--folder {path!r} is not a directory")
    split_roots = {s: root / s for s in ("train", "test") if (root / s).is_dir()} or {"train": root}
    classes = sorted(d.name for d in split_roots["train"].iterdir() if d.is_dir())
    if not classes:
        raise ValueError(f"--folder {path!r} has no class subfolders (expected {path}/<class>/<image>)")
    return classes, {s: _folder_items(r, classes) for s, r in split_roots.items()}


def _array_items(images: np.ndarray, labels: np.ndarray, prefix: str) -> list[Item]:
    return [Item(f"{prefix}_{i:07d}", int(labels[i]), (lambda a=images[i]: Image.fromarray(a)))
            for i in range(len(labels))]


def builtin_source(name: str, path: Optional[str]) -> tuple[list[str], dict[str, list[Item]]]:
    splits = {s: load_builtin(name, s, path) for s in ("train", "test")}
    return list(splits["train"].classes), {s: _array_items(d.images, d.labels, s) for s, d in splits.items()}


def torchvision_source(name: str, root: str) -> tuple[list[str], dict[str, list[Item]]]:
    import torchvision.datasets as tvd

    cls = getattr(tvd, name, None)
    if cls is None:
        raise ValueError(f"--torchvision {name!r} is not a torchvision.datasets class (e.g. CIFAR10, FashionMNIST)")
    out: dict[str, list[Item]] = {}
    classes: list[str] = []
    for split in ("train", "test"):
        try:
            ds = cls(root, train=(split == "train"), download=False)
        except TypeError:
            ds = cls(root, split=split, download=False)
        classes = list(getattr(ds, "classes", classes)) or [str(i) for i in range(10)]
        out[split] = [Item(f"{split}_{i:07d}", int(ds[i][1]), (lambda i=i, ds=ds: ds[i][0])) for i in range(len(ds))]
    return classes, out


def _prepare(img: Image.Image, mode: str, resize: Optional[int]) -> Image.Image:
    if mode != "keep":
        img = img.convert(mode)
    elif img.mode not in ("L", "RGB"):
        img = img.convert("RGB")
    if resize:
        img = img.resize((resize, resize), Image.BICUBIC)
    return img


def _encode(img: Image.Image, fmt: str, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG" if fmt == "jpg" else "PNG", **({"quality": quality} if fmt == "jpg" else {}))
    return buf.getvalue()


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


class Converter:
    def __init__(self, out: str, *, formats: list[str], shard_size: int, image_format: str, quality: int,
                 mode: str, resize: Optional[int], resume: bool, ffcv_mode: str) -> None:
        self.out = Path(out)
        self.formats, self.shard_size, self.image_format = formats, shard_size, image_format
        self.quality, self.mode, self.resize, self.resume, self.ffcv_mode = quality, mode, resize, resume, ffcv_mode
        self.progress_path = self.out / ".progress.json"
        self.progress: dict[str, Any] = {}

    def check_output(self) -> bool:
        """True when there is nothing to do. Raises SystemExit(2) rather than touch an existing output."""
        if (self.out / MANIFEST).is_file():
            if self.resume:
                print(f"{self.out}/{MANIFEST} exists: conversion already complete, nothing to do")
                return True
            raise SystemExit(f"error: {self.out} already holds a complete conversion ({MANIFEST}); "
                             "choose another --out or delete it")
        if self.out.exists() and any(self.out.iterdir()):
            if not self.resume:
                raise SystemExit(f"error: {self.out} is not empty (an interrupted conversion?); pass --resume "
                                 "to continue it or choose another --out")
            if self.progress_path.is_file():
                self.progress = json.loads(self.progress_path.read_text())
        self.out.mkdir(parents=True, exist_ok=True)
        return False

    def decode_check(self, split: str, items: list[Item], bad: list[dict]) -> list[Item]:
        good = []
        for it in tqdm(items, desc=f"check {split}", unit="img"):
            try:
                it.load()
                good.append(it)
            except Exception as e:  # noqa: BLE001 - any decoder failure is a bad file to list
                bad.append({"split": split, "name": it.name, "error": f"{type(e).__name__}: {e}"})
                print(f"bad image skipped: {it.name}: {type(e).__name__}: {e}", file=sys.stderr)
        return good

    def write_shards(self, split: str, items: list[Item]) -> list[dict]:
        d = self.out / split
        d.mkdir(exist_ok=True)
        done: list[dict] = self.progress.setdefault(split, [])
        # Keep the intact prefix of recorded shards; from the first missing or changed one on, rewrite.
        intact = 0
        while intact < len(done) and (d / done[intact]["name"]).is_file() and \
                sha256(d / done[intact]["name"]) == done[intact]["sha256"]:
            intact += 1
        del done[intact:]
        start = len(done) * self.shard_size
        ext = "jpg" if self.image_format == "jpg" else "png"
        bar = tqdm(total=len(items), initial=start, desc=f"shards {split}", unit="img")
        for k in range(len(done), (len(items) + self.shard_size - 1) // self.shard_size):
            name = f"shard-{k:06d}.tar"
            tmp = d / (name + ".tmp")
            chunk = items[k * self.shard_size:(k + 1) * self.shard_size]
            with tarfile.open(tmp, "w") as tar:
                for it in chunk:
                    # No dots in keys: WebDataset splits "<key>.<ext>" at the first dot.
                    key = f"{Path(it.name).stem.replace('.', '_')}_{hash_name(it.name)}"
                    payload = {ext: _encode(_prepare(it.load(), self.mode, self.resize), ext, self.quality),
                               "cls": str(it.label).encode()}
                    for e, data in payload.items():
                        info = tarfile.TarInfo(f"{key}.{e}")
                        info.size, info.mtime, info.mode = len(data), 0, 0o644
                        tar.addfile(info, io.BytesIO(data))
                    bar.update(1)
            os.replace(tmp, d / name)
            done.append({"name": name, "count": len(chunk), "sha256": sha256(d / name)})
            _atomic_json(self.progress_path, self.progress)
        bar.close()
        return done

    def write_folder(self, split: str, items: list[Item], classes: list[str]) -> None:
        for it in tqdm(items, desc=f"folder {split}", unit="img"):
            ext = "jpg" if self.image_format == "jpg" else "png"
            dest = self.out / "folder" / split / folder_class_name(it.label, classes) / \
                f"{Path(it.name).stem}_{hash_name(it.name)}.{ext}"
            if dest.is_file():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".tmp")
            tmp.write_bytes(_encode(_prepare(it.load(), self.mode, self.resize), ext, self.quality))
            os.replace(tmp, dest)

    def write_beton(self, split: str, items: list[Item]) -> dict:
        from hypersolid_scale.data.ffcv import write_beton

        dest = self.out / f"{split}.beton"
        rgb = [lambda it=it: np.asarray(_prepare(it.load(), "RGB", self.resize)) for it in items]
        # FFCV allocates whole pages per writer chunk: small pages keep small-image files small.
        side = self.resize or max(np.asarray(items[0].load()).shape[:2]) if items else 0
        page_size = 1 << 21 if side <= 512 else 1 << 23
        write_beton(str(dest), rgb, [it.label for it in items], write_mode=self.ffcv_mode,
                    jpeg_quality=self.quality, page_size=page_size)
        return {"name": dest.name, "count": len(items), "sha256": sha256(dest), "bytes": dest.stat().st_size}

    def run(self, classes: list[str], splits: dict[str, list[Item]], source: str) -> dict:
        manifest: dict[str, Any] = {"format_version": 1, "source": source, "classes": classes,
                                    "num_classes": len(classes), "formats": self.formats, "splits": {},
                                    "bad_files": []}
        for split, items in splits.items():
            good = self.decode_check(split, items, manifest["bad_files"])
            per_class = {c: 0 for c in classes}
            for it in good:
                per_class[classes[it.label]] += 1
            entry: dict[str, Any] = {"count": len(good), "per_class": per_class}
            if "webdataset" in self.formats:
                entry["shards"] = self.write_shards(split, good)
            if "folder" in self.formats:
                self.write_folder(split, good, classes)
            if "ffcv" in self.formats:
                entry["beton"] = self.write_beton(split, good)
            manifest["splits"][split] = entry
        _atomic_json(self.out / MANIFEST, manifest)
        self.progress_path.unlink(missing_ok=True)
        return manifest


def folder_class_name(label: int, classes: list[str]) -> str:
    """Class directory: the label number first, so that sorted directories keep the label order
    (what ImageFolder assumes), and no path separators ("T-shirt/top")."""
    width = len(str(len(classes) - 1))
    return f"{label:0{width}d}_" + "".join(c if c.isalnum() or c in "-_" else "_" for c in classes[label])


def hash_name(name: str) -> str:
    """Short stable id of a source name, so keys stay unique when file stems repeat across classes."""
    return hashlib.sha1(name.encode()).hexdigest()[:8]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hypersolid_scale.data.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--folder", help="image folder: ROOT/<class>/* or ROOT/{train,test}/<class>/*")
    src.add_argument("--builtin", choices=BUILTIN_DATASETS, help="a built-in dataset")
    src.add_argument("--torchvision", help="torchvision.datasets class name (already downloaded to --root)")
    p.add_argument("--root", help="dataset root for --torchvision; idx directory for --builtin fashion_mnist")
    p.add_argument("--out", required=True)
    p.add_argument("--formats", default="webdataset,ffcv", help=f"comma list of {FORMATS}")
    p.add_argument("--shard-size", type=int, default=5000, help="samples per tar shard")
    p.add_argument("--image-format", choices=("png", "jpg"), default="png")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    p.add_argument("--mode", choices=("keep", "RGB", "L"), default="keep", help="color mode of stored images")
    p.add_argument("--resize", type=int, default=None, help="resize every image to N x N (e.g. 224)")
    p.add_argument("--ffcv-mode", choices=("raw", "jpg", "smart"), default="raw", help="FFCV image storage")
    p.add_argument("--resume", action="store_true", help="continue an interrupted conversion into --out")
    p.add_argument("--limit", type=int, default=None, help="keep the first N images of each split (quick tries)")
    args = p.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        p.error(f"--formats: {bad or formats} not in {FORMATS}")
    if args.shard_size < 1:
        p.error("--shard-size must be >= 1")
    conv = Converter(args.out, formats=formats, shard_size=args.shard_size, image_format=args.image_format,
                     quality=args.quality, mode=args.mode, resize=args.resize, resume=args.resume,
                     ffcv_mode=args.ffcv_mode)
    if args.folder:
        classes, splits = folder_source(args.folder)
        source = f"folder:{args.folder}"
    elif args.builtin:
        classes, splits = builtin_source(args.builtin, args.root)
        source = f"builtin:{args.builtin}"
    else:
        if not args.root:
            p.error("--torchvision needs --root")
        classes, splits = torchvision_source(args.torchvision, args.root)
        source = f"torchvision:{args.torchvision}:{args.root}"
    if conv.check_output():
        return 0
    if args.limit is not None:
        splits = {k: v[:args.limit] for k, v in splits.items()}
    manifest = conv.run(classes, splits, source)
    counts = {s: e["count"] for s, e in manifest["splits"].items()}
    print(f"wrote {args.out}: {counts} samples, {len(manifest['bad_files'])} bad files skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
