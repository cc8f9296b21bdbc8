"""The device stage of data.views_on=device, before and after batching, on ImageNet-sized photographs.

    python -m benchmarks.device_stage [--images 256] [--batch 64] [--device cpu] [--out runs/bench/device_stage]

Data: the photo set's images (benchmarks.photo_set: JPEGs with a short side of 375-500 px, made from the
photographs installed packages ship), decoded once; the default preset's views, 2 x 224 + 6 x 96.
Rows, measured in one run on the same decoded batches:

* ``before``: the stage as it was: one resize call per crop (torch's 8-bit antialiased bicubic kernel on the
  CPU, PIL's algorithm), the photometric chain on boolean-mask subsets with kornia's hue
  (benchmarks/aug_reference.py);
* ``after``: ``DeviceStage.views_of``: every crop of a view in one batched resize, the chain as per-sample
  ``where`` over the whole batch (data/device/batched_resize.py, data/augment/tensor_aug.py).

Each row: host CPU ms per image (this thread's CPU time; on a CPU "device" that is the device's work too),
wall ms per image, and the operator calls per batch at --batch and at half of it (from torch.profiler: the
calls the Python code makes). Pixels: mean / p99 / max difference in 8-bit levels between ``after`` and
``before``, and of each against the PIL path itself (lightly's multi-crop on the decoded file, under the same
per-sample seeding), for the geometry alone (photometric steps off) and for the whole chain.
Writes device_stage.json and device_stage.png into --out (a run directory by default; the committed results
are in benchmarks/results/device_stage/).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks import common
from benchmarks.aug_reference import crop_resize_one, masked_photometric
from benchmarks.common import RESULTS
from benchmarks.photo_set import generate, load_sources
from hypersolid_scale.data import PRESETS
from hypersolid_scale.data.augment.transforms import build_pil_multicrop, seeded_global_rngs
from hypersolid_scale.data.device.views import DeviceStage, HostStage, _decisions, collate_host
from hypersolid_scale.safety import atomic

SEED, EPOCH = 0, 0


def before_views(stage: DeviceStage, images: list[torch.Tensor], params: torch.Tensor) -> list[torch.Tensor]:
    """The stage as it was: one resize per crop, the photometric chain on masked subsets."""
    out = []
    for v, size in enumerate(stage.preset.view_sizes()):
        rows = params[:, v].tolist()
        x = torch.stack([crop_resize_one(img, row, size) for img, row in zip(images, rows)]).div_(255.0)
        out.append(masked_photometric(stage.photometric, x, _decisions(params[:, v].float())))
    return out


def draws(preset: Any, data: list[bytes], offset: int) -> Any:
    host = HostStage(preset)
    items = []
    for i, d in enumerate(data):
        with seeded_global_rngs(SEED, EPOCH, offset + i):
            items.append((host(d), offset + i))
    return collate_host(items)[0]


def operator_calls(fn: Any) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def levels(preset: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in 8-bit levels of the normalised views a and b."""
    return ((a.cpu() - b.cpu()).abs() * torch.tensor(preset.std).view(1, -1, 1, 1) * 255).flatten()


def stats(diffs: list[torch.Tensor]) -> dict[str, float]:
    d = torch.cat(diffs).double()
    sample = d[torch.randperm(d.numel(), generator=torch.Generator().manual_seed(0))[:2_000_000]]
    return {"mean": float(d.mean()), "p99": float(torch.quantile(sample, 0.99)), "max": float(d.max())}


def pil_views(preset: Any, data: list[bytes], offset: int) -> list[torch.Tensor]:
    pil = build_pil_multicrop(preset)
    per_image = []
    for i, d in enumerate(data):
        with seeded_global_rngs(SEED, EPOCH, offset + i):
            per_image.append(pil(Image.open(io.BytesIO(d)).convert("RGB")))
    return [torch.stack([torch.as_tensor(views[v]) for views in per_image]) for v in range(preset.num_views)]


