"""The trainer's speed against the model's own step: where a GPU's time goes, one row per way of feeding it.

    python -m benchmarks.gpu_speed --device cuda [--budget-s 330] [--out DIR]     # ResNet-50, 2 x 224 + 6 x 96
    python -m benchmarks.gpu_speed --device cpu --quick                           # ResNet-18, 32/16 px, a few steps

Rows (configs/imagenet1k.yaml, the trainer's own ``build`` and ``train_step``, bf16 autocast on CUDA):

* ``step_*``: the model step alone: fixed random views already on the device, no augmentation (the ceiling);
  eager and compiled first (``dist.compile=true``: the whole step's module, backbone, heads and loss, for
  Hypersolid's dense backend; the row records ``dist.compile_scope``), and compiled with its forward and backward
  replayed as CUDA graphs (``dist.compile_mode=reduce-overhead``), then channels-last on and off, batch 128 and
  256, AdamW fused (optim.fused=auto on CUDA) and multi-tensor;
* ``synthetic_*``: views augmented on the device from uint8 images in device memory (TensorMultiCrop);
* ``jpeg_device_*``: the trainer's loader over the photo set's WebDataset shards, data.views_on=device (JPEGs
  decoded on the device, every view cut there, prepared a batch ahead on a side stream);
* ``jpeg_pil``: the same shards, data.views_on=workers (PIL in the DataLoader workers).

Per row: images/s, step ms, the share of the wall time spent waiting for the next batch (``data_wait_share``),
and host CPU ms per image (this process and its workers, psutil). ``ratio``: images/s over the model step's
at the same batch and format. Not measured: the whole training step as one CUDA graph, optimizer included (the
JSON's ``not_measured`` says why; docs/benchmarks.md, "CUDA graphs").
Then one profiled step of ``jpeg_device_cl_b128``: the top kernels by device time and the host's gaps (device
idle between kernels), as text. Writes gpu_speed.json, gpu_speed.png and gpu_speed_profile.txt into --out.
Each row gets an equal share of --budget-s (after its warm-up); the JSON is rewritten after every row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs installed
import torch

from benchmarks import common
from benchmarks.common import sync
from benchmarks.photo_loaders import DEFAULT_SOURCES, prepare_set
from benchmarks.train_throughput import DeviceImages, make_config
from hypersolid_scale.data.augment.presets import resolve_preset
from hypersolid_scale.distributed import WorldInfo
from hypersolid_scale.safety import atomic
from hypersolid_scale.training import trainer

CL, NCHW = "model.channels_last=true", "model.channels_last=false"
# name: (source, batch, overrides)
ROWS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "step_cl_b128": ("step", 128, (CL,)),
    # The model step eager vs compiled comes first (issue 41, item 5a); compiling takes about a minute of its warm-up.
    "step_cl_b128_compile": ("step", 128, (CL, "dist.compile=true")),
    # The compiled forward and backward replayed as CUDA graphs (torch's cudagraph trees, static input buffers).
    "step_cl_b128_cudagraphs": ("step", 128, (CL, "dist.compile=true", "dist.compile_mode=reduce-overhead")),
    "step_nchw_b128": ("step", 128, (NCHW,)),
    "step_cl_b128_foreach": ("step", 128, (CL, "optim.fused=false")),
    "step_cl_b256": ("step", 256, (CL,)),
    "synthetic_cl_b128": ("synthetic", 128, (CL,)),
    "synthetic_nchw_b128": ("synthetic", 128, (NCHW,)),
    "jpeg_device_cl_b128": ("jpeg_device", 128, (CL,)),
    "jpeg_device_nchw_b128": ("jpeg_device", 128, (NCHW,)),
    "jpeg_device_cl_b256": ("jpeg_device", 256, (CL,)),
    "jpeg_pil_cl_b128": ("jpeg_pil", 128, (CL,)),
    # The compiled step issues far fewer launches: does that free the host for the device stage's thread?
    "jpeg_device_cl_b128_compile": ("jpeg_device", 128, (CL, "dist.compile=true")),
}
PROFILED = "jpeg_device_cl_b128"
# Why no row replays the whole training step as one CUDA graph (docs/benchmarks.md, "CUDA graphs").
CUDA_GRAPHS_NOT_USED = (
    "the compiled forward and backward are replayed as CUDA graphs in step_cl_b128_cudagraphs; the whole step as "
    "one graph (optimizer step included) is not implemented: the learning rate can be a device tensor "
    "(optim.lr_tensor, taken by the fused AdamW), but a graph of the whole train_step would replay stale Python "
    "numbers the step passes to kernels every step (the non-finite guard's step number, the EMA teachers' "
    "momentum), the trainer hands new view tensors each step (no static input buffers of its own), DDP's "
    "bucketed all-reduce would be captured too (unchecked), and the neighbors and auto backends have "
    "data-dependent shapes; the fused optimizer step left outside the graphs is a few kernel launches"
)


def host_cpu_s() -> float:
    """CPU seconds of this process and its children (the DataLoader workers), live ones included."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def build_row(source: str, batch: int, overrides: tuple[str, ...], args: argparse.Namespace, root: Path) -> Any:
    """(run, next_views) for a row: ``next_views(i)`` returns the step's views on the device and the seconds
    spent waiting for them."""
    device = torch.device(args.device)
    extra = list(overrides)
    if args.quick:
        extra += ["model.arch=resnet18", "data.global_crop_size=32", "data.local_crop_size=16"]
    if source.startswith("jpeg"):
        decode = "device" if source == "jpeg_device" else "workers"
        extra += [
            f"data.path={root}",
            f"data.num_workers={args.workers}",
            "data.webdataset.shuffle_buffer=256",
            f"data.views_on={decode}",
        ]
    cfg = make_config("imagenet", batch, device, extra)
    trainer.seed_everything(cfg.seed, cfg.deterministic)
    info = WorldInfo(0, 1, 0, "single")
    if not source.startswith("jpeg"):
        preset = resolve_preset(cfg.data)
        size = max(preset.global_crop_size, 32) if args.quick else 256
        data = DeviceImages(preset, max(4 * batch, batch + 1), size, batch, device, channels_last=False)
        from hypersolid_scale.training import run_builder

        original = run_builder.build_train_loader
        run_builder.build_train_loader = lambda *a, **k: data  # the only replaced piece: the data source
        try:
            run = trainer.build(cfg, info, device)
        finally:
            run_builder.build_train_loader = original
        fixed = [v.to(memory_format=run.memory_format) for v in data.views(0)]
        if source == "step":
            return run, lambda i: (fixed, 0.0)
        return run, lambda i: ([v.to(memory_format=run.memory_format) for v in data.views(i)], 0.0)
    run = trainer.build(cfg, info, device)
    state: dict[str, Any] = {"epoch": 0, "it": iter(run.loader)}

    def next_views(i: int) -> tuple[list[torch.Tensor], float]:
        t0 = time.perf_counter()
        try:
            views, _ = next(state["it"])
        except StopIteration:  # a small set: the next epoch
            state["epoch"] += 1
            run.loader.set_epoch(state["epoch"])
            state["it"] = iter(run.loader)
            views, _ = next(state["it"])
        waited = time.perf_counter() - t0
        return [v.to(device, non_blocking=True, memory_format=run.memory_format) for v in views], waited

    return run, next_views


