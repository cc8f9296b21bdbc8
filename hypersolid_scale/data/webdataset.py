"""WebDataset: tar shards of (image, class) samples -> multi-crop batches, split by rank and by worker.

Shard format (what `python -m hypersolid_scale.data.convert` writes, and `webdataset.TarWriter`): members
`<key>.jpg|png|webp|jpeg` and `<key>.cls` (ASCII integer). The shard list is a directory, a brace pattern
(`d/shard-{000000..000009}.tar`) or a comma-separated list.

Epoch definition (what makes DDP work): the sample count N comes from the manifest (or one header scan of
the shards), each rank gets exactly floor(N / (world * batch)) batches. Shards are dealt to the
(rank, worker) streams; a stream cycles through its shards until it has produced its quota, so uneven
shard sizes never give ranks different batch counts. With fewer shards than streams, every stream reads
all shards and keeps every S-th sample. A sample that fails to decode is skipped and counted
(`stats["corrupt_skipped"]`); a missing or unreadable shard raises an error naming it.

What this loader promises, and what it does not (compare DESIGN §3b, which the in-memory, map-style and
FFCV loaders meet). Let P = world size, W = max(1, data.num_workers), S = P * W streams, b = batch per rank:
- Equal work: every rank yields exactly floor(N / (P * b)) batches of b samples per epoch.
- Determinism for a fixed (seed, epoch, P, W, rank): the samples of each batch and their order are
  reproducible. The shard order is shuffled by (seed, epoch) identically on every rank; stream
  s = rank * W + worker takes shards[s::S] (or, with fewer than S shards, samples i with i % S == s of
  every shard) and shuffles them with a buffer seeded by (seed, epoch, rank, worker). Batch t of a rank
  is produced whole by worker t % W.
- Coverage: streams read disjoint data. A stream whose shards hold fewer samples than its quota starts
  over (repeats samples); one with more leaves the rest unread; so with uneven shards an epoch is not
  exactly one pass over the data.
- NOT world-size or worker-count invariant: which samples form a batch, and their order, depend on P and W
  (they decide the streams), so P ranks with batch b do not reproduce one process with batch P * b, and
  changing num_workers changes the batches.
- Augmentations are NOT keyed per sample: lightly/torchvision transforms draw from the worker's global
  generators, seeded through the DataLoader from (seed, epoch, rank, first batch of this iteration) and
  the worker id (with num_workers=0: the main process's global generators, i.e. the trainer's streams).
  They depend on the rank, the worker count and the order in which the worker processed its samples.
- Resume at (epoch, batches done): the same samples in the same batches as the uninterrupted run (each
  stream re-reads and drops the samples of the skipped batches without decoding them; each sample that
  failed to decode before the restored position shifts that stream's later samples by one), but
  different augmentation draws, since the worker seeds depend on the first batch of the iteration.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from braceexpand import braceexpand
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from hypersolid_scale.data.common import ResumableEpochs, batches_per_epoch, find_manifest, mix_seed
from hypersolid_scale.data.loaders import _seed_worker
from hypersolid_scale.data.presets import MultiCropPreset
from hypersolid_scale.data.transforms import build_pil_multicrop, pil_mode

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
Sample = dict[str, Any]


def expand_shards(urls: str) -> list[str]:
    """Directory, brace pattern or comma list -> shard paths; every one must exist and be readable."""
    if os.path.isdir(urls):
        shards = sorted(str(p) for p in Path(urls).glob("*.tar"))
        if not shards:
            raise FileNotFoundError(f"no .tar shards in directory {urls!r}")
    else:
        shards = [s for part in urls.split(",") for s in braceexpand(part.strip())]
    for s in shards:
        if not os.path.isfile(s):
            raise FileNotFoundError(f"shard {s!r} does not exist (from {urls!r})")
        if not os.access(s, os.R_OK):
            raise PermissionError(f"shard {s!r} is not readable")
    return shards


def iter_shard(path: str) -> Iterator[Sample]:
    """Samples of one tar shard in file order: {"__key__", "<ext>": bytes, ...}."""
    try:
        with tarfile.open(path, mode="r|*") as tar:
            current: Sample = {}
            for member in tar:
                if not member.isfile():
                    continue
                stem, _, ext = os.path.basename(member.name).partition(".")
                key = os.path.join(os.path.dirname(member.name), stem)
                if current and current["__key__"] != key:
                    yield current
                    current = {}
                current["__key__"] = key
                f = tar.extractfile(member)
                current[ext.lower()] = f.read() if f is not None else b""
            if current:
                yield current
    except (OSError, tarfile.TarError, EOFError) as e:
        raise RuntimeError(f"cannot read shard {path!r}: {e}") from e


def decode_image(sample: Sample, mode: str) -> Image.Image:
    """The sample's image, fully decoded (a truncated/corrupt file raises here, not later)."""
    for ext in IMAGE_EXTS:
        if ext in sample:
            img = Image.open(io.BytesIO(sample[ext]))
            img.load()
            return img.convert(mode)
    raise KeyError(f"sample {sample['__key__']!r} has no image ({'/'.join(IMAGE_EXTS)})")


