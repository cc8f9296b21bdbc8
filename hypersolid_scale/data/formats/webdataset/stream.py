"""WebDataset: tar shards of (image, class) samples -> multi-crop batches, split by rank and by worker.

Shards are read through the `webdataset` library (`wds.DataPipeline`; its tar reader; its URL opener),
so data.path may be anything `urls.py` lists: a local directory, brace patterns, `pipe:` commands,
http(s), and s3/gs/... through fsspec. Shard format (what `python -m hypersolid_scale.data.convert`
and `webdataset.TarWriter` write): members `<key>.jpg|png|webp|jpeg` and `<key>.cls` (ASCII integer).

Epoch definition (what makes DDP work): the sample count N comes from the manifest (or one header scan
of local shards / one streamed pass over remote ones), each rank gets exactly floor(N / (world * batch))
batches. Shards are dealt to the (rank, worker) streams; a stream cycles through its shards until it has
produced its quota, so uneven or damaged shards never give ranks different batch counts. With fewer
shards than streams, every stream reads all shards and keeps every S-th sample.

Data loss is never silent. A sample that fails to decode is skipped (`stats["corrupt_skipped"]`). A shard
is checked against the manifest when it has been read to its end: fewer samples than listed ("short",
e.g. truncated at a member boundary), a break inside a member ("truncated": the samples before it are
used), a missing tar end marker, a sha256 mismatch (with data.webdataset.verify_shards) each warn once per
read and count (`stats`: short_shards, truncated_shards, lost_samples, checksum_mismatches). When the samples
a rank's shards lost in an epoch exceed max_lost_fraction of the samples it reads per epoch, iteration
raises an error naming the shards (undecodable samples are warned about one by one and do not count).
A shard that is missing, cannot be opened or is no tar archive raises an error naming it. These errors
are `DataError`s (the user's data, reported in one line), also when a DataLoader worker met them. `stats`
are this rank's counts; the trainer sums them over ranks before logging.

What this loader promises, and what it does not (compare docs/design.md §3b, which the in-memory, map-style and
FFCV loaders meet). Let P = world size, W = max(1, data.num_workers), S = P * W streams, b = batch per rank:
- Equal work: every rank yields exactly floor(N / (P * b)) batches of b samples per epoch.
- Determinism for a fixed (seed, epoch, P, W, rank): the samples of each batch and their order are
  reproducible, whatever the URL scheme the same bytes come from. The shard order is shuffled by
  (seed, epoch) identically on every rank; stream s = rank * W + worker takes shards[s::S] (or, with
  fewer than S shards, samples i with i % S == s of every shard) and shuffles them with the library's
  buffer shuffle seeded by (seed, epoch, rank, worker), flushed at the end of each pass over its shards.
  Batch t of a rank is produced whole by stream t % W of that epoch. One DataLoader (one pool of W worker
  processes) serves the whole run (data/loading/run_stream.py): the workers run the streams of epoch e + 1 while
  the main process still takes epoch e's batches, each worker playing whichever stream the DataLoader's
  round robin gives its batches in that epoch, so no worker idles at an epoch boundary even when an epoch
  has fewer batches than workers.
- Coverage: streams read disjoint data. A stream whose shards hold fewer samples than its quota starts
  over (repeats samples); one with more leaves the rest unread; so with uneven shards an epoch is not
  exactly one pass over the data.
- NOT world-size or worker-count invariant: which samples form a batch, and their order, depend on P and W
  (they decide the streams), so P ranks with batch b do not reproduce one process with batch P * b, and
  changing num_workers changes the batches.
- Augmentations are keyed per sample: each sample's transform runs with the generators seeded by (seed, epoch,
  a hash of its ``__key__``) (`seeded_global_rngs`), so its views do not depend on the rank, worker or order.
  With data.views_on=device the workers only read the bytes and draw the same parameters (data/device/views.py).
- Resume at (epoch, batches done): the same samples in the same batches as the uninterrupted run (each
  stream re-reads and drops the samples of the skipped batches without decoding them; each sample that
  failed to decode before the restored position shifts that stream's later samples by one) with the same
  views. On
  another world size (at the same global batch) the position carries over but the streams do not: the rest
  of that epoch comes from the new world size's streams, so some of its samples repeat and others are skipped.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from hypersolid_scale.data.augment.presets import MultiCropPreset
from hypersolid_scale.data.augment.transforms import build_pil_multicrop, pil_mode
from hypersolid_scale.data.device.views import DeviceStage, collate_host
from hypersolid_scale.data.formats.webdataset.index import ShardIndexDataset
from hypersolid_scale.data.formats.webdataset.rank_streams import ShardStream, decode_image, decode_label
from hypersolid_scale.data.formats.webdataset.shards import COUNTERS, Event, Manifest, apply_events, count_samples
from hypersolid_scale.data.formats.webdataset.urls import expand_shards, is_local
from hypersolid_scale.data.loading.common import ResumableEpochs, batches_per_epoch, mix_seed
from hypersolid_scale.data.loading.random_access import _seed_worker
from hypersolid_scale.data.loading.run_stream import RunStream
from hypersolid_scale.safety.errors import DataError

__all__ = ["WebDatasetLoader", "ShardIndexDataset", "decode_image", "decode_label", "expand_shards"]


class WebDatasetLoader(ResumableEpochs):
    """Multi-crop batches `(views, labels)` from WebDataset shards (PIL path, CPU tensors).

    manifest: the conversion manifest (path or URL) when it is not next to local shards; verify_shards:
    also check each shard's sha256, hashed as it streams by, until it has matched once; max_lost_fraction:
    see the module docstring.
    """

    world_size_invariant = False  # the streams are split by rank (and worker): see the module docstring

    def __init__(
        self,
        urls: str,
        preset: MultiCropPreset,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        num_workers: int,
        shuffle_buffer: int = 2000,
        num_samples: int | None = None,
        transform: Callable | None = None,
        manifest: str | None = None,
        verify_shards: bool = False,
        max_lost_fraction: float = 0.01,
        device_stage: DeviceStage | None = None,
    ) -> None:
        """device_stage: data.views_on=device; `transform` is then the workers' `HostStage` (bytes -> draws)."""
        super().__init__()
        if not 0.0 <= max_lost_fraction <= 1.0:
            raise ValueError(f"max_lost_fraction must be in [0, 1], got {max_lost_fraction}")
        self.shards = expand_shards(urls)
        self.manifest = Manifest.locate(self.shards, manifest)
        total = self.manifest.total(self.shards) if self.manifest else None
        if total is None:
            if not all(is_local(s) for s in self.shards):
                warnings.warn(
                    f"no manifest lists every shard of {urls!r}: counting samples streams every "
                    "shard once; set data.webdataset.manifest to the conversion's manifest.json to skip that",
                    stacklevel=1,
                )
            total = count_samples(self.shards)
        if num_samples is not None:
            total = min(total, num_samples)
        self.num_samples = total
        self.preset, self.rank, self.world_size, self.seed = preset, rank, world_size, seed
        self.batch_size, self.num_workers, self.shuffle_buffer = batch_size, num_workers, shuffle_buffer
        self.verify_shards, self.max_lost_fraction = verify_shards, max_lost_fraction
        self.transform = transform if transform is not None else build_pil_multicrop(preset)
        self.device_stage = device_stage
        self._len = batches_per_epoch(total, world_size, batch_size)
        self.stats = dict.fromkeys(COUNTERS, 0.0)
        self._verified: set[str] = set()  # shards whose sha256 matched the manifest: not hashed again
        self._stream = RunStream(self._open)  # one worker pool and stage thread for the run

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        start = self._begin()
        per_epoch = self._len * self.batch_size
        lost: dict[str, list[Any]] = {}  # url -> [samples lost this epoch, kinds]
        for views, labels, events, replaced in self._stream.epoch(self.epoch, start, self._len):
            for text in events:
                if text:
                    self._record(json.loads(text), lost)
            if self.max_lost_fraction < 1.0 and sum(n for n, _ in lost.values()) > self.max_lost_fraction * per_epoch:
                self._stream.close()
                raise DataError(self._loss_message(lost, per_epoch))
            self.stats["corrupt_skipped"] += replaced
            self._count()
            yield views, labels
        self._skip = 0

    def close(self) -> None:
        """Stop the run's DataLoader workers and stage thread (the next iteration starts new ones)."""
        self._stream.close()

    def _open(self, epoch: int, start: int) -> Iterator[tuple[Any, Any, Any, int]]:
        """Every batch from (epoch, start) on, through one DataLoader and one stage thread (run_stream.py)."""
        ds = ShardStream(
            self.shards,
            rank=self.rank,
            world_size=self.world_size,
            seed=self.seed,
            epoch=epoch,
            num_batches=self._len,
            batch_size=self.batch_size,
            skip_batches=start,
            shuffle_buffer=self.shuffle_buffer,
            transform=self.transform,
            mode=None if self.device_stage else pil_mode(self.preset),
            manifest=self.manifest,
            verify=self.verify_shards,
            verified=frozenset(self._verified),
        )
        gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch, self.rank, start))
        loader = DataLoader(
            ds,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            worker_init_fn=_seed_worker,
            generator=gen,
            collate_fn=collate_host if self.device_stage else None,
            pin_memory=bool(self.device_stage and self.device_stage.device.type == "cuda"),
        )
        items = _unwrapped(loader)
        # The views prepared ahead of the step (data/device/prefetch.py), across epoch boundaries too.
        return _handed_over(items, None if self.device_stage is None else self.device_stage.ahead(items))

    def _record(self, events: list[Event], lost: dict[str, list[Any]]) -> None:
        for ev in events:
            if ev["kind"] == "verified":
                self._verified.add(ev["url"])
                continue
            warnings.warn(ev["message"], stacklevel=1)
            n = apply_events(dict.fromkeys(COUNTERS, 0.0) if ev.get("replayed") else self.stats, [ev])
            if ev["kind"] != "corrupt":
                entry = lost.setdefault(ev["url"], [0.0, set()])
                entry[0] += n
                entry[1].add(ev["kind"])

    def _loss_message(self, lost: dict[str, list[Any]], per_epoch: int) -> str:
        total = sum(n for n, _ in lost.values())
        worst = sorted(((n, url, kinds) for url, (n, kinds) in lost.items() if n > 0), reverse=True)
        shards = "; ".join(f"{url}: {n:.0f} lost ({'/'.join(sorted(kinds))})" for n, url, kinds in worst[:10])
        more = f"; and {len(worst) - 10} more shards" if len(worst) > 10 else ""
        return (
            f"rank {self.rank} lost {total:.0f} samples in epoch {self.epoch}, {total / per_epoch:.1%} of "
            f"the {per_epoch} it reads per epoch, over data.webdataset.max_lost_fraction={self.max_lost_fraction}. "
            f"Shards: {shards}{more}. Repair or re-convert them (python -m hypersolid_scale.data.convert), "
            f"or raise data.webdataset.max_lost_fraction to train on what is left (1.0 never stops)."
        )


