"""Writing FFCV `.beton` files (image + label), with pages sized to the images and no hang on a worker error.

FFCV's `DatasetWriter` stores every sample whole inside one page of `page_size` bytes, so a page must hold
the largest encoded image: a raw 2400 x 2400 RGB image is 17,280,000 bytes and does not fit the default
8 MiB page. A worker that meets such an image fails, and FFCV's own wait loop, which only counts written
samples, then waits forever. So (1) the page size is chosen before writing from the largest image's pixel
count (`page_size_for`), which the converter reads from the image headers; (2) `_GuardedWriter` watches the
worker processes and stops with the worker's error instead of waiting for samples that never come.

Why pages sized to the images rather than refusing or shrinking them: the user gets the images they asked
for (a `.beton` of large raw images works; the loader's page cache then holds large pages, which
`--resize` or `--ffcv-mode jpg` with smaller images avoids). Only images that no FFCV page can hold
(FFCV's page size is below 2^32, its stored sides below 2^16) are refused, before anything is written.

This module imports FFCV's writer and fields only, not the loader side (`hypersolid_scale.data.formats.ffcv.loader`).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import Process, Queue, Value
from queue import Empty
from time import sleep
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import DataError

try:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.memory_allocator import MemoryAllocator
    from ffcv.writer import DatasetWriter

    FFCV_WRITER_IMPORT_ERROR: BaseException | None = None
except ImportError as _e:  # the optional extra is not installed
    FFCV_WRITER_IMPORT_ERROR = _e
    DatasetWriter = object

# FFCV's limits: pages are powers of two in [2 MiB, 2^32) (ffcv.writer), widths and heights are uint16.
MIN_PAGE = 1 << 21
MAX_PAGE = 1 << 31
MAX_FFCV_SIDE = (1 << 16) - 1
# Pages of small images stay at 2 MiB (FFCV writes whole pages, so small pages keep small files small);
# larger images get at least 8 MiB (fewer, larger reads).
_SMALL_IMAGE_PIXELS = 512 * 512


def page_size_for(max_pixels: int, max_side: int = 0) -> int:
    """The FFCV page size for images of up to `max_pixels` pixels (and `max_side` pixels a side).

    The bound is the raw RGB size, 3 bytes a pixel, whatever the write mode: a raw image takes exactly
    that, and a JPEG, whose size is known only after encoding, stays under it (OpenCV encodes 4:2:0, 1.5
    samples a pixel). Raises DataError, before anything is written, for images no FFCV page holds.
    """
    need = 3 * max_pixels
    if need > MAX_PAGE or max_side > MAX_FFCV_SIDE:
        raise DataError(
            f"an image of {max_pixels} pixels ({need} bytes as raw RGB, longest side {max_side} px) is "
            f"over what FFCV stores (pages up to {MAX_PAGE} bytes, sides up to {MAX_FFCV_SIDE} px); pass "
            "--resize N to store smaller images, or a lower --max-side to skip such images"
        )
    page = MIN_PAGE if max_pixels <= _SMALL_IMAGE_PIXELS else 1 << 23
    while page < need:
        page *= 2
    return page


def largest_image(opens: Iterable[Callable[[], Image.Image]], max_side: int) -> tuple[int, int]:
    """(pixels, longest side) of the largest image up to `max_side` a side, from the headers only (`opens`
    give images opened, not decoded); images that fail to open or are larger are left out, as the
    conversion skips them."""
    pixels = side = 0
    for open_image in opens:
        try:
            with open_image() as img:
                w, h = img.size
        except Exception:  # noqa: BLE001 - a bad file, listed by the conversion
            continue
        if max(w, h) <= max_side:
            pixels, side = max(pixels, w * h), max(side, w, h)
    return pixels, side


def _run_worker(errors: Queue[str], work_fn: Callable[..., None], *args: Any) -> None:
    """FFCV's worker, reporting its error to the parent (one line) and exiting with status 1."""
    try:
        work_fn(*args)
    except BaseException as e:  # noqa: BLE001 - whatever it is, the parent must hear of it
        errors.put(f"{type(e).__name__}: {e}")
        sys.exit(1)


