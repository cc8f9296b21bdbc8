"""The samples of one rank's (rank, worker) streams, epoch after epoch, in a DataLoader worker: the shard
order, the split into streams, the shuffle, the decode and the quota of each stream (the promises are in
stream.py's docstring; the training loader there runs one DataLoader over this for the whole run)."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from hypersolid_scale.data.augment.transforms import seeded_global_rngs
from hypersolid_scale.data.augment.view_params import sample_id
from hypersolid_scale.data.formats.webdataset.shards import IMAGE_EXTS, RECREATE, Manifest, Sample, ShardReader
from hypersolid_scale.data.loading.common import mix_seed
from hypersolid_scale.safety.errors import DataError

__all__ = ["ShardStream", "decode_image", "decode_label", "image_bytes"]


def image_bytes(sample: Sample) -> bytes:
    """The sample's encoded image."""
    for ext in IMAGE_EXTS:
        if ext in sample:
            return sample[ext]
    raise KeyError(f"sample {sample['__key__']!r} has no image ({'/'.join(IMAGE_EXTS)})")


def decode_image(sample: Sample, mode: str) -> Image.Image:
    """The sample's image, fully decoded (a truncated/corrupt file raises here, not later)."""
    img = Image.open(io.BytesIO(image_bytes(sample)))
    img.load()
    return img.convert(mode)


def decode_label(sample: Sample) -> int:
    if "cls" not in sample:
        raise KeyError(f"sample {sample['__key__']!r} has no .cls label")
    return int(sample["cls"].decode().strip())


class _Corrupt(Exception):
    """A sample that does not decode (the pipeline's handler skips and reports it)."""

    def __init__(self, sample: Sample, cause: Exception) -> None:
        super().__init__(
            f"skipping sample {sample.get('__key__')!r} of {sample.get('__url__')!r}: {type(cause).__name__}: {cause}"
        )
        self.url = str(sample.get("__url__"))


