"""Evaluation suite: time and peak memory of each part on Fashion-MNIST-sized embeddings (60k train + 10k test).

    python benchmarks/eval.py                    # dims 512 and 2048, a few minutes on 2 CPU cores
    python benchmarks/eval.py --dims 512 --quick # smaller sizes, a smoke run

Embeddings are synthetic but shaped like real ones: 10 overlapping classes, ReLU features (sparse,
non-negative), see ``make_embeddings``. Each part runs at the size ``launch/eval.py`` uses by default:
kNN and the linear probe on 60k -> 10k, geometry and the interpolation profile on the 10k test split,
K-Means on all 70k, DBSCAN on ``cluster_max_samples`` (20k), HDBSCAN on ``hdbscan_max_samples`` (10k).
Peak memory is the growth of this process's peak resident set during the part (VmHWM, reset with
/proc/self/clear_refs before each part); on CUDA also the torch peak.

Then DBSCAN through the sparse FAISS range-search graph against scikit-learn's DBSCAN on a dense
precomputed distance matrix, at the largest n whose float32 matrix fits ``--dense-budget-gib``, on the
same eps values; the clusterings must agree. Writes results/eval.json and results/eval.png.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersolid_scale.eval import clustering, geometry, neighborhood, plots  # noqa: E402
from hypersolid_scale.eval.config import EvalConfig  # noqa: E402
from hypersolid_scale.eval.knn import knn_accuracy  # noqa: E402
from hypersolid_scale.eval.linear import linear_probe  # noqa: E402
from hypersolid_scale.eval.search import as_unit_float32  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# L-BFGS iterations of the timed probe: time per iteration is what scales; launch/eval.py runs up to
# eval.linear_max_iter (200) iterations for each of the 5 weight decays plus the refit (warm-started).
LINEAR_ITERS = 50


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Run ``fn``; wall time, growth of the peak RSS over the RSS at the start, CUDA peak when present."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    rss0 = _status_kib("VmRSS")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    stats = {"seconds": time.perf_counter() - t0, "peak_rss_mib": max(_status_kib("VmHWM") - rss0, 0) / 1024}
    if torch.cuda.is_available():
        stats["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out, stats


def make_embeddings(n_train: int, n_test: int, d: int, seed: int = 0, latent: int = 16,
                    spread: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and test splits of ReLU(W z + small noise), z = class centre + ``spread`` noise in a 16-d latent.

    A low-dimensional latent keeps classes overlapping (kNN well below 100 %) and same-class cosine
    distances around 0.1-0.4, where the DBSCAN sweep finds its clusters; ReLU makes ~half the
    activations zero, as after a ResNet's last block.
    """
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((10, latent)).astype(np.float32)
    proj = rng.standard_normal((latent, d)).astype(np.float32) / np.sqrt(latent)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.arange(n) % 10)
        z = centres[y] + spread * rng.standard_normal((n, latent), dtype=np.float32)
        x = z @ proj + 0.1 * rng.standard_normal((n, d), dtype=np.float32)  # (n, latent) @ (latent, d)
        return np.maximum(x, 0.0, out=x), y

    return (*split(n_train), *split(n_test))


