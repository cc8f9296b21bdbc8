"""PNG figures of the evaluation report (the paper's Figs. on similarity density, centroid similarity,
DBSCAN NMI/ARI against eps and the interpolation profile). Headless: matplotlib's Agg backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on training nodes; must precede pyplot
import matplotlib.pyplot as plt
import numpy as np

from hypersolid_scale.safety import atomic


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 120) -> Path:
    """Lay out, write (creating the folder) and close ``fig``; returns the path."""
    path = Path(path)
    fig.tight_layout()
    atomic.write_with(path, lambda f: fig.savefig(f, format=path.suffix[1:] or "png", dpi=dpi))
    plt.close(fig)
    return path


def plot_similarity_density(pos: np.ndarray, neg: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Density of positive (same-class) vs negative (different-class) pair cosine similarities."""
    fig, ax = plt.subplots(figsize=(6, 3))
    bins = np.linspace(-1.0, 1.0, 201)
    for values, color, name in ((pos, "tab:blue", "positive pairs"), (neg, "tab:orange", "negative pairs")):
        density, edges = np.histogram(values, bins=bins, density=True)
        centers = 0.5 * (edges[1:] + edges[:-1])
        ax.fill_between(centers, density, color=color, alpha=0.35, step="mid")
        ax.plot(centers, density, color=color, drawstyle="steps-mid", label=f"{name} (n={len(values)})")
    lo = min(np.percentile(pos, 0.5), np.percentile(neg, 0.5))
    ax.set_xlim(max(-1.0, lo - 0.05), 1.0)
    ax.set_xlabel("cosine similarity")
    ax.set_ylabel("density")
    ax.set_title(title or "pairwise cosine similarity")
    ax.legend(frameon=False, fontsize=8)
    return save_figure(fig, path)


def plot_centroid_heatmap(cos: np.ndarray, path: str | Path, class_names: Sequence[str] | None = None) -> Path:
    """(C, C) cosine similarity between class centroids; 0 (orthogonal centroids) is dark."""
    fig, ax = plt.subplots(figsize=(5, 4.4))
    im = ax.imshow(cos, cmap="plasma", vmin=min(0.0, float(cos.min())), vmax=1.0, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, label="cosine similarity")
    if class_names is not None and len(class_names) <= 30:
        ax.set_xticks(range(len(class_names)), class_names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(class_names)), class_names, fontsize=7)
    ax.set_title("class-centroid cosine similarity")
    return save_figure(fig, path)


def plot_dbscan_sweep(results: Sequence[dict], path: str | Path) -> Path:
    """NMI and ARI of DBSCAN against eps (skipped eps values are left out)."""
    rows = [r for r in results if r.get("nmi") is not None]
    eps = [r["eps"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(eps, [r["nmi"] for r in rows], marker="o", ms=3, label="NMI")
    ax.plot(eps, [r["ari"] for r in rows], marker="s", ms=3, label="ARI")
    ax.set_xlabel("eps (cosine distance)")
    ax.set_ylabel("score")
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    ax.set_title("DBSCAN (cosine) against eps")
    return save_figure(fig, path)


def plot_interpolation_profile(profile: dict[str, list[float]], path: str | Path) -> Path:
    """Mean ± std distance to the nearest real embedding along same-class and different-class paths."""
    t = np.asarray(profile["t"])
    fig, ax = plt.subplots(figsize=(6, 3))
    for key, color, name in (("pos", "tab:blue", "intra-class"), ("neg", "tab:orange", "inter-class")):
        m, s = np.asarray(profile[f"{key}_mean"]), np.asarray(profile[f"{key}_std"])
        ax.fill_between(t, np.maximum(m - s, 0.0), m + s, color=color, alpha=0.25)
        ax.plot(t, m, color=color, label=name)
    ax.set_xticks([0.0, 0.5, 1.0], ["A", "t", "B"])
    ax.set_ylabel("cosine distance to nearest")
    ax.set_ylim(bottom=0.0)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    ax.set_title("interpolation profile")
    return save_figure(fig, path)
