"""Built-in real datasets held in memory as uint8 arrays: Fashion-MNIST (idx files) and sklearn digits."""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BUILTIN_DATASETS = ("fashion_mnist", "digits")
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_HOW_TO_GET = (
    "Install Debian's package (apt-get install dataset-fashion-mnist, files in /usr/share/datasets/fashion-mnist), "
    "or download with torchvision (python -c \"import torchvision; torchvision.datasets.FashionMNIST('DIR', "
    'download=True)") and set data.path=DIR'
)


@dataclass
class ArraySplit:
    """images: (N, H, W) or (N, H, W, 3) uint8; labels: (N,) int64."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (optionally .gz): magic (0, 0, dtype, ndim), big-endian dims, then the data."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte idx file (bad magic {data[:4]!r})")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    expected = int(np.prod(dims))
    payload = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if payload.size != expected:
        raise ValueError(f"{path} is truncated: header says {dims} ({expected} bytes), found {payload.size}")
    return payload.reshape(dims).copy()  # writable, so torch.from_numpy shares it without a warning


def _find(directory: Path, stem: str) -> Path | None:
    # Debian ships *.gz; torchvision keeps both in <root>/FashionMNIST/raw/.
    for sub in (directory, directory / "FashionMNIST" / "raw", directory / "raw"):
        for name in (stem, stem + ".gz"):
            if (sub / name).is_file():
                return sub / name
    return None


def fashion_mnist_dir(path: str | None = None) -> Path:
    """The directory holding the idx files: `path` if given, else Debian's install location."""
    candidates = [Path(path)] if path else [Path(d) for d in FASHION_MNIST_DIRS]
    for d in candidates:
        if all(_find(d, stem) for pair in _FILES.values() for stem in pair):
            return d
    where = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"Fashion-MNIST idx files not found in {where}. {_HOW_TO_GET}")


def load_fashion_mnist(split: str, path: str | None = None) -> ArraySplit:
    if split not in _FILES:
        raise ValueError(f"split={split!r} is not one of {tuple(_FILES)}")
    d = fashion_mnist_dir(path)
    img_stem, lbl_stem = _FILES[split]
    images = read_idx(_find(d, img_stem))  # type: ignore[arg-type]
    labels = read_idx(_find(d, lbl_stem)).astype(np.int64)  # type: ignore[arg-type]
    if images.ndim != 3 or len(images) != len(labels):
        raise ValueError(f"Fashion-MNIST {split} in {d}: {images.shape} images vs {labels.shape} labels")
    return ArraySplit(images, labels, FASHION_MNIST_CLASSES)


def load_digits(split: str, test_fraction: float = 0.2) -> ArraySplit:
    """sklearn's 8x8 digits (values 0..16) scaled to uint8; a fixed, stratified train/test split."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    if split not in _FILES:
        raise ValueError(f"split={split!r} is not one of {tuple(_FILES)}")
    d = sk_load_digits()
    images = np.clip(np.round(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    labels = d.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, random_state=0, stratify=labels
    )
    idx = idx_train if split == "train" else idx_test
    return ArraySplit(images[idx], labels[idx], tuple(str(i) for i in range(10)))


def load_builtin(name: str, split: str, path: str | None = None) -> ArraySplit:
    if name == "fashion_mnist":
        return load_fashion_mnist(split, path)
    if name == "digits":
        return load_digits(split)
    raise ValueError(f"builtin dataset {name!r} is not one of {BUILTIN_DATASETS}")
