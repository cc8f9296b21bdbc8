"""FFCV: `.beton` files (image + label) -> multi-crop batches on the training device.

One FFCV pipeline per view reads the same `image` field, each with its own random-resized-crop + flip
decoder at the view's size and scale, then goes to the device. The photometric part of the preset
(color jitter, grayscale, blur, solarization, normalisation) runs per sample but batched on the
device (`photometric.BatchPhotometric`), with the preset's probabilities per view.
FFCV stores RGB images only; a one-channel preset keeps the first channel on the device.

What does not depend on the world size, the rank or the number of FFCV threads (docs/design.md §3b):
- The order. FFCV gets an explicit per-rank order (`_EpochOrder`): the epoch's global order depends only
  on (seed, epoch) (`random`: the seeded permutation of `common.epoch_permutation`; `sequential`:
  0..N-1; `quasi_random`: FFCV's page-aware order, seeded by (seed, epoch) and computed for the global
  batch P*b, so it also depends on that global batch size), cut into global batches of P*b; rank r
  takes rows [r*b, (r+1)*b) of each. The ranks' batches t, concatenated, are the global batch t.
- The crop and flip. FFCV's own RandomResizedCrop decoder and RandomHorizontalFlip draw from numba's
  per-thread generators, which FFCV never seeds (os entropy): their draws depend on the thread and on
  what it drew before, so they are not reproducible even between two runs. `KeyedRandomResizedCropFlip`
  (crop.py) re-seeds the decoding thread's generator before each sample from (seed, epoch, sample
  index, view) and then runs FFCV's own crop sampler and resize; the flip is drawn from the same stream.
- The photometric draws: `BatchPhotometric` keyed by (seed, epoch, sample index, view).
So for the same seed and global batch, P ranks with batch b give, concatenated, exactly the views and
labels of one process with batch P*b (same device type; a view is bit-identical); a restored position
(epoch, batches done) resumes with the same views, and FFCV starts directly at the restored batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hypersolid_scale.data.augment.photometric import BatchPhotometric
from hypersolid_scale.data.augment.presets import MultiCropPreset
from hypersolid_scale.data.formats.ffcv.crop import KeyedRandomResizedCropFlip, _SharedKernel
from hypersolid_scale.data.formats.ffcv.options import ORDERS
from hypersolid_scale.data.loading.common import ResumableEpochs, epoch_permutation, mix_seed, split_global_batches

try:
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.reader import Reader
    from ffcv.transforms import Squeeze, ToDevice, ToTensor, ToTorchImage
    from ffcv.traversal_order.base import TraversalOrder
    from ffcv.traversal_order.quasi_random import QuasiRandom, generate_order_inner

    FFCV_IMPORT_ERROR: BaseException | None = None
except ImportError as _e:  # the optional extra is not installed
    FFCV_IMPORT_ERROR = _e
    TraversalOrder = object

_HOW_TO_INSTALL = (
    "FFCV is not installed: apt-get install pkg-config libopencv-dev libturbojpeg0-dev, then "
    "pip install numpy cython pkgconfig && pip install --no-build-isolation ffcv"
)


def require_ffcv() -> None:
    if FFCV_IMPORT_ERROR is not None:
        raise ImportError(f"{_HOW_TO_INSTALL} ({FFCV_IMPORT_ERROR})")


def check_beton(path: str) -> int:
    """Number of samples of a readable .beton; a clear error for a missing, truncated or corrupt file."""
    require_ffcv()
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"FFCV file {path!r} does not exist (create it with "
            "python -m hypersolid_scale.data.convert ... --formats ffcv)"
        )
    size = os.path.getsize(path)
    try:
        reader = Reader(path)
        table = reader.alloc_table
        end = int((table["ptr"] + table["size"]).max()) if len(table) else 0
    except Exception as e:  # whatever numpy/FFCV raise on a short read
        raise ValueError(
            f"FFCV file {path!r} is truncated or corrupt ({type(e).__name__}: {e}); "
            "re-create it with python -m hypersolid_scale.data.convert"
        ) from e
    if end > size or reader.num_samples == 0:
        raise ValueError(
            f"FFCV file {path!r} is truncated: data runs to byte {end} but the file has {size}; "
            "re-create it with python -m hypersolid_scale.data.convert"
        )
    return int(reader.num_samples)


class _EpochOrder(TraversalOrder):  # type: ignore[misc]
    """FFCV traversal order: this rank's rows of every global batch of the epoch, from batch `start` on.

    FFCV accepts a TraversalOrder instance and calls it with the loader; `sample_order(epoch)` is then
    what FFCV iterates, cut into batches of b.
    """

    def __init__(self, mode: str, *, num_samples: int, seed: int, rank: int, world_size: int, batch_size: int) -> None:
        if mode not in ORDERS:
            raise ValueError(f"data.ffcv.order={mode!r} is not one of {ORDERS}")
        self.mode, self.num_samples, self.seed = mode, num_samples, seed
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.start = 0  # first batch of the epoch to produce (a restored position)
        self._cache: tuple[int, np.ndarray] = (-1, np.empty(0, np.int64))

    def __call__(self, loader: Any) -> _EpochOrder:
        TraversalOrder.__init__(self, loader)
        if self.mode == "quasi_random":
            # FFCV's page table (raises for a file with no pages); the order itself is made below.
            q = QuasiRandom(loader)
            self._pages, self._page_sizes = q.page_to_samples_array, q.page_sizes
        return self

    def global_order(self, epoch: int) -> np.ndarray:
        """The epoch's order of all samples; depends on (seed, epoch) (and P*b for quasi_random)."""
        if self.mode != "quasi_random":
            return epoch_permutation(self.num_samples, seed=self.seed, epoch=epoch, shuffle=self.mode == "random")
        out = np.zeros(self.num_samples, dtype=np.int64)
        # A fresh copy of the page table every time: FFCV's generator shuffles it in place, which would
        # make an epoch's order depend on the epochs drawn before it.
        generate_order_inner(
            mix_seed(self.seed, epoch) % 2**31,
            self._pages.copy(),
            self._page_sizes,
            out,
            2 * self.world_size * self.batch_size,
        )
        return out

    def rank_order(self, epoch: int) -> np.ndarray:
        """This rank's whole epoch: batch t is [t*b, (t+1)*b)."""
        if self._cache[0] != epoch:
            self._cache = (
                epoch,
                split_global_batches(
                    self.global_order(epoch), rank=self.rank, world_size=self.world_size, batch_size=self.batch_size
                ),
            )
        return self._cache[1]

    def sample_order(self, epoch: int) -> np.ndarray:
        return self.rank_order(epoch)[self.start * self.batch_size :]


