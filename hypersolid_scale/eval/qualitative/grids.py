"""PNG grids of the qualitative analyses: one row per image, one column per view. Headless (Agg), saved
like the report's other figures (``eval.plots``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hypersolid_scale.eval.plots import plt, save_figure  # imports matplotlib with the Agg backend first

PANEL_INCHES = 1.5  # a 28 px image and a 224 px one get the same cell; `nearest` keeps small images crisp


@dataclass
class Panel:
    """One cell: an (H, W) or (H, W, 1|3) image in [0, 1], optionally a heat map in [0, 1] drawn over it."""

    image: np.ndarray
    heat: np.ndarray | None = None
    cmap: str = "gray"  # for single-channel images without a heat map


def _show(ax: plt.Axes, panel: Panel) -> None:
    img = np.asarray(panel.image, dtype=np.float32)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if panel.heat is None:
        if img.ndim == 2:
            ax.imshow(img, cmap=panel.cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        else:
            ax.imshow(np.clip(img, 0.0, 1.0), interpolation="nearest")
        return
    # Heat map over a dimmed grey copy of the image, so the map's colours are not mixed with the image's.
    grey = img if img.ndim == 2 else img.mean(axis=-1)
    ax.imshow(grey, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", alpha=1.0)
    ax.imshow(panel.heat, cmap="jet", vmin=0.0, vmax=1.0, interpolation="nearest", alpha=0.5)


def save_grid(
    columns: Mapping[str, Sequence[Panel]], path: str | Path, row_labels: Sequence[str] | None = None, title: str = ""
) -> Path:
    """Write a grid with one column per ``columns`` entry (its key is the column title) to ``path``."""
    titles = list(columns)
    rows = len(columns[titles[0]])
    if any(len(col) != rows for col in columns.values()):
        raise ValueError(f"every column needs {rows} panels, got {[len(c) for c in columns.values()]}")
    fig, axes = plt.subplots(
        rows, len(titles), figsize=(PANEL_INCHES * len(titles), PANEL_INCHES * rows + 0.4), squeeze=False
    )
    for c, name in enumerate(titles):
        for r, panel in enumerate(columns[name]):
            ax = axes[r, c]
            _show(ax, panel)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(name, fontsize=8)
            if c == 0 and row_labels is not None:
                ax.set_ylabel(row_labels[r], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path, dpi=100)