class _GuardedWriter(DatasetWriter):  # type: ignore[misc]
    """FFCV's DatasetWriter whose wait loop stops when a worker dies (FFCV's would wait forever)."""

    def _write_common(
        self, num_samples: int, queue_content: Any, work_fn: Callable[..., None], extra_worker_args: tuple
    ) -> None:
        # As ffcv.writer.DatasetWriter._write_common (FFCV 1.0), with the workers watched while waiting.
        self.num_samples = num_samples
        self.prepare()
        workqueue: Queue = Queue()
        for todo in queue_content:
            workqueue.put(todo)
        for _ in range(self.num_workers):
            workqueue.put(None)
        allocations_queue: Queue = Queue()
        errors: Queue = Queue()
        done_number = Value(ctypes.c_uint64, 0)
        allocator = MemoryAllocator(self.fname, self.data_region_start, self.page_size)
        args = (
            workqueue,
            self.metadata_sm,
            self.metadata_type,
            self.fields,
            allocator,
            done_number,
            allocations_queue,
            *extra_worker_args,
        )
        processes = [Process(target=_run_worker, args=(errors, work_fn, *args)) for _ in range(self.num_workers)]
        try:
            for p in processes:
                p.start()
            with tqdm(total=num_samples) as progress:
                while progress.n < num_samples:
                    self._check_workers(processes, errors, need_all=False)
                    progress.update(int(done_number.value) - progress.n)
                    sleep(0.1)
            allocation_list: list = []
            got = 0
            while got < len(processes):
                try:
                    allocation_list.extend(allocations_queue.get(timeout=0.5))
                    got += 1
                except Empty:
                    self._check_workers(processes, errors, need_all=True)
            for p in processes:
                p.join()
            self.finalize(allocation_list)
        finally:
            for p in processes:
                if p.is_alive():
                    p.terminate()
                    p.join()
            self.metadata_sm.close()
            self.metadata_sm.unlink()

    @staticmethod
    def _check_workers(processes: list, errors: Queue[str], need_all: bool) -> None:
        """Raise when a worker failed, or (`need_all`) when all have exited without the results."""
        failed = [p for p in processes if p.exitcode not in (None, 0)]
        if not failed and not (need_all and all(p.exitcode is not None for p in processes)):
            return
        try:
            why = errors.get(timeout=1.0)
        except Empty:
            why = (
                f"a worker exited with status {failed[0].exitcode} (killed, e.g. out of memory?)"
                if failed
                else "the workers exited without reporting their pages"
            )
        raise RuntimeError(f"an FFCV writer worker failed: {why}")


class _ArrayList:
    """The indexed dataset FFCV's workers read: image `i` is loaded (decoded) only when written."""

    def __init__(self, images: Sequence[Callable[[], np.ndarray]], labels: Sequence[int]) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        img = self.images[i]()
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise ValueError(f"FFCV needs (H, W, 3) uint8 images, item {i} is {img.shape} {img.dtype}")
        return img, int(self.labels[i])


def write_beton(
    path: str,
    images: Sequence[Callable[[], np.ndarray]],
    labels: Sequence[int],
    *,
    write_mode: str = "raw",
    jpeg_quality: int = 90,
    num_workers: int = 2,
    page_size: int | None = None,
    max_pixels: int | None = None,
    max_side: int = 0,
) -> None:
    """Write (image, label) pairs to `path` (atomically: via a temporary file, removed on failure).

    `max_pixels` / `max_side`: the largest image's pixel count and longest side (the converter reads them
    from the headers); None: every image is loaded once here to measure it. `page_size`: None chooses
    `page_size_for` them; a given one that cannot hold the largest image is refused before writing.
    """
    if FFCV_WRITER_IMPORT_ERROR is not None:
        from hypersolid_scale.data.formats.ffcv.loader import require_ffcv

        require_ffcv()
    if max_pixels is None:
        shapes = [img().shape for img in images]
        max_pixels = max((h * w for h, w, *_ in shapes), default=0)
        max_side = max((max(h, w) for h, w, *_ in shapes), default=0)
    needed = page_size_for(max_pixels, max_side)
    if page_size is None:
        page_size = needed
    elif page_size < 3 * max_pixels:
        raise DataError(
            f"FFCV page size {page_size} cannot hold an image of {max_pixels} pixels ({3 * max_pixels} "
            f"bytes as raw RGB); use page_size={needed} or leave it out"
        )
    with atomic.atomic_path(path) as tmp:
        writer = _GuardedWriter(
            str(tmp),
            {"image": RGBImageField(write_mode=write_mode, jpeg_quality=jpeg_quality), "label": IntField()},
            num_workers=num_workers,
            page_size=page_size,
        )
        writer.from_indexed_dataset(_ArrayList(images, labels))
