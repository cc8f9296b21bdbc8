"""Where a training step's time goes: data, forward, loss, backward, optimizer, communication; images/s.

    python -m benchmarks.train_step                       # quickstart + ResNet-18 at 32 px, CPU, brief
    python -m benchmarks.train_step --steps 20 --device cuda --batch-resnet 256
    torchrun --nproc_per_node=2 -m benchmarks.train_step  # adds the gradient all-reduce of 2 ranks

Two setups: the quickstart (small CNN, Fashion-MNIST 28 px, 2 + 4 views, the real in-memory loader) and
ResNet-18 with the small-image stem at 32 px (2 + 6 views of CIFAR size; synthetic uint8 images through
the same multi-crop loader, since CIFAR is not shipped). For each loss backend the step is timed phase by
phase with synchronisation between phases (so phases do not overlap as they would in a real DDP step);
"repulsion share" is the loss phase (forward + its share of backward) relative to the whole step.
Communication is the all-reduce of a gradient-sized buffer (what DDP does, here not overlapped).
Writes train_step.json and train_step.png into --out (default runs/bench/train_step; the committed ones:
--out benchmarks/results).

A profiler, so it runs its own loop: the trainer's ``train_step`` never synchronises between phases (that
is what keeps a GPU fed), so it cannot be split like this; the trainer's step is timed whole, against a plain
reference loop, by ``benchmarks.train_throughput``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import common
from benchmarks.common import sync
from hypersolid_scale.data import DataConfig, build_train_loader
from hypersolid_scale.data.augment.presets import resolve_preset
from hypersolid_scale.data.loading.builtin_sets import ArraySplit
from hypersolid_scale.data.loading.random_access import InMemoryMultiCropLoader
from hypersolid_scale.distributed import all_reduce_sum, cleanup, get_rank, get_world_size, init_distributed
from hypersolid_scale.methods import MethodModel
from hypersolid_scale.methods.hypersolid import Hypersolid, HypersolidConfig
from hypersolid_scale.models import ModelConfig, build_backbone
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.process_exit import exit_process

PHASES = ("data", "forward", "loss", "backward", "optimizer", "communication")


# (loader, backbone, Hypersolid's section without its backend) of a setup.
Setup = tuple[Any, ModelConfig, dict[str, Any]]


def quickstart_setup(batch: int, device: torch.device) -> Setup:
    data = DataConfig(dataset="fashion_mnist", num_local_views=4, batch_size_per_gpu=batch, num_workers=0)
    loader = build_train_loader(data, rank=get_rank(), world_size=get_world_size(), seed=0, device=device)
    return loader, ModelConfig(arch="small_cnn", in_channels=1), {"num_layers": 2, "hidden_dim": 1024}


def resnet18_setup(batch: int, device: torch.device) -> Setup:
    data = DataConfig(
        format="webdataset",
        dataset="cifar100",
        path="unused",
        preset="cifar100",
        num_local_views=6,
        batch_size_per_gpu=batch,
    )
    n = batch * get_world_size() * 4
    rng = np.random.default_rng(0)
    split = ArraySplit(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 100, n), ())
    loader = InMemoryMultiCropLoader(
        split, resolve_preset(data), rank=get_rank(), world_size=get_world_size(), seed=0, batch_size=batch
    )
    return loader, ModelConfig(arch="resnet18", in_channels=3, small_stem=True), {}


def time_steps(
    loader: Any,
    model_cfg: ModelConfig,
    head: dict[str, Any],
    backend: str,
    steps: int,
    device: torch.device,
    bf16: bool,
) -> dict[str, float]:
    torch.manual_seed(0)
    opts: dict[str, Any] = {"tile_size": 256} if backend == "tiled" else {}
    backbone, dim = build_backbone(model_cfg)
    method = Hypersolid(dim, HypersolidConfig(backend=backend, **head, **opts))
    model = MethodModel(backbone, dim, method).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    totals = dict.fromkeys(PHASES, 0.0)
    it, done, images = iter(loader), 0, 0
    for i in range(steps + 1):  # the first step warms up (allocations, FAISS index) and is not counted
        t = {}
        t0 = time.perf_counter()
        try:
            views, _ = next(it)
        except StopIteration:
            loader.set_epoch(loader.epoch + 1)
            it = iter(loader)
            views, _ = next(it)
        views = [v.to(device) for v in views]
        sync(device)
        t["data"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            feats = method.embed_views(views, model.backbone)
        feats = feats.float()
        sync(device)
        t["forward"] = time.perf_counter() - t0
        # The loss phase covers its forward and the backward through the loss only (to the embeddings).
        t0 = time.perf_counter()
        leaf = feats.detach().requires_grad_(True)
        loss, _ = method.loss({"z": [leaf]})
        loss.backward()
        sync(device)
        t["loss"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        feats.backward(leaf.grad)
        sync(device)
        t["backward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        all_reduce_sum(flat)
        sync(device)
        t["communication"] = time.perf_counter() - t0 if get_world_size() > 1 else 0.0
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        t["optimizer"] = time.perf_counter() - t0
        if i > 0:
            for p in PHASES:
                totals[p] += t[p]
            done += 1
            images += views[0].shape[0] * get_world_size()
    out = {f"{p}_ms": 1000 * totals[p] / done for p in PHASES}
    step_s = sum(totals.values()) / done
    out.update(
        step_ms=1000 * step_s,
        images_per_s=images / sum(totals.values()),
        repulsion_share=totals["loss"] / sum(totals.values()),
        batch_per_rank=views[0].shape[0],
        views=len(views),
        active_pairs=method.criterion.stats.get("active_pairs", float("nan")),
    )
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    labels = [f"{r['setup']}\n{r['backend']}" for r in results]
    with common.figure(path, 110, figsize=(max(6, 1.4 * len(results)), 4)) as (_, ax):
        bottom = np.zeros(len(results))
        for p in PHASES:
            vals = np.array([r[f"{p}_ms"] for r in results])
            ax.bar(labels, vals, bottom=bottom, label=p)
            bottom += vals
        for x, r in enumerate(results):
            ax.text(x, bottom[x], f"{r['images_per_s']:.0f} img/s", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("ms per step")
        ax.set_title(f"Training step breakdown ({results[0]['device']}, world size {results[0]['world_size']})")
        ax.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per setup and backend (after 1 warm-up)")
    common.add_device(ap, default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--batch-quickstart", type=int, default=128, help="images per rank")
    ap.add_argument("--batch-resnet", type=int, default=32, help="images per rank")
    ap.add_argument("--backends", default="dense,tiled,neighbors")
    common.add_out(ap, "train_step")
    args = ap.parse_args(argv)
    info, device = init_distributed(args.device)
    bf16 = device.type == "cuda"
    results = []
    try:
        for setup, make, batch in (
            ("quickstart", quickstart_setup, args.batch_quickstart),
            ("resnet18_32px", resnet18_setup, args.batch_resnet),
        ):
            loader, model_cfg, head = make(batch, device)
            for backend in args.backends.split(","):
                r: dict[str, Any] = time_steps(loader, model_cfg, head, backend, args.steps, device, bf16)
                r.update(setup=setup, backend=backend, device=str(device), world_size=info.world_size, bf16=bf16)
                results.append(r)
                if info.rank == 0:
                    print(
                        f"{setup:14s} {backend:9s} "
                        + " ".join(f"{p} {r[p + '_ms']:7.1f}" for p in PHASES)
                        + f" | step {r['step_ms']:7.1f} ms | {r['images_per_s']:7.1f} img/s | "
                        f"repulsion {100 * r['repulsion_share']:4.1f}%",
                        flush=True,
                    )
    finally:
        cleanup()
    if info.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = common.metadata("cpu", steps=args.steps)
        atomic.write_text((out / "train_step.json"), json.dumps({"meta": meta, "results": results}, indent=2))
        plot(results, out / "train_step.png")
        print(f"wrote {out / 'train_step.json'} and {out / 'train_step.png'}")
    return 0


if __name__ == "__main__":
    exit_process(main())
