"""Evaluation suite: time and peak memory of each part, and density clustering at the paper's scale.

    python -m benchmarks.eval                                  # both sections (36 min on a shared 2-core CPU)
    python -m benchmarks.eval --sections clustering            # clustering rows only
    python -m benchmarks.eval --quick --dims 64                # a smoke run (tests/test_benchmark_eval.py)

Into --out (default runs/bench/eval; the committed results: --out benchmarks/results).
Section "parts" (eval.json, eval.png): kNN, the linear probe, K-Means, geometry and the
interpolation profile on 60k train + 10k test embeddings shaped like ``eval_embeddings.make_embeddings``, each
timed in this process (peak RSS reset through /proc/self/clear_refs before each part).

Section "clustering" (clustering.json, clustering.png): what ``eval.suites._cluster`` runs under
the default protocol on every point, at n = 50k and 100k, d = 512 and 2048: K-Means (k = classes), the
exact neighbour graph (``pairs.neighbour_graph``), the DBSCAN sweep over the paper's 101 eps and over the
adaptive grid, the HDBSCAN spanning tree (``density.reachability_tree``) and its labels. Each row runs in a
process of its own: its peak RSS is the whole cost (interpreter, data, algorithm). The dense path the exact one
replaced (scikit-learn's DBSCAN and the hdbscan package on a precomputed (n, n) matrix) needs 8 n^2 bytes for
HDBSCAN's float64 matrix alone (19 GiB at 50k): it runs at the largest n within ``--dense-budget-gib``, next
to the exact path at the same n, and their labels are compared.
Embeddings (``eval_embeddings.cluster_embeddings``) are shaped like a trained encoder's and L2-normalised. The
plots are ``eval_report``'s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from benchmarks import common
from benchmarks.eval_embeddings import cluster_embeddings, make_embeddings
from benchmarks.eval_report import plot_clustering, plot_parts
from hypersolid_scale.eval import clustering, geometry, neighborhood, plots
from hypersolid_scale.eval.config import EvalConfig
from hypersolid_scale.eval.density import EPS_FLOOR, dbscan_sweep_labels, labels_from_tree, reachability_tree
from hypersolid_scale.eval.knn import knn_accuracy
from hypersolid_scale.eval.linear import linear_probe
from hypersolid_scale.safety import atomic

# L-BFGS iterations of the timed probe: time per iteration is what scales; launch/eval.py runs up to
# eval.linear_max_iter (200) iterations for each of the 5 weight decays plus the refit (warm-started).
LINEAR_ITERS = 50
# The dense comparison's DBSCAN grid: scikit-learn scans the whole matrix once per eps, so 11 of the 101.
COMPARE_EPS = [round(0.05 * i, 2) for i in range(11)]
TARGET = {"seconds": 15 * 60, "peak_rss_gib": 8.0}  # 100k x 2048 on the whole clustering protocol


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Run ``fn``: wall time, the process's peak RSS during it and that peak's growth over the RSS at the start."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    rss0 = _status_kib("VmRSS")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    hwm = _status_kib("VmHWM")
    stats = {
        "seconds": round(time.perf_counter() - t0, 2),
        "peak_rss_mib": round(hwm / 1024, 1),
        "peak_rss_growth_mib": round(max(hwm - rss0, 0) / 1024, 1),
    }
    if torch.cuda.is_available():
        stats["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out, stats


# ---- Section "clustering": one subprocess per row --------------------------------------------------------


def _exact_row(
    x: np.ndarray, y: np.ndarray, spec: dict[str, Any], ev: EvalConfig, stages: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The exact path: K-Means, adaptive eps, one neighbour graph, DBSCAN sweeps, HDBSCAN tree and labels."""
    out: dict[str, Any] = {}
    if spec["kmeans"]:
        out["kmeans"], stages["kmeans"] = measure(
            lambda: clustering.kmeans(x, y, k=spec["classes"], niter=ev.kmeans_niter, seed=ev.seed)
        )
    grids = {"dbscan_grid": spec.get("eps") or ev.dbscan_eps}
    if spec["adaptive"]:
        grids["dbscan_adaptive"], stages["adaptive_eps"] = measure(
            lambda: clustering.adaptive_eps(x, ev.dbscan_min_samples, ev.dbscan_eps_quantiles, seed=ev.seed)
        )
    ms = ev.hdbscan_min_cluster_size
    k = max(ev.dbscan_min_samples - 1, ms)
    radius = max(max(g) for g in grids.values())
    graph, stages["neighbour_graph"] = measure(
        lambda: clustering.density_graph(x, radius=radius, k=k, max_edges=ev.dbscan_max_edges)
    )
    out["graph"] = {"requested_radius": radius, "radius": graph.radius, "pairs": int(graph.dist.size), "k": k}
    labels: dict[str, np.ndarray] = {}
    for name, eps in grids.items():
        sweep, stages[name] = measure(
            partial(
                clustering.dbscan_sweep,
                x,
                y,
                eps=eps,
                min_samples=ev.dbscan_min_samples,
                max_edges=ev.dbscan_max_edges,
                graph=graph,
            )
        )
        done = [r for r in sweep if r["nmi"] is not None]
        best = max(done, key=lambda r: r["nmi"])
        out[name] = {
            "n_eps": len(sweep),
            "n_run": len(done),
            **{f"best_{key}": best[key] for key in ("eps", "nmi", "ari", "n_clusters")},
        }
    if spec.get("labels_out"):
        fits = [e for e in grids["dbscan_grid"] if max(e, EPS_FLOOR) <= graph.radius]
        labels.update(
            {f"dbscan_{e}": lab for e, lab in zip(fits, dbscan_sweep_labels(graph, ev.dbscan_min_samples, fits))}
        )
    (a, b, w, exact), stages["hdbscan_tree"] = measure(lambda: reachability_tree(x, graph, ms))
    labels["hdbscan"], stages["hdbscan_labels"] = measure(lambda: labels_from_tree(a, b, w, ms))
    out["hdbscan"] = {**clustering.cluster_scores(y, labels["hdbscan"]), "exact_tree": exact}
    return out, labels