def time_row(run: Any, next_views: Any, batch: int, args: argparse.Namespace, share_s: float) -> dict[str, Any]:
    device = torch.device(args.device)

    def step(i: int) -> tuple[torch.Tensor, float]:
        views, waited = next_views(i)
        return trainer.train_step(run, views, i)["loss"], waited

    counters: dict[str, float] = {}

    def start() -> None:  # the counters of the timed steps only
        counters.update(stage=getattr(run.loader, "device_stage_cpu_s", 0.0), cpu=host_cpu_s(), waited=0.0)

    def timed(i: int) -> torch.Tensor:
        loss, waited = step(i)
        counters["waited"] = counters.get("waited", 0.0) + waited
        return loss

    t = common.timed_loop(timed, device, warmup=args.warmup, seconds=share_s, max_steps=args.max_steps, on_start=start)
    steps, elapsed, loss, waited = t.steps, t.seconds, t.last, counters["waited"]
    stage_cpu0, cpu0 = counters["stage"], counters["cpu"]
    stage = getattr(run.loader, "device_stage", None)
    extra = {}
    if stage is not None:  # data.views_on=device: the stage thread's share of the host time, and its chain
        stage_s = run.loader.device_stage_cpu_s - stage_cpu0
        extra = {
            "device_stage_cpu_ms_per_image": 1000 * stage_s / (batch * steps),
            "photometric_chain": stage.photometric.chain,  # compiled, or eager and why
        }
    return {
        **t.rates(batch),
        "data_wait_share": waited / elapsed,
        "host_cpu_ms_per_image": 1000 * (host_cpu_s() - cpu0) / (batch * steps),
        "last_loss": float(loss),
        "memory_format": "channels_last" if run.memory_format == torch.channels_last else "nchw",
        "bf16": bool(run.bf16),
        **run.compile_scope.params(),  # what dist.compile compiled (off | step | backbone) and why not more
        **extra,
    }


