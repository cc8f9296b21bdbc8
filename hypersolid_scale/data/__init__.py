"""Data: multi-crop presets, loaders (in-memory, PIL, WebDataset, FFCV), evaluation datasets.

The trainer uses four functions:
    build_train_loader(cfg, rank=, world_size=, seed=, device=)  -> iterable of (views, labels)
    build_eval_datasets(cfg)                                       -> (train_ds, test_ds)
    num_classes(cfg), in_channels(cfg)

Each storage format (data.format) is a module of `hypersolid_scale.data.formats` that registers how it
builds these; this module only validates, resolves the preset and dispatches. Importing it loads neither
torch nor any format's reader (the converter runs without them).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from hypersolid_scale.data import formats
from hypersolid_scale.data.augment.presets import PRESETS, MultiCropPreset, resolve_preset
from hypersolid_scale.data.batch import BatchPlan, plan_batch
from hypersolid_scale.data.config import DataConfig
from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hypersolid_scale.data.loading.protocol import TrainLoader

__all__ = [
    "BatchPlan",
    "DataConfig",
    "MultiCropPreset",
    "PRESETS",
    "plan_batch",
    "build_train_loader",
    "build_eval_datasets",
    "num_classes",
    "in_channels",
    "resolve_preset",
]


def build_train_loader(
    cfg: DataConfig, *, rank: int, world_size: int, seed: int, device: torch.device, rank_batch: int | None = None
) -> TrainLoader:
    """Iterable over `(views, labels)` batches; views = [global_0, global_1, local_0, ...] (B, C, H, W).

    ``rank_batch``: the images this rank reads per optimizer step (``BatchPlan.rank_batch``: its share of
    the global batch, all its micro-batches); default: the config's batch split over ``world_size``.
    """
    cfg.validate()
    if rank_batch is None:
        rank_batch = plan_batch(cfg, world_size=world_size).rank_batch
    # The formats read one number: the rows of each batch they yield.
    cfg = dataclasses.replace(cfg, batch_size_per_gpu=rank_batch, global_batch_size=None)
    preset = resolve_preset(cfg)
    return formats.get(cfg.format).train_loader(
        cfg, preset, rank=rank, world_size=world_size, seed=int(seed) + int(cfg.seed_offset), device=device
    )


def holdout_split(ds: Dataset, fraction: float) -> tuple[Dataset, Dataset]:
    """Deterministic train/held-out split by index (seed 0), for datasets without a test split."""
    from torch.utils.data import Subset

    n = len(ds)  # type: ignore[arg-type]
    order = np.random.default_rng(0).permutation(n)
    k = max(1, int(round(n * fraction)))
    return Subset(ds, sorted(order[k:].tolist())), Subset(ds, sorted(order[:k].tolist()))


def build_eval_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """(train_ds, test_ds) of (image (C, H, W) float normalised, int label) with the preset's eval transform."""
    cfg.validate()
    preset = resolve_preset(cfg)
    fmt = formats.get(cfg.format)
    train = fmt.eval_dataset(cfg, preset, "train")
    if cfg.eval_split == "holdout":
        return holdout_split(train, cfg.holdout_fraction)
    return train, fmt.eval_dataset(cfg, preset, "test")


def num_classes(cfg: DataConfig) -> int:
    if cfg.num_classes is not None:
        return int(cfg.num_classes)
    found = formats.get(cfg.format).num_classes(cfg)
    if found is None:
        raise ConfigError(
            f"cannot tell the number of classes of data.path={cfg.path!r}: no manifest.json "
            "found next to it; set data.num_classes"
        )
    return found


def in_channels(cfg: DataConfig) -> int:
    return resolve_preset(cfg).channels