def bench_dim(d: int, n_train: int, n_test: int, ev: EvalConfig, out_dir: Path) -> dict[str, Any]:
    x_tr, y_tr, x_te, y_te = make_embeddings(n_train, n_test, d)
    x_all, y_all = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
    sub = clustering.subsample(len(x_all), ev.cluster_max_samples, 0)
    hsub = clustering.subsample(len(x_all), ev.hdbscan_max_samples, 0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parts: list[tuple[str, int, Callable[[], Any]]] = [
        ("knn (k=5,20,200)", n_train + n_test,
         lambda: knn_accuracy(x_tr, y_tr, x_te, y_te, ks=(5, 20, 200))),
        (f"linear probe (1 wd, {LINEAR_ITERS} it)", n_train + n_test,
         lambda: linear_probe(x_tr, y_tr, x_te, y_te, weight_decays=[1e-4], max_iter=LINEAR_ITERS,
                              device=device)),
        ("kmeans (k=10)", len(x_all), lambda: clustering.kmeans(x_all, y_all, k=10)),
        (f"dbscan sparse ({len(ev.dbscan_eps)} eps)", len(sub),
         lambda: clustering.dbscan_sweep(x_all[sub], y_all[sub], eps=ev.dbscan_eps, max_edges=ev.dbscan_max_edges)),
        ("hdbscan", len(hsub), lambda: clustering.hdbscan_cluster(x_all[hsub], y_all[hsub])),
        ("geometry", n_test, lambda: geometry.geometry_metrics(x_te, y_te, max_pairs=ev.max_pairs)),
        ("interpolation profile", n_test,
         lambda: neighborhood.interpolation_profile(x_te, y_te, n_pairs=ev.interp_pairs)),
    ]
    rows, outputs = [], {}
    for name, n, fn in parts:
        out, stats = measure(fn)
        outputs[name] = out
        rows.append({"part": name, "n": n, "dim": d, **stats})
        print(f"  d={d:5d} {name:28s} n={n:6d} {stats['seconds']:8.1f} s {stats['peak_rss_mib']:8.0f} MiB", flush=True)
    sweep = outputs[f"dbscan sparse ({len(ev.dbscan_eps)} eps)"]

    def make_plots() -> None:
        pos, neg = geometry.pair_similarities(x_te, y_te, max_pairs=ev.max_pairs)
        plots.plot_similarity_density(pos, neg, out_dir / f"density_{d}.png")
        plots.plot_centroid_heatmap(geometry.centroid_cosine(x_te, y_te), out_dir / f"centroids_{d}.png")
        plots.plot_dbscan_sweep(sweep, out_dir / f"dbscan_{d}.png")
        plots.plot_interpolation_profile(outputs["interpolation profile"], out_dir / f"interp_{d}.png")

    _, stats = measure(make_plots)
    rows.append({"part": "plots (4 PNG)", "n": n_test, "dim": d, **stats})
    print(f"  d={d:5d} {'plots (4 PNG)':28s} n={n_test:6d} {stats['seconds']:8.1f} s", flush=True)
    return {"rows": rows, "knn": outputs["knn (k=5,20,200)"], "linear": outputs[parts[1][0]]}


def bench_dbscan_dense(d: int, budget_gib: float, eps: list[float]) -> dict[str, Any]:
    """Sparse graph vs dense precomputed matrix, at the largest n whose float32 (n, n) matrix fits the budget."""
    from sklearn.cluster import DBSCAN

    n = int(math.isqrt(int(budget_gib * 2**30 / 4)))
    x, y, _, _ = make_embeddings(n, 1, d, seed=2)
    sparse, s_stats = measure(lambda: clustering.dbscan_sweep(x, y, eps=eps))

    def dense() -> list[dict[str, Any]]:
        u = as_unit_float32(x)
        dist = 1.0 - u @ u.T  # (n, d) @ (d, n), float32: the smallest dense matrix sklearn accepts
        np.clip(dist, 0.0, 2.0, out=dist)
        return [{"eps": e, **clustering.cluster_scores(
            y, DBSCAN(eps=max(e, 1e-6), min_samples=5, metric="precomputed").fit_predict(dist))} for e in eps]

    dense_out, d_stats = measure(dense)
    agree = all(abs(a["nmi"] - b["nmi"]) < 1e-9 and a["n_clusters"] == b["n_clusters"]
                for a, b in zip(sparse, dense_out))
    print(f"  dbscan n={n} d={d}: sparse {s_stats['seconds']:.1f} s {s_stats['peak_rss_mib']:.0f} MiB | dense "
          f"{d_stats['seconds']:.1f} s {d_stats['peak_rss_mib']:.0f} MiB | same clusters: {agree}", flush=True)
    return {"n": n, "dim": d, "eps": eps, "sparse": s_stats, "dense": d_stats, "same_clusters": agree,
            "edges_at_max_eps": sparse[-1].get("edges"), "sweep": sparse}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    dims = sorted({r["dim"] for r in result["parts"]})
    names = list(dict.fromkeys(r["part"] for r in result["parts"]))
    width = 0.8 / len(dims)
    for i, d in enumerate(dims):
        rows = {r["part"]: r for r in result["parts"] if r["dim"] == d}
        pos = np.arange(len(names)) + i * width
        axes[0].barh(pos, [rows[n]["seconds"] for n in names], height=width, label=f"d={d}")
        axes[1].barh(pos, [rows[n]["peak_rss_mib"] for n in names], height=width, label=f"d={d}")
    for ax, label in ((axes[0], "seconds"), (axes[1], "peak RSS growth (MiB)")):
        ax.set_yticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=8)
        ax.set_xlabel(label)
        ax.invert_yaxis()
        ax.legend(frameon=False)
        ax.grid(axis="x", alpha=0.3)
    db = result.get("dbscan_dense_vs_sparse")
    if db:
        axes[0].set_title(f"DBSCAN n={db['n']}: sparse {db['sparse']['seconds']:.0f} s / "
                          f"{db['sparse']['peak_rss_mib']:.0f} MiB vs dense {db['dense']['seconds']:.0f} s / "
                          f"{db['dense']['peak_rss_mib']:.0f} MiB", fontsize=9)
    fig.suptitle(f"evaluation parts, {result['n_train']} + {result['n_test']} embeddings, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--n-train", type=int, default=60000)
    p.add_argument("--n-test", type=int, default=10000)
    p.add_argument("--dense-budget-gib", type=float, default=1.5,
                   help="memory allowed for the dense DBSCAN distance matrix (float32)")
    p.add_argument("--quick", action="store_true", help="10x fewer samples (smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.n_train, args.n_test, args.dense_budget_gib = args.n_train // 10, args.n_test // 10, 0.05
    args.out.mkdir(parents=True, exist_ok=True)
    # The subsample sizes and the 11-value eps grid of the earlier table (the whole-split clustering at scale
    # is benchmarks/clustering_scale.py).
    ev = EvalConfig(cluster_max_samples=20000, hdbscan_max_samples=10000,
                    dbscan_eps=[round(0.05 * i, 2) for i in range(11)])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    result: dict[str, Any] = {"n_train": args.n_train, "n_test": args.n_test, "device": device,
                              "platform": platform.platform(), "torch": torch.__version__, "parts": [], "quality": {}}
    t0 = time.perf_counter()
    for d in args.dims:
        with tempfile.TemporaryDirectory() as plot_dir:  # the PNGs are timed, not kept
            out = bench_dim(d, args.n_train, args.n_test, ev, Path(plot_dir))
        result["parts"] += out["rows"]
        result["quality"][str(d)] = {**out["knn"], **out["linear"]}
    result["dbscan_dense_vs_sparse"] = bench_dbscan_dense(min(args.dims), args.dense_budget_gib, [0.1, 0.2, 0.3, 0.4])
    result["total_seconds"] = time.perf_counter() - t0
    (args.out / "eval.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
    plot(result, args.out / "eval.png")
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'eval.png'} ({result['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