def _handed_over(items: Iterator[Any], ahead: Iterator[Any] | None) -> Iterator[tuple[Any, Any, Any, int]]:
    """(views, labels, events, images replaced) of the workers' `items`, through the device stage's `ahead`."""
    try:
        if ahead is None:
            for views, labels, events in items:
                yield views, labels, events, 0
        else:
            for views, replaced, (_, labels, events) in ahead:
                yield views, labels, events, replaced
    finally:  # the stage thread stops first (it closes `items` itself), then the workers
        for part in (ahead, items):
            close = getattr(part, "close", None)  # generators; typed as plain iterators
            if close is not None:
                close()


# How a DataError's type and message end the traceback text that a DataLoader worker sends back.
_DATA_ERROR_LINE = f"{DataError.__module__}.{DataError.__qualname__}: "


def _unwrapped(loader: DataLoader) -> Iterator[Any]:
    """`loader`'s items; a DataError from a worker comes back with its own one-line message.

    The DataLoader re-raises a worker's exception as the same type built from the worker's whole traceback
    text, which would put that traceback into the one line the user is shown; the worker's traceback stays
    attached as the cause, for the log file and HS_DEBUG=1.
    """
    try:
        yield from loader
    except DataError as err:
        text = str(err)
        if "Original Traceback" not in text or _DATA_ERROR_LINE not in text:
            raise
        raise DataError(text.rsplit(_DATA_ERROR_LINE, 1)[1].strip()) from err
