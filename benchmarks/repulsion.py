"""Repulsion backends: forward+backward time, peak memory, recall and loss error, at growing batch sizes.

    python benchmarks/repulsion.py                      # CPU, M in {1k, 4k, 16k, 32k, 64k}, D = 1024
    python benchmarks/repulsion.py --device cuda        # on a GPU
    python benchmarks/repulsion.py --sizes 1024 4096    # a quick subset

Each measurement runs in its own subprocess, so peak memory is that of one backend at one size: on CPU the
peak resident set (VmHWM, reset after the inputs are built), on CUDA ``torch.cuda.max_memory_allocated``.
A dense run whose estimated footprint exceeds the memory budget is skipped and recorded as such rather than
risking the machine. Two regimes: ``spread`` (embeddings of a trained encoder: few pairs inside alpha) and
``collapsed`` (an untrained one: almost every pair inside alpha). Writes results/repulsion.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
VIEWS = 8  # 2 global + 6 local, the paper's default
BACKENDS = [
    ("dense", {}),
    ("tiled", {"tile_size": 4096}),
    ("neighbors-flat", {"index": "flat", "k": 64}),
    ("neighbors-ivf", {"index": "ivf", "k": 64, "nprobe": 16}),
    ("neighbors-hnsw", {"index": "hnsw", "k": 64, "ef_search": 64}),
]
DENSE_BYTES_PER_PAIR = 24  # similarity, hinge, masks and autograd buffers of the (M × M) block, measured ~20


def make_embeddings(m: int, d: int, regime: str, device: str):
    import torch

    g = torch.Generator().manual_seed(0)
    b = m // VIEWS
    if regime == "collapsed":
        base = torch.randn(1, 1, d, generator=g)
        feats = 3.0 * base + 0.05 * torch.randn(b, VIEWS, d, generator=g)
    else:  # classes -> images -> views, tuned so ~0.1–1% of pairs sit inside alpha = 0.9
        classes = torch.randn(100, d, generator=g)
        labels = torch.randint(0, 100, (b,), generator=g)
        images = classes[labels] + 0.35 * torch.randn(b, d, generator=g)
        feats = images[:, None, :] + 0.25 * torch.randn(b, VIEWS, d, generator=g)
    return feats.to(device)


def _rss_peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def worker(args) -> dict:
    """One backend at one size and regime; prints a JSON line."""
    import torch

    from hypersolid_scale.losses import HypersolidLoss

    opts = dict(dict(BACKENDS)[args.backend])
    backend = args.backend.split("-")[0]
    feats = make_embeddings(args.m, args.dim, args.regime, args.device)
    if backend == "neighbors":
        opts["recall_every"] = 1  # every call: the recall of this very step is reported
    fn = HypersolidLoss(backend=backend, **opts)
    reps = 3 if args.m <= 4096 else 1

    def step():
        f = feats.clone().requires_grad_(True)
        loss = fn(f)
        loss.backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return float(loss.detach())

    if args.m <= 4096:
        step()  # warm-up (FAISS/BLAS initialisation)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter to the current RSS
        base = _rss_bytes()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if args.device == "cuda" else _rss_peak_bytes()) - base
    out = {
        "backend": args.backend,
        "m": args.m,
        "dim": args.dim,
        "regime": args.regime,
        "device": args.device,
        "seconds": sorted(times)[len(times) // 2],
        "peak_bytes": int(peak),
        "loss": loss,
        "repulsion": fn.stats["repulsion"],
        "active_fraction": fn.stats["active_fraction"],
    }
    for key in ("recall", "saturated_rows", "candidates"):
        if key in fn.stats:
            out[key] = fn.stats[key]
    return out


def run_one(backend: str, m: int, regime: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--m", str(m), "--regime", regime,
           "--dim", str(args.dim), "--device", args.device]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"backend": backend, "m": m, "regime": regime, "skipped": f"failed: {proc.stderr.strip()[-400:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_budget(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory * 0.9)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, regime in enumerate(("spread", "collapsed")):
        for name, _ in BACKENDS:
            pts = sorted((r["m"], r) for r in rows if r["backend"] == name and r["regime"] == regime and "seconds" in r)
            if not pts:
                continue
            ms = [p[0] for p in pts]
            axes[0, col].plot(ms, [p[1]["seconds"] for p in pts], marker="o", label=name)
            axes[1, col].plot(ms, [p[1]["peak_bytes"] / 2**30 for p in pts], marker="o", label=name)
        axes[0, col].set_title(f"{regime}: forward+backward time")
        axes[1, col].set_title(f"{regime}: peak memory")
        axes[0, col].set_ylabel("seconds")
        axes[1, col].set_ylabel("GiB")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("global batch M (rows = images × 8 views)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarize(rows: list[dict]) -> list[str]:
    """Markdown table + the targets of the benchmark, checked on this run's numbers."""
    lines = ["| regime | M | backend | time (s) | peak mem (GiB) | active pairs | recall | loss rel. err vs tiled |",
             "|---|---|---|---|---|---|---|---|"]
    exact = {(r["regime"], r["m"]): r for r in rows if r["backend"] == "tiled" and "loss" in r}
    for r in sorted(rows, key=lambda r: (r["regime"], r["m"], [b for b, _ in BACKENDS].index(r["backend"]))):
        if "skipped" in r:
            lines.append(f"| {r['regime']} | {r['m']} | {r['backend']} | – | – | – | – | {r['skipped'][:60]} |")
            continue
        ref = exact.get((r["regime"], r["m"]))
        err = abs(r["loss"] - ref["loss"]) / abs(ref["loss"]) if ref else float("nan")
        rec = f"{r['recall']:.4f}" if "recall" in r else "–"
        lines.append(
            f"| {r['regime']} | {r['m']} | {r['backend']} | {r['seconds']:.3f} | {r['peak_bytes'] / 2**30:.2f} | "
            f"{r['active_fraction']:.2%} | {rec} | {err:.1e} |"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 32768, 65536])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--regimes", nargs="+", default=["spread", "collapsed"])
    ap.add_argument("--backends", nargs="+", default=[b for b, _ in BACKENDS])
    ap.add_argument("--large-from", type=int, default=32768,
                    help="from this M on, run only --large-backends (the approximate indexes are slow to build)")
    ap.add_argument("--large-backends", nargs="+", default=["dense", "tiled", "neighbors-flat"])
    ap.add_argument("--timeout", type=int, default=3600, help="seconds allowed for one measurement")
    ap.add_argument("--out", default=str(RESULTS / "repulsion"), help="output path without extension")
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--m", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--regime", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    budget = memory_budget(args.device)
    rows = []
    for m in args.sizes:
        for regime in args.regimes:
            for backend in args.backends:
                if m >= args.large_from and backend not in args.large_backends:
                    continue
                est = DENSE_BYTES_PER_PAIR * m * m
                if backend == "dense" and est > budget:
                    row = {"backend": backend, "m": m, "regime": regime,
                           "skipped": f"needs ~{est / 2**30:.0f} GiB > {budget / 2**30:.0f} GiB budget"}
                else:
                    row = run_one(backend, m, regime, args)
                rows.append(row)
                shown = {k: row[k] for k in ("seconds", "peak_bytes", "recall", "skipped") if k in row}
                print(f"[{regime:9s} M={m:6d}] {backend:15s} {shown}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": args.device, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "dim": args.dim, "views": VIEWS, "memory_budget_bytes": budget}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    plot(rows, out.with_suffix(".png"))
    table = "\n".join(summarize(rows))
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    raise SystemExit(main())