def decode_label(sample: Sample) -> int:
    if "cls" not in sample:
        raise KeyError(f"sample {sample['__key__']!r} has no .cls label")
    return int(sample["cls"].decode().strip())


def count_samples(shards: list[str]) -> int:
    return sum(1 for s in shards for x in iter_shard(s) if any(e in x for e in IMAGE_EXTS))


def manifest_count(urls: str, shards: list[str]) -> Optional[int]:
    """Samples in `shards` according to the conversion manifest, if it lists every one of them."""
    manifest = find_manifest(urls)
    if manifest is None:
        return None
    for split_dir in {str(Path(s).parent) for s in shards}:
        entry = manifest.get("splits", {}).get(Path(split_dir).name, {})
        counts = {sh["name"]: sh["count"] for sh in entry.get("shards", [])}
        if not all(Path(s).name in counts for s in shards if str(Path(s).parent) == split_dir):
            return None
    total = 0
    for s in shards:
        entry = manifest["splits"][Path(s).parent.name]
        total += next(sh["count"] for sh in entry["shards"] if sh["name"] == Path(s).name)
    return total


class _ShardStream(IterableDataset):
    """One epoch of samples for one rank; each DataLoader worker produces its own whole batches."""

    def __init__(self, shards: list[str], *, rank: int, world_size: int, seed: int, epoch: int,
                 num_batches: int, batch_size: int, skip_batches: int, shuffle_buffer: int,
                 transform: Callable, mode: str) -> None:
        super().__init__()
        self.shards, self.rank, self.world_size, self.seed, self.epoch = shards, rank, world_size, seed, epoch
        self.num_batches, self.batch_size, self.skip_batches = num_batches, batch_size, skip_batches
        self.shuffle_buffer, self.transform, self.mode = shuffle_buffer, transform, mode

    def _raw(self, stream: int, streams: int, rng: random.Random) -> Iterator[Sample]:
        """Undecoded samples of this stream, cycling through its shards (reshuffled every cycle).

        The shuffle buffer is flushed at the end of every cycle, so a cycle yields each of its samples
        exactly once.
        """
        by_shard = len(self.shards) >= streams
        mine = self.shards[stream::streams] if by_shard else list(self.shards)
        while True:
            order = list(mine)
            rng.shuffle(order)
            cycle = (sample for shard in order for i, sample in enumerate(iter_shard(shard))
                     if by_shard or i % streams == stream)
            produced = 0
            for sample in self._shuffled(cycle, rng):
                produced += 1
                yield sample
            if produced == 0:
                raise RuntimeError(f"shards {mine} hold no samples for stream {stream}")

    def _shuffled(self, it: Iterator[Sample], rng: random.Random) -> Iterator[Sample]:
        if self.shuffle_buffer <= 1:
            yield from it
            return
        buf: list[Sample] = []
        for sample in it:
            if len(buf) < self.shuffle_buffer:
                buf.append(sample)
                continue
            j = rng.randrange(len(buf))
            buf[j], sample = sample, buf[j]
            yield sample
        rng.shuffle(buf)
        yield from buf

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], int, int]]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        # Batch b of this rank comes from worker b % nw (the DataLoader's round robin). A restored
        # DataLoader starts its round robin at worker 0, so worker ids are rotated by the skipped batches
        # to keep batch b with the stream that produced it in the uninterrupted run.
        wid = (wid + self.skip_batches) % nw
        quota = len(range(wid, self.num_batches, nw)) * self.batch_size
        skip = len(range(wid, self.skip_batches, nw)) * self.batch_size
        # Shards are dealt to streams in a per-epoch order that every rank agrees on.
        shards = list(self.shards)
        random.Random(mix_seed(self.seed, self.epoch)).shuffle(shards)
        self.shards = shards
        rng = random.Random(mix_seed(self.seed, self.epoch, self.rank, wid))
        stream = self.rank * nw + wid
        raw = self._raw(stream, self.world_size * nw, rng)
        produced, corrupt = skip, 0
        for _ in range(skip):
            next(raw)
        while produced < quota:
            sample = next(raw)
            try:
                img = decode_image(sample, self.mode)
                label = decode_label(sample)
            except Exception as e:  # noqa: BLE001 - any decoder failure means "skip this sample"
                corrupt += 1
                warnings.warn(f"skipping sample {sample.get('__key__')!r}: {type(e).__name__}: {e}")
                continue
            produced += 1
            yield self.transform(img), label, corrupt
            corrupt = 0


