"""Activation memory of an accumulated step: K micro-batches hold one micro-batch's graph, not K.

    python -m benchmarks.accumulation_memory                     # CPU: quickstart CNN and ViT-Tiny, K = 1, 2, 4
    python -m benchmarks.accumulation_memory --device cuda --setups resnet18

One trainer step (``trainer.train_step``, the real loader's first batch) at the same global batch for each
K = ``optim.accumulate_steps``. Measured on every device: the peak of the bytes autograd holds for backward
(every tensor saved by a forward, counted once per storage while its graph lives, parameters excluded),
through ``torch.autograd.graph.saved_tensors_hooks``. On a GPU also ``torch.cuda.max_memory_allocated``
over the step, which adds the weights, gradients, optimizer state and the kept outputs of pass 1. The
step's time is reported as a ratio to K = 1 in the same run (pass 1 is an extra forward): wall time on a GPU,
the process's CPU time on the CPU (steadier than the wall clock on a shared machine).

Writes runs/bench/accumulation_memory.json and .png (--out benchmarks/results/accumulation_memory.json: the
committed ones).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.common import ROOT
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.distributed import WorldInfo, cleanup
from hypersolid_scale.safety import atomic
from hypersolid_scale.training import trainer

COMMON = ["tracking.enabled=false", "eval.every_n_epochs=0", "checkpoint.every_n_steps=0", "progress=false"]
SETUPS = {  # name: (config, overrides); Fashion-MNIST ships with the machine, so every setup runs anywhere
    "small_cnn": ("configs/quickstart.yaml", []),
    "vit_tiny": (
        "configs/quickstart.yaml",
        ["model.arch=vit_tiny", "model.vit_tiny.img_size=28", "model.vit_tiny.patch_size=4", "data.num_local_views=2"],
    ),
    "resnet18": ("configs/quickstart.yaml", ["model.arch=resnet18", "model.small_stem=true"]),
}


class SavedBytes:
    """Live and peak bytes of the tensors autograd saves for backward (one count per storage)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude, self.now, self.peak = exclude, 0, 0
        self.refs: dict[int, list[int]] = {}  # storage -> [bytes, saved tensors using it]

    def pack(self, t: torch.Tensor) -> Any:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.exclude:
            return t
        if key not in self.refs:
            self.refs[key] = [storage.nbytes(), 0]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        self.refs[key][1] += 1
        # A detached alias of the same storage: holding the saved tensor itself would tie its graph node to
        # it in a cycle that no collector sees, whenever a node saves its own output.
        return _Held(t.detach(), key, self)

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        return held.t if isinstance(held, _Held) else held

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.refs[key]


class _Held:
    """A saved tensor; freed with its graph node, which releases its bytes."""

    def __init__(self, t: torch.Tensor, key: int, owner: SavedBytes) -> None:
        self.t, self.key, self.owner = t, key, owner

    def __del__(self) -> None:
        self.owner.release(self.key)


def measure(setup: str, batch: int, k: int, device: torch.device, steps: int) -> dict[str, Any]:
    path, extra = SETUPS[setup]
    cfg = load_config(
        ROOT / path,
        [
            *COMMON,
            *extra,
            f"data.global_batch_size={batch}",
            f"optim.accumulate_steps={k}",
            f"dist.device={device.type}",
            "data.num_workers=0",
        ],
    )
    trainer.seed_everything(cfg.seed, cfg.deterministic)
    run = trainer.build(cfg, WorldInfo(0, 1, 0, "single"), device)
    views, _ = next(iter(run.loader))
    views = [v.to(device) for v in views]
    trainer.train_step(run, views, 0)  # warm-up (allocator, lazy modules)
    params = {p.untyped_storage().data_ptr() for p in run.engine.model.parameters()}
    saved = SavedBytes(params)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):  # the memory, in one step
        stats = trainer.train_step(run, views, 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    del stats
    gc.collect()  # the step's graphs are gone: nothing saved may be left
    assert saved.now == 0, f"{saved.now} saved bytes still held after the step"
    t0, c0 = time.perf_counter(), time.process_time()  # the time, in steps without the counting hooks
    for i in range(2, steps + 2):
        trainer.train_step(run, views, i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out: dict[str, Any] = {
        "setup": setup,
        "global_batch": batch,
        "accumulate_steps": k,
        "micro_batch": run.batch.micro_batch,
        "views": len(views),
        "saved_for_backward_mb": saved.peak / 2**20,
        "step_s": (time.perf_counter() - t0) / steps,
        # CPU seconds of this process: on a shared CPU machine steadier than the wall clock
        "step_cpu_s": (time.process_time() - c0) / steps,
    }
    if device.type == "cuda":
        out["cuda_peak_allocated_mb"] = peak_mb
    cleanup()
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    with common.figure(path, 120, figsize=(6, 4)) as (_, ax):
        for setup in dict.fromkeys(r["setup"] for r in rows):
            mine = [r for r in rows if r["setup"] == setup]
            ax.plot(
                [r["accumulate_steps"] for r in mine],
                [r["saved_for_backward_mb"] for r in mine],
                "o-",
                label=f"{setup} (global batch {mine[0]['global_batch']})",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("optim.accumulate_steps K (same global batch)")
        ax.set_ylabel("peak activation memory saved for backward (MiB)")
        ax.set_title("Exact accumulation holds one micro-batch's graph")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="small_cnn,vit_tiny", help=f"comma-separated, of {list(SETUPS)}")
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--ks", default="1,2,4", help="accumulation steps to measure")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per K")
    common.add_device(parser, default="cpu", choices=None)
    common.add_out(parser, "accumulation_memory.json", what="the JSON file, the PNG beside it")
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for setup in args.setups.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            rows.append(measure(setup, args.batch, k, device, args.steps))
            print(json.dumps(rows[-1]), flush=True)
    for r in rows:
        base = next(b for b in rows if b["setup"] == r["setup"] and b["accumulate_steps"] == 1)
        r["memory_vs_k1"] = r["saved_for_backward_mb"] / base["saved_for_backward_mb"]
        clock = "step_s" if device.type == "cuda" else "step_cpu_s"
        r["time_vs_k1"] = r[clock] / base[clock]
    meta = common.metadata(device)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    plot(rows, out.with_suffix(".png"))
    for r in rows:
        print(
            f"{r['setup']:10s} K={r['accumulate_steps']}  micro {r['micro_batch']:4d}  "
            f"saved {r['saved_for_backward_mb']:8.1f} MiB ({r['memory_vs_k1']:.2f} x K=1)  "
            f"time {r['time_vs_k1']:.2f} x K=1"
        )


if __name__ == "__main__":
    main()
