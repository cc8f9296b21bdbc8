"""The comparison table: every metric of every method as mean ± std over its seeds, as JSON and Markdown.

Two sets of columns: ``QUICK`` for the smoke comparison's reports (``--suite``), ``PROTOCOL`` for reports of
``--protocol paper`` (flat ``protocol.*`` keys, ``hypersolid_scale.eval.protocol``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypersolid_scale.safety import atomic

# (column, report key, format). The evaluation's metric names: hypersolid_scale.eval.suites.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("kNN@20 (%)", "knn_k20_weighted", ".2f"),
    ("linear (%)", "linear_top1", ".2f"),
    ("K-Means NMI", "kmeans_nmi", ".3f"),
    ("K-Means ARI", "kmeans_ari", ".3f"),
    ("HDBSCAN NMI", "hdbscan_nmi", ".3f"),
    ("HDBSCAN ARI", "hdbscan_ari", ".3f"),
    ("HDBSCAN clusters", "hdbscan_n_clusters", ".1f"),
    ("DBSCAN best NMI", "dbscan_best_nmi", ".3f"),
    ("DBSCAN best eps", "dbscan_best_eps", ".3f"),
    ("anisotropy", "anisotropy", ".3f"),
    ("sparsity", "sparsity", ".3f"),
    ("effective rank", "embedding_rank", ".1f"),
)
# The metrics of the bar chart (the accuracy and the clustering quality a reader compares first).
MAIN_METRICS: tuple[str, ...] = ("knn_k20_weighted", "linear_top1", "kmeans_nmi", "hdbscan_nmi", "dbscan_best_nmi")
# Where higher is better (the best mean is bold); not for eps, cluster counts or the geometry.
QUALITY: frozenset[str] = frozenset(
    {"knn_k20_weighted", "linear_top1", "kmeans_nmi", "kmeans_ari", "hdbscan_nmi", "hdbscan_ari", "dbscan_best_nmi"}
)

_B = "protocol.backbone.raw."  # the paper's features: the headline columns are on raw backbone outputs
_MCS = (5, 10, 25, 50, 100)
PROTOCOL_METRICS: tuple[tuple[str, str, str], ...] = (
    ("kNN@5 (%)", f"{_B}knn_k5_weighted", ".2f"),
    ("kNN@20 (%)", f"{_B}knn_k20_weighted", ".2f"),
    ("linear (%)", f"{_B}linear_top1", ".2f"),
    ("K-Means AMI", f"{_B}kmeans.ami", ".3f"),
    ("K-Means NMI", f"{_B}kmeans.nmi", ".3f"),
    *((f"HDBSCAN AMI mcs={m}", f"{_B}hdbscan_mcs{m}.ami", ".3f") for m in _MCS),
    ("HDBSCAN noise mcs=10", f"{_B}hdbscan_mcs10.noise_fraction", ".3f"),
    ("DBSCAN AMI 50% core", f"{_B}dbscan_q50.ami", ".3f"),
    ("projector kNN@5 (%)", "protocol.projector.raw.knn_k5_weighted", ".2f"),
    ("same-class pairs > alpha", "protocol.exclusion.same_class_frac", ".4f"),
    ("different-class pairs > alpha", "protocol.exclusion.diff_class_frac", ".4f"),
)


@dataclass(frozen=True)
class Columns:
    """The table's columns (label, report key, format), the bar chart's metrics, and the higher-is-better ones."""

    metrics: tuple[tuple[str, str, str], ...]
    main: tuple[str, ...]
    quality: frozenset[str] = field(default_factory=frozenset)


QUICK_COLUMNS = Columns(METRICS, MAIN_METRICS, QUALITY)
PROTOCOL_COLUMNS = Columns(
    PROTOCOL_METRICS,
    (f"{_B}knn_k5_weighted", f"{_B}knn_k20_weighted", f"{_B}linear_top1", f"{_B}kmeans.ami", f"{_B}hdbscan_mcs10.ami"),
    frozenset(k for _label, k, _s in PROTOCOL_METRICS if "noise" not in k and "exclusion" not in k),
)


@dataclass
class Summary:
    """One metric of one method over its seeds."""

    values: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (n - 1); None for a single seed."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def format(self, spec: str) -> str:
        return f"{self.mean:{spec}}" + (f" ± {self.std:{spec}}" if self.std is not None else "")


def summarise(
    reports: dict[str, list[dict[str, Any]]], columns: Columns = QUICK_COLUMNS
) -> dict[str, dict[str, Summary]]:
    """``{method: [report.json of each seed]}`` -> ``{method: {metric key: Summary}}``; a metric a seed
    skipped is left out of that seed's values (and the method has no entry when every seed skipped it)."""
    out: dict[str, dict[str, Summary]] = {}
    for method, seeds in reports.items():
        out[method] = {}
        for _label, key, _spec in columns.metrics:
            values = [
                float(r["metrics"][key])
                for r in seeds
                if isinstance(r["metrics"].get(key), (int, float)) and math.isfinite(r["metrics"][key])
            ]
            if values:
                out[method][key] = Summary(values)
    return out


