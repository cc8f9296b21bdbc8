"""Training loaders over random-access data: in-memory arrays (batched tensor multi-crop) and map-style
datasets of PIL images (lightly's DINOTransform per sample, in DataLoader workers)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from hypersolid_scale.data.augment.presets import MultiCropPreset
from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop
from hypersolid_scale.data.augment.transforms import seeded_global_rngs
from hypersolid_scale.data.device.views import DeviceStage, collate_host
from hypersolid_scale.data.loading.builtin_sets import ArraySplit
from hypersolid_scale.data.loading.common import ResumableEpochs, batches_per_epoch, mix_seed, rank_indices
from hypersolid_scale.data.loading.run_stream import RunStream

Batch = tuple[list[torch.Tensor], torch.Tensor]


def array_to_tensor(images: np.ndarray) -> torch.Tensor:
    """(N, H, W) or (N, H, W, C) uint8 -> (N, C, H, W) uint8 tensor."""
    t = torch.from_numpy(np.ascontiguousarray(images))
    return t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2).contiguous()


class ArrayPILDataset(Dataset):
    """An ArraySplit as (PIL image, label) pairs, optionally through a transform."""

    def __init__(self, split: ArraySplit, mode: str, transform: Callable | None = None) -> None:
        self.split, self.mode, self.transform = split, mode, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        img = Image.fromarray(self.split.images[i]).convert(self.mode)
        return (self.transform(img) if self.transform else img), int(self.split.labels[i])


class InMemoryMultiCropLoader(ResumableEpochs):
    """Batches of multi-crop views from uint8 images in memory, augmented a whole batch at a time.

    World-size invariant (docs/design.md §3b): rank r's batch t = rows [r*b, (r+1)*b) of global batch t of the
    (seed, epoch) permutation, and every augmentation draw is keyed by (seed, epoch, sample index, view);
    so the ranks' batches t, concatenated, are bit for bit the batch t of one process with batch P*b, and
    a resumed run produces the very same views as an uninterrupted one.
    """

    def __init__(
        self,
        split: ArraySplit,
        preset: MultiCropPreset,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        max_samples: int | None = None,
    ) -> None:
        super().__init__()
        n = len(split) if max_samples is None else min(len(split), max_samples)
        self.images = array_to_tensor(split.images[:n])
        self.labels = torch.from_numpy(split.labels[:n]).long()
        if self.images.shape[1] != preset.channels:
            raise ValueError(
                f"images have {self.images.shape[1]} channels but preset {preset.name!r} expects "
                f"{preset.channels}; pick a matching data.preset"
            )
        self.preset, self.rank, self.world_size, self.seed, self.batch_size = preset, rank, world_size, seed, batch_size
        self.multicrop = TensorMultiCrop(preset, "cpu", seed)
        self._len = batches_per_epoch(n, world_size, batch_size)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Batch]:
        start = self._begin()
        idx = torch.from_numpy(
            rank_indices(
                len(self.labels),
                rank=self.rank,
                world_size=self.world_size,
                batch_size=self.batch_size,
                seed=self.seed,
                epoch=self.epoch,
            )
        )
        for b in range(start, self._len):
            bi = idx[b * self.batch_size : (b + 1) * self.batch_size]
            views = self.multicrop(self.images[bi], bi, self.epoch)
            self._count()
            yield views, self.labels[bi]
        self._skip = 0


def _seed_worker(worker_id: int) -> None:
    # (WebDataset loader) lightly's transforms draw from numpy and torchvision's from torch: seed both
    # from the per-worker torch seed, which the DataLoader derives from its seeded generator.
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


class KeyedSamples(Dataset):
    """Item ``(epoch, i)``: item `i` of `dataset`, fetched with the global RNGs seeded by (seed, epoch, i).

    lightly's and torchvision's transforms draw from Python's `random`, numpy's and torch's global
    generators; seeding all three per sample (and restoring them afterwards) makes a sample's views a
    function of (seed, epoch, index) only, whichever process or DataLoader worker computes it, and whichever
    epoch the worker's previous item belonged to (one worker pool serves the run: run_stream.py).
    """

    def __init__(self, dataset: Dataset, *, seed: int) -> None:
        self.dataset, self.seed = dataset, int(seed)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, i = key
        with seeded_global_rngs(self.seed, epoch, i):
            return self.dataset[i]


class _RankOrder(Sampler[tuple[int, int]]):
    """``(epoch, index)`` of this rank's samples, batch after batch, from (epoch, batch `start`) on, epoch after
    epoch without end: each epoch's order is `rank_indices` of (seed, epoch), whatever epoch the stream began in."""

    def __init__(
        self,
        num_samples: int,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int,
        batches: int,
        epoch: int,
        start: int,
    ) -> None:
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size
        self.batch_size, self.seed, self.batches, self.epoch, self.start = batch_size, seed, batches, epoch, start

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, start, b = self.epoch, self.start, self.batch_size
        while True:
            idx = rank_indices(
                self.num_samples, rank=self.rank, world_size=self.world_size, batch_size=b, seed=self.seed, epoch=epoch
            )
            for i in idx[start * b : self.batches * b].tolist():
                yield epoch, i
            epoch, start = epoch + 1, 0


