"""Plots of ``benchmarks.eval``'s results (kept apart from the measuring code): the clustering rows' stages and
peak memory against the target the result records (clustering.png), the evaluation parts' time and memory
(eval.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common


def plot_clustering(result: dict[str, Any], path: Path) -> None:
    rows = result["rows"]
    names = [f"{r['path']} {r['n'] // 1000}k x {r['dim']}" for r in rows]
    stage_names = list(dict.fromkeys(s for r in rows for s in r["stages"]))
    with common.figure(path, 110, 1, 2, figsize=(13, 0.45 * len(rows) + 2)) as (fig, axes):
        left = np.zeros(len(rows))
        for s in stage_names:
            secs = np.array([r["stages"].get(s, {}).get("seconds", 0.0) for r in rows])
            axes[0].barh(names, secs, left=left, label=s)
            left += secs
        axes[0].axvline(result["target"]["seconds"], color="k", ls="--", lw=1, label="target (100k x 2048)")
        axes[0].set_xlabel("seconds (stages stacked)")
        axes[0].legend(fontsize=7, frameon=False)
        axes[1].barh(names, [r["peak_rss_mib"] / 1024 for r in rows], color="tab:orange")
        axes[1].axvline(result["target"]["peak_rss_gib"], color="k", ls="--", lw=1)
        axes[1].set_xlabel("peak RSS of the row's process (GiB)")
        for ax in axes:
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
        fig.suptitle(
            f"density clustering on every point, {result['machine']['cpus']} CPU cores; dense path only "
            f"within {result['dense_budget_gib']} GiB"
        )


def plot_parts(result: dict[str, Any], path: Path) -> None:
    with common.figure(path, 120, 1, 2, figsize=(12, 4)) as (fig, axes):
        dims = sorted({r["dim"] for r in result["parts"]})
        names = list(dict.fromkeys(r["part"] for r in result["parts"]))
        width = 0.8 / len(dims)
        for i, d in enumerate(dims):
            rows = {r["part"]: r for r in result["parts"] if r["dim"] == d}
            pos = np.arange(len(names)) + i * width
            axes[0].barh(pos, [rows[n]["seconds"] for n in names], height=width, label=f"d={d}")
            axes[1].barh(pos, [rows[n]["peak_rss_growth_mib"] for n in names], height=width, label=f"d={d}")
        for ax, label in ((axes[0], "seconds"), (axes[1], "peak RSS growth (MiB)")):
            ax.set_yticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=8)
            ax.set_xlabel(label)
            ax.invert_yaxis()
            ax.legend(frameon=False)
            ax.grid(axis="x", alpha=0.3)
        fig.suptitle(f"evaluation parts, {result['n_train']} + {result['n_test']} embeddings, {result['device']}")
