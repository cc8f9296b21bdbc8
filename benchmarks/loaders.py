"""Loader throughput: images/s of the multi-crop loaders over the same JPEG data and workers.

    python -m benchmarks.loaders [--images 512] [--workers 2] [--batch 32] [--device cpu]

(a) WebDataset shards + PIL multi-crop (lightly DINOTransform), (b) FFCV .beton multi-crop (FFCV
decode/crop/flip, photometric batched on --device), (c) torchvision ImageFolder + the same PIL
multi-crop, (d) ``tensor``: TensorMultiCrop on --device over uint8 images already in memory (no decoding:
the augmentation alone). A loader that cannot run here (FFCV not installed) is recorded as skipped.
Data: real Fashion-MNIST images (sklearn's digits where Fashion-MNIST is not installed), converted once per
resolution with the conversion CLI to RGB JPEGs (quality 90) at 32 px (cifar preset: 2x32 + 6x32 views)
and 224 px (default preset: 2x224 + 6x96 views). FFCV's one-time numba compilation is timed separately
(warm-up epoch), then every loader is timed over whole epochs. Writes loaders.json and loaders.png into --out
(default runs/bench/loaders; the committed ones: --out benchmarks/results).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from benchmarks import common
from hypersolid_scale.data import DataConfig, build_train_loader
from hypersolid_scale.data.convert import main as convert
from hypersolid_scale.safety import atomic

if TYPE_CHECKING:
    from hypersolid_scale.data.formats.ffcv.loader import FFCVLoader

SETUPS = {32: "cifar", 224: "default"}


def ffcv_missing() -> str | None:
    """Why FFCV cannot run here (None when it imports)."""
    try:
        import ffcv  # noqa: F401
    except Exception as err:  # noqa: BLE001 - ImportError, or a missing system library (OSError)
        return f"ffcv does not import: {type(err).__name__}: {err}"
    return None


def _has_section(fmt: str) -> bool:
    """The DataConfig has format ``fmt``'s own section (data.<fmt>.*); earlier versions had flat fields."""
    return any(f.name == fmt for f in dataclasses.fields(DataConfig))


def option_key(fmt: str, key: str) -> str:
    """The config key of format ``fmt``'s option ``key``: ``data.<fmt>.<key>``, or in earlier versions (which
    the photo benchmarks also run) its flat name (``data.shuffle_buffer``, ``data.ffcv_order``)."""
    return f"data.{fmt}.{key}" if _has_section(fmt) else f"data.{'ffcv_' if fmt == 'ffcv' else ''}{key}"


def format_options(fmt: str, **values: Any) -> dict[str, Any]:
    """DataConfig keywords giving format ``fmt`` these options (its section, or the flat fields of earlier
    versions; see ``option_key``)."""
    if _has_section(fmt):
        return {fmt: dataclasses.replace(getattr(DataConfig(), fmt), **values)}
    return {option_key(fmt, k).removeprefix("data."): v for k, v in values.items()}


def builtin_source() -> str:
    """Fashion-MNIST where its files are installed, else sklearn's digits (bundled with scikit-learn)."""
    from hypersolid_scale.data.loading.builtin_sets import load_builtin

    try:
        load_builtin("fashion_mnist", "train")
        return "fashion_mnist"
    except Exception:  # noqa: BLE001 - not installed on this machine
        return "digits"


def prepare(cache: Path, size: int, images: int, source: str, with_ffcv: bool) -> Path:
    out = cache / f"{source}_{size}px_{images}{'_ffcv' if with_ffcv else ''}"
    if not (out / "manifest.json").is_file():
        formats = "webdataset,ffcv,imagefolder" if with_ffcv else "webdataset,imagefolder"
        convert(
            [
                "--builtin",
                source,
                "--out",
                str(out),
                "--limit",
                str(images),
                "--mode",
                "RGB",
                "--resize",
                str(size),
                "--image-format",
                "jpg",
                "--formats",
                formats,
                "--ffcv-mode",
                "jpg",
                "--shard-size",
                "128",
            ]
        )
    return out


