"""The loss's exchange across ranks on the CPU (gloo): memory, bytes and time per rank as P grows, rows per rank fixed.

    python -m benchmarks.loss_exchange                               # P = 2, 4, 8; 128 images x 8 views, D = 1024
    python -m benchmarks.loss_exchange --worlds 2 4 --images 32      # a quick subset
    python -m benchmarks.loss_exchange --out benchmarks/results/loss_exchange.json   # the committed results

Three ways for the repulsion's rows to cross ranks (docs/design.md §3f), each at P = 2, 4, 8 gloo processes on
this machine, every rank holding b images x 8 views (m = 8b rows) of one global batch:

* ``all-gather``: ``backend=tiled``, one all_gather of the rows (the path of every backend but ``ring``);
* ``ring``: ``backend=ring``, the rows passed round the ranks point to point;
* ``ring-bf16``: ``backend=ring, screen=bf16``, the rows passed and screened in bf16, the undecided ones again.

Each in two regimes: ``spread`` (embeddings of a trained encoder: classes, images, views; few pairs inside α) and
``collapsed`` (an untrained one: every pair inside α). Per rank and loss step (forward + backward, after one
warm-up step, the same ``tile_size`` everywhere):

* ``peak_loss_mib``: the peak resident memory of the step above the resident memory before it (``VmHWM`` reset
  through /proc/self/clear_refs; glibc's mmap threshold is fixed at 128 KiB, so freed buffers leave the resident
  set and the peak is what the step held at once, gloo's buffers included); the largest over the ranks;
* ``sent_mib``: the bytes the rank wrote to its sockets during the step (``wchar`` of /proc/self/io: the
  payload and gloo's headers; statistics and row counts included), the largest over the ranks; ``received_mib``:
  the ranks' mean of the same number (what the ranks send, they receive: the total is the same);
* ``step_s``: the wall time of the step, the median over the timed steps, the slowest rank. This is CPU time on a
  shared machine whose cores the P processes share (P = 8 on 2 cores: the ranks take turns), not a GPU figure.

Writes runs/bench/loss_exchange.json and .png (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from hypersolid_scale.safety import atomic

VARIANTS: dict[str, dict[str, Any]] = {  # name: loss options besides the shared tile_size
    "all-gather": {"backend": "tiled"},
    "ring": {"backend": "ring"},
    "ring-bf16": {"backend": "ring", "screen": "bf16"},
}
REGIMES = ("spread", "collapsed")
MMAP_THRESHOLD = "131072"  # glibc: buffers above 128 KiB are mapped and unmapped, never cached in the heap


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _written() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise KeyError("wchar")


def _step(fn: Any, feats: Any) -> float:
    """One forward and backward of the loss on a fresh leaf; the loss value."""
    f = feats.clone().requires_grad_(True)
    loss = fn(f)
    loss.backward()
    return float(loss.detach())


def _worker(rank: int, world: int, args: argparse.Namespace, out_dir: str) -> list[dict[str, Any]]:
    """One rank's rows (``common.spawn_ranks``)."""
    import torch

    from benchmarks.repulsion_measure import VIEWS, make_embeddings
    from hypersolid_scale.distributed import barrier, cleanup, init_distributed
    from hypersolid_scale.losses import HypersolidLoss

    torch.set_num_threads(1)
    init_distributed("cpu", "gloo")
    m = args.images * VIEWS
    rows = []
    for regime in REGIMES:
        feats = make_embeddings(world * m, args.dim, regime, "cpu").reshape(world * args.images, VIEWS, args.dim)
        mine = feats[rank * args.images : (rank + 1) * args.images].contiguous()
        for name, opts in VARIANTS.items():
            fn = HypersolidLoss(**opts, tile_size=args.tile, same_rows_per_rank=True, check_finite=False)

            _step(fn, mine)  # warm-up: gloo's pairs and buffers, BLAS
            times, peaks, sent = [], [], []
            for _ in range(args.steps):
                barrier()
                Path("/proc/self/clear_refs").write_text("5")  # the peak-RSS counter restarts at the current RSS
                base, w0, t0 = _status("VmRSS"), _written(), time.perf_counter()
                loss = _step(fn, mine)
                times.append(time.perf_counter() - t0)
                sent.append(_written() - w0)
                peaks.append(_status("VmHWM") - base)
            stats = fn.stats
            rows.append(
                {
                    "variant": name,
                    "regime": regime,
                    "rank": rank,
                    "step_s": statistics.median(times),
                    "peak_bytes": max(peaks),
                    "sent_bytes": statistics.median(sent),
                    "loss": loss,
                    "active_fraction": stats["active_fraction"],
                    "exact_fraction": stats.get("exact_fraction"),
                }
            )
    cleanup()
    return rows


