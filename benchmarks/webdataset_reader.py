"""WebDataset reader throughput: the former hand-written tarfile loop vs the `webdataset` library pipeline.

    python -m benchmarks.webdataset_reader [--images 1600] [--multicrop-images 768] [--workers 2]
                                           [--batch 64] [--repeats 3]

Same shards (real Fashion-MNIST images converted with the conversion CLI to RGB JPEGs at 32 px, 500 per
shard), same preset (cifar: 2x32 + 6x32 views, lightly's DINOTransform), same workers and batch size, one
epoch each (--multicrop-images of them with the multi-crop, all --images decode-only). Two transforms:
the full multi-crop (what training pays) and "decode only" (image -> tensor, which exposes the reader's
own cost). The library path is also timed with every shard streamed through `pipe:cat` (what
`pipe:aws s3 cp ... -` costs on top of the network). images/s counts the epoch's images over the time
from the first batch to the last (worker start-up left out; it is reported separately). Best of
--repeats, run interleaved. Writes webdataset_reader.json and webdataset_reader.png into --out (default
runs/bench/webdataset_reader; the committed ones: --out benchmarks/results).

The former reader is kept here only, as it was before the library pipeline replaced it
(`git show 262c4c4:hypersolid_scale/data/webdataset.py`): one tarfile stream per shard, its own shuffle
buffer, the same (rank, worker) streams and quotas.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from benchmarks import common
from hypersolid_scale.data.augment.presets import PRESETS
from hypersolid_scale.data.augment.transforms import build_pil_multicrop
from hypersolid_scale.data.convert import main as convert
from hypersolid_scale.data.formats.webdataset.stream import WebDatasetLoader, decode_image, decode_label
from hypersolid_scale.data.loading.common import mix_seed
from hypersolid_scale.data.loading.random_access import _seed_worker
from hypersolid_scale.safety import atomic

PRESET = PRESETS["cifar"]


# --- the former reader (copied, trimmed to what one epoch from the start needs) ----------------------
def old_iter_shard(path: str) -> Iterator[dict[str, Any]]:
    with tarfile.open(path, mode="r|*") as tar:
        current: dict[str, Any] = {}
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


class OldShardStream(IterableDataset):
    def __init__(
        self,
        shards: list[str],
        *,
        num_batches: int,
        batch_size: int,
        shuffle_buffer: int,
        transform: Callable,
        seed: int = 0,
        epoch: int = 0,
    ) -> None:
        super().__init__()
        self.shards, self.num_batches, self.batch_size = shards, num_batches, batch_size
        self.shuffle_buffer, self.transform, self.seed, self.epoch = shuffle_buffer, transform, seed, epoch

    def _shuffled(self, it: Iterator, rng: random.Random) -> Iterator:
        buf: list = []
        for sample in it:
            if len(buf) < self.shuffle_buffer:
                buf.append(sample)
                continue
            j = rng.randrange(len(buf))
            buf[j], sample = sample, buf[j]
            yield sample
        rng.shuffle(buf)
        yield from buf

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        quota = len(range(wid, self.num_batches, nw)) * self.batch_size
        shards = list(self.shards)
        random.Random(mix_seed(self.seed, self.epoch)).shuffle(shards)
        rng = random.Random(mix_seed(self.seed, self.epoch, 0, wid))
        mine = shards[wid::nw] if len(shards) >= nw else shards
        produced = 0
        while produced < quota:
            order = list(mine)
            rng.shuffle(order)
            for sample in self._shuffled((s for sh in order for s in old_iter_shard(sh)), rng):
                img, label = decode_image(sample, "RGB"), decode_label(sample)
                yield self.transform(img), label, 0
                produced += 1
                if produced == quota:
                    return


# --- timing -------------------------------------------------------------------------------------------
def to_tensor(img: Image.Image) -> torch.Tensor:
    return torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)


def time_epoch(batches: Iterator) -> tuple[float, float, int]:
    """(start-up s, first-to-last batch s, images after the first batch)."""
    t0 = time.perf_counter()
    first = next(batches)
    t1 = time.perf_counter()
    n = 0
    for b in batches:
        n += len(b[1])
    del first
    return t1 - t0, time.perf_counter() - t1, n


def run(
    reader: str, urls: str, shards: list[str], transform: Callable, args: argparse.Namespace, n_batches: int
) -> tuple[float, float, int]:
    """One epoch of n_batches (the loader's data.max_pretrain_samples cap) with `reader`."""
    if reader == "former tarfile loop":
        ds = OldShardStream(
            shards, num_batches=n_batches, batch_size=args.batch, shuffle_buffer=args.shuffle, transform=transform
        )
        gen = torch.Generator().manual_seed(0)
        dl = DataLoader(ds, batch_size=args.batch, num_workers=args.workers, worker_init_fn=_seed_worker, generator=gen)
        return time_epoch(iter(dl))
    ld = WebDatasetLoader(
        urls,
        PRESET,
        rank=0,
        world_size=1,
        seed=0,
        batch_size=args.batch,
        num_workers=args.workers,
        shuffle_buffer=args.shuffle,
        transform=transform,
        num_samples=n_batches * args.batch,
        manifest=str(Path(shards[0]).parents[1] / "manifest.json"),
    )
    assert len(ld) == n_batches
    return time_epoch(iter(ld))


def plot(results: list[dict], path: Path) -> None:
    modes = sorted({r["transform"] for r in results}, reverse=True)
    with common.figure(path, 120, 1, len(modes), figsize=(5 * len(modes), 3.2)) as (fig, axes):
        for ax, mode in zip(axes, modes):
            rows = [r for r in results if r["transform"] == mode]
            ax.barh(
                [f"{r['reader']}\n({r['source']})" for r in rows],
                [r["images_per_s"] for r in rows],
                color=["#888888" if r["reader"].startswith("former") else "#3070b0" for r in rows],
            )
            ax.set_title(f"{mode}")
            ax.set_xlabel("images/s (higher is better)")
            ax.invert_yaxis()
        fig.suptitle("WebDataset reader, 2 workers, cifar preset, 32 px JPEG shards")


def main() -> int:
    p = common.parser(__doc__)
    p.add_argument("--images", type=int, default=1600, help="images converted; the decode-only epoch")
    p.add_argument("--multicrop-images", type=int, default=768, help="the multi-crop epoch (slow: PIL)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--shuffle", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    common.add_out(p, "webdataset_reader")
    args = p.parse_args()
    torch.set_num_threads(1)  # the main process only collates; the workers do the work
    with tempfile.TemporaryDirectory(prefix="wds-bench-") as tmp:
        root = Path(tmp) / "data"
        convert(
            [
                "--builtin",
                "fashion_mnist",
                "--out",
                str(root),
                "--formats",
                "webdataset",
                "--limit",
                str(args.images),
                "--mode",
                "RGB",
                "--resize",
                "32",
                "--image-format",
                "jpg",
                "--shard-size",
                "500",
            ]
        )
        shards = sorted(str(s) for s in (root / "train").glob("*.tar"))
        n_batches = args.images // args.batch
        brace = f"{root}/train/shard-{{000000..{len(shards) - 1:06d}}}.tar"
        setups = [
            ("former tarfile loop", "local files", str(root / "train")),
            ("webdataset library", "local files", str(root / "train")),
            ("webdataset library", "pipe:cat", f"pipe:cat {brace}"),
        ]
        transforms: dict[str, Callable[..., Any]] = {
            "multi-crop": build_pil_multicrop(PRESET),
            "decode only": to_tensor,
        }
        results = []
        for mode, transform in transforms.items():
            # Repeats interleaved (A B C A B C ...): a machine whose load changes affects every reader alike.
            runs: dict[int, list[tuple[float, float, int]]] = {i: [] for i in range(len(setups))}
            batches = n_batches if mode == "decode only" else max(2, args.multicrop_images // args.batch)
            for _ in range(args.repeats):
                for i, (reader, _, urls) in enumerate(setups):
                    runs[i].append(run(reader, urls, shards, transform, args, batches))
            for i, (reader, source, _) in enumerate(setups):
                startup, seconds, n = min(runs[i], key=lambda t: t[1] / max(t[2], 1))
                results.append(
                    {
                        "reader": reader,
                        "source": source,
                        "transform": mode,
                        "images": n,
                        "seconds": round(seconds, 3),
                        "startup_s": round(startup, 3),
                        "images_per_s": round(n / seconds, 1),
                        "all_images_per_s": [round(r[2] / r[1], 1) for r in runs[i]],
                    }
                )
                print(f"{mode:12s} {reader:20s} {source:12s} {n / seconds:9.0f} img/s  (start-up {startup:.2f} s)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import webdataset

    report = {
        "config": {
            "images": args.images,
            "multicrop_images": args.multicrop_images,
            "workers": args.workers,
            "batch": args.batch,
            "shuffle_buffer": args.shuffle,
            "preset": PRESET.name,
            "image": "32 px RGB JPEG q90",
            "shard_size": 500,
            "repeats": args.repeats,
        },
        "machine": common.metadata("cpu", webdataset=webdataset.__version__),
        "results": results,
    }
    atomic.write_text((out / "webdataset_reader.json"), json.dumps(report, indent=2))
    plot(results, out / "webdataset_reader.png")
    print(f"wrote {out / 'webdataset_reader.json'} and {out / 'webdataset_reader.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