class ShardStream(IterableDataset):
    """This rank's samples from epoch `epoch`, batch `skip_batches`, on, epoch after epoch without end; each
    DataLoader worker produces its own whole batches (one DataLoader iterator serves the run: run_stream.py).

    Items are (views, label, events): events is a JSON list of what the shard reader and the decoder
    found since the previous item ("" when nothing), for the main process to count and warn about.
    """

    def __init__(
        self,
        shards: list[str],
        *,
        rank: int,
        world_size: int,
        seed: int,
        epoch: int,
        num_batches: int,
        batch_size: int,
        skip_batches: int,
        shuffle_buffer: int,
        transform: Callable,
        mode: str | None,
        manifest: Manifest | None,
        verify: bool,
        verified: frozenset[str],
    ) -> None:
        super().__init__()
        self.shards, self.rank, self.world_size, self.seed, self.epoch = shards, rank, world_size, seed, epoch
        self.num_batches, self.batch_size, self.skip_batches = num_batches, batch_size, skip_batches
        self.shuffle_buffer, self.transform, self.mode = shuffle_buffer, transform, mode
        self.manifest, self.verify, self.verified = manifest, verify, verified

    def _cycles(
        self,
        shards: list[str],
        stream: int,
        streams: int,
        rng: random.Random,
        reader: ShardReader,
        decoded: dict[str, int],
    ) -> Iterator[Sample]:
        """Undecoded samples of this stream, cycling through its shards (reshuffled every cycle).

        The shuffle buffer is flushed at the end of every cycle, so a cycle yields each of its samples
        exactly once.
        """
        by_shard = len(shards) >= streams
        mine = shards[stream::streams] if by_shard else list(shards)
        share = None if by_shard else (stream, streams)
        while True:
            order = list(mine)
            rng.shuffle(order)
            cycle: Iterator[Sample] = (sample for url in order for sample in reader.samples(url, share))
            if self.shuffle_buffer > 1:
                cycle = wds.shuffle(self.shuffle_buffer, initial=self.shuffle_buffer, rng=rng)(cycle)
            produced, tried, good = 0, decoded["tried"], decoded["good"]
            for sample in cycle:
                produced += 1
                yield sample
            if produced == 0:
                raise DataError(
                    f"shards {mine} hold no samples (rank {self.rank}, stream {stream}): they are "
                    f"empty or damaged; {RECREATE}"
                )
            if decoded["tried"] > tried and decoded["good"] == good:  # would cycle forever
                raise DataError(
                    f"no sample of shards {mine} decodes to an image with a .cls label (rank "
                    f"{self.rank}, stream {stream}): {RECREATE}"
                )

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], int, str]]:
        info = get_worker_info()
        worker, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        verified = set(self.verified)  # what this worker has verified carries over to its next epochs
        # The DataLoader hands this iterator's batches out round robin: the run's k-th batch (counted from
        # the start position) comes from worker k % nw. `first` is that count at the epoch's batch 0.
        epoch, skip, first = self.epoch, self.skip_batches, -self.skip_batches
        while True:
            # Batch b of an epoch comes from stream b % nw of that epoch (whichever worker process runs it),
            # so a batch holds the same samples whether the epoch started the stream, followed another epoch
            # in it, or was restored mid-way.
            yield from self._epoch(epoch, (worker - first) % nw, nw, skip, verified)
            epoch, skip, first = epoch + 1, 0, first + self.num_batches

    def _epoch(
        self, epoch: int, wid: int, nw: int, skip_batches: int, verified: set[str]
    ) -> Iterator[tuple[Any, int, str]]:
        """Stream `wid`'s batches of `epoch` (batches b with b % nw == wid), from batch `skip_batches` on."""
        quota = len(range(wid, self.num_batches, nw)) * self.batch_size
        skip = len(range(wid, skip_batches, nw)) * self.batch_size
        if quota == skip:
            return  # this epoch has no batch for this stream (after the restored position)
        # Shards are dealt to streams in a per-epoch order that every rank agrees on.
        shards = list(self.shards)
        random.Random(mix_seed(self.seed, epoch)).shuffle(shards)
        rng = random.Random(mix_seed(self.seed, epoch, self.rank, wid))
        reader = ShardReader(self.manifest, self.verify, frozenset(verified))
        decoded = {"tried": 0, "good": 0}

        def decode(sample: Sample) -> tuple[Any, int]:
            decoded["tried"] += 1
            with seeded_global_rngs(self.seed, epoch, sample_id(str(sample["__key__"]))):
                try:
                    label = decode_label(sample)
                    if self.mode is None:  # data.views_on=device: the bytes go to the host stage (it reads headers)
                        item = self.transform(image_bytes(sample))
                    else:
                        img = decode_image(sample, self.mode)
                except Exception as e:  # any decoder failure means "skip this sample"
                    raise _Corrupt(sample, e) from e
                if self.mode is not None:
                    item = self.transform(img)
            decoded["good"] += 1
            return item, label

        def skip_corrupt(exn: Exception) -> bool:
            if not isinstance(exn, _Corrupt):
                raise exn  # a bug in a transform is not a data problem
            reader.events.append({"kind": "corrupt", "url": exn.url, "lost": 1.0, "message": str(exn)})
            return True

        def drop_restored(samples: Iterator[Sample]) -> Iterator[Sample]:
            # The samples of batches done before the restored position: read, not decoded. What the
            # reader found meanwhile was counted before the checkpoint: flagged, not counted again.
            for _ in range(skip):
                next(samples)
            for ev in reader.events:
                ev["replayed"] = True
            yield from samples

        def with_events(items: Iterator[tuple[Any, int]]) -> Iterator[tuple[Any, int, str]]:
            for views, label in items:
                events, reader.events[:] = list(reader.events), []
                yield views, label, json.dumps(events) if events else ""

        stream = self.rank * nw + wid
        pipeline = wds.DataPipeline(
            lambda: self._cycles(shards, stream, self.world_size * nw, rng, reader, decoded),
            drop_restored,
            wds.map(decode, handler=skip_corrupt),
            wds.slice(quota - skip),
            with_events,
        )
        yield from pipeline
        verified |= reader.verified
