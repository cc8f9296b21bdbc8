"""Data: multi-crop presets, loaders (in-memory, PIL, WebDataset, FFCV), evaluation datasets.

The trainer uses four functions:
    build_train_loader(cfg, rank=, world_size=, seed=, device=)  -> iterable of (views, labels)
    build_eval_datasets(cfg)                                       -> (train_ds, test_ds)
    num_classes(cfg), in_channels(cfg)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from hypersolid_scale.data.builtin import BUILTIN_DATASETS, load_builtin
from hypersolid_scale.data.common import find_manifest
from hypersolid_scale.data.config import DataConfig
from hypersolid_scale.data.loaders import ArrayPILDataset, InMemoryMultiCropLoader, MapStyleMultiCropLoader
from hypersolid_scale.data.presets import PRESETS, MultiCropPreset, resolve_preset
from hypersolid_scale.data.transforms import build_eval_transform, build_pil_multicrop, pil_mode

__all__ = ["DataConfig", "MultiCropPreset", "PRESETS", "build_train_loader", "build_eval_datasets",
           "num_classes", "in_channels", "resolve_preset"]


def _split_dir(path: str, split: str, dataset: str) -> str:
    """`<root>/<split>` (`<root>/<split>.beton` for FFCV) when `path` is a conversion output root,
    else `path` itself."""
    p = Path(path)
    if dataset == "ffcv":
        return str(p / f"{split}.beton") if (p / f"{split}.beton").is_file() else path
    if dataset == "imagefolder" and (p / "folder" / split).is_dir():
        return str(p / "folder" / split)
    if (p / split).is_dir():
        return str(p / split)
    return path


def _test_path(cfg: DataConfig) -> str:
    if cfg.test_path:
        return cfg.test_path
    assert cfg.path is not None
    p = Path(cfg.path)
    name = "test.beton" if cfg.dataset == "ffcv" else "test"
    for cand in (Path(_split_dir(cfg.path, "test", cfg.dataset)), p.parent / name):
        if cand.exists() and cand.resolve() != p.resolve():
            return str(cand)
    raise ValueError(f"no held-out split found next to data.path={cfg.path!r}: set data.test_path, or "
                     "data.eval_split=holdout to carve one out of the training data")


def _imagefolder(root: str, mode: str, transform: Any) -> Dataset:
    from PIL import Image
    from torchvision.datasets import ImageFolder

    if not Path(root).is_dir():
        raise FileNotFoundError(f"image folder {root!r} does not exist (expected one subfolder per class)")
    return ImageFolder(root, transform=transform, loader=lambda f: Image.open(f).convert(mode))


def build_train_loader(cfg: DataConfig, *, rank: int, world_size: int, seed: int, device: torch.device,
                       epoch_length: Optional[int] = None) -> Any:
    """Iterable over `(views, labels)` batches; views = [global_0, global_1, local_0, ...] (B, C, H, W).

    `epoch_length`: optional cap on batches per epoch (quick runs); identical on every rank.
    """
    cfg.validate()
    preset = resolve_preset(cfg)
    seed = int(seed) + int(cfg.seed_offset)
    train_path = _split_dir(cfg.path, "train", cfg.dataset) if cfg.path else None
    common = dict(rank=rank, world_size=world_size, seed=seed, batch_size=cfg.batch_size_per_gpu)
    if cfg.dataset in BUILTIN_DATASETS:
        split = load_builtin(cfg.dataset, "train", cfg.path)
        if cfg.augment in ("auto", "tensor"):
            loader: Any = InMemoryMultiCropLoader(split, preset, max_samples=cfg.max_train_samples, **common)
        else:
            ds = ArrayPILDataset(split, pil_mode(preset), build_pil_multicrop(preset))
            loader = MapStyleMultiCropLoader(ds, num_workers=cfg.num_workers, max_samples=cfg.max_train_samples,
                                             **common)
    elif cfg.dataset == "imagefolder":
        ds = _imagefolder(train_path, pil_mode(preset), build_pil_multicrop(preset))  # type: ignore[arg-type]
        loader = MapStyleMultiCropLoader(ds, num_workers=cfg.num_workers, max_samples=cfg.max_train_samples,
                                         **common)
    elif cfg.dataset == "webdataset":
        from hypersolid_scale.data.webdataset import WebDatasetLoader

        loader = WebDatasetLoader(train_path, preset, num_workers=cfg.num_workers,  # type: ignore[arg-type]
                                  shuffle_buffer=cfg.shuffle_buffer, num_samples=cfg.max_train_samples,
                                  manifest=cfg.manifest, verify_shards=cfg.verify_shards,
                                  max_lost_fraction=cfg.max_lost_fraction, **common)
    else:  # ffcv (validated above)
        from hypersolid_scale.data.ffcv import FFCVLoader

        loader = FFCVLoader(train_path, preset, device=device, num_workers=cfg.num_workers,  # type: ignore[arg-type]
                            order=cfg.ffcv_order, os_cache=cfg.ffcv_os_cache,
                            batches_ahead=cfg.ffcv_batches_ahead, **common)
    if epoch_length is not None:
        loader.limit_batches(int(epoch_length))
    return loader


class _Holdout:
    """Deterministic train/held-out split by index (seed 0), for datasets without a test split."""

    @staticmethod
    def split(ds: Dataset, fraction: float) -> tuple[Dataset, Dataset]:
        n = len(ds)  # type: ignore[arg-type]
        order = np.random.default_rng(0).permutation(n)
        k = max(1, int(round(n * fraction)))
        return Subset(ds, sorted(order[k:].tolist())), Subset(ds, sorted(order[:k].tolist()))


def build_eval_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """(train_ds, test_ds) of (image (C, H, W) float normalised, int label) with the preset's eval transform."""
    cfg.validate()
    preset = resolve_preset(cfg)
    if cfg.dataset in BUILTIN_DATASETS:
        from hypersolid_scale.data.eval_datasets import ArrayEvalDataset

        train = ArrayEvalDataset(load_builtin(cfg.dataset, "train", cfg.path), preset)
        if cfg.eval_split == "holdout":
            return _Holdout.split(train, cfg.holdout_fraction)
        return train, ArrayEvalDataset(load_builtin(cfg.dataset, "test", cfg.path), preset)

    def make(path: str) -> Dataset:
        tf = build_eval_transform(preset)
        if cfg.dataset == "imagefolder":
            return _imagefolder(path, pil_mode(preset), tf)
        if cfg.dataset == "webdataset":
            from hypersolid_scale.data.webdataset import ShardIndexDataset

            return ShardIndexDataset(path, mode=pil_mode(preset), transform=tf, manifest=cfg.manifest,
                                     verify=cfg.verify_shards)
        from hypersolid_scale.data.ffcv import ffcv_eval_dataset

        return ffcv_eval_dataset(path, preset)

    train = make(_split_dir(cfg.path, "train", cfg.dataset))  # type: ignore[arg-type]
    if cfg.eval_split == "holdout":
        return _Holdout.split(train, cfg.holdout_fraction)
    return train, make(_test_path(cfg))


def num_classes(cfg: DataConfig) -> int:
    if cfg.num_classes is not None:
        return int(cfg.num_classes)
    if cfg.dataset in BUILTIN_DATASETS:
        return 10
    if cfg.dataset == "webdataset" and cfg.manifest:
        from hypersolid_scale.data.shards import Manifest

        manifest: Optional[dict] = Manifest.load(cfg.manifest).data
    else:
        manifest = find_manifest(cfg.path)
    if manifest is not None and "num_classes" in manifest:
        return int(manifest["num_classes"])
    if cfg.dataset == "imagefolder" and cfg.path:
        root = Path(_split_dir(cfg.path, "train", cfg.dataset))
        return sum(1 for d in root.iterdir() if d.is_dir())
    raise ValueError(f"cannot tell the number of classes of data.path={cfg.path!r}: no {'manifest.json'} "
                     "found next to it; set data.num_classes")


def in_channels(cfg: DataConfig) -> int:
    return resolve_preset(cfg).channels