def _suite_of(key: str) -> str:
    """The name under which the evaluation records the skip of the step that computes ``key``."""
    head = key.split("_")[0]
    return head if head in ("knn", "linear", "kmeans", "dbscan", "hdbscan") else "geometry"


def skipped_reasons(
    reports: dict[str, list[dict[str, Any]]], columns: Columns = QUICK_COLUMNS
) -> dict[str, dict[str, str]]:
    """``{method: {metric key: reason}}`` for the table's metrics that some seed did not compute."""
    out: dict[str, dict[str, str]] = {}
    for method, seeds in reports.items():
        for report in seeds:
            for _label, key, _spec in columns.metrics:
                if key not in report["metrics"]:
                    skips = report.get("skipped", {})  # e.g. knn_k20 (K over the bank) or the whole step
                    # a protocol key's step is its stem: protocol.backbone.raw.hdbscan_mcs100(.ami)
                    stems = (key.rsplit("_", 1)[0], key.rsplit(".", 1)[0], _suite_of(key))
                    why = next((skips[s] for s in stems if s in skips), "not computed")
                    out.setdefault(method, {})[key] = why
    return out


def to_json(summary: dict[str, dict[str, Summary]], info: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The table as plain data: ``{method: {**info[method], metric: {"mean", "std", "values"}}}``."""
    return {
        m: {
            **info.get(m, {}),
            "metrics": {k: {"mean": s.mean, "std": s.std, "values": s.values} for k, s in cols.items()},
        }
        for m, cols in summary.items()
    }


def markdown(
    summary: dict[str, dict[str, Summary]],
    info: dict[str, dict[str, Any]],
    skipped: dict[str, dict[str, str]],
    columns: Columns = QUICK_COLUMNS,
) -> str:
    """Two Markdown tables (the budget and wall-clock per method; the metrics), best mean per column in bold
    for the quality metrics (not for eps, cluster counts or the geometry, where higher is not better)."""
    lines = [
        "| method | seeds | images seen | views / image | train wall-clock (s) | eval wall-clock (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in summary:
        i = info.get(m, {})
        lines.append(
            f"| {m} | {i.get('seeds', '')} | {i.get('images_seen', '')} | {i.get('views', '')} | "
            f"{_clock(i.get('train_s'))} | {_clock(i.get('eval_s'))} |"
        )
    quality, metrics = columns.quality, columns.metrics
    best = {key: max((s[key].mean for s in summary.values() if key in s), default=None) for key in quality}
    lines += [
        "",
        "| method | " + " | ".join(label for label, _k, _s in metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for m, cols in summary.items():
        cells = []
        for _label, key, spec in metrics:
            if key not in cols:
                cells.append("skipped" if key in skipped.get(m, {}) else "n/a")
                continue
            text = cols[key].format(spec)
            cells.append(f"**{text}**" if key in quality and len(summary) > 1 and cols[key].mean == best[key] else text)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    notes = [f"- {m}, {k}: skipped ({why})" for m, by in skipped.items() for k, why in sorted(by.items())]
    if notes:
        lines += ["", "Skipped:", *notes]
    return "\n".join(lines) + "\n"


def _clock(values: list[float] | None) -> str:
    if not values:
        return ""
    s = Summary(values)
    return s.format(".0f")


def write(
    out: Path,
    summary: dict[str, dict[str, Summary]],
    info: dict[str, dict[str, Any]],
    skipped: dict[str, dict[str, str]],
    header: str,
    columns: Columns = QUICK_COLUMNS,
) -> tuple[Path, Path]:
    """``<out>/compare.json`` and ``<out>/compare.md``; returns their paths."""
    js, md = out / "compare.json", out / "compare.md"
    atomic.write_json(js, {"methods": to_json(summary, info), "skipped": skipped}, indent=1, newline=False)
    atomic.write_text(md, header + "\n\n" + markdown(summary, info, skipped, columns))
    return js, md