def profile_step(run: Any, next_views: Any, args: argparse.Namespace, path: Path) -> None:
    """The top kernels of two steps by device time, and how long the device sat idle between kernels."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(args.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(2):
            views, _ = next_views(10_000 + i)
            trainer.train_step(run, views, 10_000 + i)
        sync(device)
    wall_ms = 1000 * (time.perf_counter() - t0)
    kind = "cuda" if device.type == "cuda" else "cpu"
    table = prof.key_averages().table(sort_by=f"self_{kind}_time_total", row_limit=15)
    lines = [f"two steps of {PROFILED}: {wall_ms:.1f} ms wall"]
    if device.type == "cuda":
        kernels = sorted(
            ((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA"),
        )
        busy, gaps, end = 0.0, [], None  # the union of the kernels' intervals, and the holes in it (us)
        for start, stop in kernels:
            if end is None or start >= end:
                if end is not None:
                    gaps.append((start - end) / 1000)
                busy, end = busy + (stop - start) / 1000, stop
            elif stop > end:
                busy, end = busy + (stop - end) / 1000, stop
        gaps.sort(reverse=True)
        lines.append(f"device busy {busy:.1f} ms ({busy / wall_ms:.0%} of the wall time); {len(kernels)} kernels")
        lines.append("largest host gaps (device idle between kernels, ms): " + ", ".join(f"{g:.2f}" for g in gaps[:10]))
    lines.append(table)
    atomic.write_text(path, "\n".join(lines) + "\n")


def plot(res: dict[str, Any], path: Path) -> None:
    rows = {k: v for k, v in res["rows"].items() if "images_per_s" in v}
    with common.figure(path, 110, figsize=(9, 3.8)) as (_, ax):
        colors = {"step": "tab:gray", "synthetic": "tab:green", "jpeg_device": "tab:blue", "jpeg_pil": "tab:orange"}
        names = list(rows)
        ax.bar(names, [rows[n]["images_per_s"] for n in names], color=[colors[ROWS[n][0]] for n in names])
        for i, n in enumerate(names):
            ax.text(i, rows[n]["images_per_s"], f"{rows[n]['images_per_s']:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_ylabel("images / s")
        ax.tick_params(axis="x", labelrotation=35, labelsize=7)
        ax.set_title(
            f"{res['card']}, torch {res['torch']}, {res['git_commit'][:7]}: {res['arch']} {res['views']}", fontsize=9
        )


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__)
    common.add_device(ap)
    common.add_quick(ap, "ResNet-18, 32/16 px crops, batches of 4 and 8")
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=300.0, help="timed seconds, split equally over the rows")
    ap.add_argument("--warmup", type=int, default=None, help="default 5 (quick: 1)")
    ap.add_argument("--max-steps", type=int, default=None, help="default 400 (quick: 2)")
    ap.add_argument("--set-images", type=int, default=None, help="photo set size (default 2048; quick 64)")
    ap.add_argument("--sources-npz", default=str(DEFAULT_SOURCES) if DEFAULT_SOURCES.is_file() else None)
    ap.add_argument("--cache", default="/tmp/hs_bench_photos")
    common.add_out(ap, "gpu_speed")
    args = ap.parse_args(argv)
    common.check_device(args.device)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 5)
    args.max_steps = args.max_steps or (2 if args.quick else 400)
    root = prepare_set(Path(args.cache), args.set_images or (64 if args.quick else 2048), args.sources_npz)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    res: dict[str, Any] = {
        **common.metadata(device),
        "arch": "resnet18" if args.quick else "resnet50",
        "views": "2x32+6x16" if args.quick else "2x224+6x96",
        "not_measured": {"cuda_graph_of_the_whole_step": CUDA_GRAPHS_NOT_USED},
        "rows": {},
    }
    share = args.budget_s / len(args.rows)
    for name in args.rows:
        source, batch, overrides = ROWS[name]
        batch = batch // 32 if args.quick else batch
        t0 = time.monotonic()
        try:
            run, next_views = build_row(source, batch, overrides, args, root)
            r = time_row(run, next_views, batch, args, share)
            if name == PROFILED:
                profile_step(run, next_views, args, out / "gpu_speed_profile.txt")
            del run, next_views
        except Exception as err:  # noqa: BLE001 - one row's failure must not end the others
            r = {"skipped": f"failed: {type(err).__name__}: {str(err)[:300]}", "traceback": traceback.format_exc()}
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        r.update(source=source, batch=batch, overrides=list(overrides), wall_s=time.monotonic() - t0)
        res["rows"][name] = r
        base = res["rows"].get(f"step_{'cl' if CL in overrides else 'nchw'}_b{ROWS[name][1]}", {})
        if "images_per_s" in r and "images_per_s" in base:
            r["ratio_to_model_step"] = r["images_per_s"] / base["images_per_s"]
        shown = f"{r['images_per_s']:9.1f} img/s" if "images_per_s" in r else r["skipped"][:200]
        print(f"{name:24s} {shown}", flush=True)
        atomic.write_text((out / "gpu_speed.json"), json.dumps(res, indent=1))
    plot(res, out / "gpu_speed.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
