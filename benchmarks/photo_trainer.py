"""The trainer end to end on photographs: JPEG shards through the loader against synthetic tensors.

    python -m benchmarks.photo_trainer --device cuda [--budget-s 60]     # ResNet-50, B=128, bf16
    python -m benchmarks.photo_trainer --device cpu --quick              # ResNet-18, tiny crops, few steps

Variants, the same model, optimizer and step (the trainer's ``build`` + ``train_step``, configs/imagenet1k.yaml,
2 x 224 + 6 x 96 views; bf16 autocast on CUDA, as the trainer decides):

* ``synthetic``: views augmented from uint8 tensors already in device memory (what train_throughput.py
  times): the step alone, the ceiling;
* ``jpeg_device``: the trainer's own loader over the photo set's WebDataset shards with data.views_on=device
  (JPEG decoded and cropped on the device); skipped where data.views_on does not exist;
* ``jpeg_pil``: the same shards with data.views_on=workers (PIL decode + multi-crop in the workers).

Each variant gets an equal share of --budget-s: warm-up steps, then timed steps until its share is spent.
``ratio_<variant>`` = its images/s / synthetic's (target for jpeg_device: >= 0.9). Writes
photo_trainer.json and photo_trainer.png into --out (default runs/bench/photo_trainer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.loaders import option_key
from benchmarks.photo_loaders import DEFAULT_SOURCES, decode_missing, prepare_set, views_key
from benchmarks.train_throughput import DeviceImages, make_config
from hypersolid_scale.data.augment.presets import resolve_preset
from hypersolid_scale.distributed import WorldInfo
from hypersolid_scale.safety import atomic
from hypersolid_scale.training import trainer

VARIANTS = ("synthetic", "jpeg_device", "jpeg_pil")


def run_variant(variant: str, args: argparse.Namespace, root: Path, device: torch.device, share_s: float) -> dict:
    extra = list(args.override)
    if args.quick:  # the same code on a small model and small crops
        extra += ["model.arch=resnet18", "data.global_crop_size=32", "data.local_crop_size=16"]
    if variant != "synthetic":
        extra += [
            f"data.path={root}",
            f"data.num_workers={args.workers}",
            f"{option_key('webdataset', 'shuffle_buffer')}=256",
        ]
        if not decode_missing():  # before data.views_on (data.decode) existed, the workers path was the only one
            extra.append(f"data.{views_key()}={'device' if variant == 'jpeg_device' else 'workers'}")
    cfg = make_config("imagenet", args.batch, device, extra)
    trainer.seed_everything(cfg.seed, cfg.deterministic)
    info = WorldInfo(0, 1, 0, "single")
    if variant == "synthetic":
        preset = resolve_preset(cfg.data)
        size = max(preset.global_crop_size, 32) if args.quick else 256
        data = DeviceImages(preset, max(4 * args.batch, args.batch + 1), size, args.batch, device, channels_last=False)
        from hypersolid_scale.training import run_builder

        original = run_builder.build_train_loader
        run_builder.build_train_loader = lambda *a, **k: data  # the only replaced piece: the data source
        try:
            run = trainer.build(cfg, info, device)
        finally:
            run_builder.build_train_loader = original

        def step(i: int) -> torch.Tensor:
            return trainer.train_step(run, data.views(i), i)["loss"]

    else:
        run = trainer.build(cfg, info, device)
        batches: dict[str, Any] = {"epoch": 0, "it": iter(run.loader)}

        def step(i: int) -> torch.Tensor:
            try:
                views, _ = next(batches["it"])
            except StopIteration:  # the set is small in --quick: the next epoch
                batches["epoch"] += 1
                run.loader.set_epoch(batches["epoch"])
                batches["it"] = iter(run.loader)
                views, _ = next(batches["it"])
            views = [v.to(device, non_blocking=True) for v in views]  # as the trainer's loop does
            return trainer.train_step(run, views, i)["loss"]

    t = common.timed_loop(
        step, device, warmup=args.warmup, seconds=share_s, max_steps=args.max_steps, sync_every=4
    )  # warm-up, then steps until share_s seconds are spent (at least one, at most max_steps)
    out: dict[str, Any] = {**t.rates(args.batch), "last_loss": float(t.last)}
    out.update(bf16=bool(run.bf16), arch=cfg.model.arch)
    return out


def plot(res: dict, path: Path) -> None:
    names = [n for n in VARIANTS if "images_per_s" in res["variants"].get(n, {})]
    vals = [res["variants"][n]["images_per_s"] for n in names]
    with common.figure(path, 100, figsize=(5, 3.5)) as (_, ax):
        ax.bar(names, vals, color=["tab:gray", "tab:blue", "tab:orange"][: len(names)])
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in res.items() if k.startswith("ratio_"))
        ax.set_title(f"trainer, {res['arch']} B={res['batch']} {res['views']}\n{ratios}", fontsize=8)
        ax.set_ylabel("images / s")


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__)
    common.add_device(ap)
    common.add_quick(ap, "ResNet-18, 32/16 px crops, batch 4, 1 + 2 steps")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--batch", type=int, default=None, help="default 128 (quick: 4)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=60.0, help="split equally over the variants")
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (quick: 1)")
    ap.add_argument("--max-steps", type=int, default=None, help="default 200 (quick: 2)")
    ap.add_argument("--set-images", type=int, default=None, help="images in the photo set (default 5500; quick 64)")
    ap.add_argument("--sources-npz", default=str(DEFAULT_SOURCES) if DEFAULT_SOURCES.is_file() else None)
    ap.add_argument("--cache", default="/tmp/hs_bench_photos")
    ap.add_argument("--override", action="append", default=[], help="extra config override")
    common.add_out(ap, "photo_trainer")
    args = ap.parse_args(argv)
    common.check_device(args.device)
    device = torch.device(args.device)
    args.batch = args.batch or (4 if args.quick else 128)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.max_steps = args.max_steps or (2 if args.quick else 200)
    root = prepare_set(Path(args.cache), args.set_images or (64 if args.quick else 5500), args.sources_npz)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {
        **common.metadata(device),
        "arch": "resnet18" if args.quick else "resnet50",
        "batch": args.batch,
        "views": "2x32+6x16" if args.quick else "2x224+6x96",
        "workers": args.workers,
        "source": str(root),
        "variants": {},
    }
    share = args.budget_s / len(args.variants)
    for variant in args.variants:
        t0 = time.monotonic()
        if variant == "jpeg_device" and decode_missing():
            r: dict[str, Any] = {"skipped": decode_missing()}
        else:
            try:
                r = run_variant(variant, args, root, device, share)
            except Exception as err:  # noqa: BLE001 - one variant's failure must not end the others
                r = {"skipped": f"failed: {type(err).__name__}: {str(err)[:300]}", "traceback": traceback.format_exc()}
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        r["wall_s"] = time.monotonic() - t0
        res["variants"][variant] = r
        base = res["variants"].get("synthetic", {})
        for name, v in res["variants"].items():
            if name != "synthetic" and "images_per_s" in v and "images_per_s" in base:
                res[f"ratio_{name}"] = v["images_per_s"] / base["images_per_s"]
        shown = f"{r['images_per_s']:9.1f} img/s" if "images_per_s" in r else r["skipped"][:200]
        print(f"{variant:12s} {shown}", flush=True)
        atomic.write_text((out / "photo_trainer.json"), json.dumps(res, indent=1))
    plot(res, out / "photo_trainer.png")
    print({k: round(v, 3) for k, v in res.items() if k.startswith("ratio_")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
