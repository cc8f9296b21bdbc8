"""The comparison's figures: DBSCAN NMI against eps with one line per method (the paper's density figure, for
every method trained the same way), and a bar chart of the main metrics with the spread over seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hypersolid_scale.compare.table import QUICK_COLUMNS, Columns, Summary
from hypersolid_scale.eval.plots import plt, save_figure


def dbscan_curves(reports: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{method: (eps, mean NMI, std NMI)}`` over the eps values every seed of the method computed (a radius
    whose graph was over the edge budget in one seed is left out for the method)."""
    out = {}
    for method, seeds in reports.items():
        per_seed = [
            {round(r["eps"], 9): r["nmi"] for r in rep.get("dbscan", []) if r.get("nmi") is not None} for rep in seeds
        ]
        common = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
        if not common:
            continue
        nmi = np.array([[s[e] for e in common] for s in per_seed])
        out[method] = (np.array(common), nmi.mean(0), nmi.std(0, ddof=1) if len(nmi) > 1 else np.zeros(len(common)))
    return out


def plot_dbscan(
    reports: dict[str, list[dict[str, Any]]], path: Path, title: str, *, subject: str = "hypersolid"
) -> Path | None:
    """One line per method (mean over seeds, band ± std; the method under study, ``subject``, thicker); None
    when no method has a DBSCAN sweep."""
    curves = dbscan_curves(reports)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for method, (eps, mean, std) in curves.items():
        (line,) = ax.plot(eps, mean, lw=2 if method == subject else 1.2, label=method)
        if std.any():
            ax.fill_between(eps, np.maximum(mean - std, 0), mean + std, color=line.get_color(), alpha=0.2)
    # The sweep runs to large radii where every method has merged into one cluster (NMI 0): show the radii
    # where something happens, and a margin after it.
    top = max(float(mean.max()) for _eps, mean, _std in curves.values())
    active = [float(eps[mean > 0.02 * top].max()) for eps, mean, _std in curves.values() if (mean > 0.02 * top).any()]
    if active and top > 0:
        ax.set_xlim(0.0, min(max(float(e.max()) for e, _m, _s in curves.values()), 1.5 * max(active)))
    ax.set_xlabel("eps (cosine distance)")
    ax.set_ylabel("DBSCAN NMI")
    ax.set_ylim(0.0, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8, ncol=2)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


def plot_bars(
    summary: dict[str, dict[str, Summary]], path: Path, title: str, columns: Columns = QUICK_COLUMNS
) -> Path | None:
    """A panel per main metric, a bar per method (mean over seeds, error bar ± std, seeds as dots)."""
    keys = [k for k in columns.main if any(k in cols for cols in summary.values())]
    if not keys:
        return None
    labels = {key: label for label, key, _spec in columns.metrics}
    methods = list(summary)
    fig, axes = plt.subplots(1, len(keys), figsize=(2.6 * len(keys), 3.2), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes[0], keys):
        for i, m in enumerate(methods):
            s = summary[m].get(key)
            if s is None:
                continue
            ax.bar(i, s.mean, yerr=s.std or 0.0, color=colors[i % len(colors)], capsize=3)
            ax.scatter([i] * len(s.values), s.values, s=6, color="black", zorder=3)
        ax.set_xticks(range(len(methods)), methods, rotation=60, fontsize=7)
        ax.set_title(labels[key], fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
