"""Repulsion backends: forward+backward time, peak memory, recall and loss error, at growing batch sizes.

    python -m benchmarks.repulsion                      # CPU, M in {1k, 4k, 16k, 32k, 64k}, D = 1024
    python -m benchmarks.repulsion --device cuda        # on a GPU
    python -m benchmarks.repulsion --sizes 1024 4096    # a quick subset
    python -m benchmarks.repulsion --device cuda --dtypes fp32 bf16 --share   # + share of a ResNet-50 step

On CPU each measurement runs in its own subprocess, so peak memory is that of one backend at one size (the
peak resident set, VmHWM, reset after the inputs are built). On CUDA they run in one process (a process
start costs seconds there) and peak memory is ``torch.cuda.max_memory_allocated`` after a reset; an
out-of-memory error is recorded as a skip. ``--dtypes bf16`` feeds bf16 embeddings (what the model emits
under autocast); the loss upcasts them, so the difference is the cast and the rounding of the input.
Loss error is relative to dense at the same size, or to tiled where dense does not fit.
``--share`` times a ResNet-50 forward+backward at the paper's views (2 x 224 + 6 x 96, bf16 autocast,
channels_last) and puts the repulsion's fwd+bwd time next to it (see ``share``).
A dense run whose estimated footprint exceeds the memory budget is skipped and recorded as such rather than
risking the machine. Two regimes: ``spread`` (embeddings of a trained encoder: few pairs inside alpha) and
``collapsed`` (an untrained one: almost every pair inside alpha). Writes runs/bench/repulsion.json, .png and .md
(``--out benchmarks/results/repulsion``: the committed ones). ``make bench`` then compares them with the
committed results/repulsion.json (``repulsion_compare``: what got slower or heavier, as ratios over a noise
allowance).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from benchmarks import common
from benchmarks.repulsion_measure import VIEWS, available_backends, measure
from benchmarks.repulsion_report import plot, summarize
from hypersolid_scale.safety import atomic

DENSE_BYTES_PER_PAIR = 24  # similarity, hinge, masks and autograd buffers of the (M × M) block, measured ~20


def worker(args: argparse.Namespace) -> dict:
    """One backend at one size and regime in a fresh process; prints a JSON line."""
    return measure(args.backend, args.m, args.regime, args.dim, args.device, args.dtype)


def run_one(backend: str, m: int, regime: str, dtype: str, args: argparse.Namespace) -> dict:
    head = {"backend": backend, "m": m, "regime": regime, "dtype": dtype}
    if args.device == "cuda" or args.inprocess:
        import torch

        try:
            return measure(backend, m, regime, args.dim, args.device, dtype)
        except torch.cuda.OutOfMemoryError as err:
            return {**head, "skipped": f"out of memory: {str(err).splitlines()[0][:200]}"}
        except Exception as err:  # noqa: BLE001 - one failed measurement must not end the others
            return {**head, "skipped": f"failed: {type(err).__name__}: {str(err)[-400:]}"}
        finally:
            torch.cuda.empty_cache()
    cmd = [
        *common.module_command("benchmarks.repulsion"),
        "--worker",
        "--backend",
        backend,
        "--m",
        str(m),
        "--regime",
        regime,
        "--dim",
        str(args.dim),
        "--device",
        args.device,
        "--dtype",
        dtype,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=common.module_env())
    except subprocess.TimeoutExpired:
        return {**head, "skipped": f"timed out after {args.timeout} s"}
    if proc.returncode != 0:
        return {**head, "skipped": f"failed: {proc.stderr.strip()[-400:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_errors(rows: list[dict]) -> None:
    """loss_rel_err against dense at the same (regime, M, dtype), or against tiled where dense did not run."""
    for r in rows:
        if "loss" not in r:
            continue
        key = (r["regime"], r["m"], r.get("dtype", "fp32"))
        refs = {x["backend"]: x for x in rows if "loss" in x and (x["regime"], x["m"], x.get("dtype", "fp32")) == key}
        ref = refs.get("dense") or refs.get("tiled")
        if ref is not None:
            r["reference"] = ref["backend"]
            r["loss_rel_err"] = abs(r["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
        exact = {
            x["backend"]: x
            for x in rows
            if "loss" in x and x.get("dtype", "fp32") == "fp32" and (x["regime"], x["m"]) == key[:2]
        }
        ref32 = exact.get("dense") or exact.get("tiled")
        if ref32 is not None and key[2] != "fp32":  # what rounding the input to bf16 changes
            r["loss_rel_err_vs_fp32"] = abs(r["loss"] - ref32["loss"]) / max(abs(ref32["loss"]), 1e-30)


def share(
    device: str,
    batch: int,
    res: tuple[int, int],
    steps: int,
    dim: int,
    repulsion_backend: str,
    global_batches: tuple[int, ...] = (128, 4096),
) -> dict:
    """Repulsion fwd+bwd vs a measured ResNet-50 fwd+bwd step (2 global + 6 local views, bf16, channels_last).

    Per-GPU mapping of a data-parallel run with global batch B x 8 views on P GPUs: each GPU runs the
    backbone on B/P images and the repulsion on rows = 8B/P local embeddings x columns = 8B global ones,
    i.e. 1/P of the (8B x 8B) work. So repulsion(P) = t_rep(M = 8B) / P and backbone(P) = t_img x B / P,
    with t_img the measured per-image time at the per-GPU batch that fits (``batch``).
    """
    import torch

    from hypersolid_scale.methods import MethodModel
    from hypersolid_scale.methods.hypersolid import Hypersolid, HypersolidConfig
    from hypersolid_scale.models import ModelConfig, build_backbone

    dev = torch.device(device)
    backbone, feature_dim = build_backbone(ModelConfig(arch="resnet50", small_stem=False))
    model = MethodModel(backbone, feature_dim, Hypersolid(feature_dim, HypersolidConfig(out_dim=dim))).to(dev)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-6)
    g = torch.Generator(device=dev).manual_seed(0)
    views = [
        torch.randn(batch, 3, s, s, device=dev, generator=g).contiguous(memory_format=torch.channels_last)
        for s in [res[0]] * 2 + [res[1]] * (VIEWS - 2)
    ]

    def backbone_step() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=device == "cuda"):
            z = model(views, embed=True)["z"][0]
        z.float().square().mean().backward()  # the loss is timed on its own below
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(steps + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        backbone_step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps (cuDNN autotuning)
            times.append(time.perf_counter() - t0)
    t_step = sorted(times)[len(times) // 2]
    # Free the activations' owners before the large repulsion runs.
    model = opt = views = None  # type: ignore[assignment]
    out: dict = {
        "per_gpu_batch_measured": batch,
        "resnet50_step_s": t_step,
        "resnet50_s_per_image": t_step / batch,
        "views": f"2x{res[0]} + {VIEWS - 2}x{res[1]}",
        "dim": dim,
        "repulsion_backend": repulsion_backend,
        "cases": [],
    }
    for global_batch in global_batches:
        m = global_batch * VIEWS
        rep = run_one(
            repulsion_backend,
            m,
            "spread",
            "bf16",
            argparse.Namespace(device=device, dim=dim, timeout=600, inprocess=True),
        )
        if "seconds" not in rep:
            out["cases"].append({"global_batch": global_batch, "m": m, "skipped": rep.get("skipped", "no time")})
            continue
        for p in (1, 8, 32, 128):
            if global_batch % p or global_batch // p < 1:
                continue
            t_rep, t_net = rep["seconds"] / p, out["resnet50_s_per_image"] * global_batch / p
            out["cases"].append(
                {
                    "global_batch": global_batch,
                    "gpus": p,
                    "rows_local": m // p,
                    "columns_global": m,
                    "repulsion_s": t_rep,
                    "backbone_s": t_net,
                    "repulsion_share": t_rep / (t_rep + t_net),
                }
            )
    return out


BLAS_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "KMP_AFFINITY",
    "OMP_PROC_BIND",
    "NVPL_BLAS_DEBUG_CPU_TYPE",
)


def environment() -> dict:
    """What besides the code and the machine (``common.metadata``) moves these timings: library versions, thread
    counts, BLAS variables, load."""
    import faiss
    import numpy
    import torch

    return {
        "numpy": numpy.__version__,
        "faiss": getattr(faiss, "__version__", "?"),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "blas_env": {k: os.environ[k] for k in BLAS_ENV if k in os.environ},
        "load_average_at_start": list(os.getloadavg()),
    }


def memory_budget(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory * 0.9)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__)
    common.add_device(ap, default="cpu")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 32768, 65536])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--regimes", nargs="+", default=["spread", "collapsed"])
    ap.add_argument("--dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    ap.add_argument("--backends", nargs="+", default=None, help="default: all, plus auto where the loss has it")
    ap.add_argument(
        "--large-from",
        type=int,
        default=32768,
        help="from this M on, run only --large-backends (the approximate indexes are slow to build)",
    )
    ap.add_argument("--large-backends", nargs="+", default=["dense", "tiled", "neighbors-flat", "auto"])
    ap.add_argument(
        "--neighbors-max",
        type=int,
        default=1 << 30,
        help="largest M for the neighbors backends (FAISS on the CPU searches M x M)",
    )
    ap.add_argument("--timeout", type=int, default=3600, help="seconds allowed for one measurement (CPU)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="stop starting new measurements after this many seconds (0: no limit); the rest are recorded as skipped",
    )
    ap.add_argument("--share", action="store_true", help="also time the repulsion against a ResNet-50 step")
    ap.add_argument("--share-batch", type=int, default=128, help="per-GPU images of the measured ResNet-50 step")
    ap.add_argument("--share-res", type=int, nargs=2, default=[224, 96], help="global and local view sizes")
    ap.add_argument("--share-steps", type=int, default=5)
    ap.add_argument("--share-backend", default="tiled")
    ap.add_argument("--share-global-batches", type=int, nargs="+", default=[128, 4096])
    ap.add_argument(
        "--inprocess",
        action="store_true",
        help="measure in this process on CPU too (faster, but peak memory is then that of the whole process)",
    )
    common.add_out(ap, "repulsion", what="output path without extension")
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--m", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--regime", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    common.check_device(args.device)

    names = [b for b, _ in available_backends()]
    backends = args.backends or names
    unknown = sorted(set(backends) - set(names))
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}; choose among {names}")
    budget = memory_budget(args.device)
    t_start = time.monotonic()
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = common.metadata(
        args.device, dim=args.dim, views=VIEWS, memory_budget_bytes=budget, backends=backends, **environment()
    )
    if args.device == "cuda":
        import torch

        meta.update(tf32_matmul=torch.backends.cuda.matmul.allow_tf32)

    def save(shares: dict | None = None) -> None:
        """Written after every measurement: a run cut short by a time limit keeps what it measured."""
        meta["seconds_total"] = time.monotonic() - t_start
        atomic.write_text(out.with_suffix(".json"), json.dumps({"meta": meta, "rows": rows, "share": shares}, indent=1))

    for m in args.sizes:
        for regime in args.regimes:
            for dtype in args.dtypes:
                for backend in backends:
                    if m >= args.large_from and backend not in args.large_backends:
                        continue
                    est = DENSE_BYTES_PER_PAIR * m * m
                    head = {"backend": backend, "m": m, "regime": regime, "dtype": dtype}
                    if backend == "dense" and est > budget:
                        row = {**head, "skipped": f"needs ~{est / 2**30:.0f} GiB > {budget / 2**30:.0f} GiB budget"}
                    elif backend.startswith("neighbors") and m > args.neighbors_max:
                        row = {**head, "skipped": f"M > --neighbors-max {args.neighbors_max} (the search time budget)"}
                    elif args.budget_s and time.monotonic() - t_start > args.budget_s:
                        row = {**head, "skipped": f"time budget of {args.budget_s:.0f} s spent"}
                    else:
                        row = run_one(backend, m, regime, dtype, args)
                    rows.append(row)
                    save()
                    shown = {k: row[k] for k in ("seconds", "peak_bytes", "recall", "skipped") if k in row}
                    print(f"[{regime:9s} M={m:6d} {dtype}] {backend:15s} {shown}", flush=True)
    add_errors(rows)
    save()
    shares = None
    if args.share:
        try:
            shares = share(
                args.device,
                args.share_batch,
                tuple(args.share_res),
                args.share_steps,
                args.dim,
                args.share_backend,
                tuple(args.share_global_batches),
            )
        except Exception as err:  # noqa: BLE001 - keep the backend table even if the ResNet part fails
            shares = {"skipped": f"failed: {type(err).__name__}: {str(err)[-400:]}"}
        print("share:", json.dumps(shares), flush=True)
    save(shares)
    plot(rows, out.with_suffix(".png"), shares)
    table = "\n".join(summarize(rows))
    atomic.write_text(out.with_suffix(".md"), table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