def timed(fn: Any) -> tuple[Any, float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    out = fn()
    return out, time.thread_time() - cpu, time.perf_counter() - wall


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    preset = PRESETS["default"]
    data = [blob for blob, *_ in generate(load_sources(str(args.sources_npz)), args.images, seed=0, workers=2)]
    device = torch.device(args.device)
    rows: dict[str, dict[str, float]] = {
        "before": {"cpu_s": 0.0, "wall_s": 0.0},
        "after": {"cpu_s": 0.0, "wall_s": 0.0},
    }
    pixels: dict[str, list[torch.Tensor]] = {}
    geometry = replace(preset, cj_prob=0.0, gray_prob=0.0, blur_probs=(0.0, 0.0, 0.0), solarize_prob=0.0)
    for name, p in (("geometry", geometry), ("full", preset)):
        stage = DeviceStage(p, device, channels_last=False)
        for start in range(0, len(data) - args.batch + 1, args.batch):
            chunk = data[start : start + args.batch]
            images, params = stage.decode(draws(p, chunk, start))
            after, cpu_a, wall_a = timed(lambda: stage.views_of(images, params))  # noqa: B023
            before, cpu_b, wall_b = timed(lambda: before_views(stage, images, params))  # noqa: B023
            if name == "full":
                rows["after"]["cpu_s"] += cpu_a
                rows["after"]["wall_s"] += wall_a
                rows["before"]["cpu_s"] += cpu_b
                rows["before"]["wall_s"] += wall_b
            if start // args.batch < args.pil_batches:
                ref = pil_views(p, chunk, start)
                for key, a, b in (
                    ("after_vs_before", after, before),
                    ("after_vs_pil", after, ref),
                    ("before_vs_pil", before, ref),
                ):
                    pixels.setdefault(f"{name}/{key}", []).extend(levels(p, x, y) for x, y in zip(a, b))
    n = (len(data) // args.batch) * args.batch
    stage = DeviceStage(preset, device, channels_last=False)
    for half, key in ((False, "calls_per_batch"), (True, "calls_per_half_batch")):
        chunk = data[: args.batch // 2 if half else args.batch]
        images, params = stage.decode(draws(preset, chunk, 0))
        rows["after"][key] = operator_calls(lambda: stage.views_of(images, params))  # noqa: B023
        rows["before"][key] = operator_calls(lambda: before_views(stage, images, params))  # noqa: B023
    for row in rows.values():
        row["host_cpu_ms_per_image"] = 1000 * row.pop("cpu_s") / n
        row["wall_ms_per_image"] = 1000 * row.pop("wall_s") / n
    return {
        "what": "device stage of data.views_on=device: views of decoded batches, before/after batching",
        "views": f"2 x {preset.global_crop_size} + {preset.num_local_views} x {preset.local_crop_size}",
        "images": n,
        "batch": args.batch,
        **common.metadata(device),
        "threads": args.threads,
        "rows": rows,
        "ratios": {
            "host_cpu_ms_per_image": rows["before"]["host_cpu_ms_per_image"] / rows["after"]["host_cpu_ms_per_image"],
            "calls_per_batch": rows["before"]["calls_per_batch"] / rows["after"]["calls_per_batch"],
        },
        "pixel_levels": {k: stats(v) for k, v in sorted(pixels.items())},
        "pixel_batches": args.pil_batches,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    rows = result["rows"]
    with common.figure(path, 110, 1, 2, figsize=(9, 3.4)) as (fig, axes):
        names = list(rows)
        axes[0].bar(names, [rows[k]["host_cpu_ms_per_image"] for k in names], color=["tab:blue", "tab:orange"])
        axes[0].set_ylabel("host CPU ms / image")
        x = np.arange(2)
        for i, k in enumerate(names):
            axes[1].bar(x + 0.38 * i, [rows[k]["calls_per_half_batch"], rows[k]["calls_per_batch"]], 0.38, label=k)
        axes[1].set_xticks(x + 0.19, [f"batch {result['batch'] // 2}", f"batch {result['batch']}"])
        axes[1].set_ylabel("operator calls per batch")
        axes[1].legend()
        fig.suptitle(f"device stage on {result['device']} ({result['views']}), {result['images']} photos", fontsize=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    common.add_device(p, default="cpu", choices=None)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--pil-batches", type=int, default=1, help="batches compared with the PIL path (slow)")
    p.add_argument("--sources-npz", type=Path, default=RESULTS / "photo_sources.npz")
    common.add_out(p, "device_stage")
    p.add_argument("--plot-only", action="store_true", help="redraw --out's plot from its device_stage.json")
    args = p.parse_args(argv)
    if args.plot_only:
        plot(json.loads((args.out / "device_stage.json").read_text()), args.out / "device_stage.png")
        return 0
    if args.batch < 2 or args.images < args.batch:
        p.error(f"--batch must be >= 2 and --images >= --batch, got {args.batch} and {args.images}")
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic.write_text((args.out / "device_stage.json"), json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "device_stage.png")
    before, after = result["rows"]["before"], result["rows"]["after"]
    print(
        f"host ms/image before {before['host_cpu_ms_per_image']:.2f} after {after['host_cpu_ms_per_image']:.2f}"
        f" ({result['ratios']['host_cpu_ms_per_image']:.2f}x); calls/batch before {before['calls_per_batch']}"
        f" after {after['calls_per_batch']}; written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
