"""What the converter reads: an image folder, a builtin dataset, a torchvision dataset root, STL-10's binary files.

A source is a list of classes and, per split, a lazy sequence of `Item`s: an item holds a name, a label and
how to open its image, never the pixels, so listing a million files holds a million names, not images.
`Item.load()` returns the image opened but, for files, not yet decoded: the converter reads the size from
the header first and decodes only images it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
from PIL import Image

from hypersolid_scale.data.loading.builtin_sets import load_builtin
from hypersolid_scale.safety.errors import ConfigError, DataError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
UNLABELED = -1  # the label of an image of a split without labels


@dataclass
class Item:
    """One source image: `load()` -> PIL image (may raise for a corrupt file)."""

    name: str
    label: int
    load: Callable[[], Image.Image]


class ItemList(Sequence[Item]):
    """`n` items made on demand by `make(i)`; slicing gives another lazy list."""

    def __init__(self, n: int, make: Callable[[int], Item]) -> None:
        self.n, self.make = n, make

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> Item: ...

    @overload
    def __getitem__(self, i: slice) -> ItemList: ...

    def __getitem__(self, i: int | slice) -> Item | ItemList:
        if isinstance(i, slice):
            r = range(self.n)[i]
            return ItemList(len(r), lambda k: self.make(r[k]))
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.make(i % self.n)

    def __iter__(self) -> Iterator[Item]:
        return (self.make(i) for i in range(self.n))


@dataclass
class Source:
    classes: list[str]
    splits: dict[str, Sequence[Item]]
    description: str
    unlabeled: set[str] = field(default_factory=set)  # splits whose images have no class


def _open_file(path: str) -> Callable[[], Image.Image]:
    def load() -> Image.Image:
        # Header only: the converter checks the sides (--max-side) before it decodes, and says so by
        # width x height, so PIL's pixel-count guard, which would refuse first, is off while opening.
        saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            return Image.open(path)
        finally:
            Image.MAX_IMAGE_PIXELS = saved

    return load


def folder_source(path: str) -> Source:
    """root/<class>/* (one split, "train") or root/{train,test}/<class>/*."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"--folder {path!r} is not a directory")
    split_roots = {s: root / s for s in ("train", "test") if (root / s).is_dir()} or {"train": root}
    classes = sorted(d.name for d in split_roots["train"].iterdir() if d.is_dir())
    if not classes:
        raise ConfigError(f"--folder {path!r} has no class subfolders (expected {path}/<class>/<image>)")
    splits: dict[str, Sequence[Item]] = {}
    for split, split_root in split_roots.items():
        names: list[str] = []
        labels: list[int] = []
        for label, cls in enumerate(classes):
            for f in sorted((split_root / cls).rglob("*")):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    names.append(str(f.relative_to(split_root)))
                    labels.append(label)

        def make(i: int, r: Path = split_root, n: list[str] = names, lab: list[int] = labels) -> Item:
            return Item(n[i], lab[i], _open_file(str(r / n[i])))

        splits[split] = ItemList(len(names), make)
    return Source(classes, splits, f"folder:{path}")


def array_items(images: np.ndarray, labels: np.ndarray | None, prefix: str) -> ItemList:
    """(N, H, W[, C]) uint8 images (a memory map is read one image at a time) as items."""

    def make(i: int) -> Item:
        label = UNLABELED if labels is None else int(labels[i])
        return Item(f"{prefix}_{i:07d}", label, lambda: Image.fromarray(np.ascontiguousarray(images[i])))

    return ItemList(len(images), make)


def builtin_source(name: str, path: str | None) -> Source:
    splits = {s: load_builtin(name, s, path) for s in ("train", "test")}
    return Source(
        list(splits["train"].classes),
        {s: array_items(d.images, d.labels, s) for s, d in splits.items()},
        f"builtin:{name}",
    )


# ------------------------------------------------------------------------------------------ STL-10 --
# STL-10's binary release (stl10_binary/, what torchvision downloads): <split>_X.bin holds 96x96 RGB
# images as uint8, each stored channel by channel and column by column (3 x W x H); <split>_y.bin holds
# one byte per image, the class 1..10; the unlabeled split (100,000 images) has no _y.bin.
STL10_SIDE = 96
STL10_SPLITS = ("train", "test", "unlabeled")


def _stl10_dir(root: str) -> Path:
    for d in (Path(root) / "stl10_binary", Path(root)):
        if any((d / f"{s}_X.bin").is_file() for s in STL10_SPLITS):
            return d
    raise DataError(
        f"no STL-10 binary files (train_X.bin, test_X.bin, unlabeled_X.bin) in {root!r} or "
        f"{root}/stl10_binary: download and extract http://ai.stanford.edu/~acoates/stl10/"
        "stl10_binary.tar.gz there"
    )


def stl10_images(path: Path) -> np.ndarray:
    """A memory map of (N, 96, 96, 3) uint8 view of an STL-10 `_X.bin` file (nothing is read yet)."""
    per_image = 3 * STL10_SIDE * STL10_SIDE
    size = path.stat().st_size
    if size == 0 or size % per_image:
        raise DataError(
            f"{path} holds {size} bytes, not a whole number of {per_image}-byte STL-10 images (truncated download?)"
        )
    raw = np.memmap(path, dtype=np.uint8, mode="r", shape=(size // per_image, 3, STL10_SIDE, STL10_SIDE))
    return raw.transpose(0, 3, 2, 1)  # (N, C, W, H) -> (N, H, W, C)


def stl10_source(root: str, splits: Sequence[str]) -> Source:
    """STL-10 read straight from its binary files (memory mapped: the 2.8 GB unlabeled split is read one
    image at a time). The unlabeled split's images get label -1 and the split is marked unlabeled."""
    d = _stl10_dir(root)
    names = d / "class_names.txt"
    classes = names.read_text().split() if names.is_file() else [str(i) for i in range(10)]
    out: dict[str, Sequence[Item]] = {}
    for split in splits:
        if split not in STL10_SPLITS:
            raise ConfigError(f"--split {split!r}: STL-10 has the splits {STL10_SPLITS}")
        x = d / f"{split}_X.bin"
        if not x.is_file():
            raise DataError(f"STL-10 split {split!r}: {x} does not exist")
        images = stl10_images(x)
        labels = None
        if split != "unlabeled":
            y = d / f"{split}_y.bin"
            if not y.is_file():
                raise DataError(f"STL-10 split {split!r}: {y} (its labels) does not exist")
            labels = np.fromfile(y, dtype=np.uint8).astype(np.int64) - 1
            if len(labels) != len(images) or labels.min(initial=0) < 0 or labels.max(initial=0) >= len(classes):
                raise DataError(
                    f"{y} holds {len(labels)} labels in 1..{labels.max(initial=-1) + 1} for "
                    f"{len(images)} images and {len(classes)} classes: the files do not match"
                )
        out[split] = array_items(images, labels, split)
    return Source(classes, out, f"stl10:{d}", unlabeled={"unlabeled"} & set(splits))


def torchvision_source(name: str, root: str, splits: Sequence[str]) -> Source:
    import torchvision.datasets as tvd

    if name.lower() == "stl10":
        return stl10_source(root, splits)
    cls = getattr(tvd, name, None)
    if cls is None:
        raise ConfigError(f"--torchvision {name!r} is not a torchvision.datasets class (e.g. CIFAR10, FashionMNIST)")
    out: dict[str, Sequence[Item]] = {}
    classes: list[str] = []
    for split in splits:
        try:
            if split not in ("train", "test"):
                raise TypeError  # only the split= signature names other splits
            ds = cls(root, train=(split == "train"), download=False)
        except TypeError:
            ds = cls(root, split=split, download=False)
        classes = list(getattr(ds, "classes", classes)) or [str(i) for i in range(10)]
        # The label list, where the class has one, spares decoding an image just for its label.
        targets = getattr(ds, "targets", None)

        def make(i: int, ds: Any = ds, split: str = split, t: Any = targets) -> Item:
            return Item(f"{split}_{i:07d}", int(t[i] if t is not None else ds[i][1]), lambda: ds[i][0])

        out[split] = ItemList(len(ds), make)
    return Source(classes, out, f"torchvision:{name}:{root}")
