"""Multi-crop loaders on photographs: images/s and host CPU seconds per image, ImageNet-sized JPEGs.

    python -m benchmarks.photo_loaders [--device cpu|cuda] [--workers 2] [--images 5120] [--local-views 6 10]

Data: the photo set of benchmarks.photo_set (built once into --cache; from --sources-npz where given).
Rows, each for 2 x 224 + N x 96 views (N = --local-views, default preset), on the set's WebDataset shards:

* ``pil``: data.views_on=workers, PIL decode + lightly's multi-crop in the DataLoader workers;
* ``device``: data.views_on=device, data.jpeg_decoder=device: workers read bytes and draw the crop parameters,
  the JPEG is decoded on --device, all views cut from that one decode, photometric batched on --device;
* ``device_workers_jpeg``: data.views_on=device, data.jpeg_decoder=workers (JPEG decoded in the workers);
* ``ffcv``: the set's .beton (FFCV decode + crop, photometric on --device), where ffcv imports;
* ``device_imagefolder``: as ``device``, on the set's image folder.

Each row is timed over --images images after its first batch (workers up, FFCV compiled). Host CPU seconds
per image = (CPU of the DataLoader workers + CPU of this process - the device stage's own CPU when the
device is the CPU) / images: on a CPU "device" that stage is the device's work, not the host's. A row the
code here cannot run (data.views_on not there yet, ffcv missing) records `skipped: <reason>`.
Writes photo_loaders.json and photo_loaders.png into --out (default runs/bench/photo_loaders).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs installed
import torch

from benchmarks import common
from benchmarks.common import RESULTS, sync
from benchmarks.loaders import ffcv_missing, format_options
from benchmarks.photo_set import IMAGENET_MEAN_KB, build
from hypersolid_scale.data import DataConfig, build_train_loader
from hypersolid_scale.safety import atomic

ROWS = ("pil", "device", "device_workers_jpeg", "ffcv", "device_imagefolder")
DEFAULT_SOURCES = RESULTS / "photo_sources.npz"


def views_key() -> str | None:
    """The DataConfig field saying where the views are made: views_on (named decode in earlier versions); None
    in versions before the device path."""
    names = {f.name for f in dataclasses.fields(DataConfig)}
    return next((k for k in ("views_on", "decode") if k in names and "jpeg_decoder" in names), None)


def decode_missing() -> str | None:
    """Why the device rows cannot run with this DataConfig (None when data.views_on exists)."""
    return None if views_key() else "data.views_on not available"


def prepare_set(cache: Path, n: int, sources_npz: str | None, ffcv: bool = False) -> Path:
    """The photo set of `n` images under `cache`, built once (a partial build is removed and redone); `ffcv`:
    with its .beton where ffcv imports (a set built without one is rebuilt)."""
    out = cache / f"photos_{n}_seed0"
    with_beton = ffcv and ffcv_missing() is None
    if not (out / "photo_set.json").is_file() or (with_beton and not (out / "train.beton").is_file()):
        shutil.rmtree(out, ignore_errors=True)
        build(str(out), n, seed=0, sources_npz=sources_npz, ffcv=with_beton)
    return out


def cpu_seconds() -> tuple[float, float]:
    """(this process, its child processes) user + system CPU seconds. Children = the live ones plus those
    already waited for (the kernel adds those to children_user/children_system): a worker that ends between
    two samples is counted in both, once."""
    me = psutil.Process()
    t = me.cpu_times()
    kids = t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            kids += c.user + c.system
        except psutil.Error:  # ended between the listing and the read
            pass
    return t.user + t.system, kids


def time_row(cfg: DataConfig, device: torch.device, images: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    loader = build_train_loader(cfg, rank=0, world_size=1, seed=0, device=device)
    it = iter(loader)
    next(it)  # workers up (and FFCV's pipelines compiled): not timed
    sync(device)
    first_s = time.perf_counter() - t0
    stage0 = float(getattr(loader, "device_stage_cpu_s", 0.0))
    main0, kids0 = cpu_seconds()
    n, epoch, t0 = 0, 0, time.perf_counter()
    while n < images:
        try:
            _views, labels = next(it)
        except StopIteration:  # a set smaller than --images: go on with the next epoch (its workers counted)
            epoch += 1
            loader.set_epoch(epoch)
            it = iter(loader)
            continue
        n += len(labels)
    sync(device)
    elapsed = time.perf_counter() - t0
    main1, kids1 = cpu_seconds()  # before the iterator closes: its workers are still alive
    stage = float(getattr(loader, "device_stage_cpu_s", 0.0)) - stage0
    del it
    host = (kids1 - kids0) + (main1 - main0) - (stage if device.type == "cpu" else 0.0)
    return {
        "images": n,
        "seconds": elapsed,
        "images_per_s": n / elapsed,
        "host_cpu_ms_per_image": 1000 * host / n,
        "workers_cpu_ms_per_image": 1000 * (kids1 - kids0) / n,
        "main_cpu_ms_per_image": 1000 * (main1 - main0) / n,
        "device_stage_cpu_ms_per_image": 1000 * stage / n,
        "first_batch_s": first_s,
        "epochs_started": epoch + 1,
    }


def row_config(row: str, root: Path, local: int, args: argparse.Namespace) -> DataConfig:
    shared: dict[str, Any] = dict(
        preset="default", num_local_views=local, batch_size_per_gpu=args.batch, num_workers=args.workers
    )
    shards: dict[str, Any] = dict(
        format="webdataset", path=str(root), **format_options("webdataset", shuffle_buffer=256)
    )
    if row == "pil":
        return DataConfig(**shards, **shared)
    if row == "ffcv":
        return DataConfig(format="ffcv", path=str(root), **format_options("ffcv", order="random"), **shared)
    shared[views_key() or "views_on"] = "device"
    shared["jpeg_decoder"] = "workers" if row == "device_workers_jpeg" else "device"
    if row == "device_imagefolder":
        return DataConfig(format="imagefolder", path=str(root / "imagefolder"), **shared)
    return DataConfig(**shards, **shared)


def plot(results: list[dict], path: Path) -> None:
    setups = sorted({r["setup"] for r in results})
    with common.figure(path, 110, 1, 2, figsize=(11, 3.8)) as (fig, axes):
        width = 0.8 / max(1, len(setups))
        for k, (key, label) in enumerate(
            (("images_per_s", "images / s"), ("host_cpu_ms_per_image", "host CPU ms / image"))
        ):
            ax = axes[k]
            for j, setup in enumerate(setups):
                vals = [
                    next((r.get(key, 0) for r in results if r["row"] == n and r["setup"] == setup), 0) for n in ROWS
                ]
                xs = [i + (j - (len(setups) - 1) / 2) * width for i in range(len(ROWS))]
                ax.bar(xs, vals, width, label=setup)
                for x, v in zip(xs, vals):
                    ax.text(
                        x, v, f"{v:.0f}" if key == "images_per_s" else f"{v:.1f}", ha="center", va="bottom", fontsize=6
                    )
            ax.set_xticks(range(len(ROWS)), ROWS, fontsize=7, rotation=15)
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        fig.suptitle("multi-crop loaders on the photo set (missing bar: skipped)", fontsize=9)


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    common.add_device(p)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--images", type=int, default=5120, help="images timed per row, after the first batch")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--local-views", type=int, nargs="+", default=[6, 10])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--set-images", type=int, default=None, help="images in the set (default: --images + 6 batches)")
    p.add_argument("--sources-npz", default=str(DEFAULT_SOURCES) if DEFAULT_SOURCES.is_file() else None)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of this process")
    p.add_argument("--cache", default=os.environ.get("HS_BENCH_CACHE", "/tmp/hs_bench_photos"))
    common.add_out(p, "photo_loaders")
    args = p.parse_args(argv)
    common.check_device(args.device)
    device = torch.device(args.device)
    # One intra-op thread, as data/loading/random_access.py: on shared cores more threads spin rather than work.
    torch.set_num_threads(args.threads)
    t_set = time.perf_counter()
    n_set = args.set_images or args.images + 6 * args.batch
    root = prepare_set(Path(args.cache), n_set, args.sources_npz, ffcv="ffcv" in args.rows)
    photo_set = json.loads((root / "photo_set.json").read_text())
    photo_set.pop("qualities", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = common.metadata(
        device,
        workers=args.workers,
        batch=args.batch,
        images_timed=args.images,
        set_seconds=time.perf_counter() - t_set,
        set_mean_kb=photo_set["mean_kb"],
        imagenet_mean_kb=IMAGENET_MEAN_KB,
        photo_set=photo_set,
        host_cpu="workers' + this process's CPU s / image, less the device stage's own when --device cpu",
    )
    reasons = {"ffcv": ffcv_missing()}
    for row in ("device", "device_workers_jpeg", "device_imagefolder"):
        reasons[row] = decode_missing()
    results: list[dict] = []
    for local in args.local_views:
        setup = f"2x224+{local}x96"
        for row in args.rows:
            head = {"row": row, "setup": setup, "source": str(root)}
            if reasons.get(row):
                results.append({**head, "skipped": reasons[row]})
            else:
                try:
                    results.append({**head, **time_row(row_config(row, root, local, args), device, args.images)})
                except Exception as err:  # noqa: BLE001 - one row's failure must not end the others
                    results.append({**head, "skipped": f"failed: {type(err).__name__}: {str(err)[-300:]}"})
            r = results[-1]
            shown = (
                f"{r['images_per_s']:8.1f} img/s  host CPU {r['host_cpu_ms_per_image']:6.2f} ms/img "
                f"(workers {r['workers_cpu_ms_per_image']:.2f}, main {r['main_cpu_ms_per_image']:.2f}, "
                f"device stage {r['device_stage_cpu_ms_per_image']:.2f})"
                if "images_per_s" in r
                else f"skipped: {r['skipped']}"
            )
            print(f"{setup:12s} {row:20s} {shown}", flush=True)
            # Written after every row: a run cut short by a time limit keeps what it measured.
            atomic.write_text((out / "photo_loaders.json"), json.dumps({"meta": meta, "results": results}, indent=1))
    for local in args.local_views:
        rows = {r["row"]: r for r in results if r["setup"] == f"2x224+{local}x96" and "images_per_s" in r}
        if "pil" in rows and "device" in rows:
            meta[f"device_vs_pil_host_cpu_{local}"] = (
                rows["device"]["host_cpu_ms_per_image"] / rows["pil"]["host_cpu_ms_per_image"]
            )
    atomic.write_text((out / "photo_loaders.json"), json.dumps({"meta": meta, "results": results}, indent=1))
    plot([r for r in results if "images_per_s" in r], out / "photo_loaders.png")
    print(f"set: mean {photo_set['mean_kb']:.1f} KB per JPEG (ImageNet ~{IMAGENET_MEAN_KB:.0f} KB)")
    print(f"wrote {out / 'photo_loaders.json'} and {out / 'photo_loaders.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