class FFCVLoader(ResumableEpochs):
    """Multi-crop batches `(views, labels)` from a .beton; views already on `device`, normalised."""

    def __init__(
        self,
        path: str,
        preset: MultiCropPreset,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        device: torch.device,
        num_workers: int,
        order: str = "quasi_random",
        os_cache: bool = False,
        batches_ahead: int = 3,
    ) -> None:
        super().__init__()
        require_ffcv()
        self.num_samples = check_beton(path)
        self.path, self.preset, self.rank, self.world_size, self.seed = path, preset, rank, world_size, seed
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.augment = BatchPhotometric(preset, self.device, seed)
        self._order = _EpochOrder(
            order, num_samples=self.num_samples, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size
        )
        label_pipe = [IntDecoder(), ToTensor(), Squeeze(), ToDevice(self.device, non_blocking=True)]
        pipelines: dict[str, Any] = {"image": None, "label": label_pipe}
        self.view_names, self._decoders = [], []
        shared = _SharedKernel()
        for i, (size, scale) in enumerate(zip(preset.view_sizes(), preset.view_scales())):
            name = f"view_{i}"
            self.view_names.append(name)
            decoder = KeyedRandomResizedCropFlip(
                (size, size),
                scale=scale,
                ratio=(3 / 4, 4 / 3),
                flip_prob=preset.hflip_prob,
                seed=seed,
                view=i,
                shared=shared,
            )
            self._decoders.append(decoder)
            pipelines[name] = PipelineSpec(
                "image",
                decoder=decoder,
                transforms=[ToTensor(), ToDevice(self.device, non_blocking=True), ToTorchImage(channels_last=False)],
            )
        # FFCV's Loader sets torch's intra-op threads to its worker count; keep the trainer's setting.
        threads = torch.get_num_threads()
        self.loader = Loader(
            path,
            batch_size=batch_size,
            num_workers=max(1, num_workers),
            os_cache=os_cache,
            order=self._order,
            distributed=False,
            seed=seed % (2**31),
            pipelines=pipelines,
            drop_last=True,
            batches_ahead=batches_ahead,
        )
        torch.set_num_threads(threads)
        self._len = len(self.loader)
        self._out_names = list(self.loader.pipeline_specs.keys())

    def __len__(self) -> int:
        return self._len

    def raw_batches(self, start: int = 0) -> Iterator[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]]:
        """`(views, labels, indices)` of this epoch from batch `start` on, after FFCV (crop + flip, uint8
        (B, 3, H, W) on the device), before photometric; `indices`: the samples' indices in the file (CPU)."""
        self._order.start = start
        for decoder in self._decoders:
            decoder.set_epoch(self.epoch)
        mine = torch.from_numpy(self._order.rank_order(self.epoch))
        self.loader.next_epoch = self.epoch
        threads = torch.get_num_threads()
        epoch_iter = iter(self.loader)  # FFCV resets torch's thread count here too
        torch.set_num_threads(threads)
        b = self.batch_size
        try:
            for t, out in zip(range(start, self._len), epoch_iter):
                named = dict(zip(self._out_names, out))
                yield [named[v] for v in self.view_names], named["label"].long(), mine[t * b : (t + 1) * b]
        finally:
            epoch_iter.close()  # stop FFCV's prefetching thread when the epoch is cut short

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        start = self._begin()
        for views, labels, indices in self.raw_batches(start):
            if self.preset.channels == 1:
                views = [v[:, :1] for v in views]
            self._count()
            yield self.augment(views, indices, self.epoch), labels
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
    pipelines = {
        "image": [
            CenterCropRGBImageDecoder((size, size), ratio=size / preset.eval_resize),
            ToTensor(),
            ToTorchImage(channels_last=False),
        ],
        "label": [IntDecoder(), ToTensor(), Squeeze()],
    }
    loader = Loader(
        path, batch_size=512, num_workers=1, order=OrderOption.SEQUENTIAL, pipelines=pipelines, drop_last=False
    )
    xs, ys = [], []
    for img, label in loader:
        xs.append(img.clone())
        ys.append(label.clone().long().view(-1))
    x = torch.cat(xs).float().div_(255.0)[:, : preset.channels]
    mean = torch.tensor(preset.mean).view(1, -1, 1, 1)
    std = torch.tensor(preset.std).view(1, -1, 1, 1)
    return TensorLabelDataset((x - mean) / std, torch.cat(ys))