def time_tensor_path(size: int, images: int, batch: int, device: torch.device, epochs: int) -> dict:
    """TensorMultiCrop (crop + flip + photometric, batched on `device`) over uint8 images already in memory."""
    from hypersolid_scale.data.augment.presets import PRESETS
    from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop

    g = torch.Generator(device=device).manual_seed(0)
    src = 256 if size == 224 else size  # ImageNet-style: crops of slightly larger images
    x = torch.randint(0, 256, (images, 3, src, src), dtype=torch.uint8, generator=g, device=device)
    mc = TensorMultiCrop(PRESETS[SETUPS[size]], device, seed=0)
    mc(x[:batch], torch.arange(batch, device=device), 0)  # warm-up
    n, t0 = 0, time.perf_counter()
    for epoch in range(1, epochs + 1):
        for start in range(0, images - batch + 1, batch):
            mc(x[start : start + batch], torch.arange(start, start + batch, device=device), epoch)
            n += batch
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {"images_per_s": n / elapsed, "images": n, "seconds": elapsed, "build_s": 0.0, "warmup_s": 0.0}


def time_loader(cfg: DataConfig, device: torch.device, epochs: int) -> dict:
    t0 = time.perf_counter()
    loader = build_train_loader(cfg, rank=0, world_size=1, seed=0, device=device)
    build_s = time.perf_counter() - t0
    warm = 0.0
    if cfg.format == "ffcv":  # first epoch compiles the pipelines with numba
        t0 = time.perf_counter()
        for _ in loader:
            pass
        warm = time.perf_counter() - t0
    n, t0 = 0, time.perf_counter()
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        for _views, labels in loader:
            n += len(labels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    out = {"images_per_s": n / elapsed, "images": n, "seconds": elapsed, "build_s": build_s, "warmup_s": warm}
    if cfg.format == "ffcv":
        # FFCV's own share (decode + per-view crop + flip), without the photometric step that the
        # loader runs batched on `device`: what FFCV delivers when that step lives on a GPU.
        n_raw, t0 = 0, time.perf_counter()
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            for _views, labels, _ in cast(FFCVLoader, loader).raw_batches():
                n_raw += len(labels)
        out["decode_crop_flip_images_per_s"] = n_raw / (time.perf_counter() - t0)
    return out


def plot(results: list[dict], path: Path) -> None:
    sizes = sorted({r["size"] for r in results}) or [224]  # nothing ran: an empty panel, still a plot
    names = list(LOADERS)
    with common.figure(path, 120, 1, len(sizes), figsize=(5 * len(sizes), 3.5)) as (_, axes):
        for ax, size in zip(axes if len(sizes) > 1 else [axes], sizes):
            vals = [
                next((r["images_per_s"] for r in results if r["size"] == size and r["loader"] == n), 0) for n in names
            ]
            raw = next(
                (
                    r.get("decode_crop_flip_images_per_s", 0)
                    for r in results
                    if r["size"] == size and r["loader"] == "ffcv"
                ),
                0,
            )
            ax.bar(names, vals, color=["tab:blue", "tab:orange", "tab:green", "tab:purple"])
            ax.bar(
                ["ffcv"], [raw], color="none", edgecolor="tab:orange", hatch="//", label="ffcv decode+crop+flip only"
            )
            ax.legend(fontsize=7)
            ax.set_title(f"{size} px ({SETUPS[size]} preset, 8 views)")
            ax.tick_params(axis="x", labelsize=7)
            ax.set_ylabel("images / s")
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")


LOADERS = ("webdataset+PIL", "ffcv", "imagefolder+PIL", "tensor")


def main(argv: list[str] | None = None) -> None:
    p = common.parser(__doc__)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--sizes", default="32,224")
    p.add_argument(
        "--loaders",
        default=",".join(LOADERS),
        help=f"comma-separated subset of {LOADERS}; "
        "tensor = TensorMultiCrop on --device over uint8 images in memory (no decoding)",
    )
    p.add_argument(
        "--source",
        default="auto",
        choices=["auto", "fashion_mnist", "digits"],
        help="builtin images to convert (auto: fashion_mnist if installed, else digits)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the main process")
    common.add_device(p, choices=None)
    p.add_argument("--cache", default=os.environ.get("HS_BENCH_CACHE", "/tmp/hs_bench_loaders"))
    common.add_out(p, "loaders", what="folder for loaders.json and loaders.png")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    # One intra-op thread in the main process (what each of 2 trainer processes on 2 cores would use):
    # more threads than free cores make torch's batched ops on the CPU spin rather than work.
    torch.set_num_threads(args.threads)
    wanted = args.loaders.split(",")
    unknown = sorted(set(wanted) - set(LOADERS))
    if unknown:
        raise SystemExit(f"unknown loader(s) {unknown}; choose among {LOADERS}")
    no_ffcv = ffcv_missing() if "ffcv" in wanted else "not requested"
    source = builtin_source() if args.source == "auto" else args.source
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        shared = dict(preset=SETUPS[size], batch_size_per_gpu=args.batch, num_workers=args.workers)
        root: Any = None  # a Path when a file-based loader is wanted
        if set(wanted) - {"tensor"}:
            root = prepare(Path(args.cache), size, args.images, source, with_ffcv=no_ffcv is None)
        for name in wanted:
            head = dict(loader=name, size=size, preset=SETUPS[size])
            if name == "ffcv" and no_ffcv is not None:
                print(f"{size:4d}px {name:16s} skipped: {no_ffcv}", flush=True)
                results.append({**head, "skipped": no_ffcv})
                continue
            try:
                if name == "tensor":
                    r = time_tensor_path(size, args.images, args.batch, device, args.epochs)
                else:
                    if name == "webdataset+PIL":
                        options = format_options("webdataset", shuffle_buffer=256)
                        cfg = DataConfig(format="webdataset", path=str(root), **options, **shared)
                    elif name == "ffcv":
                        cfg = DataConfig(
                            format="ffcv", path=str(root), **format_options("ffcv", order="random"), **shared
                        )
                    elif name == "imagefolder+PIL":
                        cfg = DataConfig(format="imagefolder", path=str(root / "folder"), **shared)
                    else:
                        raise KeyError(name)
                    r = time_loader(cfg, device, args.epochs)
            except Exception as err:  # noqa: BLE001 - one loader's failure must not end the others
                results.append({**head, "skipped": f"failed: {type(err).__name__}: {str(err)[-300:]}"})
                print(f"{size:4d}px {name:16s} skipped: {results[-1]['skipped']}", flush=True)
                continue
            r.update(head)
            extra = (
                f", decode+crop+flip only {r['decode_crop_flip_images_per_s']:.1f}/s"
                if "decode_crop_flip_images_per_s" in r
                else ""
            )
            print(
                f"{size:4d}px {name:16s} {r['images_per_s']:8.1f} images/s{extra}  "
                f"(build {r['build_s']:.1f}s, warm-up {r['warmup_s']:.1f}s)",
                flush=True,
            )
            results.append(r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = common.metadata(
        device,
        workers=args.workers,
        torch_threads=args.threads,
        batch=args.batch,
        images=args.images,
        source=source,
        load_avg_at_end=os.getloadavg(),
    )
    atomic.write_text((out / "loaders.json"), json.dumps({"meta": meta, "results": results}, indent=2))
    plot([r for r in results if "images_per_s" in r], out / "loaders.png")
    print(f"wrote {out / 'loaders.json'} and {out / 'loaders.png'}")


if __name__ == "__main__":
    main()