class MapStyleMultiCropLoader(ResumableEpochs):
    """A map-style dataset of (views, label) samples (PIL multi-crop inside), split by rank, in workers.

    World-size and worker-count invariant (docs/design.md §3b): the sample set and order of a batch follow
    `rank_indices`, and each sample's transform runs with the RNGs seeded by (seed, epoch, index)
    (`KeyedSamples`), so neither the rank, the world size nor the number of workers changes a view. One
    DataLoader (one worker pool, one stage thread) serves the run (run_stream.py): its sampler runs on into the
    next epoch, so the workers prepare that epoch's first batches while the current one ends.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        num_workers: int,
        max_samples: int | None = None,
        device_stage: DeviceStage | None = None,
    ) -> None:
        """device_stage: turns what the workers collated (`collate_host`) into the views, in this process and
        ahead of the step (data.views_on=device, data/device/views.py; on CUDA the workers' tensors are pinned
        for async copies); the dataset's items are then its `HostStage`'s."""
        super().__init__()
        self.dataset = dataset
        self.device_stage = device_stage
        self.collate_fn = collate_host if device_stage is not None else None
        self.pin_memory = device_stage is not None and device_stage.device.type == "cuda"
        n = len(dataset)  # type: ignore[arg-type]
        self.num_samples = n if max_samples is None else min(n, max_samples)
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.batch_size, self.num_workers = batch_size, num_workers
        self._len = batches_per_epoch(self.num_samples, world_size, batch_size)
        self._stream = RunStream(self._open)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Batch]:
        start = self._begin()
        for views, labels in self._stream.epoch(self.epoch, start, self._len):
            self._count()
            yield views, labels
        self._skip = 0

    def close(self) -> None:
        """Stop the run's DataLoader workers and stage thread (the next iteration starts new ones)."""
        self._stream.close()

    def _open(self, epoch: int, start: int) -> Iterator[Batch]:
        """Every batch from (epoch, start) on, through one DataLoader and one stage thread."""
        # The generator only seeds the workers' base seed; passing one keeps the DataLoader from
        # drawing it from the trainer's global torch RNG.
        gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
        loader = DataLoader(
            KeyedSamples(self.dataset, seed=self.seed),
            batch_size=self.batch_size,
            sampler=_RankOrder(
                self.num_samples,
                rank=self.rank,
                world_size=self.world_size,
                batch_size=self.batch_size,
                seed=self.seed,
                batches=self._len,
                epoch=epoch,
                start=start,
            ),
            num_workers=self.num_workers,
            generator=gen,
            drop_last=True,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
        )
        batches: Iterator[Any] = iter(loader)
        return _handed_over(batches, None if self.device_stage is None else self.device_stage.ahead(batches))


def _handed_over(batches: Iterator[Any], ahead: Iterator[Any] | None) -> Iterator[Batch]:
    """The workers' `batches`, or the views the device stage made of them `ahead` (data/device/prefetch.py)."""
    try:
        if ahead is None:
            yield from batches
        else:  # the views prepared ahead of the step, across epoch boundaries too
            for views, _, (_, labels) in ahead:
                yield views, labels
    finally:  # the stage thread stops first, then the workers (their iterator is freed with this frame)
        close = getattr(ahead, "close", None)
        if close is not None:
            close()
