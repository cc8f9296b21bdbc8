"""Training throughput (images/s) of the paper's setups: the trainer against a plain reference loop.

    python -m benchmarks.train_throughput --device cuda             # CIFAR + ImageNet setups, ~2-3 min on an H100
    python -m benchmarks.train_throughput --device cpu --quick      # tiny sizes, a couple of steps

Setups (from configs/): ``cifar`` = ResNet-18 with the small stem, cifar10 preset (2 x 32 + 6 x 32 views);
``imagenet`` = ResNet-50, imagenet preset (2 x 224 + 6 x 96 views). Every step augments uint8 images held
in device memory with the project's TensorMultiCrop (crop + flip + BatchPhotometric on the device), then:

* ``trainer``: the trainer's own ``build(cfg, info, device)`` and ``train_step(run, views, step)``
  (hypersolid_scale/training/trainer.py; only its data loader is replaced by the in-memory source);
* ``reference``: the same model (the method's own ``embed``), the paper's loss written out plainly below, AdamW,
  bf16 autocast, nothing else;
* ``deepspeed``: the trainer with dist.engine=deepspeed, ZeRO-2, world size 1 (where deepspeed imports).

Each with and without torch.compile, channels_last, bf16 autocast on CUDA. A few warm-up steps, then
timed steps between torch.cuda.synchronize() calls. ``ratio`` = trainer / reference images/s (target
>= 0.95). Writes <out>/train_throughput.json and .png (default out: runs/bench/train_throughput).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F

from benchmarks import common
from benchmarks.common import ROOT
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.data.augment.presets import resolve_preset
from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop
from hypersolid_scale.data.batch import plan_batch
from hypersolid_scale.data.loading.common import ResumableEpochs
from hypersolid_scale.distributed import WorldInfo, cleanup
from hypersolid_scale.methods import build_method_model
from hypersolid_scale.safety import atomic
from hypersolid_scale.training import run_builder, trainer

SETUPS = {"cifar": ("configs/cifar10.yaml", 32), "imagenet": ("configs/imagenet1k.yaml", 256)}
VARIANTS = ("reference", "trainer", "reference+compile", "trainer+compile", "deepspeed")


def paper_loss(z: torch.Tensor, alpha: float = 0.9, lam: float = 1e-6) -> torch.Tensor:
    """The Hypersolid loss of (B, V, D) projector outputs, written out plainly (one process, dense)."""
    z = z.float()
    b, v, d = z.shape
    x = F.normalize(z, dim=-1)
    target = F.normalize(z.max(dim=1).values, dim=-1).detach()  # max-pooled views, stop-gradient
    alignment = (1.0 - (x * target[:, None, :]).sum(dim=-1)).mean()
    flat = x.reshape(b * v, d)
    m = flat.shape[0]
    off_diagonal = ~torch.eye(m, dtype=torch.bool, device=z.device)
    repulsion = (F.relu(flat @ flat.T - alpha) * off_diagonal).sum() / (m * m * (1.0 - alpha))
    normalization = lam * (z.norm(dim=-1).mean() - 1.0) ** 2
    return alignment + repulsion + normalization


class DeviceImages(ResumableEpochs):
    """uint8 images in device memory, augmented a batch at a time with the project's TensorMultiCrop.

    Stands in for the trainer's loader (a ``TrainLoader``): ``build`` needs its length, the timed loops call
    ``views(step)``; iterating gives one epoch of ``(views, labels)`` as any loader does.
    """

    def __init__(self, preset: Any, n: int, size: int, batch: int, device: torch.device, channels_last: bool):
        super().__init__()
        g = torch.Generator(device=device).manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g, device=device)
        self.multicrop = TensorMultiCrop(preset, device, seed=0)
        self.batch, self.channels_last, self.device = batch, channels_last, device

    def __len__(self) -> int:
        return max(1, len(self.images) // self.batch)

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]:
        for step in range(self._begin(), len(self)):
            self._count()
            yield self.views(self.epoch * len(self) + step), torch.zeros(self.batch, dtype=torch.long)

    def views(self, step: int) -> list[torch.Tensor]:
        start = (step * self.batch) % (len(self.images) - self.batch + 1)
        # Dataset indices on the host, as the loaders keep them: the draws are made there (no read of the device).
        indices = torch.arange(start, start + self.batch)
        views = self.multicrop(self.images[start : start + self.batch], indices, step)  # draws keyed by (index, step)
        if self.channels_last:
            views = [v.contiguous(memory_format=torch.channels_last) for v in views]
        return views


def time_loop(
    step_fn: Callable[[int], Any], data: DeviceImages, warmup: int, steps: int, device: torch.device
) -> dict[str, float]:
    def reset_peak() -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    t = common.timed_loop(step_fn, device, warmup=warmup, steps=steps, on_start=reset_peak)
    loss = float("nan") if t.last is None else t.last
    loss = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)  # after the clock stops
    out = {**t.rates(data.batch), "last_loss": loss}
    if device.type == "cuda":
        out["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def make_config(setup: str, batch: int, device: torch.device, extra: list[str]) -> Any:
    path, _ = SETUPS[setup]
    overrides = [
        f"data.batch_size_per_gpu={batch}",
        f"dist.device={device.type}",
        "tracking.enabled=false",
        "eval.every_n_epochs=0",
        "checkpoint.every_n_steps=0",
        "progress=false",
        *extra,
    ]
    return load_config(ROOT / path, overrides)


def run_trainer(
    cfg: Any, data: DeviceImages, device: torch.device, warmup: int, steps: int, check_feats: list | None = None
) -> dict[str, float]:
    """The trainer's build + train_step, fed from ``data``; ``check_feats`` gets the trainer's loss of a batch."""
    original = run_builder.build_train_loader
    run_builder.build_train_loader = lambda *a, **k: data  # the only replaced piece: the data source
    try:
        trainer.seed_everything(cfg.seed, cfg.deterministic)
        run = trainer.build(cfg, WorldInfo(0, 1, 0, "single"), device)
    finally:
        run_builder.build_train_loader = original
    if data.channels_last and cfg.dist.engine == "ddp":
        # Same Parameter objects, so the optimizer keeps them. Not under DeepSpeed: ZeRO's parameters are
        # views into its flat buffers, which a memory-format change would cut loose.
        run.engine.model.to(memory_format=torch.channels_last)
    if check_feats is not None:
        with torch.no_grad():
            method = cast(Any, run.method)  # a Hypersolid run: its projector and loss
            with run.engine.autocast():
                feats = method.embed_views(data.views(0), run.backbone).float()
            check_feats.append((feats, float(method.criterion(feats))))
    # train_step's statistics may stay on the device (no host sync per step): read only the last one.
    out = time_loop(lambda i: trainer.train_step(run, data.views(i), i)["loss"], data, warmup, steps, device)
    out["bf16"] = run.bf16
    out["channels_last_model"] = data.channels_last and cfg.dist.engine == "ddp"
    return out


def run_reference(
    cfg: Any, data: DeviceImages, device: torch.device, warmup: int, steps: int, compile: bool
) -> dict[str, float]:
    torch.manual_seed(cfg.seed)
    torch.backends.cudnn.benchmark = True  # as the trainer sets it (seed_everything, non-deterministic runs)
    model = build_method_model(cfg.model, cfg.method).to(device)
    if data.channels_last:
        model = model.to(memory_format=torch.channels_last)
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas))
    forward = torch.compile(model) if compile else model
    bf16 = device.type == "cuda"

    def step(i: int) -> torch.Tensor:
        views = data.views(i)  # augmented outside autocast, as the trainer's loader does
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            z = forward(views, embed=True)["z"][0]
        loss = paper_loss(z, cfg.method.hypersolid.alpha, cfg.method.hypersolid.norm_weight)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()  # no host sync per step, as in the trainer

    out = time_loop(step, data, warmup, steps, device)
    out["bf16"] = bf16
    return out


def prepare_setup(setup: str, batch: int, args: argparse.Namespace, device: torch.device) -> dict:
    overrides = list(args.override)
    if args.quick:  # CPU: the same code on small images
        overrides += (
            ["data.global_crop_size=32", "data.local_crop_size=16"]
            if setup == "imagenet"
            else ["data.global_crop_size=16", "data.local_crop_size=16"]
        )
    base = make_config(setup, batch, device, overrides)
    preset = resolve_preset(base.data)
    size = SETUPS[setup][1] if not args.quick else max(preset.global_crop_size, 32)
    data = DeviceImages(preset, max(4 * batch, batch + 1), size, batch, device, channels_last=not args.no_channels_last)
    res: dict[str, Any] = {
        "setup": setup,
        "batch_per_gpu": batch,
        "config": SETUPS[setup][0],
        "arch": base.model.arch,
        "views": [*map(int, preset.view_sizes())],
        "variants": {},
    }
    return {"res": res, "base": base, "data": data, "overrides": overrides}


def run_variant(variant: str, ctx: dict, args: argparse.Namespace, device: torch.device, time_left: float) -> dict:
    """One variant of one setup; a failure is recorded with its traceback tail, never raised."""
    base, data, overrides, setup, batch = (
        ctx["base"],
        ctx["data"],
        ctx["overrides"],
        ctx["res"]["setup"],
        ctx["res"]["batch_per_gpu"],
    )
    compile = variant.endswith("+compile")
    if compile and device.type != "cuda" and not args.compile_on_cpu:
        return {"skipped": "torch.compile not timed on CPU (its C++ build takes minutes); pass --compile-on-cpu"}
    need = args.compile_reserve_s if compile else 5.0
    if time_left < need:
        return {"skipped": f"time budget: {max(time_left, 0):.0f} s left of --budget-s, {need:.0f} s needed"}
    t0 = time.monotonic()
    try:
        if variant.startswith("reference"):
            r: dict[str, Any] = run_reference(base, data, device, args.warmup, args.steps, compile)
        elif variant.startswith("trainer"):
            checks: list = []
            cfg = make_config(setup, batch, device, [*overrides, f"dist.compile={str(compile).lower()}"])
            r = run_trainer(cfg, data, device, args.warmup, args.steps, None if compile else checks)
            if checks:  # the trainer's loss and the plain one agree on the same embeddings
                feats, value = checks[0]
                ref = float(paper_loss(feats, base.method.hypersolid.alpha, base.method.hypersolid.norm_weight))
                r["loss_vs_reference_rel_err"] = abs(value - ref) / max(abs(ref), 1e-12)
        else:
            try:
                import deepspeed  # noqa: F401
            except ImportError as err:
                return {"skipped": f"deepspeed does not import: {err}"}
            cfg = make_config(setup, batch, device, [*overrides, "dist.engine=deepspeed", "dist.zero_stage=2"])
            # DeepSpeed creates a one-process group and caches it: it is kept for the next setup's run (a
            # second group would not be registered with DeepSpeed) and destroyed at the end of main().
            r = run_trainer(cfg, data, device, args.warmup, args.steps)
    except Exception as err:  # noqa: BLE001 - one variant's failure must not end the others
        r = {"skipped": f"failed: {type(err).__name__}: {str(err)[:300]}", "traceback": traceback.format_exc()[-2000:]}
    finally:
        if compile:
            torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    r["wall_s"] = time.monotonic() - t0
    return r


def add_ratios(res: dict) -> None:
    v = res["variants"]
    for mode in ("", "+compile"):
        a, b = v.get(f"trainer{mode}", {}), v.get(f"reference{mode}", {})
        if "images_per_s" in a and "images_per_s" in b:
            res[f"ratio{mode.replace('+', '_')}"] = a["images_per_s"] / b["images_per_s"]


def plot(results: list[dict], path: Path) -> None:
    with common.figure(path, 100, 1, len(results), figsize=(6 * len(results), 4), squeeze=False) as (_, axes):
        for ax, r in zip(axes[0], results):
            names = [n for n in VARIANTS if "images_per_s" in r["variants"].get(n, {})]
            vals = [r["variants"][n]["images_per_s"] for n in names]
            ax.bar(names, vals, color=["tab:gray" if n.startswith("reference") else "tab:blue" for n in names])
            for i, val in enumerate(vals):
                ax.text(i, val, f"{val:.0f}", ha="center", va="bottom", fontsize=8)
            ratio = ", ".join(f"{k} {r[k]:.3f}" for k in ("ratio", "ratio_compile") if k in r)
            ax.set_title(f"{r['setup']} ({r['arch']}, B={r['batch_per_gpu']}, views {r['views']})\n{ratio}", fontsize=9)
            ax.set_ylabel("images / s")
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__)
    common.add_device(ap)
    common.add_quick(ap, "tiny batches and images, 1 warm-up + 1 timed step")
    ap.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--batch-cifar", type=int, default=None, help="default: the config's (128); quick: 2")
    ap.add_argument(
        "--batch-imagenet",
        type=int,
        default=128,
        help="images per GPU (the config's 512 does not fit one GPU with 8 views); quick: 2",
    )
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (quick: 1)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps, default 15 (quick: 1)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="skip variants once this many s are spent")
    ap.add_argument(
        "--compile-reserve-s",
        type=float,
        default=60.0,
        help="start a torch.compile variant only with this many seconds of --budget-s left",
    )
    ap.add_argument("--no-channels-last", action="store_true")
    ap.add_argument("--compile-on-cpu", action="store_true")
    ap.add_argument(
        "--override", action="append", default=[], help="extra config override, e.g. method.hypersolid.backend=tiled"
    )
    common.add_out(ap, "train_throughput")
    args = ap.parse_args(argv)
    common.check_device(args.device)
    device = torch.device(args.device)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.steps = args.steps if args.steps is not None else (1 if args.quick else 15)
    batches = {
        "cifar": args.batch_cifar or (2 if args.quick else None),
        "imagenet": 2 if args.quick else args.batch_imagenet,
    }
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = common.metadata(
        device, quick=args.quick, warmup=args.warmup, steps=args.steps, channels_last=not args.no_channels_last
    )
    ctxs = [
        prepare_setup(
            setup,
            batches[setup] or plan_batch(load_config(ROOT / SETUPS[setup][0], []).data, world_size=1).micro_batch,
            args,
            device,
        )
        for setup in args.setups
    ]
    results = [c["res"] for c in ctxs]
    # Cheap variants first, for every setup; the compiled ones (up to a minute of compilation each) last,
    # setup by setup so that a short budget still gives one setup's compiled trainer/reference ratio.
    eager = [(v, c) for v in args.variants if not v.endswith("+compile") for c in ctxs]
    compiled = [(v, c) for c in ctxs for v in args.variants if v.endswith("+compile")]
    for variant, ctx in eager + compiled:
        r = run_variant(variant, ctx, args, device, args.budget_s - (time.monotonic() - t_start))
        ctx["res"]["variants"][variant] = r
        add_ratios(ctx["res"])
        shown = f"{r['images_per_s']:9.1f} img/s" if "images_per_s" in r else r["skipped"][:120]
        print(f"{ctx['res']['setup']:9s} B={ctx['res']['batch_per_gpu']:4d} {variant:18s} {shown}", flush=True)
        meta["seconds_total"] = time.monotonic() - t_start
        # Written after every variant: a run cut short by a time limit keeps what it measured.
        atomic.write_text((out / "train_throughput.json"), json.dumps({"meta": meta, "results": results}, indent=1))
    cleanup()  # DeepSpeed's one-process group, if a DeepSpeed variant ran
    plot(results, out / "train_throughput.png")
    for r in results:
        print(r["setup"], {k: round(r[k], 3) for k in ("ratio", "ratio_compile") if k in r})
    return 0


if __name__ == "__main__":
    sys.exit(main())