def _dense_row(
    x: np.ndarray, y: np.ndarray, spec: dict[str, Any], ev: EvalConfig, stages: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The dense path: scikit-learn's DBSCAN and the hdbscan package on precomputed (n, n) cosine distances."""
    import hdbscan
    from sklearn.cluster import DBSCAN

    def dbscan() -> dict[str, np.ndarray]:
        dist = x @ x.T  # (n, d) @ (d, n), float32: the smallest matrix scikit-learn accepts
        np.subtract(1.0, dist, out=dist)
        np.clip(dist, 0.0, 2.0, out=dist)
        return {
            f"dbscan_{e}": DBSCAN(
                eps=max(e, 1e-6), min_samples=ev.dbscan_min_samples, metric="precomputed"
            ).fit_predict(dist)
            for e in spec["eps"]
        }

    def hdb() -> np.ndarray:
        dist = (1.0 - x @ x.T).astype(np.float64)  # the package computes in float64
        np.clip(dist, 0.0, 2.0, out=dist)
        np.fill_diagonal(dist, 0.0)
        return hdbscan.HDBSCAN(min_cluster_size=ev.hdbscan_min_cluster_size, metric="precomputed").fit_predict(dist)

    labels, stages["dbscan_dense"] = measure(dbscan)
    labels["hdbscan"], stages["hdbscan_dense"] = measure(hdb)
    return {"hdbscan": clustering.cluster_scores(y, labels["hdbscan"])}, labels


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """One clustering row (in its own process): the data, then the exact or the dense path."""
    ev = EvalConfig()
    stages: dict[str, Any] = {}
    (x, y), stages["data"] = measure(lambda: cluster_embeddings(spec["n"], spec["dim"], spec["classes"], spec["seed"]))
    out, labels = (_exact_row if spec["path"] == "exact" else _dense_row)(x, y, spec, ev, stages)
    if spec.get("labels_out"):
        np.savez(spec["labels_out"], **cast(dict[str, Any], labels))
    for name, s in stages.items():
        print(
            f"    {spec['path']:5s} n={spec['n']:6d} d={spec['dim']:4d} {name:22s} {s['seconds']:8.1f} s "
            f"{s['peak_rss_mib']:8.0f} MiB",
            flush=True,
        )
    return {"stages": stages, "results": out}


def _spawn(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; add its wall time and the whole process's peak RSS."""
    result_file = tmp / "row.json"
    t0 = time.perf_counter()
    cmd = [*common.module_command("benchmarks.eval"), "--row", json.dumps(spec), "--row-out", str(result_file)]
    proc = subprocess.Popen(cmd, env=common.module_env())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"clustering row {spec} failed with exit code {proc.returncode}")
    row = json.loads(result_file.read_text())
    # measure() resets the high-water mark that ru_maxrss reads too (clear_refs): the process's peak is the
    # largest of the stages' peaks and of what followed the last reset.
    peak = max([usage.ru_maxrss / 1024] + [s["peak_rss_mib"] for s in row["stages"].values()])
    return {
        **{k: v for k, v in spec.items() if k != "labels_out"},
        **row,
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_rss_mib": round(peak, 1),
    }


def _write_json(result: dict[str, Any], machine: dict[str, Any], path: Path) -> None:
    """Written after every row: a long run interrupted midway keeps the rows it finished."""
    machine["loadavg_end"] = [round(v, 2) for v in os.getloadavg()]
    atomic.write_text(path, json.dumps({**result, "machine": machine}, indent=1, default=float) + "\n")


def bench_clustering(
    ns: list[int], dims: list[int], classes: int, dense_budget_gib: float, out: Path
) -> dict[str, Any]:
    """Exact rows at every (n, d); the dense path and the exact one side by side at the largest dense n."""
    dense_n = int(math.isqrt(int(dense_budget_gib * 2**30 / 8)))  # HDBSCAN's float64 (n, n) matrix fits
    result: dict[str, Any] = {"target": TARGET, "dense_budget_gib": dense_budget_gib, "rows": [], "compare": []}
    machine = common.metadata("cpu")
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for n, d in itertools.product(ns, dims):
            print(f"  clustering n={n} d={d} (exact; dense needs {8 * n * n / 2**30:.1f} GiB)", flush=True)
            row = _spawn(
                {"path": "exact", "n": n, "dim": d, "classes": classes, "seed": 0, "kmeans": True, "adaptive": True},
                tmp,
            )
            row["dense"] = f"not run: its float64 (n, n) matrix needs {8 * n * n / 2**30:.1f} GiB"
            result["rows"].append(row)
            _write_json(result, machine, out / "clustering.json")
        for d in dims:
            print(f"  dense vs exact n={dense_n} d={d}", flush=True)
            base = {
                "n": dense_n,
                "dim": d,
                "classes": max(dense_n // 50, 10),
                "seed": 1,
                "kmeans": False,
                "adaptive": False,
                "eps": COMPARE_EPS,
            }
            pair = [_spawn({**base, "path": p, "labels_out": str(tmp / f"{p}.npz")}, tmp) for p in ("exact", "dense")]
            ex, de = (np.load(tmp / f"{p}.npz") for p in ("exact", "dense"))
            dbscan_keys = sorted(k for k in ex.files if k.startswith("dbscan_"))
            result["rows"] += pair
            result["compare"].append(
                {
                    "n": dense_n,
                    "dim": d,
                    "dbscan_eps_compared": len(dbscan_keys),
                    "dbscan_same_labels": all(np.array_equal(ex[k], de[k]) for k in dbscan_keys),
                    "hdbscan_same_labels": bool(np.array_equal(ex["hdbscan"], de["hdbscan"])),
                    "hdbscan_ari_exact_vs_dense": float(adjusted_rand_score(de["hdbscan"], ex["hdbscan"])),
                }
            )
            print(f"  {result['compare'][-1]}", flush=True)
            _write_json(result, machine, out / "clustering.json")
    return result


# ---- Section "parts": kNN, linear probe, K-Means, geometry, interpolation on 60k + 10k embeddings --------


def bench_dim(d: int, n_train: int, n_test: int, ev: EvalConfig, out_dir: Path) -> dict[str, Any]:
    x_tr, y_tr, x_te, y_te = make_embeddings(n_train, n_test, d)
    x_all, y_all = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parts: list[tuple[str, int, Callable[[], Any]]] = [
        ("knn (k=5,20,200)", n_train + n_test, lambda: knn_accuracy(x_tr, y_tr, x_te, y_te, ks=(5, 20, 200))),
        (
            f"linear probe (1 wd, {LINEAR_ITERS} it)",
            n_train + n_test,
            lambda: linear_probe(x_tr, y_tr, x_te, y_te, weight_decays=[1e-4], max_iter=LINEAR_ITERS, device=device),
        ),
        ("kmeans (k=10)", len(x_all), lambda: clustering.kmeans(x_all, y_all, k=10)),
        ("geometry", n_test, lambda: geometry.geometry_metrics(x_te, y_te, max_pairs=ev.max_pairs)),
        (
            "interpolation profile",
            n_test,
            lambda: neighborhood.interpolation_profile(x_te, y_te, n_pairs=ev.interp_pairs),
        ),
    ]
    rows, outputs = [], {}
    for name, n, fn in parts:
        outputs[name], stats = measure(fn)
        rows.append({"part": name, "n": n, "dim": d, **stats})
        print(
            f"  d={d:5d} {name:28s} n={n:6d} {stats['seconds']:8.1f} s {stats['peak_rss_growth_mib']:8.0f} MiB",
            flush=True,
        )

    def make_plots() -> None:
        pos, neg = geometry.pair_similarities(x_te, y_te, max_pairs=ev.max_pairs)
        plots.plot_similarity_density(pos, neg, out_dir / f"density_{d}.png")
        plots.plot_centroid_heatmap(geometry.centroid_cosine(x_te, y_te), out_dir / f"centroids_{d}.png")
        plots.plot_interpolation_profile(outputs["interpolation profile"], out_dir / f"interp_{d}.png")

    _, stats = measure(make_plots)
    rows.append({"part": "plots (3 PNG)", "n": n_test, "dim": d, **stats})
    return {"rows": rows, "knn": outputs["knn (k=5,20,200)"], "linear": outputs[parts[1][0]]}


def bench_parts(dims: list[int], n_train: int, n_test: int, out: Path) -> dict[str, Any]:
    device = common.card(cpu=f"CPU ({torch.get_num_threads()} threads)")
    result: dict[str, Any] = {
        **common.metadata("cpu"),
        "n_train": n_train,
        "n_test": n_test,
        "device": device,
        "parts": [],
        "quality": {},
    }
    t0 = time.perf_counter()
    for d in dims:
        with tempfile.TemporaryDirectory() as plot_dir:  # the PNGs are timed, not kept
            res = bench_dim(d, n_train, n_test, EvalConfig(), Path(plot_dir))
        result["parts"] += res["rows"]
        result["quality"][str(d)] = {**res["knn"], **res["linear"]}
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    atomic.write_text((out / "eval.json"), json.dumps(result, indent=2, default=float) + "\n")
    plot_parts(result, out / "eval.png")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", choices=["clustering", "parts"], default=["clustering", "parts"])
    p.add_argument("--dims", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--n", type=int, nargs="+", default=[50_000, 100_000], help="clustering: points per row")
    p.add_argument("--classes", type=int, default=1000, help="clustering: classes (the paper's K-Means k = 1000)")
    p.add_argument(
        "--dense-budget-gib",
        type=float,
        default=1.5,
        help="clustering: memory allowed for the dense path's float64 (n, n) matrix",
    )
    p.add_argument("--n-train", type=int, default=60000, help="parts: training embeddings")
    p.add_argument("--n-test", type=int, default=10000, help="parts: test embeddings")
    common.add_quick(p, "a smoke run: a few thousand points per row")
    common.add_out(p, "eval", what="folder for eval.json, clustering.json and their PNGs")
    p.add_argument("--row", help=argparse.SUPPRESS)  # internal: one clustering row (JSON spec) ...
    p.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)  # ... and the file for its result
    args = p.parse_args(argv)
    if args.row:
        atomic.write_text(args.row_out, json.dumps(run_row(json.loads(args.row)), default=float))
        return 0
    if args.quick:
        args.n, args.classes, args.dense_budget_gib = [3000], 60, 0.02
        args.n_train, args.n_test = args.n_train // 10, args.n_test // 10
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if "clustering" in args.sections:
        res = bench_clustering(args.n, args.dims, args.classes, args.dense_budget_gib, args.out)
        plot_clustering({**res, "machine": {"cpus": os.cpu_count()}}, args.out / "clustering.png")
        print(f"wrote {args.out / 'clustering.json'} and clustering.png", flush=True)
    if "parts" in args.sections:
        bench_parts(args.dims, args.n_train, args.n_test, args.out)
        print(f"wrote {args.out / 'eval.json'} and eval.png", flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
