"""Clustering at the paper's scale and beyond: K-Means, the DBSCAN sweep and HDBSCAN on every point.

    python benchmarks/clustering_scale.py                 # 100k x 2048, 1000 classes (7 min, shared 2-core CPU)
    python benchmarks/clustering_scale.py --n 10000 --classes 100 --out /tmp/cs   # a smoke run

Embeddings are synthetic but shaped like a ResNet's: ReLU features (non-negative, ~half zero) of class
centres grouped in superclasses of 10 (related classes are closer), each class with its own spread, plus
5 % background points that belong to no class (DBSCAN/HDBSCAN noise). Stages are what
``eval.suites._cluster`` runs under the default protocol (``EvalConfig()``): K-Means with k = classes,
the neighbour graph at the largest eps of both grids, the DBSCAN sweep over that grid (and over the
adaptive grid, from the same graph), HDBSCAN (exact tree). Peak memory per stage is the growth of this
process's peak resident set during the stage (VmHWM, reset before each stage through
/proc/self/clear_refs); ``peak_rss_mib`` is the process's absolute peak (per stage and overall). Writes results/clustering_scale.json
and .png (or under ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersolid_scale.eval import clustering  # noqa: E402
from hypersolid_scale.eval.config import EvalConfig  # noqa: E402
from hypersolid_scale.eval.density import labels_from_tree, reachability_tree  # noqa: E402
from hypersolid_scale.eval.search import as_unit_float32  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Run ``fn``: wall time, the process's peak RSS during it, and that peak's growth over the RSS at the start."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    rss0 = _status_kib("VmRSS")
    t0 = time.perf_counter()
    out = fn()
    hwm = _status_kib("VmHWM")
    return out, {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": round(hwm / 1024, 1),
                 "peak_rss_growth_mib": round(max(hwm - rss0, 0) / 1024, 1)}


def make_embeddings(n: int, d: int, classes: int, seed: int = 0,
                    background: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) float32 ReLU features and labels (-1: background); generated in chunks to bound memory."""
    rng = np.random.default_rng(seed)
    groups = rng.standard_normal((max(classes // 10, 1), d), dtype=np.float32)
    centres = groups[np.arange(classes) // 10] + 0.8 * rng.standard_normal((classes, d), dtype=np.float32)
    spread = rng.uniform(0.8, 1.6, classes).astype(np.float32)
    y = rng.integers(0, classes, n)
    y[rng.random(n) < background] = -1
    x = np.empty((n, d), np.float32)
    for s in range(0, n, 8192):
        yy = y[s:s + 8192]
        noise = rng.standard_normal((len(yy), d), dtype=np.float32)
        z = np.where(yy[:, None] >= 0, centres[yy] + spread[yy, None] * noise, 2.0 * noise)
        x[s:s + 8192] = np.maximum(z, 0.0)
    return x, y


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = result["stages"]
    names = list(stages)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    axes[0].barh(names, [stages[s]["seconds"] for s in names], color="tab:blue")
    axes[0].set_xlabel("seconds")
    axes[0].set_title(f"time per stage (total {result['total_seconds']:.0f} s)")
    axes[1].barh(names, [stages[s]["peak_rss_growth_mib"] for s in names], color="tab:orange")
    axes[1].set_xlabel("MiB")
    axes[1].set_title("peak RSS growth per stage")
    for ax in axes:
        ax.invert_yaxis()
    fig.suptitle(f"clustering {result['n']} x {result['dim']} ({result['classes']} classes) on "
                 f"{result['machine']['cpus']} CPU cores: process peak RSS {result['peak_rss_mib'] / 1024:.1f} GiB")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    ev = EvalConfig()
    load0 = os.getloadavg()
    stages: dict[str, dict[str, float]] = {}
    t_all = time.perf_counter()
    (x, y), stages["data"] = measure(lambda: make_embeddings(args.n, args.dim, args.classes, args.seed))
    x = as_unit_float32(x)
    results: dict[str, Any] = {}
    results["kmeans"], stages["kmeans"] = measure(
        lambda: clustering.kmeans(x, y, k=args.classes, niter=ev.kmeans_niter, seed=ev.seed))
    adaptive, stages["adaptive_eps"] = measure(
        lambda: clustering.adaptive_eps(x, ev.dbscan_min_samples, ev.dbscan_eps_quantiles, seed=ev.seed))
    radius = max(max(ev.dbscan_eps), max(adaptive))
    k = max(ev.dbscan_min_samples - 1, ev.hdbscan_min_cluster_size)
    graph, stages["neighbour_graph"] = measure(
        lambda: clustering.density_graph(x, radius=radius, k=k, max_edges=ev.dbscan_max_edges))
    results["graph"] = {"requested_radius": radius, "radius": graph.radius, "pairs": int(graph.dist.size),
                        "directed_edges": graph.directed_edges(graph.radius), "k": k}
    for name, eps in (("dbscan_paper_grid", ev.dbscan_eps), ("dbscan_adaptive_grid", adaptive)):
        sweep, stages[name] = measure(lambda eps=eps: clustering.dbscan_sweep(
            x, y, eps=eps, min_samples=ev.dbscan_min_samples, max_edges=ev.dbscan_max_edges, graph=graph))
        done = [r for r in sweep if r["nmi"] is not None]
        best = max(done, key=lambda r: r["nmi"])
        results[name] = {"n_eps": len(sweep), "n_run": len(done), "best_eps": best["eps"], "best_nmi": best["nmi"],
                         "best_ari": best["ari"], "best_n_clusters": best["n_clusters"], "sweep": sweep}
    ms = ev.hdbscan_min_cluster_size
    (a, b, w, exact), stages["hdbscan_tree"] = measure(lambda: reachability_tree(x, graph, ms))
    pred, stages["hdbscan_labels"] = measure(lambda: labels_from_tree(a, b, w, ms))
    results["hdbscan"] = {"min_cluster_size": ms, "min_samples": ms, **clustering.cluster_scores(y, pred),
                          "exact_tree": exact}
    total = time.perf_counter() - t_all
    result = {
        "n": args.n, "dim": args.dim, "classes": args.classes, "seed": args.seed,
        "protocol": {"kmeans_k": args.classes, "kmeans_niter": ev.kmeans_niter, "dbscan_min_samples":
                     ev.dbscan_min_samples, "dbscan_max_edges": ev.dbscan_max_edges,
                     "hdbscan_min_cluster_size": ms, "hdbscan_min_samples": ms},
        "stages": stages, "total_seconds": round(total, 1),
        "peak_rss_mib": max(v["peak_rss_mib"] for v in stages.values()),
        "results": results,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
                    "loadavg_start": [round(v, 2) for v in load0],
                    "loadavg_end": [round(v, 2) for v in os.getloadavg()]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "clustering_scale.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "clustering_scale.png")
    print(json.dumps(stages, indent=1))
    paper, adapt, hd = results["dbscan_paper_grid"], results["dbscan_adaptive_grid"], results["hdbscan"]
    print(f"total {total:.0f} s, peak RSS {result['peak_rss_mib']:.0f} MiB; K-Means NMI {results['kmeans']['nmi']:.3f}, "
          f"DBSCAN best NMI {paper['best_nmi']:.3f} at eps {paper['best_eps']} (adaptive grid: "
          f"{adapt['best_nmi']:.3f} at {adapt['best_eps']}), HDBSCAN NMI {hd['nmi']:.3f} "
          f"({hd['n_clusters']} clusters, exact tree {hd['exact_tree']})")
    return result


if __name__ == "__main__":
    main()