class WebDatasetLoader(ResumableEpochs):
    """Multi-crop batches `(views, labels)` from WebDataset shards (PIL path, CPU tensors)."""

    def __init__(self, urls: str, preset: MultiCropPreset, *, rank: int, world_size: int, seed: int,
                 batch_size: int, num_workers: int, shuffle_buffer: int = 2000,
                 num_samples: Optional[int] = None, transform: Optional[Callable] = None) -> None:
        super().__init__()
        self.shards = expand_shards(urls)
        total = manifest_count(urls, self.shards)
        if total is None:  # no manifest: one pass over the tar headers
            total = count_samples(self.shards)
        if num_samples is not None:
            total = min(total, num_samples)
        self.num_samples = total
        self.preset, self.rank, self.world_size, self.seed = preset, rank, world_size, seed
        self.batch_size, self.num_workers, self.shuffle_buffer = batch_size, num_workers, shuffle_buffer
        self.transform = transform if transform is not None else build_pil_multicrop(preset)
        self._len = batches_per_epoch(total, world_size, batch_size)
        self.stats = {"corrupt_skipped": 0}

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        start = self._begin()
        ds = _ShardStream(self.shards, rank=self.rank, world_size=self.world_size, seed=self.seed,
                          epoch=self.epoch, num_batches=self._len, batch_size=self.batch_size,
                          skip_batches=start, shuffle_buffer=self.shuffle_buffer, transform=self.transform,
                          mode=pil_mode(self.preset))
        gen = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch, self.rank, start))
        loader = DataLoader(ds, batch_size=self.batch_size, num_workers=self.num_workers,
                            worker_init_fn=_seed_worker, generator=gen)
        for views, labels, corrupt in loader:
            self.stats["corrupt_skipped"] += int(corrupt.sum())
            self._count()
            yield views, labels
        self._skip = 0


class ShardIndexDataset(Dataset):
    """Random access into shards (for evaluation): one header scan, then seek + read per sample."""

    def __init__(self, urls: str, mode: str = "RGB", transform: Optional[Callable] = None) -> None:
        self.mode, self.transform = mode, transform
        self.items: list[tuple[str, int, int, int]] = []  # (shard, offset, size, label)
        for shard in expand_shards(urls):
            try:
                with tarfile.open(shard, mode="r:") as tar:
                    members: dict[str, dict[str, tarfile.TarInfo]] = {}
                    for m in tar.getmembers():
                        if m.isfile():
                            stem, _, ext = os.path.basename(m.name).partition(".")
                            members.setdefault(os.path.join(os.path.dirname(m.name), stem), {})[ext.lower()] = m
                    for parts in members.values():
                        img = next((parts[e] for e in IMAGE_EXTS if e in parts), None)
                        if img is None or "cls" not in parts:
                            continue
                        f = tar.extractfile(parts["cls"])
                        label = int(f.read().decode().strip()) if f is not None else -1
                        self.items.append((shard, img.offset_data, img.size, label))
            except (OSError, tarfile.TarError) as e:
                raise RuntimeError(f"cannot read shard {shard!r}: {e}") from e

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        shard, offset, size, label = self.items[i]
        with open(shard, "rb") as f:
            f.seek(offset)
            img = Image.open(io.BytesIO(f.read(size)))
            img.load()
        img = img.convert(self.mode)
        return (self.transform(img) if self.transform else img), label
