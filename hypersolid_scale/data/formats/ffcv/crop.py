"""The FFCV loader's crop + flip decoder, its draws keyed per sample (docs/design.md §3b).

`KeyedRandomResizedCropFlip` re-seeds the decoding thread's numba generator before each sample from
(seed, epoch, sample index, view), then runs FFCV's own crop sampler and resize and draws the flip from the
same stream: FFCV never seeds those generators, so its own decoders' draws depend on the thread. The loader
that uses it: loader.py.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from hypersolid_scale.data.loading.common import DOMAIN_FFCV_CROP, hash32, stream_key

try:
    from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder
    from ffcv.fields.rgb_image import IMAGE_MODES, get_random_crop
    from ffcv.libffcv import imdecode, resize_crop
    from ffcv.pipeline.compiler import Compiler
    from numba import objmode
    from numba.core.errors import NumbaWarning

    # The decoder reads the epoch's key once per batch in object mode (`_epoch_key`) inside FFCV's
    # nogil pipeline; numba warns that this block holds the GIL, which is intended and cheap.
    warnings.filterwarnings(
        "ignore", message="Code running in object mode won't allow parallel execution", category=NumbaWarning
    )
except ImportError:  # the optional extra is not installed (loader.py's require_ffcv says how to install it)
    RandomResizedCropRGBImageDecoder = object


# Stream key of the current epoch per decoder, read by the compiled decoder at every batch: numba
# freezes a closure's values at compile time, and recompiling every pipeline every epoch is slow.
_EPOCH_KEYS: dict[int, int] = {}
_DECODER_IDS = itertools.count()


def _epoch_key(decoder_id: int) -> int:
    return _EPOCH_KEYS[decoder_id]


def _flip_in_place(img: np.ndarray) -> None:
    """Mirror an (H, W, C) image left-right."""
    w = img.shape[1]
    for y in range(img.shape[0]):
        for x in range(w // 2):
            for c in range(img.shape[2]):
                t = img[y, x, c]
                img[y, x, c] = img[y, w - 1 - x, c]
                img[y, w - 1 - x, c] = t


class _SharedKernel:
    """The compiled decode + crop + flip kernel, shared by the views of one loader (one compilation)."""

    def __init__(self) -> None:
        self.kernel: Callable | None = None
        self.reader: Any = None

    def get(self, memory_read: Callable) -> Callable:
        if self.kernel is None or self.reader is not memory_read:
            self.kernel, self.reader = _build_kernel(memory_read), memory_read
        return self.kernel


def _build_kernel(mem_read: Callable) -> Callable:
    """The body of FFCV's ResizedCropRGBImageDecoder.generate_code, plus the per-sample seeding and the
    flip; the view's crop scale, aspect ratios and flip probability are arguments."""
    my_range = Compiler.get_iterator()
    imdecode_c = Compiler.compile(imdecode)
    resize_crop_c = Compiler.compile(resize_crop)
    get_crop_c = Compiler.compile(get_random_crop)
    hash_c = Compiler.compile(hash32)
    flip_c = Compiler.compile(_flip_in_place)
    jpg = IMAGE_MODES["jpg"]

    def kernel(  # type: ignore[no-untyped-def]
        batch_indices,
        destination,
        temp_storage,
        metadata,
        storage_state,
        key,
        scale,
        ratio,
        flip_prob,
    ):
        for dst_ix in my_range(len(batch_indices)):
            source_ix = np.int64(batch_indices[dst_ix])
            np.random.seed(hash_c(hash_c(key ^ (source_ix & 0xFFFFFFFF)) ^ ((source_ix >> 32) & 0xFFFFFFFF)))
            field = metadata[source_ix]
            image_data = mem_read(field["data_ptr"], storage_state)
            height = np.uint32(field["height"])
            width = np.uint32(field["width"])
            if field["mode"] == jpg:
                temp_buffer = temp_storage[dst_ix]
                imdecode_c(image_data, temp_buffer, height, width, height, width, 0, 0, 1, 1, False, False)
                selected_size = 3 * height * width
                temp_buffer = temp_buffer.reshape(-1)[:selected_size]
                temp_buffer = temp_buffer.reshape(height, width, 3)
            else:
                temp_buffer = image_data.reshape(height, width, 3)
            i, j, h, w = get_crop_c(height, width, scale, ratio)
            resize_crop_c(temp_buffer, i, i + h, j, j + w, destination[dst_ix])
            if np.random.random() < flip_prob:
                flip_c(destination[dst_ix])
        return destination[: len(batch_indices)]

    kernel.is_parallel = True  # type: ignore[attr-defined]
    return Compiler.compile(kernel)


class KeyedRandomResizedCropFlip(RandomResizedCropRGBImageDecoder):  # type: ignore[misc]
    """FFCV's RandomResizedCrop decoder + a horizontal flip, with draws keyed per sample.

    Before decoding sample i the thread's numba generator is seeded with a hash of
    (seed, epoch, i, view); FFCV's crop sampler (torchvision's algorithm) and then the flip draw from it.
    """

    def __init__(
        self,
        output_size: tuple[int, int],
        *,
        scale: tuple[float, float],
        ratio: tuple[float, float],
        flip_prob: float,
        seed: int,
        view: int,
        shared: _SharedKernel | None = None,
    ) -> None:
        super().__init__(output_size, scale=scale, ratio=ratio)
        self.flip_prob, self.seed, self.view = float(flip_prob), int(seed), int(view)
        self.shared = shared if shared is not None else _SharedKernel()
        self.decoder_id = next(_DECODER_IDS)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        _EPOCH_KEYS[self.decoder_id] = stream_key(self.seed, epoch, self.view, DOMAIN_FFCV_CROP)

    def generate_code(self) -> Callable:
        kernel, decoder_id = self.shared.get(self.memory_read), self.decoder_id
        scale, ratio = np.array(self.scale, dtype=np.float64), np.array(self.ratio, dtype=np.float64)
        flip_prob = self.flip_prob

        def decode(batch_indices, my_storage, metadata, storage_state):  # type: ignore[no-untyped-def]
            with objmode(key="int64"):  # once per batch: the current epoch's key
                key = _epoch_key(decoder_id)
            destination, temp_storage = my_storage
            return kernel(
                batch_indices, destination, temp_storage, metadata, storage_state, key, scale, ratio, flip_prob
            )

        return decode