def measure(world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every variant and regime on ``world`` spawned gloo ranks: one row each, over the ranks."""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD  # read by glibc in the spawned processes
    per_rank = common.spawn_ranks(_worker, world, args)
    out = []
    for i, first in enumerate(per_rank[0]):
        ranks = [rows[i] for rows in per_rank]
        out.append(
            {
                "world": world,
                "variant": first["variant"],
                "regime": first["regime"],
                "images_per_rank": args.images,
                "rows_per_rank": args.images * 8,
                "global_rows": world * args.images * 8,
                "dim": args.dim,
                "tile_size": args.tile,
                "peak_loss_mib": max(r["peak_bytes"] for r in ranks) / 2**20,
                "sent_mib": max(r["sent_bytes"] for r in ranks) / 2**20,
                "received_mib": statistics.mean(r["sent_bytes"] for r in ranks) / 2**20,
                "step_s": max(r["step_s"] for r in ranks),
                "loss": first["loss"],
                "loss_equal_on_ranks": len({r["loss"] for r in ranks}) == 1,
                "active_fraction": first["active_fraction"],
                "exact_fraction": first["exact_fraction"],
            }
        )
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, read off the rows: ring's memory at the largest P over the smallest, the all-gather's
    growth, bf16's bytes over fp32's per regime, and the largest loss difference to the all-gather path."""

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None  # a peak below the page-level resolution of the resident set: no ratio

    def get(variant: str, regime: str, world: int) -> dict[str, Any]:
        return next(r for r in rows if (r["variant"], r["regime"], r["world"]) == (variant, regime, world))

    worlds = sorted({r["world"] for r in rows})
    lo, hi = worlds[0], worlds[-1]
    out: dict[str, Any] = {}
    for regime in REGIMES:
        out[regime] = {
            f"ring_memory_P{hi}_over_P{lo}": ratio(
                get("ring", regime, hi)["peak_loss_mib"], get("ring", regime, lo)["peak_loss_mib"]
            ),
            f"all_gather_memory_P{hi}_over_P{lo}": ratio(
                get("all-gather", regime, hi)["peak_loss_mib"], get("all-gather", regime, lo)["peak_loss_mib"]
            ),
            "bf16_bytes_over_fp32": {
                str(w): ratio(get("ring-bf16", regime, w)["sent_mib"], get("ring", regime, w)["sent_mib"])
                for w in worlds
            },
            "max_loss_rel_diff_to_all_gather": max(
                abs(r["loss"] - get("all-gather", regime, r["world"])["loss"]) / abs(r["loss"])
                for r in rows
                if r["regime"] == regime
            ),
        }
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    keys = (
        ("peak_loss_mib", "peak memory of the loss step (MiB)"),
        ("sent_mib", "bytes sent per rank (MiB)"),
        ("step_s", "time per step, CPU (s)"),
    )
    with common.figure(path, 110, 1, 3, figsize=(15, 4.2)) as (_, axes):
        for ax, (key, label) in zip(axes, keys):
            for variant, color in zip(VARIANTS, ("C0", "C1", "C2")):
                for regime, style in zip(REGIMES, ("o-", "s--")):
                    mine = sorted(
                        (r for r in rows if (r["variant"], r["regime"]) == (variant, regime)), key=lambda r: r["world"]
                    )
                    ax.plot(
                        [r["world"] for r in mine],
                        [r[key] for r in mine],
                        style,
                        color=color,
                        label=f"{variant}, {regime}",
                    )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("ranks P (gloo, rows per rank fixed)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        axes[0].set_title("ring: flat in P; all-gather: grows")
        axes[1].set_title("bf16 columns: half the bytes once spread")
        axes[2].set_title("CPU time (P ranks share 2 cores)")


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8], help="process counts P")
    parser.add_argument("--images", type=int, default=128, help="images per rank (8 views each)")
    parser.add_argument("--dim", type=int, default=1024, help="embedding width D")
    parser.add_argument("--tile", type=int, default=1024, help="method.hypersolid.tile_size, for every variant")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant, after one warm-up step")
    common.add_out(parser, "loss_exchange.json", what="the JSON file, the PNG beside it")
    args = parser.parse_args()
    rows = []
    for world in args.worlds:
        for row in measure(world, args):
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = common.metadata(
        "cpu",
        memory="peak RSS (VmHWM after clear_refs) over the step, above the RSS before it; glibc mmap threshold 128 KiB",
        bytes="wchar of /proc/self/io over the step: bytes written to gloo's sockets (payload and headers)",
        time="wall clock of forward+backward on a CPU shared by the P processes",
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps({"meta": meta, "summary": summarize(rows), "rows": rows}, indent=2) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(json.dumps(summarize(rows), indent=2))


if __name__ == "__main__":
    main()
