"""FFCV: `.beton` files (image + label) -> multi-crop batches on the training device.

One FFCV pipeline per view reads the same `image` field, each with its own RandomResizedCrop decoder at
the view's size and scale, then a horizontal flip, then goes to the device. The photometric part of the
preset (color jitter, grayscale, blur, solarization, normalisation) runs per sample but batched on the
device (`tensor_aug.BatchPhotometric`, kornia kernels), with the preset's probabilities per view.
Under DDP the loader uses FFCV's `distributed=True` ordering (a DistributedSampler over the seeded
permutation): every rank gets the same number of batches.

FFCV stores RGB images only; a one-channel preset keeps the first channel on the device.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from hypersolid_scale.data.common import ResumableEpochs, mix_seed
from hypersolid_scale.data.presets import MultiCropPreset
from hypersolid_scale.data.tensor_aug import BatchPhotometric

try:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.reader import Reader
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToDevice, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter

    FFCV_IMPORT_ERROR: Optional[BaseException] = None
except ImportError as _e:  # the optional extra is not installed
    FFCV_IMPORT_ERROR = _e

_HOW_TO_INSTALL = ("FFCV is not installed: apt-get install pkg-config libopencv-dev libturbojpeg0-dev, then "
                   "pip install numpy cython pkgconfig && pip install --no-build-isolation ffcv")


def require_ffcv() -> None:
    if FFCV_IMPORT_ERROR is not None:
        raise ImportError(f"{_HOW_TO_INSTALL} ({FFCV_IMPORT_ERROR})")


class _ArrayList(torch.utils.data.Dataset):
    def __init__(self, images: Sequence[Callable[[], np.ndarray]], labels: Sequence[int]) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        img = self.images[i]()
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise ValueError(f"FFCV needs (H, W, 3) uint8 images, item {i} is {img.shape} {img.dtype}")
        return img, int(self.labels[i])


def write_beton(path: str, images: Sequence[Callable[[], np.ndarray]], labels: Sequence[int], *,
                write_mode: str = "raw", jpeg_quality: int = 90, num_workers: int = 2,
                page_size: int = 1 << 23) -> None:
    """Write (image, label) pairs to `path` (via a temporary file renamed when complete)."""
    require_ffcv()
    tmp = path + ".tmp"
    writer = DatasetWriter(tmp, {"image": RGBImageField(write_mode=write_mode, jpeg_quality=jpeg_quality),
                                 "label": IntField()}, num_workers=num_workers,
                           page_size=page_size)
    writer.from_indexed_dataset(_ArrayList(images, labels))
    os.replace(tmp, path)


def check_beton(path: str) -> int:
    """Number of samples of a readable .beton; a clear error for a missing, truncated or corrupt file."""
    require_ffcv()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"FFCV file {path!r} does not exist (create it with "
                                "python -m hypersolid_scale.data.convert ... --formats ffcv)")
    size = os.path.getsize(path)
    try:
        reader = Reader(path)
        table = reader.alloc_table
        end = int((table["ptr"] + table["size"]).max()) if len(table) else 0
    except Exception as e:  # noqa: BLE001 - whatever numpy/FFCV raise on a short read
        raise ValueError(f"FFCV file {path!r} is truncated or corrupt ({type(e).__name__}: {e}); "
                         "re-create it with python -m hypersolid_scale.data.convert") from e
    if end > size or reader.num_samples == 0:
        raise ValueError(f"FFCV file {path!r} is truncated: data runs to byte {end} but the file has {size}; "
                         "re-create it with python -m hypersolid_scale.data.convert")
    return int(reader.num_samples)


_ORDERS = {"random": "RANDOM", "quasi_random": "QUASI_RANDOM", "sequential": "SEQUENTIAL"}


class FFCVLoader(ResumableEpochs):
    """Multi-crop batches `(views, labels)` from a .beton; views already on `device`, normalised."""

    def __init__(self, path: str, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int,
                 batch_size: int, device: torch.device, num_workers: int, order: str = "quasi_random",
                 os_cache: bool = False, batches_ahead: int = 3) -> None:
        super().__init__()
        require_ffcv()
        self.num_samples = check_beton(path)
        self.path, self.preset, self.rank, self.world_size, self.seed = path, preset, rank, world_size, seed
        self.device = torch.device(device)
        self.augment = BatchPhotometric(preset, self.device, seed)
        if order == "quasi_random" and world_size > 1:
            # FFCV's QUASI_RANDOM has no distributed mode; RANDOM is exact and rank-aware.
            order = "random"
        label_pipe = [IntDecoder(), ToTensor(), Squeeze(), ToDevice(self.device, non_blocking=True)]
        pipelines: dict[str, Any] = {"image": None, "label": label_pipe}
        self.view_names = []
        for i, (size, scale) in enumerate(zip(preset.view_sizes(), preset.view_scales())):
            name = f"view_{i}"
            self.view_names.append(name)
            pipelines[name] = PipelineSpec(
                "image", decoder=RandomResizedCropRGBImageDecoder((size, size), scale=scale, ratio=(3 / 4, 4 / 3)),
                transforms=[RandomHorizontalFlip(flip_prob=preset.hflip_prob), ToTensor(),
                            ToDevice(self.device, non_blocking=True), ToTorchImage(channels_last=False)])
        # FFCV's Loader sets torch's intra-op threads to its worker count; keep the trainer's setting.
        threads = torch.get_num_threads()
        self.loader = Loader(path, batch_size=batch_size, num_workers=max(1, num_workers), os_cache=os_cache,
                             order=getattr(OrderOption, _ORDERS[order]), distributed=world_size > 1,
                             seed=seed % (2**31), pipelines=pipelines, drop_last=True,
                             batches_ahead=batches_ahead)
        torch.set_num_threads(threads)
        self._len = len(self.loader)
        self._out_names = list(self.loader.pipeline_specs.keys())

    def __len__(self) -> int:
        return self._len

    def raw_batches(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        """Batches after FFCV (crop + flip, uint8 (B, 3, H, W) on the device), before photometric."""
        self.loader.next_epoch = self.epoch
        threads = torch.get_num_threads()
        epoch_iter = iter(self.loader)  # FFCV resets torch's thread count here too
        torch.set_num_threads(threads)
        for n, out in enumerate(epoch_iter):
            if n >= self._len:
                break
            named = dict(zip(self._out_names, out))
            yield [named[v] for v in self.view_names], named["label"].long()

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        start = self._begin()
        for b, (views, labels) in enumerate(self.raw_batches()):
            if b < start:  # restored position: FFCV cannot seek, so the skipped batches are decoded
                continue
            self.augment.reseed(mix_seed(self.seed, self.epoch, self.rank, b))
            if self.preset.channels == 1:
                views = [v[:, :1] for v in views]
            self._count()
            yield self.augment(views), labels
        self._skip = 0


class TensorLabelDataset(torch.utils.data.Dataset):
    """(image tensor, int label) pairs held in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


def ffcv_eval_dataset(path: str, preset: MultiCropPreset) -> TensorLabelDataset:
    """The whole .beton center-cropped at the eval size, normalised, held in memory (CPU)."""
    require_ffcv()
    check_beton(path)
    size = preset.global_crop_size
    pipelines = {"image": [CenterCropRGBImageDecoder((size, size), ratio=size / preset.eval_resize), ToTensor(),
                           ToTorchImage(channels_last=False)],
                 "label": [IntDecoder(), ToTensor(), Squeeze()]}
    loader = Loader(path, batch_size=512, num_workers=1, order=OrderOption.SEQUENTIAL, pipelines=pipelines,
                    drop_last=False)
    xs, ys = [], []
    for img, label in loader:
        xs.append(img.clone())
        ys.append(label.clone().long().view(-1))
    x = torch.cat(xs).float().div_(255.0)[:, :preset.channels]
    mean = torch.tensor(preset.mean).view(1, -1, 1, 1)
    std = torch.tensor(preset.std).view(1, -1, 1, 1)
    return TensorLabelDataset((x - mean) / std, torch.cat(ys))
