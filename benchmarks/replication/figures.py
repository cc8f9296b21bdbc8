"""The replication report's figures (PNG under benchmarks/results/replication/report/), from the run JSON.

Every seed is drawn as a point beside its method's mean and 95 % t-interval, so a reader sees the spread
that the tables summarise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks import common
from benchmarks.replication.claims import BB, HDBSCAN_MCS, HEADLINE, METHOD_NAMES, methods_in
from benchmarks.replication.judging import Comparison
from benchmarks.replication.stats import t_interval

COLOURS = {"hypersolid": "tab:red", "simclr": "tab:blue", "swav": "tab:green", "barlowtwins": "tab:purple"}


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return common.save(fig, path, 110)


def _headline(cmp: Comparison, path: Path, title: str) -> Path:
    methods, values = cmp.methods, cmp.values
    fig, axes = plt.subplots(3, 3, figsize=(12, 9))
    for ax, (key, label) in zip(axes.flat, HEADLINE):
        for i, m in enumerate(methods):
            seeds = values[m].get(key, {})
            if not seeds:
                continue
            ys = list(seeds.values())
            ax.scatter([i + 0.15] * len(ys), ys, s=12, color=COLOURS[m], alpha=0.6)
            ci = t_interval(ys)
            err = [[ci.mean - ci.lo], [ci.hi - ci.mean]] if ci.lo is not None and ci.hi is not None else None
            ax.errorbar([i - 0.1], [ci.mean], yerr=err, fmt="o", color=COLOURS[m], capsize=4)
        ax.set_xticks(range(len(methods)), [METHOD_NAMES[m] for m in methods], fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def _hdbscan(cmp: Comparison, path: Path) -> Path:
    methods, values = cmp.methods, cmp.values
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, metric, label in zip(axes, ("ami", "noise_fraction", "n_clusters"), ("AMI", "noise fraction", "clusters")):
        for m in methods:
            vals = values[m]
            xs, means, los, his = [], [], [], []
            for mcs in HDBSCAN_MCS:
                seeds = vals.get(f"{BB}hdbscan_mcs{mcs}.{metric}")
                if not seeds:
                    continue
                ci = t_interval(list(seeds.values()))
                xs.append(mcs)
                means.append(ci.mean)
                los.append(ci.lo if ci.lo is not None else ci.mean)
                his.append(ci.hi if ci.hi is not None else ci.mean)
            ax.plot(xs, means, "o-", color=COLOURS[m], label=METHOD_NAMES[m])
            ax.fill_between(xs, los, his, color=COLOURS[m], alpha=0.15)
        ax.set_xscale("symlog", linthresh=1)  # log-spaced grid; an empty panel (metric not run) stays drawable
        ax.set_xlabel("HDBSCAN min_cluster_size")
        ax.set_ylabel(label)
        if metric == "n_clusters":
            ax.set_yscale("symlog", linthresh=1)  # 0 clusters (all noise) stays drawable
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("HDBSCAN on backbone features, every setting (mean and 95 % interval over seeds)")
    return _save(fig, path)


def _curves(runs: Sequence[dict[str, Any]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        pts = []
        for e in r["per_epoch"]:
            v = e.get(f"{BB}knn_k20_majority", e.get("knn_k20_majority"))
            if isinstance(v, (int, float)):
                bank = "10k" if f"{BB}knn_k20_majority" in e or e.get("bank") == 10000 else "60k"
                pts.append((e["epoch"], v, bank))
        for bank, marker in (("10k", "o-"), ("60k", "x:")):  # a line joins only points of the same bank
            sel = [(x, y) for x, y, b in pts if b == bank]
            if sel:
                ax.plot(*zip(*sel), marker, color=COLOURS[r["method"]], alpha=0.6)
    for m in methods_in(runs):
        ax.plot([], [], "-", color=COLOURS[m], label=METHOD_NAMES[m])
    ax.plot([], [], "o", color="grey", label="bank of 10,000 (protocol)")
    ax.plot([], [], "x", color="grey", label="bank of 60,000 (first GPU attempt's kNN suite)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("kNN@20 top-1 (%), majority vote")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def draw_cpu(cmp: Comparison | None, out: Path) -> dict[str, Path]:
    """The CPU group's figures, from its comparison's per-seed values (None: the group has no run)."""
    if cmp is None:
        return {}
    return {
        "cpu_headline": _headline(cmp, out / "cpu_headline.png", "CPU group, one epoch: headline metrics per seed"),
        "cpu_hdbscan": _hdbscan(cmp, out / "cpu_hdbscan.png"),
    }


def draw_gpu(curve: Sequence[dict[str, Any]], out: Path) -> dict[str, Path]:
    """The GPU group's figures, from its learning-curve runs (plan part "curve")."""
    return {"gpu_curves": _curves(curve, out / "gpu_curves.png")} if curve else {}


def draw_long(runs: Sequence[dict[str, Any]], out: Path) -> dict[str, Path]:
    """The 20-epoch part's curves: one panel per metric (the protocol's and the training's loss terms), each
    seed a thin line, the mean over seeds a thick one (plan part "long")."""
    if not runs:
        return {}
    from benchmarks.replication.long_run import LONG_METRICS

    fig, axes = plt.subplots(3, 4, figsize=(16, 10))
    for ax, (key, label) in zip(axes.flat, LONG_METRICS):
        for m in methods_in(runs):
            by_epoch: dict[float, list[float]] = {}
            for r in (r for r in runs if r["method"] == m):
                pts = [(e["epoch"], e[key]) for e in r["per_epoch"] if isinstance(e.get(key), (int, float))]
                if pts:
                    ax.plot(*zip(*pts), "-", color=COLOURS[m], alpha=0.25, lw=1)
                for x, y in pts:
                    by_epoch.setdefault(x, []).append(y)
            if by_epoch:
                xs = sorted(by_epoch)
                ax.plot(xs, [sum(by_epoch[x]) / len(by_epoch[x]) for x in xs], "o-", color=COLOURS[m], lw=2)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(LONG_METRICS) :]:
        ax.axis("off")
    for m in methods_in(runs):
        axes.flat[0].plot([], [], "-", color=COLOURS[m], label=METHOD_NAMES[m])
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("20 epochs: the protocol after epochs 1, 2, 5, 10, 20 and the training's epoch means (thin: seeds)")
    return {"cpu_long_curves": _save(fig, out / "cpu_long_curves.png")}
